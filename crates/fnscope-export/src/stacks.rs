//! What the stack-shaped exports (folded stacks, flame graphs, call graphs, speedscope) share:
//! the output file, the check for traces without times, progress, and each thread's open
//! calls with the time their callees took.

use crate::{ExportError, Options, Output, Progress, Selector};
use fnscope_analysis::{
    walk_calls, AnalysisError, CallEvent, CallInfo, Order, Trace, WalkContext, MODE_MERGED,
};
use fnscope_format::Meta;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A buffered output that names its file in errors.
pub(crate) struct Sink {
    path: PathBuf,
    w: BufWriter<Box<dyn Write>>,
}

impl Sink {
    /// Opens `out` for a format that is one whole file (`what` names it in the refusal of
    /// `--split-size`).
    pub(crate) fn whole(out: &Output, what: &str) -> Result<Sink, ExportError> {
        if out.split_size.is_some() {
            return Err(ExportError::BadOption(format!(
                "--split-size: {what} is one document and cannot be split; leave the option out"
            )));
        }
        Sink::open(out.path.as_deref())
    }

    /// Opens `path`, or standard output.
    pub(crate) fn open(path: Option<&Path>) -> Result<Sink, ExportError> {
        let (path, w): (PathBuf, Box<dyn Write>) = match path {
            Some(p) => {
                let f = File::create(p).map_err(|source| ExportError::Write {
                    path: p.to_path_buf(),
                    source,
                })?;
                (p.to_path_buf(), Box::new(f))
            }
            None => (
                PathBuf::from("standard output"),
                Box::new(std::io::stdout()),
            ),
        };
        Ok(Sink {
            path,
            w: BufWriter::with_capacity(1 << 16, w),
        })
    }

    /// The writer, for `write!`; errors go through [`Sink::check`].
    pub(crate) fn w(&mut self) -> &mut dyn Write {
        &mut self.w
    }

    /// Turns a write error into an [`ExportError`] naming the file.
    pub(crate) fn check<T>(&self, r: std::io::Result<T>) -> Result<T, ExportError> {
        r.map_err(|source| ExportError::Write {
            path: self.path.clone(),
            source,
        })
    }

    /// Flushes what is buffered.
    pub(crate) fn finish(mut self) -> Result<(), ExportError> {
        let r = self.w.flush();
        self.check(r)
    }
}

/// The META chunk of the trace at `input`: what was traced, and how.
pub(crate) fn read_meta(input: &Path) -> Result<Meta, ExportError> {
    let mut r = fnscope_format::TraceReader::open(input).map_err(AnalysisError::from)?;
    match r.next_chunk().map_err(AnalysisError::from)? {
        Some(fnscope_format::Chunk::Meta(m)) => Ok(m),
        _ => Ok(Meta::default()),
    }
}

/// The META chunk of the trace at `input`, for `what`, which needs call times: a trace
/// without them is refused.
pub(crate) fn timed_meta(input: &Path, what: &str) -> Result<Meta, ExportError> {
    crate::require_times(input, what)?;
    read_meta(input)
}

/// The trace's mode when it holds no times: `count` (calls counted per function) or
/// `merged` (totals of several runs).
pub(crate) fn untimed(meta: &Meta) -> Option<&str> {
    (meta.mode == "count" || meta.mode == MODE_MERGED).then_some(meta.mode.as_str())
}

/// Whether `opts` select anything narrower than the whole trace.
pub(crate) fn narrowed(opts: &Options) -> bool {
    opts.selection.pid.is_some()
        || opts.selection.tid.is_some()
        || opts.window != (None, None)
        || !opts.filter.is_empty()
        || !opts.exclude.is_empty()
        || opts.min_duration_ns > 0
}

/// Reports progress when the walk has read more of the file.
pub(crate) struct Advance {
    last: u64,
}

impl Advance {
    pub(crate) fn new() -> Advance {
        Advance { last: 0 }
    }

    pub(crate) fn tell(&mut self, cx: &WalkContext, progress: &mut Progress<'_>) {
        if cx.bytes_read != self.last {
            self.last = cx.bytes_read;
            progress(cx.bytes_read, cx.trace.bytes);
        }
    }
}

/// One open call: what the caller attached to it, and the time its callees took.
struct Open<K> {
    key: K,
    callees: u64,
}

