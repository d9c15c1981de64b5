//! Calls in the order they started: indented call trees and `function.txt` lines.
//!
//! Both views stream: each thread's records go through [`ThreadCalls`], which turns the
//! order calls returned in into the order they started with memory bounded by the deepest
//! nesting plus fixed buffers (spilling sorted runs to temporary files when a call tree is
//! large).

use crate::names::Names;
use crate::spill::{Call, Merge, ThreadCalls, MEMORY_CALLS};
use crate::{format_duration, headers, scan, AnalysisError, Trace};
use fnscope_abi::{REC_FLAG_CUT, REC_FLAG_UNWOUND};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write;
use std::path::Path;

/// Every selected thread's calls, in the order threads first appear in the file, kept within
/// a memory budget shared by all threads.
struct Threads {
    by_key: HashMap<(u32, u32), usize>,
    order: Vec<((u32, u32), ThreadCalls)>,
    held: usize,
    budget: usize,
}

impl Threads {
    fn new(budget: usize) -> Threads {
        Threads {
            by_key: HashMap::new(),
            order: Vec::new(),
            held: 0,
            budget,
        }
    }

    /// Index of thread `(pid, tid)`, added when new.
    fn index(&mut self, key: (u32, u32)) -> usize {
        let order = &mut self.order;
        *self.by_key.entry(key).or_insert_with(|| {
            order.push((key, ThreadCalls::default()));
            order.len() - 1
        })
    }

    /// Spills the thread holding most when the budget is used up.
    fn keep_budget(&mut self) -> Result<(), AnalysisError> {
        if self.held < self.budget {
            return Ok(());
        }
        if let Some((_, t)) = self.order.iter_mut().max_by_key(|(_, t)| t.in_memory()) {
            self.held -= t.in_memory();
            t.spill()?;
        }
        Ok(())
    }
}

/// One thread's calls in entry order, each met twice, on entry and on exit, properly nested:
/// a call's exit comes after the entries and exits of its callees.
struct Nested<'a> {
    calls: Merge<'a>,
    /// Calls entered and not yet exited, outermost first.
    open: Vec<Call>,
    ahead: Option<Call>,
}

