//! `diff`: per function, how calls and times changed from one run (or merged set of runs)
//! to another.
//!
//! Each side is compared per run: a merged side's figures are divided by its number of runs
//! (its timed runs for times), so that 3 runs of A and 2 of B compare fairly. For single runs
//! these are the plain figures.

use crate::profile::{basename, check_builds, combine, keyed, Profile};
use crate::report::{json_num, SortKey};
use crate::{format_duration, AnalysisError};
use fnscope_format::FunctionSummary;
use serde_json::json;
use std::collections::HashSet;
use std::fmt::Write as _;

/// One function's figures on both sides, per run.
#[derive(Clone, Debug, PartialEq)]
pub struct FuncDiff {
    /// Demangled name.
    pub name: String,
    /// File name of the module.
    pub module: String,
    /// Link-time address (on side B when the function is there).
    pub address: u64,
    /// Calls per run on side A.
    pub calls_a: f64,
    /// Calls per run on side B.
    pub calls_b: f64,
    /// Total time per timed run on side A, when A recorded times.
    pub total_ns_a: Option<f64>,
    /// Total time per timed run on side B, when B recorded times.
    pub total_ns_b: Option<f64>,
    /// Self time per timed run on side A.
    pub self_ns_a: Option<f64>,
    /// Self time per timed run on side B.
    pub self_ns_b: Option<f64>,
}

impl FuncDiff {
    /// Change in calls per run, B minus A.
    pub fn calls_delta(&self) -> f64 {
        self.calls_b - self.calls_a
    }

    /// Change in total time per run, when both sides have times.
    pub fn total_delta(&self) -> Option<f64> {
        Some(self.total_ns_b? - self.total_ns_a?)
    }

    /// Change in self time per run, when both sides have times.
    pub fn self_delta(&self) -> Option<f64> {
        Some(self.self_ns_b? - self.self_ns_a?)
    }
}

/// The result of [`diff`].
#[derive(Clone, Debug, Default)]
pub struct Diff {
    /// Runs on side A.
    pub runs_a: u64,
    /// Runs on side B.
    pub runs_b: u64,
    /// Whether both sides recorded times.
    pub timed: bool,
    /// Every function called on either side, largest change first.
    pub functions: Vec<FuncDiff>,
    /// Some input ended abruptly or was damaged.
    pub truncated: bool,
    /// Problems the user should know about.
    pub warnings: Vec<String>,
}

/// The function at `at` of `p`, with its module's file name.
fn get<'p>(p: &'p Profile, at: Option<&(usize, usize)>) -> Option<(&'p str, &'p FunctionSummary)> {
    let &(m, f) = at?;
    Some((basename(&p.modules[m].path), &p.modules[m].functions[f]))
}

/// Number of runs of `p` that recorded times (at least 1, as a divisor).
fn timed_runs(p: &Profile) -> u64 {
    (p.runs.iter().filter(|r| r.mode != "count").count() as u64).max(1)
}

/// Compares two profiles (labelled for messages). Functions match as in
/// [`crate::combine`]: by build-id and name, or by name only with `match_by_name`.
pub fn diff(
    a: (&str, &Profile),
    b: (&str, &Profile),
    match_by_name: bool,
    key: SortKey,
) -> Result<Diff, AnalysisError> {
    check_builds(&[a, b], match_by_name)?;
    // One build run from two paths is one module per side once combined, so that each key
    // names one function per side.
    let pa = &combine(vec![(a.0.to_string(), a.1.clone())], match_by_name)?;
    let pb = &combine(vec![(b.0.to_string(), b.1.clone())], match_by_name)?;
    let (ra, rb) = (pa.run_count() as f64, pb.run_count() as f64);
    let (ta, tb) = (timed_runs(pa) as f64, timed_runs(pb) as f64);
    let timed = pa.timed() && pb.timed();
    let ka = keyed(pa, match_by_name);
    let kb = keyed(pb, match_by_name);
    let keys: HashSet<_> = ka.keys().chain(kb.keys()).collect();
    let mut functions = Vec::new();
    for k in keys {
        let fa = get(pa, ka.get(k));
        let fb = get(pb, kb.get(k));
        let calls = |f: &Option<(&str, &FunctionSummary)>| f.map_or(0, |(_, s)| s.calls);
        if calls(&fa) == 0 && calls(&fb) == 0 {
            continue;
        }
        let Some((module, shown)) = fb.or(fa) else {
            continue;
        };
        let time = |f: &Option<(&str, &FunctionSummary)>,
                    timed: bool,
                    runs: f64,
                    pick: fn(&FunctionSummary) -> u64| {
            timed.then(|| f.map_or(0.0, |(_, s)| pick(s) as f64 / runs))
        };
        functions.push(FuncDiff {
            name: fnscope_symbols::demangle(&shown.name),
            module: module.to_string(),
            address: shown.address,
            calls_a: calls(&fa) as f64 / ra,
            calls_b: calls(&fb) as f64 / rb,
            total_ns_a: time(&fa, pa.timed(), ta, |s| s.total_ns),
            total_ns_b: time(&fb, pb.timed(), tb, |s| s.total_ns),
            self_ns_a: time(&fa, pa.timed(), ta, |s| s.self_ns),
            self_ns_b: time(&fb, pb.timed(), tb, |s| s.self_ns),
        });
    }
    sort_diff(&mut functions, key);
    let warnings = [&pa.warnings[..], &pb.warnings[..]].concat();
    Ok(Diff {
        runs_a: pa.run_count(),
        runs_b: pb.run_count(),
        timed,
        functions,
        truncated: pa.truncated || pb.truncated,
        warnings,
    })
}

