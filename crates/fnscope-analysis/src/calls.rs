//! The one walk over a trace's calls that every call-by-call view reads (`replay`, the
//! exports), so that they cannot disagree on what was called, by whom, and how it ended.
//!
//! Records arrive in the order calls returned; each thread's records go through
//! [`ThreadCalls`], which yields them in the order calls started with memory bounded by the
//! deepest nesting plus fixed buffers (sorted runs spill to temporary files when a call tree
//! is large). The walk hands each call over twice, on entry and on exit, properly nested.

use crate::names::Names;
use crate::values::{decode, CallValues, DataStore, Specs};
use crate::spill::{Call, Merge, ThreadCalls, MEMORY_CALLS};
use crate::{headers, scan, AnalysisError, Trace};
use fnscope_abi::{REC_FLAG_CUT, REC_FLAG_UNWOUND};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::Path;
use std::sync::mpsc::sync_channel;

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ending {
    /// It returned.
    Returned,
    /// It was left without returning: `longjmp`, an exception, `exec` or `exit`.
    Unwound,
    /// The process died with it open (SIGKILL, a crash): it ends where the trace of its
    /// thread ends.
    CutOff,
}

impl Ending {
    /// `returned`, `unwound` or `cut off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Returned => "returned",
            Ending::Unwound => "unwound",
            Ending::CutOff => "cut off",
        }
    }
}

/// One call with its place in its thread's tree of hooked calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallInfo {
    /// Process.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// The function: an index for [`FunctionNames`].
    pub func: u32,
    /// The image (process image session) whose table names the function.
    pub image: u32,
    /// The function's id in that image's table.
    pub id: u32,
    /// The hooked call this one was made in (its function), if any; always `None` in
    /// [`Order::Returned`], where callers come later.
    pub parent: Option<u32>,
    /// Hooked calls open around it in its thread (0: outermost).
    pub depth: u32,
    /// Time-stamp of the entry (TSC ticks; see [`Trace::ticks_to_ns`]).
    pub entry_tsc: u64,
    /// Time-stamp of the exit.
    pub exit_tsc: u64,
    /// How it ended.
    pub ending: Ending,
    /// Whether the trace holds calls made inside it.
    pub has_callees: bool,
    /// Its recorded arguments, return value and injections, if any: a handle for
    /// [`WalkContext::values`] (0: none).
    pub data: u64,
}

impl CallInfo {
    /// Its duration in ticks.
    pub fn ticks(&self) -> u64 {
        self.exit_tsc.wrapping_sub(self.entry_tsc)
    }
}

/// One step of the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallEvent {
    /// The call starts: calls made inside it come next, then its [`CallEvent::Exit`].
    Enter(CallInfo),
    /// The call ends.
    Exit(CallInfo),
}

impl CallEvent {
    /// The call, whether entered or left.
    pub fn call(&self) -> &CallInfo {
        match self {
            CallEvent::Enter(c) | CallEvent::Exit(c) => c,
        }
    }

    /// The event's time-stamp: the call's entry or exit.
    pub fn tsc(&self) -> u64 {
        match self {
            CallEvent::Enter(c) => c.entry_tsc,
            CallEvent::Exit(c) => c.exit_tsc,
        }
    }
}

/// In which order threads' events come. Within a thread, events always come in time order,
/// properly nested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Each outermost call of a thread (its whole tree) as soon as it has returned; trees of
    /// different threads interleave in the order they completed, and calls whose callers
    /// never returned come last, per thread. Holds least.
    Completed,
    /// Each thread whole, in the order threads first appear in the trace.
    ByThread,
    /// All threads merged in time order (an entry before an exit at the same time-stamp).
    Time,
    /// Only exits, in the order calls returned (callees before their callers), as the trace
    /// holds them: nothing is sorted or held, which makes it the cheapest order for totals.
    Returned,
}

/// Which calls the walk delivers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only this process.
    pub pid: Option<u32>,
    /// Only this thread.
    pub tid: Option<u32>,
}

