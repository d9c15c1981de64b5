//! The caller → callee graph as graphviz DOT: a node per function with its calls, total and
//! self time, an edge per caller → callee pair with its calls and time, drawn thicker the
//! more time it carries.

use crate::stacks::{program_name, timed_meta, walk_stacks, Ended, Sink};
use crate::{ExportError, Options, Output, Progress};
use fnscope_analysis::{format_duration, CallInfo, WalkContext};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Widest edge, in points, for the edge that carries most time; the thinnest is 1.
const MAX_PEN: f64 = 8.0;

#[derive(Default)]
struct FuncStat {
    name: String,
    module: String,
    calls: u64,
    /// Summed durations (each nested call of a recursive function counts, as in `report`).
    ticks: u64,
    self_ticks: u64,
}

#[derive(Default)]
struct EdgeStat {
    calls: u64,
    ticks: u64,
}

/// Functions by index, and caller -> callee pairs.
#[derive(Default)]
struct Graph {
    funcs: HashMap<u32, FuncStat>,
    edges: BTreeMap<(u32, u32), EdgeStat>,
}

/// A DOT string literal's contents: quotes and backslashes escaped, line breaks (which a
/// name should not hold) made spaces.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn write(
    input: &Path,
    opts: &Options,
    out: &Output,
    progress: Progress<'_>,
) -> Result<Vec<String>, ExportError> {
    let meta = timed_meta(input, "a call graph")?;
    let mut graph = Graph::default();
    let enter = |g: &mut Graph, cx: &mut WalkContext, _: Option<u32>, c: &CallInfo| {
        g.funcs.entry(c.func).or_insert_with(|| FuncStat {
            name: cx.names.name(c.func).to_string(),
            module: cx.names.module(c.func).to_string(),
            ..FuncStat::default()
        });
        c.func
    };
    let exit = |g: &mut Graph, e: Ended<u32>| {
        let f = g.funcs.get_mut(&e.key).expect("added on entry");
        f.calls += 1;
        f.ticks = f.ticks.saturating_add(e.ticks);
        f.self_ticks = f.self_ticks.saturating_add(e.self_ticks);
        if let Some(caller) = e.caller {
            let edge = g.edges.entry((caller, e.key)).or_default();
            edge.calls += 1;
            edge.ticks = edge.ticks.saturating_add(e.ticks);
        }
    };
    let trace = walk_stacks(input, opts, progress, &mut graph, enter, exit)?;
    let Graph { funcs, edges } = graph;
    let time = |ticks: u64| format_duration(trace.ticks_to_ns(ticks));
    let mut sink = Sink::whole(out, "a DOT graph")?;
    let program = escape(&program_name(&meta));
    let mut ids: Vec<&u32> = funcs.keys().collect();
    ids.sort();
    let widest = edges.values().map(|e| e.ticks).max().unwrap_or(0).max(1) as f64;
    let w = sink.w();
    let r = (|| {
        writeln!(w, "digraph \"calls of {program}\" {{")?;
        writeln!(
            w,
            "  graph [label=\"Calls of {program}: caller -> callee, edges as thick as the time they \
             carry\", labelloc=t, fontname=\"sans-serif\"];"
        )?;
        writeln!(
            w,
            "  node [shape=box, fontname=\"monospace\"];\n  edge [fontname=\"monospace\"];"
        )?;
        for id in ids {
            let f = &funcs[id];
            writeln!(
                w,
                "  f{id} [label=\"{}\\n{}\\n{} calls\\ntotal {}, self {}\"];",
                escape(&f.name),
                escape(&f.module),
                f.calls,
                time(f.ticks),
                time(f.self_ticks)
            )?;
        }
        for ((a, b), e) in &edges {
            let pen = 1.0 + (MAX_PEN - 1.0) * e.ticks as f64 / widest;
            writeln!(
                w,
                "  f{a} -> f{b} [label=\"{} calls\\n{}\", penwidth={pen:.2}];",
                e.calls,
                time(e.ticks)
            )?;
        }
        writeln!(w, "}}")
    })();
    sink.check(r)?;
    sink.finish()?;
    Ok(trace.warnings)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn dot_strings_are_escaped() {
        assert_eq!(
            escape(r#"operator"" _w(unsigned long long)"#),
            r#"operator\"\" _w(unsigned long long)"#
        );
        assert_eq!(escape(r"a\b"), r"a\\b");
        assert_eq!(escape("a\nb"), "a b");
    }
}
