//! Chrome's trace-event JSON: a complete event (`"ph":"X"`) per call, written when the call
//! ends, with `ts` and `dur` in µs to the ns (three decimals) from the start of the
//! recording, whose wall-clock time is in `otherData.start_unix_ns`; process and thread
//! names as metadata events. With a split size each file is a whole JSON document with the
//! names repeated, and a call goes to the file its end falls in.

use crate::timeline::{process_name, walk_selected, SplitSink};
use crate::{ExportError, Options, Output, Progress};
use fnscope_analysis::{CallEvent, CallInfo, Ending, Trace, WalkContext};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

/// Beyond this many events in one file, or this many bytes, chrome://tracing and Perfetto's
/// JSON import fail or crawl.
const VIEWER_MAX_EVENTS: u64 = 1_000_000;
const VIEWER_MAX_BYTES: u64 = 256 << 20;

/// JSON strings of a function, escaped once.
struct FuncJson {
    name: String,
    module: String,
    /// `,"source":"file:line"` when known, else empty.
    source: String,
}

struct Writer {
    sink: SplitSink,
    buf: Vec<u8>,
    /// `otherData` of every file.
    other: String,
    /// Metadata events of every process and thread met so far, repeated in each file.
    names: Vec<String>,
    processes: HashMap<u32, String>,
    threads: HashSet<(u32, u32)>,
    funcs: Vec<Option<FuncJson>>,
    /// Events in the current file, and the most of any file.
    events: u64,
    most_events: u64,
    most_bytes: u64,
    files: u32,
}

fn json(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serialises")
}

/// `ns` as µs with three decimals: exact, whatever the size.
fn micros(buf: &mut Vec<u8>, ns: u64) {
    let _ = write!(buf, "{}.{:03}", ns / 1000, ns % 1000);
}

impl Writer {
    fn new(out: &Output) -> Writer {
        Writer {
            sink: SplitSink::new(out),
            buf: Vec::with_capacity(512),
            other: String::new(),
            names: Vec::new(),
            processes: HashMap::new(),
            threads: HashSet::new(),
            funcs: Vec::new(),
            events: 0,
            most_events: 0,
            most_bytes: 0,
            files: 0,
        }
    }

    /// Starts a file: its header, then the names of every process and thread met so far.
    fn open_file(&mut self) -> Result<(), ExportError> {
        let head = format!("{{\"otherData\":{},\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n", self.other);
        self.sink.write(head.as_bytes())?;
        self.events = 0;
        for i in 0..self.names.len() {
            let m = std::mem::take(&mut self.names[i]);
            let r = self.element(m.as_bytes());
            self.names[i] = m;
            r?;
        }
        Ok(())
    }

    fn write_event(&mut self, event: &[u8]) -> Result<(), ExportError> {
        if self.sink.at_start() {
            self.open_file()?;
        }
        self.element(event)
    }

    fn element(&mut self, event: &[u8]) -> Result<(), ExportError> {
        if self.events > 0 {
            self.sink.write(b",\n")?;
        }
        self.events += 1;
        self.sink.write(event)
    }

    fn end_file(&mut self) -> Result<(), ExportError> {
        self.sink.write(b"\n]}\n")?;
        self.most_events = self.most_events.max(self.events);
        self.most_bytes = self.most_bytes.max(self.sink.written());
        self.files += 1;
        self.sink.end_part()
    }

    fn other_data(&mut self, trace: &Trace) {
        if self.other.is_empty() {
            self.other = format!(
                "{{\"start_unix_ns\":{},\"command\":{}}}",
                trace.meta.start_unix_ns,
                serde_json::to_string(&trace.meta.command).expect("strings always serialise")
            );
        }
    }

