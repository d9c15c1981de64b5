//! Perfetto's protobuf trace: a track per process and per thread, a slice per call with its
//! exact begin and end, names interned. Times are ns from the start of the recording (as
//! `--time` takes them): `fnscope info`'s start plus a slice's begin is the wall-clock time
//! `replay --format lines` prints for the call's entry, to the ns. They are smaller numbers
//! than wall-clock ns, and every event carries one.
//!
//! The file is one packet sequence: its first packet clears the incremental state and
//! describes the tracks; names and modules are interned in a packet of their own just before
//! the first slice that names them.
//! With a split size every file is a sequence of its own, descriptors and interning repeated,
//! and the calls open at the cut are ended in the old file and begun again in the new one
//! (marked `continued`).

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
        #[prost(message, optional, tag = "60")]
        pub track_descriptor: Option<TrackDescriptor>,
        #[prost(bool, optional, tag = "87")]
        pub first_packet_on_sequence: Option<bool>,
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
}

use proto::*;

/// The one packet sequence of each file.
const SEQUENCE: u32 = 1;
/// Interned debug-annotation names.
const ANN_MODULE: u64 = 1;
const ANN_ENDING: u64 = 2;
const ANN_CONTINUED: u64 = 3;
const ANN_SOURCE: u64 = 4;

/// A thread's track, and its slices begun and not yet ended (for a cut between files).
struct ThreadTrack {
    uuid: u64,
    open: Vec<CallInfo>,
    last_ns: u64,
}

/// What the export keeps of a function met.
struct Func {
    /// The iids of its module's name and of its place in the sources (if known), interned
    /// strings of the annotations.
    strings: Vec<u64>,
    /// Whether its name is interned in the current file.
    interned: bool,
    /// The fields of its slices' begin events past type and track (`TrackEvent` fields
    /// encoded: name iid, module and source annotations), encoded once.
    tail: Vec<u8>,
}

/// Appends `v` as a protobuf varint.
fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Appends one slice begin or end packet to `buf`: `Trace.packet { timestamp,
/// trusted_packet_sequence_id, sequence_flags, track_event { type, track_uuid, ...tail } }`;
/// an end names nothing interned, so it goes without `sequence_flags` (2 bytes a call).
/// Written directly because these packets are nearly all of a file, and encoding them through
/// the message structs (nested lengths computed again at each level) took most of an
/// export's time; the `encodes_like_prost` test checks they decode to the same packet.
fn slice_packet(buf: &mut Vec<u8>, ns: u64, track: u64, kind: i32, tail: &[&[u8]]) {
    use prost::encoding::encoded_len_varint as len;
    let tail_len: usize = tail.iter().map(|t| t.len()).sum();
    let event = 2 + 1 + len(track) + tail_len;
    let interning = kind == TYPE_SLICE_BEGIN;
    let packet = 1 + len(ns) + 2 + if interning { 2 } else { 0 } + 1 + len(event as u64) + event;
    buf.push(0x0a); // Trace.packet, length-delimited
    varint(buf, packet as u64);
    buf.push(0x40); // timestamp (8), varint
    varint(buf, ns);
    buf.extend_from_slice(&[0x50, SEQUENCE as u8]); // trusted_packet_sequence_id (10)
    if interning {
        buf.extend_from_slice(&[0x68, SEQ_NEEDS_INCREMENTAL_STATE as u8]); // sequence_flags (13)
    }
    buf.push(0x5a); // track_event (11), length-delimited
    varint(buf, event as u64);
    buf.extend_from_slice(&[0x48, kind as u8]); // type (9)
    buf.push(0x58); // track_uuid (11)
    varint(buf, track);
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
    threads: Vec<ThreadTrack>,
    thread_index: HashMap<(u32, u32), usize>,
    /// The thread of the previous event (consecutive events are mostly of one thread).
    last: Option<((u32, u32), usize)>,
    /// By function index; `None` until met.
    funcs: Vec<Option<Func>>,
    /// Annotation strings (module names, `file:line`s) by value, and their iids (index + 1).
    strings: HashMap<String, u64>,
    string_values: Vec<String>,
    /// Whether each string is interned in the current file.
    string_interned: Vec<bool>,
}

