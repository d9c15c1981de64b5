//! Calls in the order they started: indented call trees and `function.txt` lines.

use crate::names::Names;
use crate::{format_duration, headers, scan, AnalysisError, Trace};
use fnscope_abi::{Record, REC_FLAG_UNWOUND};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write;
use std::path::Path;

/// A call and its callees (indices into the builder's arena), in start order.
struct Node {
    rec: Record,
    func: u32,
    children: Vec<u32>,
}

/// How a walk meets a call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    /// A call without recorded callees.
    Leaf,
    /// Before the callees of a call that has some.
    Open,
    /// After them.
    Close,
}

/// Rebuilds one thread's call trees from its post-order records.
///
/// Records wait in `pending` until their parent returns; the parent takes every pending node
/// deeper than itself. A depth-0 call completes a tree. Nodes live in a flat arena and are
/// walked with an explicit stack: recursion (and the recursive drop of nested vectors) would
/// overflow the stack on deeply recursive programs.
#[derive(Default)]
struct TreeBuilder {
    nodes: Vec<Node>,
    pending: Vec<u32>,
}

impl TreeBuilder {
    /// Adds the next record; returns the root when it completes a tree.
    fn push(&mut self, rec: Record, func: u32) -> Option<u32> {
        let d = rec.depth();
        let nodes = &self.nodes;
        let start = self
            .pending
            .iter()
            .rposition(|&i| nodes[i as usize].rec.depth() <= d)
            .map_or(0, |i| i + 1);
        let mut children = self.pending.split_off(start);
        children.sort_by_key(|&i| nodes[i as usize].rec.t_entry);
        let idx = self.nodes.len() as u32;
        self.nodes.push(Node {
            rec,
            func,
            children,
        });
        if d == 0 {
            return Some(idx);
        }
        self.pending.push(idx);
        None
    }

    /// Forgets the trees walked so far; call after a root was returned by `push`, which
    /// consumed every pending node.
    fn clear(&mut self) {
        self.nodes.clear();
    }

    /// Calls whose parents never returned (the trace ended while they were open), as roots
    /// of their own in start order.
    fn orphans(&mut self) -> Vec<u32> {
        let mut v = std::mem::take(&mut self.pending);
        v.sort_by_key(|&i| self.nodes[i as usize].rec.t_entry);
        v
    }

    /// Calls `f` on the tree under `root` in start order.
    fn walk<E>(
        &self,
        root: u32,
        mut f: impl FnMut(&Node, Visit) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut stack = vec![(root, Visit::Open)];
        while let Some((i, v)) = stack.pop() {
            let n = &self.nodes[i as usize];
            if v == Visit::Close {
                f(n, Visit::Close)?;
            } else if n.children.is_empty() {
                f(n, Visit::Leaf)?;
            } else {
                f(n, Visit::Open)?;
                stack.push((i, Visit::Close));
                stack.extend(n.children.iter().rev().map(|&c| (c, Visit::Open)));
            }
        }
        Ok(())
    }
}

/// Names and calibration from a quick first pass, so that the streaming pass can print.
fn prepare(path: &Path) -> Result<(Trace, Names), AnalysisError> {
    let t = headers(path)?;
    let names = Names::new(t.images.values());
    Ok((t, names))
}

fn out_err(e: std::io::Error) -> AnalysisError {
    AnalysisError::Output(e)
}

/// Deepest indentation of the tree view: beyond it lines would only grow (quadratically in
/// total) without becoming more readable; braces still show the nesting.
const MAX_INDENT: u32 = 200;

struct TreePrinter<'a> {
    out: &'a mut dyn Write,
    names: Names,
    tpn: f64,
}

impl TreePrinter<'_> {
    fn print(&mut self, tid: u32, tree: &TreeBuilder, root: u32) -> std::io::Result<()> {
        tree.walk(root, |n, visit| {
            let indent = "  ".repeat(n.rec.depth().min(MAX_INDENT) as usize);
            let name = self.names.name(n.func);
            let unwound = n.rec.flags() & REC_FLAG_UNWOUND != 0;
            let dur = format_duration(crate::ticks_to_ns(n.rec.ticks(), self.tpn));
            let parens = if name.ends_with(')') { "" } else { "()" };
            match visit {
                Visit::Leaf => {
                    let note = if unwound { " /* unwound */" } else { "" };
                    writeln!(
                        self.out,
                        "[{tid:>6}] {dur:>10} | {indent}{name}{parens};{note}"
                    )
                }
                Visit::Open => writeln!(
                    self.out,
                    "[{tid:>6}] {:>10} | {indent}{name}{parens} {{",
                    ""
                ),
                Visit::Close => {
                    let note = if unwound { ", unwound" } else { "" };
                    writeln!(
                        self.out,
                        "[{tid:>6}] {dur:>10} | {indent}}} /* {name}{note} */"
                    )
                }
            }
        })
    }
}

