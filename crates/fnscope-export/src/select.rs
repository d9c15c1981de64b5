//! The common options of every export, applied to the walk's events: which calls are kept,
//! and where each kept call sits among the kept ones.

use crate::{ExportError, Options};
use fnscope_analysis::{CallEvent, CallInfo, WalkContext};
use std::collections::HashMap;

/// What a pattern list says of one function, decided once per function.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Unknown,
    Yes,
    No,
}

/// Function patterns: globs on the demangled or the raw name, or `@GLOB` on the module's file
/// name.
struct Patterns {
    names: Vec<glob::Pattern>,
    modules: Vec<glob::Pattern>,
    cache: Vec<Verdict>,
}

impl Patterns {
    fn new(list: &[String], option: &str) -> Result<Patterns, ExportError> {
        let compile = |p: &str| {
            glob::Pattern::new(p).map_err(|e| {
                ExportError::BadOption(format!("{option} {p:?}: {e}; use a glob such as 'Py*' or '@libc.so*'"))
            })
        };
        let mut names = Vec::new();
        let mut modules = Vec::new();
        for p in list {
            match p.strip_prefix('@') {
                Some(m) => modules.push(compile(m)?),
                None => names.push(compile(p)?),
            }
        }
        Ok(Patterns { names, modules, cache: Vec::new() })
    }

    fn is_empty(&self) -> bool {
        self.names.is_empty() && self.modules.is_empty()
    }

    fn matches(&mut self, cx: &mut WalkContext, func: u32) -> bool {
        let i = func as usize;
        if i >= self.cache.len() {
            self.cache.resize(i + 1, Verdict::Unknown);
        }
        if self.cache[i] == Verdict::Unknown {
            let module = cx.names.module(func);
            let hit = self.modules.iter().any(|m| m.matches(module))
                || self.names.iter().any(|p| p.matches(cx.names.raw_name(func)))
                || {
                    let name = cx.names.name(func);
                    self.names.iter().any(|p| p.matches(name))
                };
            self.cache[i] = if hit { Verdict::Yes } else { Verdict::No };
        }
        self.cache[i] == Verdict::Yes
    }
}

/// One open call of a thread: whether it is kept and whether it matched `--filter`.
#[derive(Clone, Copy)]
struct Open {
    kept: bool,
    matched: bool,
}

#[derive(Default)]
struct ThreadState {
    open: Vec<Open>,
    /// Functions of the kept calls open, outermost first.
    kept: Vec<u32>,
    /// Open calls that matched `--filter`.
    inside: u32,
}

/// Applies [`Options`] to the walk: [`Selector::select`] turns each event into the event to
/// export, or `None`. When something is left out, a kept call's depth and parent are those
/// among the kept calls, and its times are clipped to the window, so every export sees a
/// properly nested stream.
pub struct Selector {
    filter: Patterns,
    exclude: Patterns,
    min_duration_ns: u64,
    window_ns: (Option<u64>, Option<u64>),
    /// The window in TSC ticks, once the calibration is known.
    window: Option<(u64, u64)>,
    /// Nothing to leave out or clip: every call is kept as it is, placed among its callers.
    all: bool,
    /// Each thread's state, by index in `thread_index`.
    threads: Vec<ThreadState>,
    thread_index: HashMap<(u32, u32), usize>,
    /// The thread of the previous event: consecutive events are mostly of one thread, and
    /// hashing its key at every event was a tenth of an export's time.
    last: Option<((u32, u32), usize)>,
}

impl Selector {
    /// A selector for `opts` (the process and thread are for the walk's own
    /// [`fnscope_analysis::Selection`]).
    pub fn new(opts: &Options) -> Result<Selector, ExportError> {
        if let (Some(a), Some(b)) = opts.window {
            if a >= b {
                return Err(ExportError::BadOption(format!(
                    "--time: the window ends ({b} ns) before it starts ({a} ns)"
                )));
            }
        }
        let (filter, exclude) = (Patterns::new(&opts.filter, "--filter")?, Patterns::new(&opts.exclude, "--exclude")?);
        let all = filter.is_empty() && exclude.is_empty() && opts.min_duration_ns == 0 && opts.window == (None, None);
        Ok(Selector {
            all,
            filter,
            exclude,
            min_duration_ns: opts.min_duration_ns,
            window_ns: opts.window,
            window: None,
            threads: Vec::new(),
            thread_index: HashMap::new(),
            last: None,
        })
    }