impl Selection {
    fn wants(&self, pid: u32, tid: u32) -> bool {
        self.pid.is_none_or(|p| p == pid) && self.tid.is_none_or(|t| t == tid)
    }
}

/// Names of the functions a walk meets: [`CallInfo::func`] indexes them.
pub struct FunctionNames(Names);

impl FunctionNames {
    /// The demangled name.
    pub fn name(&mut self, func: u32) -> &str {
        self.0.name(func)
    }

    /// The name as found in the binary (mangled).
    pub fn raw_name(&self, func: u32) -> &str {
        &self.0.info(func).raw_name
    }

    /// File name of the module the function belongs to.
    pub fn module(&self, func: u32) -> &str {
        &self.0.info(func).module
    }

    /// Link-time address of the function in its module.
    pub fn address(&self, func: u32) -> u64 {
        self.0.info(func).address
    }

    /// Where the function is in the sources (`file:line`), when its module's debug
    /// information says; looked up once per function, its module's line tables read on first
    /// use.
    pub fn source(&mut self, func: u32) -> Option<&str> {
        self.0.source(func)
    }
}

/// What the walk knows before the first call: the trace's headers (command, images, clock
/// calibration) and the function names.
pub struct WalkContext {
    /// META, IMAGE and END chunks, read in a quick first pass (its `bytes`: the file's size).
    pub trace: Trace,
    /// The functions.
    pub names: FunctionNames,
    /// The trace's time-stamps in ns (its calibration is known before the first call).
    pub clock: crate::Clock,
    /// Bytes of the file read so far by the pass over the records, for progress bars.
    pub bytes_read: u64,
    specs: Specs,
    data: DataStore,
}

impl WalkContext {
    /// The arguments, return value and injection recorded for call `c` (`record -A`, `-R`,
    /// `--inject`), if it has any. Only valid while `c` is being visited.
    pub fn values(&self, c: &CallInfo) -> Option<CallValues> {
        if c.data == 0 {
            return None;
        }
        let words = self.data.get(c.data).ok()?;
        decode(&self.specs, c.image, c.id, &words)
    }
}

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

    /// Spills thread `i` when its buffer is full, or the thread holding most when the budget
    /// is used up.
    fn keep_budget(&mut self, i: usize) -> Result<(), AnalysisError> {
        let t = if self.order[i].1.buffer_full() {
            &mut self.order[i].1
        } else if self.held < self.budget {
            return Ok(());
        } else {
            match self.order.iter_mut().max_by_key(|(_, t)| t.in_memory()) {
                Some((_, t)) => t,
                None => return Ok(()),
            }
        };
        let before = t.in_memory();
        t.spill()?;
        self.held -= before - t.in_memory();
        Ok(())
    }
}

/// One thread's calls in entry order, each met twice, on entry and on exit, properly nested:
/// a call's exit comes after the entries and exits of its callees.
struct Nested<'a> {
    key: (u32, u32),
    calls: Merge<'a>,
    /// Calls entered and not yet exited, outermost first.
    open: Vec<Call>,
    ahead: Option<Call>,
}

