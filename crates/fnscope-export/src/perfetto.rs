//! Perfetto's protobuf trace: a track per process and per thread, a slice per call with its
//! exact begin and end, names interned. Times are ns from the start of the recording (as
//! `--time` takes them): `fnscope info`'s start plus a slice's begin is the wall-clock time
//! `replay --format lines` prints for the call's entry, to the ns. They are smaller numbers
//! than wall-clock ns, and every event carries one.
//!
//! Each thread is a packet sequence of its own, whose first packet clears the incremental
//! state, makes the thread's track the default of its events and declares an incremental
//! clock (64, sequence-scoped): a slice packet's timestamp is the ns since the sequence's
//! previous one, a byte or two instead of five, and it names no track. (An event earlier than
//! the previous one, as the end of a call left by `longjmp` noticed late can be, carries an
//! absolute BOOTTIME timestamp instead.) Names and modules are interned on the sequence in a
//! packet of their own just before the first slice that names them.
//! With a split size every file starts its sequences again, descriptors and interning
//! repeated, and the calls open at the cut are ended in the old file and begun again in the
//! new one (marked `continued`).

use crate::timeline::{process_name, walk_selected, SplitSink};
use crate::{ExportError, Options, Output, Progress};
use fnscope_analysis::{CallEvent, CallInfo, Ending, WalkContext};
use prost::Message;
use std::collections::HashMap;
use std::path::Path;