/// Sorts by the size of the change in `key` (calls, total or self time; the average per call
/// sorts as total), largest first, then by the change in calls, then by name.
pub fn sort_diff(funcs: &mut [FuncDiff], key: SortKey) {
    let k = |f: &FuncDiff| -> f64 {
        match key {
            SortKey::Calls => f.calls_delta().abs(),
            SortKey::Total | SortKey::Avg => f.total_delta().unwrap_or(0.0).abs(),
            SortKey::SelfTime => f.self_delta().unwrap_or(0.0).abs(),
        }
    };
    funcs.sort_by(|a, b| {
        k(b).total_cmp(&k(a))
            .then_with(|| b.calls_delta().abs().total_cmp(&a.calls_delta().abs()))
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.module.cmp(&b.module))
            .then_with(|| a.address.cmp(&b.address))
    });
}

/// A per-run figure: whole numbers plainly, fractions with two decimals.
fn num(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn signed(v: f64) -> String {
    if v > 0.0 {
        format!("+{}", num(v))
    } else {
        num(v)
    }
}

fn signed_duration(v: f64) -> String {
    let d = format_duration(v.abs().round() as u64);
    match v {
        v if v > 0.0 => format!("+{d}"),
        v if v < 0.0 => format!("-{d}"),
        _ => d,
    }
}

/// Renders a diff as a table: calls (and times, when both sides have them) of A and B and
/// the change, the first `top` functions.
pub fn render_diff_text(d: &Diff, top: Option<usize>) -> String {
    let mut out = String::new();
    if d.runs_a > 1 || d.runs_b > 1 {
        let _ = writeln!(
            out,
            "  per run: A is {} run(s), B is {} run(s)\n",
            d.runs_a, d.runs_b
        );
    }
    let mut head = format!("  {:>12} {:>12} {:>12}", "Calls A", "Calls B", "Change");
    if d.timed {
        let _ = write!(
            head,
            " {:>11} {:>11} {:>12}",
            "Total A", "Total B", "Change"
        );
    }
    let _ = writeln!(out, "{head}  Function");
    for f in d.functions.iter().take(top.unwrap_or(usize::MAX)) {
        let _ = write!(
            out,
            "  {:>12} {:>12} {:>12}",
            num(f.calls_a),
            num(f.calls_b),
            signed(f.calls_delta())
        );
        if d.timed {
            let _ = write!(
                out,
                " {:>11} {:>11} {:>12}",
                format_duration(f.total_ns_a.unwrap_or(0.0).round() as u64),
                format_duration(f.total_ns_b.unwrap_or(0.0).round() as u64),
                signed_duration(f.total_delta().unwrap_or(0.0))
            );
        }
        let _ = writeln!(out, "  {} ({})", f.name, f.module);
    }
    out
}

/// A diff as a JSON array, one object per function: `name`, `module`, `address`, `calls_a`,
/// `calls_b`, `calls_delta` (per run), and when both sides have times `total_ns_a`,
/// `total_ns_b`, `total_ns_delta`, `self_ns_a`, `self_ns_b`, `self_ns_delta`.
pub fn diff_json(d: &Diff, top: Option<usize>) -> serde_json::Value {
    d.functions
        .iter()
        .take(top.unwrap_or(usize::MAX))
        .map(|f| {
            let mut o = json!({
                "name": f.name,
                "module": f.module,
                "address": f.address,
                "calls_a": json_num(f.calls_a),
                "calls_b": json_num(f.calls_b),
                "calls_delta": json_num(f.calls_delta()),
            });
            if d.timed {
                let t = |v: Option<f64>| json_num(v.unwrap_or(0.0).round());
                o["total_ns_a"] = t(f.total_ns_a);
                o["total_ns_b"] = t(f.total_ns_b);
                o["total_ns_delta"] = t(f.total_delta());
                o["self_ns_a"] = t(f.self_ns_a);
                o["self_ns_b"] = t(f.self_ns_b);
                o["self_ns_delta"] = t(f.self_delta());
            }
            o
        })
        .collect()
}
