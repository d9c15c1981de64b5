//! Function coverage of one or several runs: which hookable functions ran, per module and
//! per source file, and which could not be measured.
//!
//! Source files come from the DWARF of each module, found by the path the trace recorded and
//! used only while the file there is still the build that ran (same build-id). Functions
//! that could not be hooked are listed apart and never counted as covered or uncovered;
//! pieces of code that are not function entries (`.cold` parts) are left out.

use crate::profile::{basename, Profile};
use fnscope_abi::skip_reason;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Whether a function ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FunctionStatus {
    /// Hooked and called at least once.
    Executed,
    /// Hooked and never called.
    NotExecuted,
    /// Could not be hooked: not measured.
    Unhookable,
}

impl FunctionStatus {
    /// `executed`, `not-executed` or `unhookable`.
    pub fn as_str(self) -> &'static str {
        match self {
            FunctionStatus::Executed => "executed",
            FunctionStatus::NotExecuted => "not-executed",
            FunctionStatus::Unhookable => "unhookable",
        }
    }
}

/// One function entry of a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoveredFunction {
    /// Demangled name.
    pub name: String,
    /// Link-time address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Calls over all runs.
    pub calls: u64,
    /// Whether it ran.
    pub status: FunctionStatus,
    /// Why it could not be hooked (a `skip_reason` code), empty otherwise.
    pub reason: String,
    /// Specifics of `reason`.
    pub detail: String,
    /// Source file, when the module's DWARF tells.
    pub file: Option<String>,
    /// Line of the function in `file`.
    pub line: Option<u32>,
}

/// Where a module's source positions come from, or why there are none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sources {
    /// Line tables of this file (the module or its separate debug file).
    Dwarf(PathBuf),
    /// The module file has no line tables, and no separate debug file was found.
    NoLineTables,
    /// The module file is not at the recorded path any more.
    Missing,
    /// Code generated at run time (a bracketed module name such as `[mono]`): no file.
    Generated,
    /// The file at the recorded path is another build than the one that ran.
    Changed,
    /// The module file could not be read.
    Unreadable(String),
}

impl Sources {
    /// In plain words, for the report.
    pub fn describe(&self) -> String {
        match self {
            Sources::Dwarf(p) => format!("source lines from {}", p.display()),
            Sources::NoLineTables => {
                "source files unknown: the module has no DWARF line tables and no separate \
                 debug file was found (build with -g, or install its debug symbols)"
                    .to_string()
            }
            Sources::Missing => {
                "source files unknown: the module is no longer at the path it ran from".to_string()
            }
            Sources::Generated => "no source files: code generated at run time".to_string(),
            Sources::Changed => {
                "source files unknown: the file at that path is another build (its build-id \
                 differs from the one that ran)"
                    .to_string()
            }
            Sources::Unreadable(e) => format!("source files unknown: {e}"),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Sources::Dwarf(_) => "dwarf",
            Sources::NoLineTables => "no-line-tables",
            Sources::Missing => "module-missing",
            Sources::Generated => "generated",
            Sources::Changed => "module-changed",
            Sources::Unreadable(_) => "unreadable",
        }
    }
}

/// Coverage of the functions of one source file (or of those without one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileCoverage {
    /// Path of the source file; `None` for the functions whose file is unknown.
    pub file: Option<String>,
    /// Hookable functions that ran.
    pub executed: u64,
    /// Hookable functions.
    pub hookable: u64,
    /// Functions that could not be hooked.
    pub unhookable: u64,
    /// Indexes into [`ModuleCoverage::functions`], by line.
    pub functions: Vec<usize>,
}

/// Coverage of one module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleCoverage {
    /// File name of the module.
    pub module: String,
    /// Path it ran from.
    pub path: String,
    /// Build-id, when it has one.
    pub build_id: Option<String>,
    /// Where source positions come from.
    pub sources: Sources,
    /// Every function entry, sorted by file, line and address.
    pub functions: Vec<CoveredFunction>,
    /// Pieces of code that are not function entries, left out.
    pub not_entries: u64,
    /// Per source file, sorted by path; functions without a known file come last.
    pub files: Vec<FileCoverage>,
    /// Hookable functions that ran.
    pub executed: u64,
    /// Hookable functions.
    pub hookable: u64,
    /// Functions that could not be hooked.
    pub unhookable: u64,
}

