//! The Firefox Profiler's processed profile (`fxprof-processed-profile`, as samply writes it).
//!
//! The profiler thinks in samples. A trace becomes exact samples: one at every call boundary
//! (entry or exit) of a thread, holding the stack from that boundary to the next and weighing
//! the nanoseconds until it, with a sampling interval of 1 ns. The call tree and the flame
//! graph then give each function's exact total and self time ("samples" read as ns), and the
//! stack chart shows every call where it happened. Time outside every hooked call gets no
//! sample.
//!
//! The crate builds the whole profile in memory before writing it: about 50 bytes per call.

use crate::stacks::Sink;
use crate::{ExportError, Options, Output, Progress, Selector};
use fnscope_analysis::{walk_calls, CallEvent, Order, WalkContext};
use fxprof_processed_profile::{
    CategoryHandle, CpuDelta, Frame, FrameFlags, FrameHandle, FrameInfo, ProcessHandle, Profile,
    ReferenceTimestamp, SamplingInterval, StackHandle, ThreadHandle, Timestamp,
};
use std::collections::HashMap;
use std::path::Path;

/// Calls beyond which the export warns about memory.
const LARGE: u64 = 10_000_000;

/// One thread being sampled.
struct Sampled {
    handle: ThreadHandle,
    /// The stacks of the open calls, outermost first.
    stacks: Vec<StackHandle>,
    /// The last boundary: its time (ns since the start) and the stack from there on.
    since: u64,
    current: Option<StackHandle>,
}

struct Builder {
    profile: Profile,
    processes: HashMap<u32, ProcessHandle>,
    threads: HashMap<(u32, u32), Sampled>,
    frames: HashMap<(ThreadHandle, u32), FrameHandle>,
    calls: u64,
}

impl Builder {
    fn thread(&mut self, cx: &WalkContext, pid: u32, tid: u32, at: u64) -> &mut Sampled {
        let Builder { profile, processes, threads, .. } = self;
        threads.entry((pid, tid)).or_insert_with(|| {
            let exe = exe_name(cx, pid);
            let process = *processes
                .entry(pid)
                .or_insert_with(|| profile.add_process(&exe, pid, Timestamp::from_nanos_since_reference(at)));
            let handle = profile.add_thread(process, tid, Timestamp::from_nanos_since_reference(at), tid == pid);
            profile.set_thread_name(handle, &cx.trace.thread_label(pid, tid, &exe));
            Sampled { handle, stacks: Vec::new(), since: at, current: None }
        })
    }

    /// Ends the sample running on `(pid, tid)` at `at` and starts the next, on `next`.
    fn boundary(&mut self, key: (u32, u32), at: u64, next: Option<StackHandle>) {
        let t = self.threads.get_mut(&key).expect("the thread was added on its first event");
        if let Some(stack) = t.current {
            let mut from = t.since;
            // Weights are i32: a longer stretch becomes several samples.
            while from < at {
                let w = (at - from).min(i32::MAX as u64);
                self.profile.add_sample(
                    t.handle,
                    Timestamp::from_nanos_since_reference(from),
                    Some(stack),
                    CpuDelta::from_nanos(w),
                    w as i32,
                );
                from += w;
            }
        }
        t.since = at;
        t.current = next;
    }

    fn event(&mut self, cx: &mut WalkContext, ev: CallEvent) {
        let c = *ev.call();
        let key = (c.pid, c.tid);
        let ns = |tsc: u64| cx.clock.ns_since_start(tsc);
        match ev {
            CallEvent::Enter(_) => {
                self.calls += 1;
                let at = ns(c.entry_tsc);
                let handle = self.thread(cx, c.pid, c.tid, at).handle;
                let frame = match self.frames.get(&(handle, c.func)) {
                    Some(f) => *f,
                    None => {
                        let label = self.profile.intern_string(cx.names.name(c.func));
                        let info = FrameInfo {
                            frame: Frame::Label(label),
                            category_pair: CategoryHandle::OTHER.into(),
                            flags: FrameFlags::empty(),
                        };
                        let f = self.profile.intern_frame(handle, info);
                        self.frames.insert((handle, c.func), f);
                        f
                    }
                };
                let parent = self.threads[&key].stacks.last().copied();
                let stack = self.profile.intern_stack(handle, parent, frame);
                self.boundary(key, at, Some(stack));
                self.threads.get_mut(&key).expect("added above").stacks.push(stack);
            }
            CallEvent::Exit(_) => {
                let at = ns(c.exit_tsc);
                let t = self.thread(cx, c.pid, c.tid, at);
                t.stacks.pop();
                let next = t.stacks.last().copied();
                self.boundary(key, at, next);
            }
        }
    }
}

/// File name of the program of process `pid`, from its image table.
fn exe_name(cx: &WalkContext, pid: u32) -> String {
    cx.trace
        .images
        .values()
        .rev()
        .find(|i| i.pid == pid)
        .map(|i| Path::new(&i.exe).file_name().map_or_else(|| i.exe.clone(), |n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| format!("pid {pid}"))
}

pub(crate) fn write(input: &Path, opts: &Options, out: &Output, progress: Progress<'_>) -> Result<Vec<String>, ExportError> {
    crate::require_times(input, "the Firefox Profiler's call tree and stack chart")?;
    let mut sink = Sink::whole(out, "a Firefox profile (export a part with --time, --pid or --tid instead)")?;
    let mut selector = Selector::new(opts)?;
    let mut b: Option<Builder> = None;
    let trace = walk_calls(input, &opts.selection, Order::Completed, |cx, ev| {
        let b = b.get_or_insert_with(|| {
            let start_ms = cx.trace.meta.start_unix_ns as f64 / 1e6;
            let product = cx.trace.meta.command.first().map_or("fnscope trace", |s| s.as_str());
            let mut profile = Profile::new(
                product,
                ReferenceTimestamp::from_millis_since_unix_epoch(start_ms),
                SamplingInterval::from_nanos(1),
            );
            profile.set_symbolicated(true);
            Builder { profile, processes: HashMap::new(), threads: HashMap::new(), frames: HashMap::new(), calls: 0 }
        });
        if let Some(ev) = selector.select(cx, ev) {
            b.event(cx, ev);
        }
        progress(cx.bytes_read, cx.trace.bytes);
        Ok(())
    })?;
    let mut warnings = trace.warnings;
    let profile = match b {
        Some(b) => {
            if b.calls > LARGE {
                warnings.push(format!(
                    "{} calls in one Firefox profile: the profiler may be slow to open it; \
                     --time, --filter or --min-duration export a part",
                    b.calls
                ));
            }
            b.profile
        }
        None => Profile::new("fnscope trace", ReferenceTimestamp::from_millis_since_unix_epoch(0.0), SamplingInterval::from_nanos(1)),
    };
    let written = serde_json::to_writer(sink.w(), &profile).map_err(std::io::Error::other);
    sink.check(written)?;
    sink.finish()?;
    Ok(warnings)
}
