//! `report --by-arg N` / `--by-ret`: a function's calls grouped by one recorded value (which
//! `open` paths were slow, which return codes were frequent).

use crate::calls::{walk_calls, CallEvent, Order, Selection};
use crate::{format_duration, AnalysisError};
use std::collections::HashMap;
use std::path::Path;

/// Which value groups the calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    /// The N-th recorded argument (from 1).
    Arg(usize),
    /// The return value.
    Ret,
}

/// Calls of one function that had one value.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ValueGroup {
    /// The function (demangled).
    pub function: String,
    /// The value, as `replay` shows it.
    pub value: String,
    /// Calls with that value.
    pub calls: u64,
    /// Their summed duration.
    pub total_ns: u64,
    /// The shortest.
    pub min_ns: u64,
    /// The longest.
    pub max_ns: u64,
}

/// Distinct values kept per function: beyond, calls are summed under `(other values)`, so
/// memory stays bounded (pointers, counters).
const MAX_VALUES: usize = 10_000;

/// Groups the calls of every function that recorded the value `by` (in one streaming pass;
/// memory grows with functions × distinct values, at most [`MAX_VALUES`] each). Sorted by
/// function, then total time, longest first. Returns the trace's warnings too.
pub fn report_by_value(path: &Path, by: GroupBy) -> Result<(Vec<ValueGroup>, Vec<String>), AnalysisError> {
    let mut groups: HashMap<u32, HashMap<String, ValueGroup>> = HashMap::new();
    let trace = walk_calls(path, &Selection::default(), Order::Returned, |cx, ev| {
        let CallEvent::Exit(c) = ev else { return Ok(()) };
        let Some(v) = cx.values(&c) else { return Ok(()) };
        let value = match by {
            GroupBy::Arg(n) => v.args.get(n.wrapping_sub(1)).map(|(_, v)| v.clone()),
            GroupBy::Ret => v.ret.clone().or(v.raw_ret.map(|r| r.to_string())),
        };
        let Some(value) = value else { return Ok(()) };
        let ns = cx.clock.duration_ns(c.entry_tsc, c.exit_tsc);
        let per = groups.entry(c.func).or_default();
        let key = if per.len() >= MAX_VALUES && !per.contains_key(&value) { "(other values)".to_string() } else { value };
        let g = per.entry(key.clone()).or_insert_with(|| ValueGroup {
            function: cx.names.name(c.func).to_string(),
            value: key,
            min_ns: u64::MAX,
            ..ValueGroup::default()
        });
        g.calls += 1;
        g.total_ns = g.total_ns.saturating_add(ns);
        g.min_ns = g.min_ns.min(ns);
        g.max_ns = g.max_ns.max(ns);
        Ok(())
    })?;
    let mut out: Vec<ValueGroup> = groups.into_values().flat_map(|m| m.into_values()).collect();
    out.sort_by(|a, b| a.function.cmp(&b.function).then(b.total_ns.cmp(&a.total_ns)).then(a.value.cmp(&b.value)));
    Ok((out, trace.warnings))
}

/// The groups as a table: one block per function, `top` values each.
pub fn render_by_value_text(groups: &[ValueGroup], by: GroupBy, top: Option<usize>) -> String {
    let what = match by {
        GroupBy::Arg(n) => format!("argument {n}"),
        GroupBy::Ret => "return value".to_string(),
    };
    if groups.is_empty() {
        return format!("no call recorded its {what} (record with -A/-R or --args auto)\n");
    }
    let mut s = format!("{:>10} {:>12} {:>12} {:>12}  {}  {what}\n", "Calls", "Total", "Avg", "Max", "Function");
    let mut shown = 0;
    let mut last = "";
    for g in groups {
        if g.function != last {
            last = &g.function;
            shown = 0;
        }
        shown += 1;
        if top.is_some_and(|t| shown > t) {
            continue;
        }
        s.push_str(&format!(
            "{:>10} {:>12} {:>12} {:>12}  {}  {}\n",
            g.calls,
            format_duration(g.total_ns),
            format_duration(g.total_ns / g.calls.max(1)),
            format_duration(g.max_ns),
            g.function,
            g.value
        ));
    }
    s
}