    /// Names `c`'s process and thread the first time they are met.
    fn name_thread(&mut self, cx: &WalkContext, c: &CallInfo) -> Result<(), ExportError> {
        if !self.threads.insert((c.pid, c.tid)) {
            return Ok(());
        }
        let mut new = Vec::new();
        let pname = match self.processes.get(&c.pid) {
            Some(n) => n.clone(),
            None => {
                let (name, _) = process_name(&cx.trace, c.pid);
                new.push(format!(
                    "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":{}}}}}",
                    c.pid,
                    json(&name)
                ));
                self.processes.insert(c.pid, name.clone());
                name
            }
        };
        new.push(format!(
            "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}",
            c.pid,
            c.tid,
            json(&cx.trace.thread_label(c.pid, c.tid, &pname))
        ));
        for m in new {
            if !self.sink.at_start() {
                self.element(m.as_bytes())?;
            }
            // A file started later repeats it; one starting now writes it with the others.
            self.names.push(m);
        }
        Ok(())
    }

    fn event(&mut self, cx: &mut WalkContext, ev: CallEvent) -> Result<(), ExportError> {
        let CallEvent::Exit(c) = ev else {
            return Ok(());
        };
        self.other_data(&cx.trace);
        self.name_thread(cx, &c)?;
        let f = c.func as usize;
        if f >= self.funcs.len() {
            self.funcs.resize_with(f + 1, || None);
        }
        let func = self.funcs[f].get_or_insert_with(|| FuncJson {
            name: json(cx.names.name(c.func)),
            module: json(cx.names.module(c.func)),
            source: cx.names.source(c.func).map(|s| format!(",\"source\":{}", json(s))).unwrap_or_default(),
        });
        let start = cx.clock.ns_since_start(c.entry_tsc);
        let end = cx.clock.ns_since_start(c.exit_tsc);
        let mut b = std::mem::take(&mut self.buf);
        b.clear();
        let _ = write!(b, "{{\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":", c.pid, c.tid);
        micros(&mut b, start);
        b.extend_from_slice(b",\"dur\":");
        micros(&mut b, end - start);
        let _ = write!(b, ",\"name\":{},\"args\":{{\"module\":{}{}", func.name, func.module, func.source);
        if c.ending != Ending::Returned {
            let _ = write!(b, ",\"ending\":\"{}\"", c.ending.as_str());
        }
        if let Some(v) = cx.values(&c) {
            for (k, (name, value)) in v.args.iter().enumerate() {
                let key = name.clone().unwrap_or_else(|| format!("arg{}", k + 1));
                let _ = write!(b, ",{}:{}", json(&key), json(value));
            }
            if let Some(r) = &v.ret {
                let _ = write!(b, ",\"return\":{}", json(r));
            }
            if let Some(i) = &v.injection {
                let _ = write!(b, ",\"injected\":{}", json(i.rule()));
            }
        }
        b.extend_from_slice(b"}}");
        let r = self.write_event(&b);
        self.buf = b;
        r?;
        if self.sink.full() {
            self.end_file()?;
        }
        Ok(())
    }
}

pub(crate) fn write(input: &Path, opts: &Options, out: &Output, progress: Progress<'_>) -> Result<Vec<String>, ExportError> {
    let mut w = Writer::new(out);
    let trace = walk_selected(input, opts, "a Chrome trace-event timeline", progress, |cx, ev| w.event(cx, ev))?;
    w.other_data(&trace);
    if w.sink.at_start() && w.files == 0 {
        w.open_file()?;
    }
    if !w.sink.at_start() {
        w.end_file()?;
    }
    w.sink.finish()?;
    let mut warnings = trace.warnings;
    if w.most_events > VIEWER_MAX_EVENTS || w.most_bytes > VIEWER_MAX_BYTES {
        warnings.push(format!(
            "{} holds {} events ({} MiB): chrome://tracing and Perfetto's JSON import fail or \
             crawl beyond about 1 M events or 256 MiB. Use --format perfetto (compact, opens \
             far larger traces), a --time window, or --split-size 200M",
            if w.files > 1 { "one of the files" } else { "the output" },
            w.most_events,
            w.most_bytes >> 20
        ));
    }
    Ok(warnings)
}