/// The result of [`coverage`].
#[derive(Clone, Debug, Default)]
pub struct Coverage {
    /// Runs combined.
    pub runs: u64,
    /// Per module, in the order the runs listed them.
    pub modules: Vec<ModuleCoverage>,
    /// Some input ended abruptly or was damaged: functions it did not reach may have run.
    pub truncated: bool,
    /// Problems the user should know about.
    pub warnings: Vec<String>,
}

/// `executed / hookable` as a percentage, `-` when nothing was hookable.
pub fn percent(executed: u64, hookable: u64) -> String {
    if hookable == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", 100.0 * executed as f64 / hookable as f64)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Opens the module's line tables if the file at `path` is the build that ran.
fn sources(path: &str, build_id: Option<&str>) -> (Sources, Option<fnscope_symbols::SourceLines>) {
    if crate::names::is_generated(path) {
        return (Sources::Generated, None);
    }
    if !Path::new(path).exists() {
        return (Sources::Missing, None);
    }
    let lines = match fnscope_symbols::SourceLines::load(Path::new(path)) {
        Ok(l) => l,
        Err(e) => return (Sources::Unreadable(e.to_string()), None),
    };
    if let Some(want) = build_id {
        if lines.build_id().map(hex).as_deref() != Some(want) {
            return (Sources::Changed, None);
        }
    }
    match lines.dwarf_file() {
        Some(f) => (Sources::Dwarf(f.to_path_buf()), Some(lines)),
        None => (Sources::NoLineTables, None),
    }
}

/// Computes the coverage of a profile (one run, or several combined).
pub fn coverage(p: &Profile) -> Coverage {
    let mut modules = Vec::new();
    for m in &p.modules {
        let entries: Vec<_> = m
            .functions
            .iter()
            .filter(|f| f.reason != skip_reason::NOT_ENTRY)
            .collect();
        // Placeholders for ids no image table named carry no module to cover.
        if entries.is_empty() || m.path == "?" {
            continue;
        }
        let (src, lines) = sources(&m.path, m.build_id.as_deref());
        let mut functions: Vec<CoveredFunction> = entries
            .iter()
            .map(|f| {
                let loc = lines.as_ref().and_then(|l| l.locate(f.address));
                CoveredFunction {
                    name: fnscope_symbols::demangle(&f.name),
                    address: f.address,
                    size: f.size,
                    calls: f.calls,
                    status: match (f.hooked, f.calls) {
                        (false, _) => FunctionStatus::Unhookable,
                        (true, 0) => FunctionStatus::NotExecuted,
                        (true, _) => FunctionStatus::Executed,
                    },
                    reason: f.reason.clone(),
                    detail: f.detail.clone(),
                    file: loc.as_ref().map(|l| l.file.clone()),
                    line: loc.and_then(|l| l.line),
                }
            })
            .collect();
        // Files in path order with the unknown ones last; by line within a file.
        functions.sort_by(|a, b| {
            (a.file.is_none(), &a.file, a.line, a.address).cmp(&(
                b.file.is_none(),
                &b.file,
                b.line,
                b.address,
            ))
        });
        let mut files: BTreeMap<(bool, Option<String>), FileCoverage> = BTreeMap::new();
        for (i, f) in functions.iter().enumerate() {
            let fc = files
                .entry((f.file.is_none(), f.file.clone()))
                .or_insert_with(|| FileCoverage {
                    file: f.file.clone(),
                    ..FileCoverage::default()
                });
            match f.status {
                FunctionStatus::Executed => {
                    fc.executed += 1;
                    fc.hookable += 1;
                }
                FunctionStatus::NotExecuted => fc.hookable += 1,
                FunctionStatus::Unhookable => fc.unhookable += 1,
            }
            fc.functions.push(i);
        }
        let files: Vec<FileCoverage> = files.into_values().collect();
        modules.push(ModuleCoverage {
            module: basename(&m.path).to_string(),
            path: m.path.clone(),
            build_id: m.build_id.clone(),
            sources: src,
            not_entries: (m.functions.len() - entries.len()) as u64,
            executed: files.iter().map(|f| f.executed).sum(),
            hookable: files.iter().map(|f| f.hookable).sum(),
            unhookable: files.iter().map(|f| f.unhookable).sum(),
            files,
            functions,
        });
    }
    let mut warnings = p.warnings.clone();
    if p.truncated {
        warnings.push(
            "some input ended abruptly: functions reached after its end count as not executed"
                .to_string(),
        );
    }
    Coverage {
        runs: p.run_count(),
        modules,
        truncated: p.truncated,
        warnings,
    }
}

/// `file:line`, or the file alone.
fn position(f: &CoveredFunction) -> Option<String> {
    let file = f.file.as_deref()?;
    Some(match f.line {
        Some(l) => format!("{file}:{l}"),
        None => file.to_string(),
    })
}

/// Renders coverage as text: per module the totals, the table of source files, the
/// functions never executed and the unhookable ones.
pub fn render_coverage_text(c: &Coverage) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Function coverage of {} run{}",
        c.runs,
        if c.runs == 1 { "" } else { "s" }
    );
    for m in &c.modules {
        let _ = writeln!(
            o,
            "\n{} ({}): {} of {} hookable functions executed ({}); unhookable (not measured): {}; \
             pieces of code that are not function entries, left out: {}",
            m.module,
            m.path,
            m.executed,
            m.hookable,
            percent(m.executed, m.hookable),
            m.unhookable,
            m.not_entries
        );
        let _ = writeln!(o, "  {}", m.sources.describe());
        let _ = writeln!(
            o,
            "  {:>9} {:>9} {:>9} {:>11}  File",
            "Executed", "Hookable", "Coverage", "Unhookable"
        );
        for f in &m.files {
            let _ = writeln!(
                o,
                "  {:>9} {:>9} {:>9} {:>11}  {}",
                f.executed,
                f.hookable,
                percent(f.executed, f.hookable),
                f.unhookable,
                f.file.as_deref().unwrap_or("(no source file)")
            );
        }
        let list = |o: &mut String, title: &str, status: FunctionStatus| {
            let fs: Vec<&CoveredFunction> =
                m.functions.iter().filter(|f| f.status == status).collect();
            if fs.is_empty() {
                return;
            }
            let _ = writeln!(o, "  {title} ({}):", fs.len());
            for f in fs {
                let _ = write!(o, "    {}", f.name);
                if let Some(p) = position(f) {
                    let _ = write!(o, "  at {p}");
                }
                if status == FunctionStatus::Unhookable {
                    let _ = write!(o, "  [{}", f.reason);
                    if !f.detail.is_empty() {
                        let _ = write!(o, ": {}", f.detail);
                    }
                    o.push(']');
                }
                o.push('\n');
            }
        };
        list(&mut o, "never executed", FunctionStatus::NotExecuted);
        list(
            &mut o,
            "unhookable, not measured",
            FunctionStatus::Unhookable,
        );
    }
    o
}