/// Prints each thread's calls in start order as an indented tree, like `uftrace replay`:
/// `[   tid]   duration | name();` for a call without hooked callees, `name() {` … `} /* name */`
/// around one with callees (its duration on the closing line). A tree is printed as soon as
/// its outermost call has returned, so threads' trees interleave in the order they completed.
/// `tid` restricts the output to one thread. A tree is held in memory until its outermost call
/// returns (for `main`, the whole thread). Returns the trace's warnings (truncation, missing
/// calibration) for the caller to show apart from the output.
pub fn replay_tree(
    path: &Path,
    tid: Option<u32>,
    out: &mut dyn Write,
) -> Result<Vec<String>, AnalysisError> {
    let (pre, names) = prepare(path)?;
    let mut p = TreePrinter {
        out,
        names,
        tpn: pre.ticks_per_ns(),
    };
    let mut builders: HashMap<(u32, u32), TreeBuilder> = HashMap::new();
    let mut order: Vec<(u32, u32)> = Vec::new();
    let mut failed = None;
    writeln!(p.out, "#{:>7} {:>10} | FUNCTION", "TID", "DURATION").map_err(out_err)?;
    let trace = scan(path, |_, seg| {
        if failed.is_some() || tid.is_some_and(|t| t != seg.tid) {
            return;
        }
        let key = (seg.pid, seg.tid);
        let b = builders.entry(key).or_insert_with(|| {
            order.push(key);
            TreeBuilder::default()
        });
        for r in &seg.records {
            let func = p.names.index(seg.image_sid, r.id());
            if let Some(root) = b.push(*r, func) {
                if let Err(e) = p.print(seg.tid, b, root) {
                    failed = Some(e);
                    return;
                }
                b.clear();
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(out_err(e));
    }
    for key in order {
        if let Some(mut b) = builders.remove(&key) {
            for root in b.orphans() {
                p.print(key.1, &b, root).map_err(out_err)?;
            }
        }
    }
    Ok(trace.warnings)
}

/// One line of `function.txt`.
#[derive(Clone, Copy)]
struct Event {
    tsc: u64,
    func: u32,
    leave: bool,
}

/// Appends the entry and exit events of the tree under `root`, in start order.
fn flatten(tree: &TreeBuilder, root: u32, v: &mut Vec<Event>) {
    let _ = tree.walk(root, |n, visit| -> Result<(), ()> {
        let enter = Event {
            tsc: n.rec.t_entry,
            func: n.func,
            leave: false,
        };
        let leave = Event {
            tsc: n.rec.t_exit,
            func: n.func,
            leave: true,
        };
        match visit {
            Visit::Leaf => v.extend([enter, leave]),
            Visit::Open => v.push(enter),
            Visit::Close => v.push(leave),
        }
        Ok(())
    });
}

/// Prints the `function.txt` format of technique A: one line per call entry and exit, all
/// threads merged in time order, numbered from 1:
/// `SEQ[SEC,NSEC]enter:NAME` / `SEQ[SEC,NSEC]leave:NAME`, where SEC and NSEC split the
/// wall-clock time. Each thread's lines are properly nested; between threads, an entry comes
/// before an exit at the same time-stamp. `tid` restricts the output to one thread.
///
/// The merge needs every selected event before the first line can be printed, so memory
/// grows with the number of records (16 bytes per event). Returns the trace's warnings: the
/// line format has no place for them.
pub fn replay_lines(
    path: &Path,
    tid: Option<u32>,
    out: &mut dyn Write,
) -> Result<Vec<String>, AnalysisError> {
    let (pre, mut names) = prepare(path)?;
    let mut builders: HashMap<(u32, u32), (TreeBuilder, Vec<Event>)> = HashMap::new();
    let mut order: Vec<(u32, u32)> = Vec::new();
    let trace = scan(path, |_, seg| {
        if tid.is_some_and(|t| t != seg.tid) {
            return;
        }
        let key = (seg.pid, seg.tid);
        let (b, evs) = builders.entry(key).or_insert_with(|| {
            order.push(key);
            Default::default()
        });
        for r in &seg.records {
            if let Some(root) = b.push(*r, names.index(seg.image_sid, r.id())) {
                flatten(b, root, evs);
                b.clear();
            }
        }
    })?;
    let streams: Vec<Vec<Event>> = order
        .iter()
        .filter_map(|k| builders.remove(k))
        .map(|(mut b, mut evs)| {
            for root in b.orphans() {
                flatten(&b, root, &mut evs);
            }
            evs
        })
        .collect();
    let mut heap: BinaryHeap<Reverse<(u64, bool, usize, usize)>> = streams
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_empty())
        .map(|(i, s)| Reverse((s[0].tsc, s[0].leave, i, 0)))
        .collect();
    let mut seq = 0u64;
    while let Some(Reverse((_, _, i, j))) = heap.pop() {
        let e = streams[i][j];
        seq += 1;
        let wall = pre.wall_ns(e.tsc);
        let what = if e.leave { "leave" } else { "enter" };
        writeln!(
            out,
            "{seq}[{},{}]{what}:{}",
            wall / 1_000_000_000,
            wall % 1_000_000_000,
            names.name(e.func)
        )
        .map_err(out_err)?;
        if let Some(n) = streams[i].get(j + 1) {
            heap.push(Reverse((n.tsc, n.leave, i, j + 1)));
        }
    }
    Ok(trace.warnings)
}