impl Writer {
    fn new(out: &Output) -> Writer {
        Writer {
            sink: SplitSink::new(out),
            buf: Vec::with_capacity(256),
            tracks: Vec::new(),
            process_uuid: HashMap::new(),
            threads: Vec::new(),
            thread_index: HashMap::new(),
            last: None,
            funcs: Vec::new(),
            strings: HashMap::new(),
            string_values: Vec::new(),
            string_interned: Vec::new(),
        }
    }

    fn packet(&mut self, p: &TracePacket) -> Result<(), ExportError> {
        self.buf.clear();
        // The file is a `Trace`: field 1 repeated, one packet after the other.
        prost::encoding::message::encode(1, p, &mut self.buf);
        self.sink.write(&self.buf)
    }

    /// The first packets of a file: incremental state cleared, annotation names, tracks.
    fn start_file(&mut self) -> Result<(), ExportError> {
        self.funcs.iter_mut().flatten().for_each(|f| f.interned = false);
        self.string_interned.iter_mut().for_each(|b| *b = false);
        let names = [(ANN_MODULE, "module"), (ANN_ENDING, "ending"), (ANN_CONTINUED, "continued"), (ANN_SOURCE, "source")];
        self.packet(&TracePacket {
            trusted_packet_sequence_id: Some(SEQUENCE),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
            incremental_state_cleared: Some(true),
            first_packet_on_sequence: Some(true),
            interned_data: Some(InternedData {
                debug_annotation_names: names
                    .iter()
                    .map(|(iid, n)| EventName { iid: Some(*iid), name: Some(n.to_string()) })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        })?;
        for i in 0..self.tracks.len() {
            self.describe(i)?;
        }
        Ok(())
    }

    fn describe(&mut self, track: usize) -> Result<(), ExportError> {
        let p = TracePacket {
            trusted_packet_sequence_id: Some(SEQUENCE),
            track_descriptor: Some(self.tracks[track].clone()),
            ..Default::default()
        };
        self.packet(&p)
    }

    fn add_track(&mut self, descriptor: TrackDescriptor) -> Result<(), ExportError> {
        self.tracks.push(descriptor);
        if self.sink.at_start() {
            self.start_file()
        } else {
            self.describe(self.tracks.len() - 1)
        }
    }

    /// Index in `threads` of `c`'s thread, whose track (and its process's) is described when
    /// first met.
    fn thread(&mut self, cx: &WalkContext, c: &CallInfo) -> Result<usize, ExportError> {
        let key = (c.pid, c.tid);
        if let Some((k, i)) = self.last {
            if k == key {
                return Ok(i);
            }
        }
        if let Some(&i) = self.thread_index.get(&key) {
            self.last = Some((key, i));
            return Ok(i);
        }
        let (name, cmdline) = process_name(&cx.trace, c.pid);
        if !self.process_uuid.contains_key(&c.pid) {
            let uuid = self.tracks.len() as u64 + 1;
            self.process_uuid.insert(c.pid, uuid);
            self.add_track(TrackDescriptor {
                uuid: Some(uuid),
                process: Some(ProcessDescriptor {
                    pid: Some(c.pid as i32),
                    cmdline,
                    process_name: Some(name.clone()),
                }),
                ..Default::default()
            })?;
        }
        let uuid = self.tracks.len() as u64 + 1;
        self.add_track(TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: self.process_uuid.get(&c.pid).copied(),
            thread: Some(ThreadDescriptor {
                pid: Some(c.pid as i32),
                tid: Some(i64::from(c.tid)),
                thread_name: Some(cx.trace.thread_label(c.pid, c.tid, &name)),
            }),
            ..Default::default()
        })?;
        self.threads.push(ThreadTrack { uuid, open: Vec::new(), last_ns: 0 });
        let i = self.threads.len() - 1;
        self.thread_index.insert(key, i);
        self.last = Some((key, i));
        Ok(i)
    }

    /// The iid of an annotation string.
    fn string(&mut self, v: &str) -> u64 {
        let next = self.strings.len() as u64 + 1;
        let iid = *self.strings.entry(v.to_string()).or_insert(next);
        if iid == next {
            self.string_values.push(v.to_string());
            self.string_interned.push(false);
        }
        iid
    }

    /// Interns `c`'s name, module and source position in the current file if they are not
    /// yet, in a packet of their own.
    fn intern(&mut self, cx: &mut WalkContext, func: u32) -> Result<(), ExportError> {
        let f = func as usize;
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
            self.funcs[f] = Some(Func { strings, interned: false, tail: tail.encode_to_vec() });
        }
        let state = self.funcs[f].as_mut().expect("set above");
        if state.interned && state.strings.iter().all(|&s| self.string_interned[s as usize - 1]) {
            return Ok(());
        }
        let mut interned = InternedData::default();
        if !state.interned {
            state.interned = true;
            interned.event_names.push(EventName { iid: Some(u64::from(func) + 1), name: Some(cx.names.name(func).to_string()) });
        }
        for &s in &state.strings {
            let k = s as usize - 1;
            if !self.string_interned[k] {
                self.string_interned[k] = true;
                interned.debug_annotation_string_values.push(InternedString { iid: Some(s), str: Some(self.string_values[k].as_bytes().to_vec()) });
            }
        }
        self.packet(&TracePacket {
            trusted_packet_sequence_id: Some(SEQUENCE),
            sequence_flags: Some(SEQ_NEEDS_INCREMENTAL_STATE),
            interned_data: Some(interned),
            ..Default::default()
        })
    }