impl<'a> Nested<'a> {
    fn new(key: (u32, u32), calls: Merge<'a>) -> Nested<'a> {
        Nested {
            key,
            calls,
            open: Vec::new(),
            ahead: None,
        }
    }

    fn info(&self, c: &Call, parent: Option<&Call>) -> CallInfo {
        CallInfo {
            pid: self.key.0,
            tid: self.key.1,
            func: c.func,
            image: c.image,
            id: c.id,
            parent: parent.map(|p| p.func),
            depth: c.depth(),
            entry_tsc: c.t_entry,
            exit_tsc: c.t_exit,
            ending: ending(c.flags()),
            has_callees: c.has_callees(),
            data: c.data,
        }
    }

    /// The next entry or exit.
    fn next(&mut self) -> Result<Option<CallEvent>, AnalysisError> {
        if self.ahead.is_none() {
            self.ahead = self.calls.next()?;
        }
        if let Some(top) = self.open.last() {
            if self.ahead.as_ref().is_none_or(|c| !top.contains(c)) {
                let c = self.open.pop().expect("checked above");
                return Ok(Some(CallEvent::Exit(self.info(&c, self.open.last()))));
            }
        }
        let Some(c) = self.ahead.take() else {
            return Ok(None);
        };
        let info = self.info(&c, self.open.last());
        self.open.push(c);
        Ok(Some(CallEvent::Enter(info)))
    }
}

fn ending(flags: u32) -> Ending {
    if flags & REC_FLAG_CUT != 0 {
        Ending::CutOff
    } else if flags & REC_FLAG_UNWOUND != 0 {
        Ending::Unwound
    } else {
        Ending::Returned
    }
}

/// Walks the selected calls of the trace at `path` in `order`, calling `visit` for each entry
/// and exit. Reads the file twice: a quick pass for the headers and names (handed to `visit`
/// in a [`WalkContext`]), then the records. Memory stays bounded whatever the number of calls
/// (large trees are sorted through temporary files). Returns the trace as read (its warnings:
/// truncation, missing calibration, for the caller to show). `visit` stops the walk by
/// returning an error.
pub fn walk_calls(
    path: &Path,
    sel: &Selection,
    order: Order,
    visit: impl FnMut(&mut WalkContext, CallEvent) -> Result<(), AnalysisError>,
) -> Result<Trace, AnalysisError> {
    walk_calls_within(path, sel, order, MEMORY_CALLS, visit)
}

/// [`walk_calls`] holding at most about `budget` calls in memory.
pub(crate) fn walk_calls_within(
    path: &Path,
    sel: &Selection,
    order: Order,
    budget: usize,
    mut visit: impl FnMut(&mut WalkContext, CallEvent) -> Result<(), AnalysisError>,
) -> Result<Trace, AnalysisError> {
    let pre = headers(path)?;
    let names = FunctionNames(Names::new(pre.images.values()));
    let specs = Specs::new(pre.images.values());
    let clock = pre.clock();
    let mut cx = WalkContext { trace: pre, names, clock, bytes_read: 0, specs, data: DataStore::default() };
    let mut threads = Threads::new(budget);
    let mut failed = None;
    // Order::Returned: per thread, the depth of the previous record (a deeper one just
    // before is a callee).
    let mut last_depth: HashMap<(u32, u32), u32> = HashMap::new();
    let trace = scan(path, |t, seg| {
        cx.bytes_read = t.bytes;
        if failed.is_some() || !sel.wants(seg.pid, seg.tid) {
            return;
        }
        let key = (seg.pid, seg.tid);
        // The data unit of each record that has one, in record order.
        let mut units = seg.data.iter().peekable();
        let mut unit_of = |k: usize, data: &mut DataStore| -> Result<u64, AnalysisError> {
            match units.next_if(|u| u.0 as usize == k) {
                Some((_, words)) => data.put(words),
                None => Ok(0),
            }
        };
        if order == Order::Returned {
            let last = last_depth.entry(key).or_insert(0);
            for (k, r) in seg.records.iter().enumerate() {
                let data = match unit_of(k, &mut cx.data) {
                    Ok(h) => h,
                    Err(e) => {
                        failed = Some(e);
                        return;
                    }
                };
                let depth = r.depth();
                let c = CallInfo {
                    pid: seg.pid,
                    tid: seg.tid,
                    func: cx.names.0.index(seg.image_sid, r.id()),
                    image: seg.image_sid,
                    id: r.id(),
                    parent: None,
                    depth,
                    entry_tsc: r.t_entry,
                    exit_tsc: r.t_exit,
                    ending: ending(r.flags()),
                    has_callees: *last > depth,
                    data,
                };
                *last = depth;
                if let Err(e) = visit(&mut cx, CallEvent::Exit(c)) {
                    failed = Some(e);
                    return;
                }
            }
            cx.data.clear();
            return;
        }
        let i = threads.index(key);
        for (k, r) in seg.records.iter().enumerate() {
            let func = cx.names.0.index(seg.image_sid, r.id());
            let data = match unit_of(k, &mut cx.data) {
                Ok(h) => h,
                Err(e) => {
                    failed = Some(e);
                    return;
                }
            };
            let t = &mut threads.order[i].1;
            let done = t.push(r, func, seg.image_sid, data);
            threads.held += 1;
            let step = if done && order == Order::Completed {
                threads.held -= t.in_memory();
                t.drain()
                    .and_then(|m| visit_thread(&mut cx, Nested::new(key, m), &mut visit))
                    .and_then(|_| t.reset_file())
            } else {
                threads.keep_budget(i)
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
    if order == Order::Time {
        merge_by_time(&mut cx, &mut threads, &mut visit)?;
    } else {
        for (key, t) in &mut threads.order {
            visit_thread(&mut cx, Nested::new(*key, t.drain()?), &mut visit)?;
        }
    }
    Ok(trace)
}

/// Events handed from the thread reading spilled calls to the visiting one at a time.
const BATCH_EVENTS: usize = 4096;

/// Adds events to `batch` until it holds [`BATCH_EVENTS`] or the calls end.
fn fill(calls: &mut Nested<'_>, batch: &mut Vec<CallEvent>) -> Result<(), AnalysisError> {
    while batch.len() < BATCH_EVENTS {
        match calls.next()? {
            Some(ev) => batch.push(ev),
            None => break,
        }
    }
    Ok(())
}

fn visit_thread(
    cx: &mut WalkContext,
    mut calls: Nested<'_>,
    visit: &mut impl FnMut(&mut WalkContext, CallEvent) -> Result<(), AnalysisError>,
) -> Result<(), AnalysisError> {
    if !calls.calls.reads_files() {
        while let Some(ev) = calls.next()? {
            visit(cx, ev)?;
        }
        return Ok(());
    }
    // A tree that went through temporary files is large: reading it back and nesting its
    // calls (a quarter of a walk's time) runs on a thread of its own, ahead of the views.
    std::thread::scope(|s| {
        let (events, received) = sync_channel::<Result<Vec<CallEvent>, AnalysisError>>(4);
        // Visited batches come back to be filled again.
        let (give_back, returned) = sync_channel::<Vec<CallEvent>>(4);
        s.spawn(move || loop {
            let mut batch = returned.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH_EVENTS));
            batch.clear();
            let step = fill(&mut calls, &mut batch);
            let last = step.is_err() || batch.len() < BATCH_EVENTS;
            // A send fails when the visitor stopped: nothing more to do.
            if events.send(step.map(|()| batch)).is_err() || last {
                return;
            }
        });
        for batch in received {
            let batch = batch?;
            for &ev in &batch {
                visit(cx, ev)?;
            }
            let _ = give_back.try_send(batch);
        }
        Ok(())
    })
}

fn merge_by_time(
    cx: &mut WalkContext,
    threads: &mut Threads,
    visit: &mut impl FnMut(&mut WalkContext, CallEvent) -> Result<(), AnalysisError>,
) -> Result<(), AnalysisError> {
    let mut streams = Vec::with_capacity(threads.order.len());
    for (key, t) in &mut threads.order {
        streams.push(Nested::new(*key, t.drain()?));
    }
    let key = |ev: &CallEvent, i: usize| Reverse((ev.tsc(), matches!(ev, CallEvent::Exit(_)), i));
    let mut heads = Vec::with_capacity(streams.len());
    let mut heap = BinaryHeap::new();
    for (i, s) in streams.iter_mut().enumerate() {
        let h = s.next()?;
        if let Some(ev) = &h {
            heap.push(key(ev, i));
        }
        heads.push(h);
    }
    while let Some(Reverse((_, _, i))) = heap.pop() {
        let ev = heads[i].take().expect("a stream in the heap has a head");
        visit(cx, ev)?;
        heads[i] = streams[i].next()?;
        if let Some(ev) = &heads[i] {
            heap.push(key(ev, i));
        }
    }
    Ok(())
}
