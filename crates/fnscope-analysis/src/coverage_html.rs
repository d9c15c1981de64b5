//! The static HTML coverage report: `index.html` with the modules and their source files,
//! and one page per source file listing its functions (executed, never executed,
//! unhookable) above the source text when it can be read. Self-contained pages: inline CSS,
//! no scripts, no external assets, so the folder can be copied anywhere and opened.

use crate::coverage::{
    percent, Coverage, CoveredFunction, FileCoverage, FunctionStatus, ModuleCoverage,
};
use crate::AnalysisError;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Source files bigger than this are not shown inline (the function table still is).
const MAX_SOURCE_BYTES: u64 = 4 << 20;

const STYLE: &str = "<style>
body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0}
th,td{padding:.25em .7em;text-align:left;border-bottom:1px solid #ddd}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:inline-block;width:8em;height:.8em;background:#f2c4c4;vertical-align:middle}
.bar span{display:block;height:100%;background:#5cb85c}
.executed{background:#e3f6e3}.not-executed{background:#fbe3e3}.unhookable{background:#ececec;color:#666}
.mark{font-weight:bold;text-align:center}
.note{color:#555;font-size:.9em}
pre{font-size:.85em;line-height:1.35;border:1px solid #ddd;padding:.4em 0;overflow-x:auto}
pre a.ln{display:inline-block;width:4.5em;color:#999;text-align:right;padding-right:1em;text-decoration:none}
pre span.l{display:block}
pre .fn{font-weight:bold;font-size:.85em;padding:0 .5em;margin-left:1em}
</style>";

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title>{STYLE}</head><body>\n{body}</body></html>\n",
        esc(title)
    )
}

fn bar(executed: u64, hookable: u64) -> String {
    if hookable == 0 {
        return String::new();
    }
    let pct = 100.0 * executed as f64 / hookable as f64;
    format!(
        "<span class=\"bar\" title=\"{pct:.1}%\"><span style=\"width:{pct:.1}%\"></span></span>"
    )
}

fn mark(s: FunctionStatus) -> &'static str {
    match s {
        FunctionStatus::Executed => "&#10003;",
        FunctionStatus::NotExecuted => "&#10007;",
        FunctionStatus::Unhookable => "&#8211;",
    }
}

fn file_label(f: &FileCoverage) -> &str {
    f.file.as_deref().unwrap_or("(no source file)")
}

/// Name of the page of file `fi` of module `mi`.
fn file_page(mi: usize, fi: usize) -> String {
    format!("m{mi}-f{fi}.html")
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> AnalysisError + '_ {
    move |source| {
        AnalysisError::Format(fnscope_format::FormatError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Writes the report into `dir` (created if needed) and returns the path of its
/// `index.html`.
pub fn write_coverage_html(c: &Coverage, dir: &Path) -> Result<PathBuf, AnalysisError> {
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    for (mi, m) in c.modules.iter().enumerate() {
        for (fi, f) in m.files.iter().enumerate() {
            let path = dir.join(file_page(mi, fi));
            std::fs::write(&path, file_html(c, m, f)).map_err(io_error(&path))?;
        }
    }
    let index = dir.join("index.html");
    std::fs::write(&index, index_html(c)).map_err(io_error(&index))?;
    Ok(index)
}

fn index_html(c: &Coverage) -> String {
    let mut b = String::new();
    let _ = writeln!(
        b,
        "<h1>Function coverage</h1>\n<p>{}. Unhookable functions could not be measured and \
         count neither as executed nor as not executed.</p>",
        if c.runs == 1 {
            "1 run".to_string()
        } else {
            format!("{} runs combined", c.runs)
        }
    );
    for w in &c.warnings {
        let _ = writeln!(b, "<p class=\"note\">Warning: {}</p>", esc(w));
    }
    let _ = writeln!(
        b,
        "<table><tr><th>Module</th><th>Executed</th><th>Hookable</th><th>Coverage</th><th></th><th>Unhookable</th></tr>"
    );
    for (mi, m) in c.modules.iter().enumerate() {
        let counts = (m.executed, m.hookable, m.unhookable);
        totals_row(&mut b, &format!("#m{mi}"), &m.module, counts);
    }
    b.push_str("</table>\n");
    for (mi, m) in c.modules.iter().enumerate() {
        module_section(&mut b, mi, m);
    }
    page("fnscope function coverage", &b)
}

/// A table row linking to `href`: executed, hookable, coverage with its bar, unhookable.
fn totals_row(
    b: &mut String,
    href: &str,
    label: &str,
    (executed, hookable, unhookable): (u64, u64, u64),
) {
    let _ = writeln!(
        b,
        "<tr><td><a href=\"{}\">{}</a></td><td class=\"n\">{executed}</td><td class=\"n\">{hookable}</td>\
         <td class=\"n\">{}</td><td>{}</td><td class=\"n\">{unhookable}</td></tr>",
        esc(href),
        esc(label),
        percent(executed, hookable),
        bar(executed, hookable),
    );
}

fn module_section(b: &mut String, mi: usize, m: &ModuleCoverage) {
    let _ = writeln!(
        b,
        "<h2 id=\"m{mi}\">{}</h2>\n<p>{}<br>build-id {}<br>{} of {} hookable functions executed \
         ({}); unhookable: {}; pieces of code that are not function entries, left out: {}.<br>\
         <span class=\"note\">{}</span></p>",
        esc(&m.module),
        esc(&m.path),
        esc(m.build_id.as_deref().unwrap_or("-")),
        m.executed,
        m.hookable,
        percent(m.executed, m.hookable),
        m.unhookable,
        m.not_entries,
        esc(&m.sources.describe())
    );
    let _ = writeln!(
        b,
        "<table><tr><th>Source file</th><th>Executed</th><th>Hookable</th><th>Coverage</th><th></th><th>Unhookable</th></tr>"
    );
    for (fi, f) in m.files.iter().enumerate() {
        let counts = (f.executed, f.hookable, f.unhookable);
        totals_row(b, &file_page(mi, fi), file_label(f), counts);
    }
    b.push_str("</table>\n");
}

fn function_row(b: &mut String, f: &CoveredFunction, link_lines: bool) {
    let name = match (link_lines, f.line) {
        (true, Some(l)) => format!("<a href=\"#L{l}\">{}</a>", esc(&f.name)),
        _ => esc(&f.name),
    };
    let note = match f.status {
        FunctionStatus::Unhookable if f.detail.is_empty() => esc(&f.reason),
        FunctionStatus::Unhookable => format!("{}: {}", esc(&f.reason), esc(&f.detail)),
        _ => String::new(),
    };
    let _ = writeln!(
        b,
        "<tr class=\"{}\"><td class=\"mark\">{}</td><td>{name}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:#x}</td><td class=\"note\">{note}</td></tr>",
        f.status.as_str(),
        mark(f.status),
        f.line.map_or_else(String::new, |l| l.to_string()),
        if f.status == FunctionStatus::Unhookable { String::new() } else { f.calls.to_string() },
        f.address,
    );
}

fn file_html(c: &Coverage, m: &ModuleCoverage, f: &FileCoverage) -> String {
    let mut b = String::new();
    let _ = writeln!(
        b,
        "<p><a href=\"index.html\">&larr; all modules</a></p>\n<h1>{}</h1>\n<p>Module {} \
         ({} run{}): {} of {} hookable functions executed ({}); {} unhookable.</p>",
        esc(file_label(f)),
        esc(&m.module),
        c.runs,
        if c.runs == 1 { "" } else { "s" },
        f.executed,
        f.hookable,
        percent(f.executed, f.hookable),
        f.unhookable
    );
    let source = f.file.as_deref().and_then(read_source);
    let _ = writeln!(
        b,
        "<table><tr><th></th><th>Function</th><th>Line</th><th>Calls</th><th>Address</th><th>Note</th></tr>"
    );
    let funcs: Vec<&CoveredFunction> = f.functions.iter().map(|&i| &m.functions[i]).collect();
    for func in &funcs {
        function_row(&mut b, func, source.is_some());
    }
    b.push_str("</table>\n<p class=\"note\">&#10003; executed &nbsp; &#10007; never executed &nbsp; &#8211; unhookable: not measured</p>\n");
    match (&source, &f.file) {
        (Some(text), _) => source_listing(&mut b, text, &funcs),
        (None, Some(path)) => {
            let _ = writeln!(
                b,
                "<p class=\"note\">The source text is not shown: {} cannot be read here.</p>",
                esc(path)
            );
        }
        (None, None) => {}
    }
    let title = format!("{} - fnscope coverage", file_label(f));
    page(&title, &b)
}

fn read_source(path: &str) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_SOURCE_BYTES {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The source text with line numbers; lines where functions start are coloured by status
/// and carry the functions' names.
fn source_listing(b: &mut String, text: &str, funcs: &[&CoveredFunction]) {
    let mut at: BTreeMap<u32, Vec<&CoveredFunction>> = BTreeMap::new();
    for f in funcs {
        if let Some(l) = f.line {
            at.entry(l).or_default().push(f);
        }
    }
    b.push_str("<pre>");
    for (i, line) in text.lines().enumerate() {
        let n = i as u32 + 1;
        let starts = at.get(&n);
        // Several functions on one line (macros): the line shows the worst status.
        let class = starts
            .and_then(|fs| fs.iter().map(|f| f.status).max())
            .map_or("", FunctionStatus::as_str);
        let _ = write!(
            b,
            "<span class=\"l {class}\" id=\"L{n}\"><a class=\"ln\" href=\"#L{n}\">{n}</a>{}",
            esc(line)
        );
        if let Some(fs) = starts {
            for f in fs {
                let calls = match f.status {
                    FunctionStatus::Unhookable => String::new(),
                    _ => format!(" ({} calls)", f.calls),
                };
                let _ = write!(
                    b,
                    "<span class=\"fn {}\">{} {}{calls}</span>",
                    f.status.as_str(),
                    mark(f.status),
                    esc(&f.name),
                );
            }
        }
        b.push_str("</span>");
    }
    b.push_str("</pre>\n");
}