    /// The slice of `c` begins at `ns` on `track`.
    fn begin(&mut self, cx: &mut WalkContext, track: u64, c: &CallInfo, ns: u64, continued: bool) -> Result<(), ExportError> {
        self.intern(cx, c.func)?;
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
        self.sink.write_with(|out| slice_packet(out, ns, track, TYPE_SLICE_BEGIN, &[tail, &extra]))
    }

    fn end(&mut self, track: u64, ns: u64) -> Result<(), ExportError> {
        self.sink.write_with(|out| slice_packet(out, ns, track, TYPE_SLICE_END, &[]))
    }

    /// Ends the current file with every open slice ended where its thread last was, and
    /// starts the next with them begun again.
    fn cut(&mut self, cx: &mut WalkContext) -> Result<(), ExportError> {
        let open: Vec<(u64, u64, Vec<CallInfo>)> =
            self.threads.iter().filter(|t| !t.open.is_empty()).map(|t| (t.uuid, t.last_ns, t.open.clone())).collect();
        for (track, ns, calls) in &open {
            for _ in calls {
                self.end(*track, *ns)?;
            }
        }
        self.sink.end_part()?;
        self.start_file()?;
        for (track, ns, calls) in &open {
            for c in calls {
                self.begin(cx, *track, c, *ns, true)?;
            }
        }
        Ok(())
    }

    fn event(&mut self, cx: &mut WalkContext, ev: CallEvent) -> Result<(), ExportError> {
        let (c, entry) = match &ev {
            CallEvent::Enter(c) => (c, true),
            CallEvent::Exit(c) => (c, false),
        };
        let i = self.thread(cx, c)?;
        let ns = cx.clock.ns_since_start(ev.tsc());
        let splits = self.sink.splits();
        let t = &mut self.threads[i];
        t.last_ns = ns;
        let track = t.uuid;
        // Open calls are only needed to cut between files.
        if entry {
            if splits {
                t.open.push(*c);
            }
            self.begin(cx, track, c, ns, false)?;
        } else {
            if splits {
                t.open.pop();
            }
            self.end(track, ns)?;
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
        w.start_file()?;
    }
    w.sink.finish()?;
    Ok(trace.warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_prost() {
        for (ns, track, kind) in [(0, 1, TYPE_SLICE_BEGIN), (1_795_407_036_866_440_064, 300, TYPE_SLICE_END), (127, 128, TYPE_SLICE_BEGIN)] {
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
            slice_packet(&mut fast, ns, track, kind, &[&tail.encode_to_vec(), &extra.encode_to_vec()]);
            let mut event = tail.clone();
            event.debug_annotations.extend(extra.debug_annotations.clone());
            event.r#type = Some(kind);
            event.track_uuid = Some(track);
            let packet = TracePacket {
                timestamp: Some(ns),
                trusted_packet_sequence_id: Some(SEQUENCE),
                sequence_flags: (kind == TYPE_SLICE_BEGIN).then_some(SEQ_NEEDS_INCREMENTAL_STATE),
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
}
