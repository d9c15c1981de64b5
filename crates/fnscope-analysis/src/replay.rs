//! Calls in the order they started: indented call trees and `function.txt` lines, both
//! printed from [`crate::walk_calls`].

use crate::calls::{walk_calls_within, CallEvent, Ending, Order, Selection};
use crate::spill::MEMORY_CALLS;
use crate::{format_duration, AnalysisError, ShortText};
use std::io::Write;
use std::path::Path;

fn out_err(e: std::io::Error) -> AnalysisError {
    AnalysisError::Output(e)
}

/// Deepest indentation of the tree view: beyond it lines would only grow (quadratically in
/// total) without becoming more readable; braces still show the nesting.
const MAX_INDENT: u32 = 200;

/// Bytes of output gathered before they are written: a write per line, through the
/// caller's buffered writer, was a copy and a dynamic call per line.
const FLUSH_AT: usize = 64 * 1024;

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
    writeln!(out, "#{:>7} {:>10} | FUNCTION", "TID", "DURATION").map_err(out_err)?;
    let sel = Selection { pid: None, tid };
    // Lines are put together by hand in one buffer, written when it fills: through the
    // formatting machinery (padding, a string per duration and indentation) they were half
    // of the time of a replay.
    let mut line: Vec<u8> = Vec::with_capacity(FLUSH_AT + 1024);
    // `[   tid] `, made again only when the thread changes: trees come a thread at a time.
    let mut tid_field: (Option<u32>, Vec<u8>) = (None, Vec::with_capacity(16));
    let walked = walk_calls_within(path, &sel, Order::Completed, budget, |cx, ev| {
        let (c, leave) = match ev {
            CallEvent::Enter(c) => (c, false),
            CallEvent::Exit(c) => (c, true),
        };
        if leave && !c.has_callees {
            return Ok(());
        }
        if tid_field.0 != Some(c.tid) {
            let (of, field) = &mut tid_field;
            *of = Some(c.tid);
            field.clear();
            field.push(b'[');
            ShortText::decimal(u64::from(c.tid)).push_padded(field, 6);
            field.extend_from_slice(b"] ");
        }
        line.extend_from_slice(&tid_field.1);
        if c.has_callees && !leave {
            ShortText::new().push_padded(&mut line, 10);
        } else {
            let ns = cx.clock.duration_ns(c.entry_tsc, c.exit_tsc);
            match ShortText::duration(ns) {
                Some(d) => d.push_padded(&mut line, 10),
                None => line.extend_from_slice(format!("{:>10}", format_duration(ns)).as_bytes()),
            }
        }
        line.extend_from_slice(b" | ");
        // Sixteen spaces at a time (a copy of fixed size), the excess cut off.
        let indent = 2 * c.depth.min(MAX_INDENT) as usize;
        let to = line.len() + indent;
        for _ in 0..indent.div_ceil(16) {
            line.extend_from_slice(&[b' '; 16]);
        }
        line.truncate(to);
        let values = cx.values(&c);
        let name = cx.names.name(c.func);
        // A call the process died in (SIGKILL, a crash) says so; other calls that did not
        // return normally were left by longjmp, an exception, exec or exit.
        let ending = match c.ending {
            Ending::Returned => "",
            e => e.as_str(),
        }
        .as_bytes();
        // Recorded arguments replace the parameter list; a return value follows the call. A
        // name without them gets `()` here rather than through `format!`, which was a fifth
        // of a replay's time.
        let push_call = |line: &mut Vec<u8>| match &values {
            Some(v) if v.has_args => line.extend_from_slice(crate::values::call_text(name, &v.args_text()).as_bytes()),
            _ => {
                line.extend_from_slice(name.as_bytes());
                if !name.ends_with(')') {
                    line.extend_from_slice(b"()");
                }
            }
        };
        let ret = values.as_ref().and_then(|v| v.ret.as_deref());
        let injected = values.as_ref().and_then(|v| v.injection.as_ref());
        let push_ret = |line: &mut Vec<u8>| {
            if let Some(r) = ret {
                line.extend_from_slice(b" = ");
                line.extend_from_slice(r.as_bytes());
            }
        };
        let push_injected = |line: &mut Vec<u8>| {
            if let Some(i) = injected {
                line.extend_from_slice(b" /* injected: ");
                line.extend_from_slice(i.rule().as_bytes());
                line.extend_from_slice(b" */");
            }
        };
        if !c.has_callees {
            push_call(&mut line);
            push_ret(&mut line);
            line.push(b';');
            if !ending.is_empty() {
                line.extend_from_slice(b" /* ");
                line.extend_from_slice(ending);
                line.extend_from_slice(b" */");
            }
            push_injected(&mut line);
        } else if !leave {
            push_call(&mut line);
            line.extend_from_slice(b" {");
            push_injected(&mut line);
        } else {
            line.push(b'}');
            push_ret(&mut line);
            line.extend_from_slice(b" /* ");
            line.extend_from_slice(name.as_bytes());
            if !ending.is_empty() {
                line.extend_from_slice(b", ");
                line.extend_from_slice(ending);
            }
            line.extend_from_slice(b" */");
        }
        line.push(b'\n');
        if line.len() >= FLUSH_AT {
            // Cleared whatever the write did, so that nothing is written twice.
            let written = out.write_all(&line);
            line.clear();
            written.map_err(out_err)?;
        }
        Ok(())
    });
    // What was put together before an error is printed too; the walk's error comes first.
    let rest = out.write_all(&line);
    let trace = walked?;
    rest.map_err(out_err)?;
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
    let sel = Selection { pid: None, tid };
    let mut seq = 0u64;
    let trace = walk_calls_within(path, &sel, Order::Time, budget, |cx, ev| {
        seq += 1;
        let wall = cx.clock.wall_ns(ev.tsc());
        let values = cx.values(ev.call());
        // Technique A glues `ret:` and the raw return value to the name on leave lines; the
        // arguments go the same way on enter lines, as `args:(...)`.
        let (what, tail) = match (ev, &values) {
            (CallEvent::Enter(_), Some(v)) if v.has_args => ("enter", format!("args:{}", v.args_text())),
            (CallEvent::Enter(_), _) => ("enter", String::new()),
            (CallEvent::Exit(_), Some(v)) => match v.ret.clone().or(v.raw_ret.map(|r| r.to_string())) {
                Some(r) => ("leave", format!("ret:{r}")),
                None => ("leave", String::new()),
            },
            (CallEvent::Exit(_), None) => ("leave", String::new()),
        };
        writeln!(
            out,
            "{seq}[{},{}]{what}:{}{tail}",
            wall / 1_000_000_000,
            wall % 1_000_000_000,
            cx.names.name(ev.call().func)
        )
        .map_err(out_err)
    })?;
    Ok(trace.warnings)
}