/// The messages of Perfetto's `perfetto_trace.proto` that the export writes, with their
/// field numbers; `oneof` members are plain optional fields (the same bytes on the wire).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TracePacket {
        #[prost(message, optional, tag = "6")]
        pub clock_snapshot: Option<ClockSnapshot>,
        #[prost(uint64, optional, tag = "8")]
        pub timestamp: Option<u64>,
        #[prost(uint32, optional, tag = "10")]
        pub trusted_packet_sequence_id: Option<u32>,
        #[prost(message, optional, tag = "11")]
        pub track_event: Option<TrackEvent>,
        #[prost(message, optional, tag = "12")]
        pub interned_data: Option<InternedData>,
        #[prost(uint32, optional, tag = "13")]
        pub sequence_flags: Option<u32>,
        #[prost(bool, optional, tag = "41")]
        pub incremental_state_cleared: Option<bool>,
        #[prost(uint32, optional, tag = "58")]
        pub timestamp_clock_id: Option<u32>,
        #[prost(message, optional, tag = "59")]
        pub trace_packet_defaults: Option<TracePacketDefaults>,
        #[prost(message, optional, tag = "60")]
        pub track_descriptor: Option<TrackDescriptor>,
        #[prost(bool, optional, tag = "87")]
        pub first_packet_on_sequence: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TracePacketDefaults {
        #[prost(message, optional, tag = "11")]
        pub track_event_defaults: Option<TrackEventDefaults>,
        #[prost(uint32, optional, tag = "58")]
        pub timestamp_clock_id: Option<u32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackEventDefaults {
        #[prost(uint64, optional, tag = "11")]
        pub track_uuid: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ClockSnapshot {
        #[prost(message, repeated, tag = "1")]
        pub clocks: Vec<Clock>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Clock {
        #[prost(uint32, optional, tag = "1")]
        pub clock_id: Option<u32>,
        #[prost(uint64, optional, tag = "2")]
        pub timestamp: Option<u64>,
        #[prost(bool, optional, tag = "3")]
        pub is_incremental: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackEvent {
        #[prost(message, repeated, tag = "4")]
        pub debug_annotations: Vec<DebugAnnotation>,
        /// `TrackEvent.Type`.
        #[prost(int32, optional, tag = "9")]
        pub r#type: Option<i32>,
        #[prost(uint64, optional, tag = "10")]
        pub name_iid: Option<u64>,
        #[prost(uint64, optional, tag = "11")]
        pub track_uuid: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DebugAnnotation {
        #[prost(uint64, optional, tag = "1")]
        pub name_iid: Option<u64>,
        #[prost(bool, optional, tag = "2")]
        pub bool_value: Option<bool>,
        #[prost(string, optional, tag = "6")]
        pub string_value: Option<String>,
        /// The name itself, for names not interned (recorded arguments).
        #[prost(string, optional, tag = "10")]
        pub name: Option<String>,
        #[prost(uint64, optional, tag = "17")]
        pub string_value_iid: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackDescriptor {
        #[prost(uint64, optional, tag = "1")]
        pub uuid: Option<u64>,
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
        #[prost(message, optional, tag = "3")]
        pub process: Option<ProcessDescriptor>,
        #[prost(message, optional, tag = "4")]
        pub thread: Option<ThreadDescriptor>,
        #[prost(uint64, optional, tag = "5")]
        pub parent_uuid: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessDescriptor {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        #[prost(string, repeated, tag = "2")]
        pub cmdline: Vec<String>,
        #[prost(string, optional, tag = "6")]
        pub process_name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ThreadDescriptor {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        #[prost(int64, optional, tag = "2")]
        pub tid: Option<i64>,
        #[prost(string, optional, tag = "5")]
        pub thread_name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InternedData {
        #[prost(message, repeated, tag = "2")]
        pub event_names: Vec<EventName>,
        #[prost(message, repeated, tag = "3")]
        pub debug_annotation_names: Vec<EventName>,
        #[prost(message, repeated, tag = "29")]
        pub debug_annotation_string_values: Vec<InternedString>,
    }

    /// `EventName`; `DebugAnnotationName` has the same fields.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EventName {
        #[prost(uint64, optional, tag = "1")]
        pub iid: Option<u64>,
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InternedString {
        #[prost(uint64, optional, tag = "1")]
        pub iid: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub str: Option<Vec<u8>>,
    }

    pub const TYPE_SLICE_BEGIN: i32 = 1;
    pub const TYPE_SLICE_END: i32 = 2;
    pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
    pub const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
    /// `BuiltinClocks.BOOTTIME`: the trace's clock, which timestamps refer to by default.
    pub const CLOCK_BOOTTIME: u32 = 6;
    /// The first sequence-scoped clock id: each thread's incremental clock.
    pub const CLOCK_INCREMENTAL: u32 = 64;
}

use proto::*;

/// Interned debug-annotation names.
const ANN_MODULE: u64 = 1;
const ANN_ENDING: u64 = 2;
const ANN_CONTINUED: u64 = 3;
const ANN_SOURCE: u64 = 4;

/// A thread's track and packet sequence, and its slices begun and not yet ended (for a cut
/// between files).
struct ThreadTrack {
    uuid: u64,
    /// The process's track.
    parent: u64,
    /// Its packet sequence id.
    seq: u32,
    open: Vec<CallInfo>,
    /// The time of the thread's last event.
    last_ns: u64,
    /// Whether its sequence has started in the current file.
    started: bool,
    /// The incremental clock's value: the last timestamp written on the sequence.
    clock_ns: u64,
    /// By function index: whether its name and strings are interned on the sequence.
    interned: Vec<bool>,
    /// By string iid - 1: whether the string is interned on the sequence.
    strings: Vec<bool>,
}

impl ThreadTrack {
    /// A slice packet's timestamp for `ns`: the delta on the incremental clock, or (for a
    /// time earlier than the clock's) `ns` itself, absolute (`true`).
    fn stamp(&mut self, ns: u64) -> (u64, bool) {
        match ns.checked_sub(self.clock_ns) {
            Some(delta) => {
                self.clock_ns = ns;
                (delta, false)
            }
            None => (ns, true),
        }
    }
}

/// What the export keeps of a function met.
struct Func {
    /// The iids of its module's name and of its place in the sources (if known), interned
    /// strings of the annotations.
    strings: Vec<u64>,
    /// The fields of its slices' begin events past type and track (`TrackEvent` fields
    /// encoded: name iid, module and source annotations), encoded once.
    tail: Vec<u8>,
}

/// Writes `v` as a protobuf varint at `out[*n..]`, moving `n` past it.
#[inline]
fn varint_at(out: &mut [u8], n: &mut usize, mut v: u64) {
    while v >= 0x80 {
        out[*n] = v as u8 | 0x80;
        *n += 1;
        v >>= 7;
    }
    out[*n] = v as u8;
    *n += 1;
}

/// Appends one slice begin or end packet to `buf`: `Trace.packet { timestamp,
/// [timestamp_clock_id: BOOTTIME when `absolute`], trusted_packet_sequence_id, sequence_flags,
/// track_event { type, ...tail } }` (the track is the sequence's default).
/// Written directly because these packets are nearly all of a file, and encoding them through
/// the message structs (nested lengths computed again at each level) took most of an
/// export's time; the fields before the tail (at most 32 bytes) are put together byte by byte
/// in an array and appended at once. The `encodes_like_prost` test checks the packets decode
/// to the same message.
fn slice_packet(buf: &mut Vec<u8>, ts: u64, absolute: bool, seq: u32, kind: i32, tail: &[&[u8]]) {
    use prost::encoding::encoded_len_varint as len;
    let tail_len: usize = tail.iter().map(|t| t.len()).sum();
    let event = 2 + tail_len;
    let clock = if absolute { 3 } else { 0 };
    let packet = 1 + len(ts) + clock + 1 + len(u64::from(seq)) + 2 + 1 + len(event as u64) + event;
    let mut h = [0u8; 32];
    let mut n = 0;
    h[n] = 0x0a; // Trace.packet, length-delimited
    n += 1;
    varint_at(&mut h, &mut n, packet as u64);
    h[n] = 0x40; // timestamp (8), varint
    n += 1;
    varint_at(&mut h, &mut n, ts);
    if absolute {
        // timestamp_clock_id (58)
        h[n..n + 3].copy_from_slice(&[0xd0, 0x03, CLOCK_BOOTTIME as u8]);
        n += 3;
    }
    h[n] = 0x50; // trusted_packet_sequence_id (10)
    n += 1;
    varint_at(&mut h, &mut n, u64::from(seq));
    h[n] = 0x68; // sequence_flags (13)
    h[n + 1] = SEQ_NEEDS_INCREMENTAL_STATE as u8;
    h[n + 2] = 0x5a; // track_event (11), length-delimited
    n += 3;
    varint_at(&mut h, &mut n, event as u64);
    h[n] = 0x48; // type (9)
    h[n + 1] = kind as u8;
    n += 2;
    buf.reserve(n + tail_len);
    buf.extend_from_slice(&h[..n]);
    for t in tail {
        buf.extend_from_slice(t);
    }
}

struct Writer {
    sink: SplitSink,
    buf: Vec<u8>,
    /// Processes' and threads' tracks, in the order met (uuid: index + 1).
    tracks: Vec<TrackDescriptor>,
    process_uuid: HashMap<u32, u64>,
    /// By track uuid - 1: whether the track is described in the current file.
    described: Vec<bool>,
    threads: Vec<ThreadTrack>,
    thread_index: HashMap<(u32, u32), usize>,
    /// The thread of the previous event (consecutive events are mostly of one thread).
    last: Option<((u32, u32), usize)>,
    /// By function index; `None` until met.
    funcs: Vec<Option<Func>>,
    /// Annotation strings (module names, `file:line`s) by value, and their iids (index + 1).
    strings: HashMap<String, u64>,
    string_values: Vec<String>,
}

impl Writer {
    fn new(out: &Output) -> Writer {
        Writer {
            sink: SplitSink::new(out),
            buf: Vec::with_capacity(256),
            tracks: Vec::new(),
            process_uuid: HashMap::new(),
            described: Vec::new(),
            threads: Vec::new(),
            thread_index: HashMap::new(),
            last: None,
            funcs: Vec::new(),
            strings: HashMap::new(),
            string_values: Vec::new(),
        }
    }

    fn packet(&mut self, p: &TracePacket) -> Result<(), ExportError> {
        self.buf.clear();
        // The file is a `Trace`: field 1 repeated, one packet after the other.
        prost::encoding::message::encode(1, p, &mut self.buf);
        self.sink.write(&self.buf)
    }

    /// A new file: every sequence starts again in it, when its thread is next met.
    fn start_file(&mut self) {
        self.described.iter_mut().for_each(|d| *d = false);
        for t in &mut self.threads {
            t.started = false;
            t.interned.clear();
            t.strings.clear();
        }
    }

    /// Starts thread `i`'s sequence in the current file: incremental state cleared, the
    /// thread's track as its events' default, its incremental clock (at 0 on BOOTTIME, the
    /// trace's clock: timestamps are ns since the recording started), the annotation names;
    /// then the thread's track and its process's, unless described already.
    fn start_sequence(&mut self, i: usize) -> Result<(), ExportError> {
        let (seq, uuid, parent) = (self.threads[i].seq, self.threads[i].uuid, self.threads[i].parent);
        let names = [(ANN_MODULE, "module"), (ANN_ENDING, "ending"), (ANN_CONTINUED, "continued"), (ANN_SOURCE, "source")];
        let clock = |clock_id, is_incremental| Clock { clock_id: Some(clock_id), timestamp: Some(0), is_incremental };
        self.packet(&TracePacket {
            trusted_packet_sequence_id: Some(seq),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
            incremental_state_cleared: Some(true),
            first_packet_on_sequence: Some(true),
            trace_packet_defaults: Some(TracePacketDefaults {
                timestamp_clock_id: Some(CLOCK_INCREMENTAL),
                track_event_defaults: Some(TrackEventDefaults { track_uuid: Some(uuid) }),
            }),
            clock_snapshot: Some(ClockSnapshot { clocks: vec![clock(CLOCK_INCREMENTAL, Some(true)), clock(CLOCK_BOOTTIME, None)] }),
            interned_data: Some(InternedData {
                debug_annotation_names: names
                    .iter()
                    .map(|(iid, n)| EventName { iid: Some(*iid), name: Some(n.to_string()) })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        })?;
        let t = &mut self.threads[i];
        t.started = true;
        t.clock_ns = 0;
        for track in [parent, uuid] {
            let k = track as usize - 1;
            if !self.described[k] {
                self.described[k] = true;
                let p = TracePacket {
                    trusted_packet_sequence_id: Some(seq),
                    track_descriptor: Some(self.tracks[k].clone()),
                    ..Default::default()
                };
                self.packet(&p)?;
            }
        }
        Ok(())
    }

    fn add_track(&mut self, descriptor: TrackDescriptor) -> u64 {
        self.tracks.push(descriptor);
        self.described.push(false);
        self.tracks.len() as u64
    }

    /// Index in `threads` of `c`'s thread, whose track (and its process's) is made when
    /// first met.
    fn thread(&mut self, cx: &WalkContext, c: &CallInfo) -> usize {
        let key = (c.pid, c.tid);
        if let Some((k, i)) = self.last {
            if k == key {
                return i;
            }
        }
        if let Some(&i) = self.thread_index.get(&key) {
            self.last = Some((key, i));
            return i;
        }
        let (name, cmdline) = process_name(&cx.trace, c.pid);
        let parent = match self.process_uuid.get(&c.pid) {
            Some(&uuid) => uuid,
            None => {
                let uuid = self.add_track(TrackDescriptor {
                    uuid: Some(self.tracks.len() as u64 + 1),
                    process: Some(ProcessDescriptor {
                        pid: Some(c.pid as i32),
                        cmdline,
                        process_name: Some(name.clone()),
                    }),
                    ..Default::default()
                });
                self.process_uuid.insert(c.pid, uuid);
                uuid
            }
        };
        let uuid = self.add_track(TrackDescriptor {
            uuid: Some(self.tracks.len() as u64 + 1),
            parent_uuid: Some(parent),
            thread: Some(ThreadDescriptor {
                pid: Some(c.pid as i32),
                tid: Some(i64::from(c.tid)),
                thread_name: Some(cx.trace.thread_label(c.pid, c.tid, &name)),
            }),
            ..Default::default()
        });
        let i = self.threads.len();
        self.threads.push(ThreadTrack {
            uuid,
            parent,
            seq: i as u32 + 1,
            open: Vec::new(),
            last_ns: 0,
            started: false,
            clock_ns: 0,
            interned: Vec::new(),
            strings: Vec::new(),
        });
        self.thread_index.insert(key, i);
        self.last = Some((key, i));
        i
    }

    /// The iid of an annotation string.
    fn string(&mut self, v: &str) -> u64 {
        let next = self.strings.len() as u64 + 1;
        let iid = *self.strings.entry(v.to_string()).or_insert(next);
        if iid == next {
            self.string_values.push(v.to_string());
        }
        iid
    }

    /// Interns `func`'s name, module and source position on thread `i`'s sequence if they
    /// are not yet, in a packet of their own.
    fn intern(&mut self, cx: &mut WalkContext, i: usize, func: u32) -> Result<(), ExportError> {
        let f = func as usize;
        if self.threads[i].interned.get(f) == Some(&true) {
            return Ok(());
        }
        if f >= self.funcs.len() {
            self.funcs.resize_with(f + 1, || None);
        }
        if self.funcs[f].is_none() {
            let mut strings = vec![self.string(cx.names.module(func))];
            let mut annotations = vec![DebugAnnotation { name_iid: Some(ANN_MODULE), string_value_iid: Some(strings[0]), ..Default::default() }];
            if let Some(src) = cx.names.source(func) {
                let iid = self.string(src);
                strings.push(iid);
                annotations.push(DebugAnnotation { name_iid: Some(ANN_SOURCE), string_value_iid: Some(iid), ..Default::default() });
            }
            let tail = TrackEvent { name_iid: Some(u64::from(func) + 1), debug_annotations: annotations, ..Default::default() };
            self.funcs[f] = Some(Func { strings, tail: tail.encode_to_vec() });
        }
        let t = &mut self.threads[i];
        if f >= t.interned.len() {
            t.interned.resize(f + 1, false);
        }
        t.interned[f] = true;
        let mut interned = InternedData::default();
        interned.event_names.push(EventName { iid: Some(u64::from(func) + 1), name: Some(cx.names.name(func).to_string()) });
        for &s in &self.funcs[f].as_ref().expect("made above").strings {
            let k = s as usize - 1;
            if k >= t.strings.len() {
                t.strings.resize(k + 1, false);
            }
            if !t.strings[k] {
                t.strings[k] = true;
                interned.debug_annotation_string_values.push(InternedString { iid: Some(s), str: Some(self.string_values[k].as_bytes().to_vec()) });
            }
        }
        let seq = t.seq;
        self.packet(&TracePacket {
            trusted_packet_sequence_id: Some(seq),
            sequence_flags: Some(SEQ_NEEDS_INCREMENTAL_STATE),
            interned_data: Some(interned),
            ..Default::default()
        })
    }

    /// The slice of `c` begins at `ns` on thread `i`'s track.
    fn begin(&mut self, cx: &mut WalkContext, i: usize, c: &CallInfo, ns: u64, continued: bool) -> Result<(), ExportError> {
        if !self.threads[i].started {
            self.start_sequence(i)?;
        }
        self.intern(cx, i, c.func)?;
        let mut extra = TrackEvent::default();
        if c.ending != Ending::Returned {
            extra.debug_annotations.push(DebugAnnotation {
                name_iid: Some(ANN_ENDING),
                string_value: Some(c.ending.as_str().to_string()),
                ..Default::default()
            });
        }
        if continued {
            extra.debug_annotations.push(DebugAnnotation { name_iid: Some(ANN_CONTINUED), bool_value: Some(true), ..Default::default() });
        }
        // Recorded arguments, return value and injection (`record -A`, `-R`, `--inject`).
        if let Some(v) = cx.values(c) {
            let mut add = |name: String, value: String| {
                extra.debug_annotations.push(DebugAnnotation { name: Some(name), string_value: Some(value), ..Default::default() });
            };
            for (k, (name, value)) in v.args.into_iter().enumerate() {
                add(name.unwrap_or_else(|| format!("arg{}", k + 1)), value);
            }
            if let Some(r) = v.ret {
                add("return".into(), r);
            }
            if let Some(i) = v.injection {
                add("injected".into(), i.rule().to_string());
            }
        }
        // Encoded messages concatenated merge: the extra annotations join the function's.
        let extra = if extra.debug_annotations.is_empty() { Vec::new() } else { extra.encode_to_vec() };
        let tail = &self.funcs[c.func as usize].as_ref().expect("interned above").tail;
        let t = &mut self.threads[i];
        let (ts, absolute) = t.stamp(ns);
        let seq = t.seq;
        self.sink.write_with(|out| slice_packet(out, ts, absolute, seq, TYPE_SLICE_BEGIN, &[tail, &extra]))
    }

    /// The slice last begun on thread `i`'s track ends at `ns`.
    fn end(&mut self, i: usize, ns: u64) -> Result<(), ExportError> {
        let t = &mut self.threads[i];
        let (ts, absolute) = t.stamp(ns);
        let seq = t.seq;
        self.sink.write_with(|out| slice_packet(out, ts, absolute, seq, TYPE_SLICE_END, &[]))
    }

    /// Ends the current file with every open slice ended where its thread last was, and
    /// starts the next with them begun again.
    fn cut(&mut self, cx: &mut WalkContext) -> Result<(), ExportError> {
        let open: Vec<(usize, u64, Vec<CallInfo>)> =
            self.threads.iter().enumerate().filter(|(_, t)| !t.open.is_empty()).map(|(i, t)| (i, t.last_ns, t.open.clone())).collect();
        for (i, ns, calls) in &open {
            for _ in calls {
                self.end(*i, *ns)?;
            }
        }
        self.sink.end_part()?;
        self.start_file();
        for (i, ns, calls) in &open {
            for c in calls {
                self.begin(cx, *i, c, *ns, true)?;
            }
        }
        Ok(())
    }

    fn event(&mut self, cx: &mut WalkContext, ev: CallEvent) -> Result<(), ExportError> {
        let (c, entry) = match &ev {
            CallEvent::Enter(c) => (c, true),
            CallEvent::Exit(c) => (c, false),
        };
        let i = self.thread(cx, c);
        let ns = cx.clock.ns_since_start(ev.tsc());
        let splits = self.sink.splits();
        let t = &mut self.threads[i];
        t.last_ns = ns;
        // Open calls are only needed to cut between files.
        if entry {
            if splits {
                t.open.push(*c);
            }
            self.begin(cx, i, c, ns, false)?;
        } else {
            if splits {
                t.open.pop();
            }
            self.end(i, ns)?;
        }
        if self.sink.full() {
            self.cut(cx)?;
        }
        Ok(())
    }
}

pub(crate) fn write(input: &Path, opts: &Options, out: &Output, progress: Progress<'_>) -> Result<Vec<String>, ExportError> {
    let mut w = Writer::new(out);
    let trace = walk_selected(input, opts, "a Perfetto timeline", progress, |cx, ev| w.event(cx, ev))?;
    if w.sink.at_start() {
        // No call selected: a valid trace that says so, with the processes' tracks.
        w.packet(&TracePacket { trusted_packet_sequence_id: Some(1), first_packet_on_sequence: Some(true), ..Default::default() })?;
    }
    w.sink.finish()?;
    Ok(trace.warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_prost() {
        for (ts, absolute, seq, kind) in [(0, false, 1, TYPE_SLICE_BEGIN), (1_795_407_036_866_440_064, true, 300, TYPE_SLICE_END), (127, false, 128, TYPE_SLICE_BEGIN)] {
            let tail = TrackEvent {
                name_iid: Some(70_000),
                debug_annotations: vec![DebugAnnotation { name_iid: Some(ANN_MODULE), string_value_iid: Some(5), ..Default::default() }],
                ..Default::default()
            };
            let extra = TrackEvent {
                debug_annotations: vec![DebugAnnotation { name_iid: Some(ANN_CONTINUED), bool_value: Some(true), ..Default::default() }],
                ..Default::default()
            };
            let mut fast = Vec::new();
            slice_packet(&mut fast, ts, absolute, seq, kind, &[&tail.encode_to_vec(), &extra.encode_to_vec()]);
            let mut event = tail.clone();
            event.debug_annotations.extend(extra.debug_annotations.clone());
            event.r#type = Some(kind);
            let packet = TracePacket {
                timestamp: Some(ts),
                timestamp_clock_id: absolute.then_some(CLOCK_BOOTTIME),
                trusted_packet_sequence_id: Some(seq),
                sequence_flags: Some(SEQ_NEEDS_INCREMENTAL_STATE),
                track_event: Some(event),
                ..Default::default()
            };
            let mut slow = Vec::new();
            prost::encoding::message::encode(1, &packet, &mut slow);
            // Same length; the same message once decoded (field order may differ).
            assert_eq!(fast.len(), slow.len());
            let decode = |b: &[u8]| TracePacket::decode_length_delimited(&b[1..]).unwrap();
            assert_eq!(decode(&fast), packet);
        }
    }

    #[test]
    fn timestamps_are_deltas_unless_time_goes_back() {
        let mut t = ThreadTrack { uuid: 2, parent: 1, seq: 1, open: Vec::new(), last_ns: 0, started: true, clock_ns: 0, interned: Vec::new(), strings: Vec::new() };
        assert_eq!(t.stamp(1000), (1000, false));
        assert_eq!(t.stamp(1007), (7, false));
        assert_eq!(t.stamp(1007), (0, false));
        // Earlier than the clock: absolute, and the clock stays where it was.
        assert_eq!(t.stamp(990), (990, true));
        assert_eq!(t.stamp(1010), (3, false));
    }
}
