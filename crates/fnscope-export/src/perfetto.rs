//! Perfetto's protobuf trace: a track per process and per thread, a slice per call with its
//! exact begin and end (wall-clock ns, as `replay --format lines` prints them), names
//! interned.
//!
//! The file is one packet sequence: its first packet clears the incremental state and
//! describes the tracks; names and modules are interned in the packet that first needs them.
//! With a split size every file is a sequence of its own, descriptors and interning repeated,
//! and the calls open at the cut are ended in the old file and begun again in the new one
//! (marked `continued`).

use crate::timeline::{process_name, walk_selected, Sink};
use crate::{ExportError, Options, Output, Progress};
use fnscope_analysis::{CallEvent, CallInfo, Ending, WalkContext};
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

/// A thread's slices begun and not yet ended, for a cut between files.
#[derive(Default)]
struct ThreadSlices {
    open: Vec<CallInfo>,
    last_ns: u64,
}

struct Writer {
    sink: Sink,
    buf: Vec<u8>,
    /// Processes' and threads' tracks, in the order met (uuid: index + 1).
    tracks: Vec<TrackDescriptor>,
    process_uuid: HashMap<u32, u64>,
    thread_uuid: HashMap<(u32, u32), u64>,
    threads: HashMap<(u32, u32), ThreadSlices>,
    /// Module iid of each function (0: not known yet).
    func_module: Vec<u64>,
    modules: HashMap<String, u64>,
    module_names: Vec<String>,
    /// Whether each function name / module has been interned in the current file.
    name_interned: Vec<bool>,
    module_interned: Vec<bool>,
}

impl Writer {
    fn packet(&mut self, p: &TracePacket) -> Result<(), ExportError> {
        self.buf.clear();
        // The file is a `Trace`: field 1 repeated, one packet after the other.
        prost::encoding::message::encode(1, p, &mut self.buf);
        self.sink.write(&self.buf)
    }

    /// The first packets of a file: incremental state cleared, annotation names, tracks.
    fn start_file(&mut self) -> Result<(), ExportError> {
        self.name_interned.iter_mut().for_each(|b| *b = false);
        self.module_interned.iter_mut().for_each(|b| *b = false);
        let names = [(ANN_MODULE, "module"), (ANN_ENDING, "ending"), (ANN_CONTINUED, "continued")];
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

    /// The track of `c`'s thread, described (with its process's) when first met.
    fn thread_track(&mut self, cx: &WalkContext, c: &CallInfo) -> Result<u64, ExportError> {
        if let Some(&u) = self.thread_uuid.get(&(c.pid, c.tid)) {
            return Ok(u);
        }
        let (name, cmdline) = process_name(&cx.trace, c.pid);
        if !self.process_uuid.contains_key(&c.pid) {
            let uuid = self.tracks.len() as u64 + 1;
            self.process_uuid.insert(c.pid, uuid);
            let d = TrackDescriptor {
                uuid: Some(uuid),
                process: Some(ProcessDescriptor {
                    pid: Some(c.pid as i32),
                    cmdline,
                    process_name: Some(name.clone()),
                }),
                ..Default::default()
            };
            self.add_track(d)?;
        }
        let uuid = self.tracks.len() as u64 + 1;
        self.thread_uuid.insert((c.pid, c.tid), uuid);
        let d = TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: self.process_uuid.get(&c.pid).copied(),
            thread: Some(ThreadDescriptor {
                pid: Some(c.pid as i32),
                tid: Some(i64::from(c.tid)),
                thread_name: Some(format!("{name} {}", c.tid)),
            }),
            ..Default::default()
        };
        self.add_track(d)?;
        Ok(uuid)
    }

