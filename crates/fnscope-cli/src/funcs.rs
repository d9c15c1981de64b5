//! `fnscope funcs`: every function of a binary with its hookability verdict and source
//! position, or the function list of a Windows PDB file.

use anyhow::{Context, Result};
use fnscope_x86::{HookForm, Verdict};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// What `fnscope funcs` was asked.
pub struct FuncsOptions {
    /// The ELF file to list.
    pub binary: Option<PathBuf>,
    /// A PDB file to list instead.
    pub pdb: Option<PathBuf>,
    /// JSON instead of a table.
    pub json: bool,
    /// Only the functions that cannot be hooked.
    pub skipped: bool,
    /// Names as found in the file (mangled).
    pub raw: bool,
}

/// One listed piece of code.
struct Row {
    index: usize,
    name: String,
    address: u64,
    size: Option<u64>,
    entry: bool,
    /// `None` when not analysed (PDB listings).
    hookable: Option<bool>,
    reason: &'static str,
    /// How a hookable function is hooked (`entry`, `padding`, `island`, `borrowed`).
    form: Option<&'static str>,
    detail: String,
    source: &'static str,
    file: Option<String>,
    line: Option<u32>,
}

/// Runs `fnscope funcs`.
pub fn run(o: &FuncsOptions) -> Result<()> {
    let (module, rows) = match (&o.pdb, &o.binary) {
        (Some(pdb), _) => (file_name(pdb), pdb_rows(pdb, o.raw)?),
        (None, Some(bin)) => (file_name(bin), elf_rows(bin, o.raw)?),
        (None, None) => anyhow::bail!("give the binary to list (or --pdb FILE)"),
    };
    let summary = summary_line(&rows, o.pdb.is_some());
    let shown: Vec<&Row> = rows
        .iter()
        .filter(|r| !o.skipped || r.hookable == Some(false))
        .collect();
    let out = if o.json {
        let arr: Vec<serde_json::Value> = shown.iter().map(|r| row_json(r, &module)).collect();
        serde_json::to_string_pretty(&arr)? + "\n"
    } else {
        text(&shown, &summary)
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()) {
        // A reader that stops early (`| head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r.context("cannot write the listing")?,
    }
    if o.json {
        eprintln!("fnscope: {summary}");
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

fn source_name(s: fnscope_symbols::SymSource) -> &'static str {
    match s {
        fnscope_symbols::SymSource::Symtab => "symtab",
        fnscope_symbols::SymSource::Dynsym => "dynsym",
        fnscope_symbols::SymSource::EhFrame => "eh_frame",
        fnscope_symbols::SymSource::DebugFile => "debug-file",
    }
}

fn elf_rows(path: &Path, raw: bool) -> Result<Vec<Row>> {
    let data = std::fs::read(path).with_context(|| {
        format!(
            "cannot read {}; check the path and that you may read the file",
            path.display()
        )
    })?;
    let inv = fnscope_symbols::load_bytes(path, &data)?;
    let verdicts = fnscope_x86::analyze(&inv, &data);
    // The inventory already checked the file; line tables are optional extras.
    let lines = fnscope_symbols::SourceLines::load(path).ok();
    Ok(inv
        .functions
        .iter()
        .zip(verdicts)
        .enumerate()
        .map(|(index, (f, v))| {
            let (hookable, reason, detail) = match &v {
                // How a short function is hooked is worth saying; the usual jump is not.
                Verdict::Hookable(h) if h.form == HookForm::Entry => (true, "", String::new()),
                Verdict::Hookable(h) => (true, "", h.describe()),
                Verdict::Skip { reason, detail } => (false, *reason, detail.clone()),
            };
            let form = v.hook().map(|h| h.form_name());
            let loc = lines.as_ref().and_then(|l| l.locate(f.address));
            let name = match (&f.name, raw) {
                (Some(n), true) => n.clone(),
                _ => f.display_name(),
            };
            Row {
                index,
                name,
                address: f.address,
                size: Some(f.size),
                entry: f.entry,
                hookable: Some(hookable),
                reason,
                form,
                detail,
                source: source_name(f.source),
                file: loc.as_ref().map(|l| l.file.clone()),
                line: loc.and_then(|l| l.line),
            }
        })
        .collect())
}

fn pdb_rows(path: &Path, raw: bool) -> Result<Vec<Row>> {
    let funcs = fnscope_analysis::pdb_functions(path)?;
    Ok(funcs
        .into_iter()
        .map(|f| Row {
            index: f.index,
            name: match (raw, f.raw_name) {
                (true, Some(r)) => r,
                _ => f.name,
            },
            address: u64::from(f.rva),
            size: f.size.map(u64::from),
            entry: true,
            hookable: None,
            reason: "",
            form: None,
            detail: String::new(),
            source: "pdb",
            file: f.file,
            line: f.line,
        })
        .collect())
}

/// Totals by verdict, and the hookable share of function entries.
fn summary_line(rows: &[Row], pdb: bool) -> String {
    if pdb {
        return format!(
            "{} functions in the PDB (hookability is not analysed for Windows code)",
            rows.len()
        );
    }
    let entries = rows.iter().filter(|r| r.entry).count();
    let hookable = rows.iter().filter(|r| r.hookable == Some(true)).count();
    let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.hookable == Some(false)) {
        *by_reason.entry(r.reason).or_default() += 1;
    }
    let mut s = format!(
        "{} pieces of code, {entries} function entries: {hookable} hookable ({:.1}% of entries)",
        rows.len(),
        100.0 * hookable as f64 / entries.max(1) as f64
    );
    let over_padding = rows.iter().filter(|r| r.form == Some("padding")).count();
    let islands = rows.iter().filter(|r| r.form == Some("island")).count();
    let borrowed = rows.iter().filter(|r| r.form == Some("borrowed")).count();
    if over_padding + islands + borrowed > 0 {
        let _ = write!(
            s,
            ", of which {over_padding} over their padding, {islands} through an island in padding and {borrowed} through an island in a neighbour's moved bytes"
        );
    }
    if !by_reason.is_empty() {
        let parts: Vec<String> = by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let _ = write!(s, "; skipped: {}", parts.join(", "));
    }
    s
}