    /// The event to export for `ev`, if its call is kept.
    pub fn select(&mut self, cx: &mut WalkContext, ev: CallEvent) -> Option<CallEvent> {
        if self.all {
            // Every call kept as the walk gives it: an export of everything spent a tenth of
            // its time placing calls again. (The walk's depth is the recorded one, which is
            // the depth among kept calls unless callers' records were lost; no export reads
            // it, they nest by entry and exit.)
            return Some(ev);
        }
        let (lo, hi) = *self.window.get_or_insert_with(|| {
            let t = &cx.trace;
            let to_tsc = |ns: u64| t.meta.tsc_at_start.saturating_add((ns as f64 * t.ticks_per_ns()) as u64);
            (self.window_ns.0.map_or(0, to_tsc), self.window_ns.1.map_or(u64::MAX, to_tsc))
        });
        let c = *ev.call();
        let key = (c.pid, c.tid);
        let i = match self.last {
            Some((k, i)) if k == key => i,
            _ => {
                let threads = &mut self.threads;
                let i = *self.thread_index.entry(key).or_insert_with(|| {
                    threads.push(ThreadState::default());
                    threads.len() - 1
                });
                self.last = Some((key, i));
                i
            }
        };
        let th = &mut self.threads[i];
        match ev {
            CallEvent::Enter(_) => {
                let matched = !self.filter.is_empty() && self.filter.matches(cx, c.func);
                let kept = (self.filter.is_empty() || matched || th.inside > 0)
                    && c.exit_tsc > lo
                    && c.entry_tsc < hi
                    && (self.min_duration_ns == 0 || cx.trace.ticks_to_ns(c.ticks()) >= self.min_duration_ns)
                    && (self.exclude.is_empty() || !self.exclude.matches(cx, c.func));
                th.open.push(Open { kept, matched });
                th.inside += u32::from(matched);
                if !kept {
                    return None;
                }
                let out = placed(&c, th, lo, hi);
                th.kept.push(c.func);
                Some(CallEvent::Enter(out))
            }
            CallEvent::Exit(_) => {
                let o = th.open.pop()?;
                th.inside -= u32::from(o.matched);
                if !o.kept {
                    return None;
                }
                th.kept.pop();
                Some(CallEvent::Exit(placed(&c, th, lo, hi)))
            }
        }
    }
}

/// `c` placed among the kept calls of its thread (`th.kept`: its kept callers) and clipped to
/// `[lo, hi]`.
fn placed(c: &CallInfo, th: &ThreadState, lo: u64, hi: u64) -> CallInfo {
    CallInfo {
        parent: th.kept.last().copied(),
        depth: th.kept.len() as u32,
        entry_tsc: c.entry_tsc.max(lo),
        exit_tsc: c.exit_tsc.min(hi),
        ..*c
    }
}

/// Parses `--time START..END`: times from the start of the recording, each a number with a
/// unit (`ns`, `us`, `ms`, `s`, `m`; seconds without one), either side may be left out
/// (`2s..`, `..500ms`). Returns the window in ns.
pub fn parse_time_window(s: &str) -> Result<(Option<u64>, Option<u64>), ExportError> {
    let bad = |why: &str| {
        ExportError::BadOption(format!(
            "--time {s:?}: {why}; write START..END from the start of the recording, e.g. 1.5s..2s, 200ms.., ..3s"
        ))
    };
    let (a, b) = s.split_once("..").ok_or_else(|| bad("no '..'"))?;
    let one = |x: &str| -> Result<Option<u64>, ExportError> {
        let x = x.trim();
        if x.is_empty() {
            return Ok(None);
        }
        parse_ns(x).map(Some).map_err(|why| bad(&why))
    };
    Ok((one(a)?, one(b)?))
}

/// Parses a duration such as `50us`, `2ms` or `1.5s` (`ns`, `us`, `ms`, `s`, `m`; seconds
/// without a unit) for the option named `option`; returns ns.
pub fn parse_duration(s: &str, option: &str) -> Result<u64, ExportError> {
    parse_ns(s.trim()).map_err(|why| ExportError::BadOption(format!("{option} {s:?}: {why}; write a duration such as 50us, 2ms or 1.5s")))
}

/// A number with a time unit, in ns; the error says what is wrong with it.
fn parse_ns(x: &str) -> Result<u64, String> {
    let split = x.find(|ch: char| ch.is_ascii_alphabetic()).unwrap_or(x.len());
    let (num, unit) = x.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{num:?} is not a number"))?;
    let scale = match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "" | "s" => 1e9,
        "m" => 60e9,
        u => return Err(format!("unknown unit {u:?}")),
    };
    if !(n >= 0.0 && n.is_finite()) {
        return Err("times are not negative".to_string());
    }
    Ok((n * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_windows() {
        assert_eq!(parse_time_window("1.5s..2s").unwrap(), (Some(1_500_000_000), Some(2_000_000_000)));
        assert_eq!(parse_time_window("200ms..").unwrap(), (Some(200_000_000), None));
        assert_eq!(parse_time_window("..3").unwrap(), (None, Some(3_000_000_000)));
        assert_eq!(parse_time_window("10us..1m").unwrap(), (Some(10_000), Some(60_000_000_000)));
        for bad in ["1s", "x..2s", "1h..", "-1s.."] {
            assert!(parse_time_window(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("50us", "--min-duration").unwrap(), 50_000);
        assert!(parse_duration("5 parsecs", "--min-duration").is_err());
    }
}