/// Coverage as JSON: `{"runs": N, "modules": [...]}`, each module with its totals,
/// `sources` (`dwarf`, `no-line-tables`, `module-missing`, `generated`, `module-changed`,
/// `unreadable`), `files` and `functions` (`name`, `address`, `size`, `status`, `calls`,
/// `file`/`line` when known, `reason`/`detail` when unhookable).
pub fn coverage_json(c: &Coverage) -> serde_json::Value {
    let modules: Vec<serde_json::Value> = c
        .modules
        .iter()
        .map(|m| {
            let files: Vec<serde_json::Value> = m
                .files
                .iter()
                .map(|f| {
                    json!({
                        "file": f.file,
                        "executed": f.executed,
                        "hookable": f.hookable,
                        "unhookable": f.unhookable,
                    })
                })
                .collect();
            let functions: Vec<serde_json::Value> = m
                .functions
                .iter()
                .map(|f| {
                    let mut o = json!({
                        "name": f.name,
                        "address": f.address,
                        "size": f.size,
                        "status": f.status.as_str(),
                        "calls": f.calls,
                    });
                    if let Some(file) = &f.file {
                        o["file"] = json!(file);
                    }
                    if let Some(l) = f.line {
                        o["line"] = json!(l);
                    }
                    if f.status == FunctionStatus::Unhookable {
                        o["reason"] = json!(f.reason);
                        o["detail"] = json!(f.detail);
                    }
                    o
                })
                .collect();
            json!({
                "module": m.module,
                "path": m.path,
                "build_id": m.build_id,
                "sources": m.sources.code(),
                "sources_note": m.sources.describe(),
                "executed": m.executed,
                "hookable": m.hookable,
                "unhookable": m.unhookable,
                "not_entries": m.not_entries,
                "files": files,
                "functions": functions,
            })
        })
        .collect();
    json!({ "runs": c.runs, "truncated": c.truncated, "modules": modules })
}