    /// The slice of `c` begins at `ns` on `track`; names and module interned as needed.
    fn begin(&mut self, cx: &mut WalkContext, track: u64, c: &CallInfo, ns: u64, continued: bool) -> Result<(), ExportError> {
        let f = c.func as usize;
        if f >= self.func_module.len() {
            self.func_module.resize(f + 1, 0);
            self.name_interned.resize(f + 1, false);
        }
        if self.func_module[f] == 0 {
            let m = cx.names.module(c.func);
            let next = self.modules.len() as u64 + 1;
            let iid = *self.modules.entry(m.to_string()).or_insert(next);
            if iid == next {
                self.module_names.push(m.to_string());
                self.module_interned.push(false);
            }
            self.func_module[f] = iid;
        }
        let module = self.func_module[f];
        let mut interned = InternedData::default();
        if !self.name_interned[f] {
            self.name_interned[f] = true;
            interned.event_names.push(EventName { iid: Some(u64::from(c.func) + 1), name: Some(cx.names.name(c.func).to_string()) });
        }
        let m = module as usize - 1;
        if !self.module_interned[m] {
            self.module_interned[m] = true;
            interned.debug_annotation_string_values.push(InternedString {
                iid: Some(module),
                str: Some(self.module_names[m].as_bytes().to_vec()),
            });
        }
        let mut annotations = vec![DebugAnnotation { name_iid: Some(ANN_MODULE), string_value_iid: Some(module), ..Default::default() }];
        if c.ending != Ending::Returned {
            annotations.push(DebugAnnotation {
                name_iid: Some(ANN_ENDING),
                string_value: Some(c.ending.as_str().to_string()),
                ..Default::default()
            });
        }
        if continued {
            annotations.push(DebugAnnotation { name_iid: Some(ANN_CONTINUED), bool_value: Some(true), ..Default::default() });
        }
        let has_interned = !interned.event_names.is_empty() || !interned.debug_annotation_string_values.is_empty();
        self.packet(&TracePacket {
            timestamp: Some(ns),
            trusted_packet_sequence_id: Some(SEQUENCE),
            sequence_flags: Some(SEQ_NEEDS_INCREMENTAL_STATE),
            interned_data: has_interned.then_some(interned),
            track_event: Some(TrackEvent {
                debug_annotations: annotations,
                r#type: Some(TYPE_SLICE_BEGIN),
                name_iid: Some(u64::from(c.func) + 1),
                track_uuid: Some(track),
            }),
            ..Default::default()
        })
    }

    fn end(&mut self, track: u64, ns: u64) -> Result<(), ExportError> {
        self.packet(&TracePacket {
            timestamp: Some(ns),
            trusted_packet_sequence_id: Some(SEQUENCE),
            sequence_flags: Some(SEQ_NEEDS_INCREMENTAL_STATE),
            track_event: Some(TrackEvent { r#type: Some(TYPE_SLICE_END), track_uuid: Some(track), ..Default::default() }),
            ..Default::default()
        })
    }

    /// Ends the current file with every open slice ended where its thread last was, and
    /// starts the next with them begun again.
    fn cut(&mut self, cx: &mut WalkContext) -> Result<(), ExportError> {
        let mut open: Vec<((u32, u32), u64, Vec<CallInfo>)> = Vec::new();
        for (key, t) in &self.threads {
            if !t.open.is_empty() {
                open.push((*key, t.last_ns, t.open.clone()));
            }
        }
        open.sort_by_key(|(key, _, _)| *key);
        for (key, ns, calls) in &open {
            let track = self.thread_uuid[key];
            for _ in calls {
                self.end(track, *ns)?;
            }
        }
        self.sink.end_part()?;
        self.start_file()?;
        for (key, ns, calls) in &open {
            let track = self.thread_uuid[key];
            for c in calls {
                self.begin(cx, track, c, *ns, true)?;
            }
        }
        Ok(())
    }

    fn event(&mut self, cx: &mut WalkContext, ev: CallEvent) -> Result<(), ExportError> {
        let c = *ev.call();
        let track = self.thread_track(cx, &c)?;
        let ns = cx.trace.wall_ns(ev.tsc());
        let t = self.threads.entry((c.pid, c.tid)).or_default();
        t.last_ns = ns;
        match ev {
            CallEvent::Enter(_) => {
                t.open.push(c);
                self.begin(cx, track, &c, ns, false)?;
            }
            CallEvent::Exit(_) => {
                t.open.pop();
                self.end(track, ns)?;
            }
        }
        if self.sink.full() {
            self.cut(cx)?;
        }
        Ok(())
    }
}

pub(crate) fn write(input: &Path, opts: &Options, out: &Output, progress: Progress<'_>) -> Result<Vec<String>, ExportError> {
    let mut w = Writer {
        sink: Sink::new(out),
        buf: Vec::with_capacity(256),
        tracks: Vec::new(),
        process_uuid: HashMap::new(),
        thread_uuid: HashMap::new(),
        threads: HashMap::new(),
        func_module: Vec::new(),
        modules: HashMap::new(),
        module_names: Vec::new(),
        name_interned: Vec::new(),
        module_interned: Vec::new(),
    };
    let trace = walk_selected(input, opts, "perfetto", progress, |cx, ev| w.event(cx, ev))?;
    if w.sink.at_start() {
        w.start_file()?;
    }
    w.sink.finish()?;
    Ok(trace.warnings)
}