fn position(r: &Row) -> Option<String> {
    let file = r.file.as_deref()?;
    Some(match r.line {
        Some(l) => format!("{file}:{l}"),
        None => file.to_string(),
    })
}

fn text(rows: &[&Row], summary: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>6}  {:>18}  {:>8}  {:<18}  Function",
        "Index", "Address", "Size", "Verdict"
    );
    for r in rows {
        let verdict = match r.hookable {
            Some(true) => "hookable",
            Some(false) => r.reason,
            None => "-",
        };
        let size = r.size.map_or_else(|| "?".to_string(), |s| s.to_string());
        let _ = write!(
            out,
            "{:>6}  {:>#18x}  {size:>8}  {verdict:<18}  {}",
            r.index, r.address, r.name
        );
        if let Some(p) = position(r) {
            let _ = write!(out, "  at {p}");
        }
        if !r.detail.is_empty() {
            let _ = write!(out, "  ({})", r.detail);
        }
        out.push('\n');
    }
    let _ = writeln!(out, "{summary}");
    out
}

fn row_json(r: &Row, module: &str) -> serde_json::Value {
    let mut o = json!({
        "index": r.index,
        "name": r.name,
        "module": module,
        "address": r.address,
        "size": r.size,
        "entry": r.entry,
        "hookable": r.hookable,
        "reason": r.reason,
        "source": r.source,
    });
    if let Some(f) = r.form {
        o["form"] = json!(f);
    }
    if !r.detail.is_empty() {
        o["detail"] = json!(r.detail);
    }
    if let Some(f) = &r.file {
        o["file"] = json!(f);
    }
    if let Some(l) = r.line {
        o["line"] = json!(l);
    }
    o
}