impl<'a> Nested<'a> {
    fn new(calls: Merge<'a>) -> Nested<'a> {
        Nested {
            calls,
            open: Vec::new(),
            ahead: None,
        }
    }

    /// The next entry (`false`) or exit (`true`).
    fn next(&mut self) -> Result<Option<(Call, bool)>, AnalysisError> {
        if self.ahead.is_none() {
            self.ahead = self.calls.next()?;
        }
        if let Some(top) = self.open.last() {
            if self.ahead.as_ref().is_none_or(|c| !top.contains(c)) {
                return Ok(self.open.pop().map(|c| (c, true)));
            }
        }
        Ok(self.ahead.take().map(|c| {
            self.open.push(c);
            (c, false)
        }))
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
    fn print(&mut self, tid: u32, calls: Merge<'_>) -> Result<(), AnalysisError> {
        let mut calls = Nested::new(calls);
        while let Some((c, leave)) = calls.next()? {
            if leave && !c.has_callees() {
                continue;
            }
            let indent = "  ".repeat(c.depth().min(MAX_INDENT) as usize);
            let name = self.names.name(c.func);
            // A call the process died in (SIGKILL, a crash) says so; other calls that did not
            // return normally were left by longjmp, an exception, exec or exit.
            let ending = if c.flags() & REC_FLAG_CUT != 0 {
                "cut off"
            } else if c.flags() & REC_FLAG_UNWOUND != 0 {
                "unwound"
            } else {
                ""
            };
            let dur = format_duration(crate::ticks_to_ns(c.ticks(), self.tpn));
            let parens = if name.ends_with(')') { "" } else { "()" };
            let r = if !c.has_callees() {
                let note = if ending.is_empty() { String::new() } else { format!(" /* {ending} */") };
                writeln!(self.out, "[{tid:>6}] {dur:>10} | {indent}{name}{parens};{note}")
            } else if !leave {
                writeln!(self.out, "[{tid:>6}] {:>10} | {indent}{name}{parens} {{", "")
            } else {
                let note = if ending.is_empty() { String::new() } else { format!(", {ending}") };
                writeln!(self.out, "[{tid:>6}] {dur:>10} | {indent}}} /* {name}{note} */")
            };
            r.map_err(out_err)?;
        }
        Ok(())
    }
}

/// Prints each thread's calls in start order as an indented tree, like `uftrace replay`:
/// `[   tid]   duration | name();` for a call without hooked callees, `name() {` … `} /* name */`
/// around one with callees (its duration on the closing line). A tree is printed as soon as
/// its outermost call has returned, so threads' trees interleave in the order they completed;
/// calls whose callers never returned (the trace ended first) come last, per thread. A call's
/// callees are in the order they returned, which is the order they were made in. `tid`
/// restricts the output to one thread. Memory stays bounded whatever the size of a tree: large
/// ones are sorted through temporary files. Returns the trace's warnings (truncation, missing
/// calibration) for the caller to show apart from the output.
pub fn replay_tree(
    path: &Path,
    tid: Option<u32>,
    out: &mut dyn Write,
) -> Result<Vec<String>, AnalysisError> {
    replay_tree_within(path, tid, out, MEMORY_CALLS)
}

/// [`replay_tree`] holding at most about `budget` calls in memory.
pub(crate) fn replay_tree_within(
    path: &Path,
    tid: Option<u32>,
    out: &mut dyn Write,
    budget: usize,
) -> Result<Vec<String>, AnalysisError> {
    let (pre, names) = prepare(path)?;
    let mut p = TreePrinter {
        out,
        names,
        tpn: pre.ticks_per_ns(),
    };
    let mut threads = Threads::new(budget);
    let mut failed = None;
    writeln!(p.out, "#{:>7} {:>10} | FUNCTION", "TID", "DURATION").map_err(out_err)?;
    let trace = scan(path, |_, seg| {
        if failed.is_some() || tid.is_some_and(|t| t != seg.tid) {
            return;
        }
        let i = threads.index((seg.pid, seg.tid));
        for r in &seg.records {
            let func = p.names.index(seg.image_sid, r.id());
            let t = &mut threads.order[i].1;
            let done = t.push(r, func);
            threads.held += 1;
            let step = if done {
                threads.held -= t.in_memory();
                t.drain()
                    .and_then(|m| p.print(seg.tid, m))
                    .and_then(|_| t.reset_file())
            } else {
                threads.keep_budget()
            };
            if let Err(e) = step {
                failed = Some(e);
                return;
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    for ((_, tid), t) in &mut threads.order {
        p.print(*tid, t.drain()?)?;
    }
    Ok(trace.warnings)
}

/// Prints the `function.txt` format of technique A: one line per call entry and exit, all
/// threads merged in time order, numbered from 1:
/// `SEQ[SEC,NSEC]enter:NAME` / `SEQ[SEC,NSEC]leave:NAME`, where SEC and NSEC split the
/// wall-clock time. Each thread's lines are properly nested; between threads, an entry comes
/// before an exit at the same time-stamp. `tid` restricts the output to one thread.
///
/// The merge needs every selected call before the first line can be printed: calls beyond a
/// fixed memory budget wait, sorted, in temporary files. Returns the trace's warnings: the
/// line format has no place for them.
pub fn replay_lines(
    path: &Path,
    tid: Option<u32>,
    out: &mut dyn Write,
) -> Result<Vec<String>, AnalysisError> {
    replay_lines_within(path, tid, out, MEMORY_CALLS)
}

/// [`replay_lines`] holding at most about `budget` calls in memory.
pub(crate) fn replay_lines_within(
    path: &Path,
    tid: Option<u32>,
    out: &mut dyn Write,
    budget: usize,
) -> Result<Vec<String>, AnalysisError> {
    let (pre, mut names) = prepare(path)?;
    let mut threads = Threads::new(budget);
    let mut failed = None;
    let trace = scan(path, |_, seg| {
        if failed.is_some() || tid.is_some_and(|t| t != seg.tid) {
            return;
        }
        let i = threads.index((seg.pid, seg.tid));
        for r in &seg.records {
            threads.order[i].1.push(r, names.index(seg.image_sid, r.id()));
            threads.held += 1;
            if let Err(e) = threads.keep_budget() {
                failed = Some(e);
                return;
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let mut streams = Vec::with_capacity(threads.order.len());
    for (_, t) in &mut threads.order {
        streams.push(Nested::new(t.drain()?));
    }
    let mut heads = Vec::with_capacity(streams.len());
    let mut heap = BinaryHeap::new();
    for (i, s) in streams.iter_mut().enumerate() {
        let h = s.next()?;
        if let Some((c, leave)) = h {
            heap.push(Reverse((if leave { c.t_exit } else { c.t_entry }, leave, i)));
        }
        heads.push(h);
    }
    let mut seq = 0u64;
    while let Some(Reverse((tsc, leave, i))) = heap.pop() {
        let (c, _) = heads[i].take().expect("a stream in the heap has a head");
        seq += 1;
        let wall = pre.wall_ns(tsc);
        let what = if leave { "leave" } else { "enter" };
        writeln!(
            out,
            "{seq}[{},{}]{what}:{}",
            wall / 1_000_000_000,
            wall % 1_000_000_000,
            names.name(c.func)
        )
        .map_err(out_err)?;
        heads[i] = streams[i].next()?;
        if let Some((c, leave)) = heads[i] {
            heap.push(Reverse((if leave { c.t_exit } else { c.t_entry }, leave, i)));
        }
    }
    Ok(trace.warnings)
}