/// A call that has just ended, as [`walk_stacks`] hands it over.
pub(crate) struct Ended<K> {
    /// The key given to it on entry.
    pub key: K,
    /// Its duration in ticks.
    pub ticks: u64,
    /// Its duration without that of its callees.
    pub self_ticks: u64,
    /// Its caller's key, if it has a caller.
    pub caller: Option<K>,
}

/// Each thread's open calls (as the [`Selector`] passes them), each with a key of the
/// caller's choosing (a stack node, a function) and the time its callees took, so that a
/// call's self time is known when it ends. Holds threads × depth.
struct Frames<K> {
    threads: HashMap<(u32, u32), Vec<Open<K>>>,
}

impl<K: Copy> Frames<K> {
    fn new() -> Frames<K> {
        Frames {
            threads: HashMap::new(),
        }
    }

    /// The key of the innermost open call of `c`'s thread.
    fn caller(&self, c: &CallInfo) -> Option<K> {
        self.threads
            .get(&(c.pid, c.tid))
            .and_then(|s| s.last())
            .map(|o| o.key)
    }

    /// `c` starts, keyed `key`.
    fn enter(&mut self, c: &CallInfo, key: K) {
        self.threads
            .entry((c.pid, c.tid))
            .or_default()
            .push(Open { key, callees: 0 });
    }

    /// `c` ends; `None` for an exit without its entry (not given by the selector).
    fn exit(&mut self, c: &CallInfo) -> Option<Ended<K>> {
        let stack = self.threads.get_mut(&(c.pid, c.tid))?;
        let o = stack.pop()?;
        let ticks = c.ticks();
        let caller = stack.last_mut().map(|p| {
            p.callees = p.callees.saturating_add(ticks);
            p.key
        });
        Some(Ended {
            key: o.key,
            ticks,
            self_ticks: ticks.saturating_sub(o.callees),
            caller,
        })
    }
}

/// Walks the calls of the trace at `input` selected by `opts`, each thread's trees as they
/// complete, keeping each thread's open calls: `enter` gives an entered call its key (knowing
/// its caller's), `exit` takes each call that ends; both work on `state`. Reports progress.
/// Returns the trace as read.
pub(crate) fn walk_stacks<S, K: Copy>(
    input: &Path,
    opts: &Options,
    mut progress: Progress<'_>,
    state: &mut S,
    enter: impl Fn(&mut S, &mut WalkContext, Option<K>, &CallInfo) -> K,
    exit: impl Fn(&mut S, Ended<K>),
) -> Result<Trace, ExportError> {
    let mut selector = Selector::new(opts)?;
    let mut frames: Frames<K> = Frames::new();
    let mut advance = Advance::new();
    let trace = walk_calls(input, &opts.selection, Order::Completed, |cx, ev| {
        advance.tell(cx, &mut progress);
        match selector.select(cx, ev) {
            Some(CallEvent::Enter(c)) => {
                let k = enter(state, cx, frames.caller(&c), &c);
                frames.enter(&c, k);
            }
            Some(CallEvent::Exit(c)) => {
                if let Some(e) = frames.exit(&c) {
                    exit(state, e);
                }
            }
            None => {}
        }
        Ok(())
    })?;
    Ok(trace)
}

/// A function name made safe for formats that split on `;` and lines: `;` becomes `,`,
/// line breaks become spaces, and an empty name `?`.
pub(crate) fn frame_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|ch| match ch {
            ';' => ',',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect();
    if s.trim().is_empty() {
        "?".to_string()
    } else {
        s
    }
}

/// The command's program name (file name of its first word), for titles.
pub(crate) fn program_name(meta: &Meta) -> String {
    meta.command
        .first()
        .map(|c| {
            Path::new(c)
                .file_name()
                .map_or(c.clone(), |f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "program".to_string())
}

#[cfg(test)]
mod tests {
    use super::frame_name;

    #[test]
    fn frame_names_hold_no_separators() {
        assert_eq!(
            frame_name("core::array::<impl [u8; 4]>::map"),
            "core::array::<impl [u8, 4]>::map"
        );
        assert_eq!(frame_name("a\nb\r"), "a b ");
        assert_eq!(frame_name(""), "?");
        assert_eq!(
            frame_name("operator\"\" _w(unsigned long long)"),
            "operator\"\" _w(unsigned long long)"
        );
    }
}
