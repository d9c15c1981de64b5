//! What the timeline exports (Perfetto, Chrome trace events) share: the walk through the
//! selection, the names of processes and threads, and output files that can be split.

use crate::{ExportError, Options, Output, Progress, Selector};
use fnscope_analysis::{walk_calls, AnalysisError, CallEvent, Order, Trace, WalkContext};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

/// How many calls between two progress reports.
const PROGRESS_EVERY: u64 = 1 << 16;

/// Walks the calls of `input` that `opts` selects, in [`Order::Completed`] (least held),
/// handing each selected entry and exit to `visit`, after refusing a trace without times
/// (`what` needs them). Returns the trace as read.
pub(crate) fn walk_selected(
    input: &Path,
    opts: &Options,
    what: &str,
    progress: Progress<'_>,
    mut visit: impl FnMut(&mut WalkContext, CallEvent) -> Result<(), ExportError>,
) -> Result<Trace, ExportError> {
    crate::require_times(input, what)?;
    let mut selector = Selector::new(opts)?;
    let mut failed = None;
    let mut events = 0u64;
    let walked = walk_calls(input, &opts.selection, Order::Completed, |cx, ev| {
        events += 1;
        if events.is_multiple_of(PROGRESS_EVERY) {
            progress(cx.bytes_read, cx.trace.bytes);
        }
        let step = match selector.select(cx, ev) {
            Some(ev) => visit(cx, ev),
            None => Ok(()),
        };
        step.map_err(|e| {
            failed = Some(e);
            // Only stops the walk: the error returned is the one kept in `failed`.
            AnalysisError::Output(std::io::Error::other("export stopped"))
        })
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let trace = walked?;
    progress(trace.bytes, trace.bytes);
    Ok(trace)
}

/// A process's name and command line from the image tables: the executable's file name (all
/// of them in order, `a → b`, when it ran `exec`), and the last command line.
pub(crate) fn process_name(trace: &Trace, pid: u32) -> (String, Vec<String>) {
    let mut names: Vec<&str> = Vec::new();
    let mut args = Vec::new();
    for img in trace.images.values().filter(|i| i.pid == pid) {
        let exe = Path::new(&img.exe).file_name().and_then(|n| n.to_str()).unwrap_or(&img.exe);
        if names.last() != Some(&exe) {
            names.push(exe);
        }
        args.clone_from(&img.args);
    }
    let name = if names.is_empty() { format!("process {pid}") } else { names.join(" → ") };
    (name, args)
}

/// Bytes handed to the writing thread at a time.
const CHUNK: usize = 1 << 20;

/// A file being written by a thread of its own, so that the walk and the encoding do not
/// wait for the kernel to copy the bytes (a fifth of an export's time).
struct Part {
    path: PathBuf,
    chunks: Option<SyncSender<Vec<u8>>>,
    returned: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Part {
    fn open(path: Option<PathBuf>) -> Result<Part, ExportError> {
        let (w, path): (Box<dyn Write + Send>, PathBuf) = match path {
            Some(p) => {
                let f = File::create(&p).map_err(|source| ExportError::Write { path: p.clone(), source })?;
                (Box::new(f), p)
            }
            None => (Box::new(std::io::stdout()), PathBuf::from("standard output")),
        };
        let (chunks, received) = sync_channel::<Vec<u8>>(4);
        // Written chunks come back to be filled again: a fresh megabyte each time cost as
        // much in page faults as the writing itself.
        let (give_back, returned) = sync_channel::<Vec<u8>>(8);
        let thread = std::thread::spawn(move || {
            let mut w = w;
            for mut chunk in received {
                w.write_all(&chunk)?;
                chunk.clear();
                let _ = give_back.try_send(chunk);
            }
            w.flush()
        });
        Ok(Part { path, chunks: Some(chunks), returned, thread: Some(thread) })
    }

    /// An empty chunk to fill: one written already if there is one.
    fn empty_chunk(&self) -> Vec<u8> {
        self.returned.try_recv().unwrap_or_else(|_| Vec::with_capacity(CHUNK))
    }

    fn send(&mut self, chunk: Vec<u8>) -> Result<(), ExportError> {
        let sent = self.chunks.as_ref().is_some_and(|c| c.send(chunk).is_ok());
        if sent {
            Ok(())
        } else {
            // The thread stopped on an error: its result says which.
            self.chunks = None;
            Err(self.close().err().unwrap_or_else(|| ExportError::Write {
                path: self.path.clone(),
                source: std::io::Error::other("the writing thread stopped"),
            }))
        }
    }

    fn close(&mut self) -> Result<(), ExportError> {
        self.chunks = None;
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(r)) => r.map_err(|source| ExportError::Write { path: self.path.clone(), source }),
            Some(Err(panic)) => std::panic::resume_unwind(panic),
        }
    }
}

/// The output: standard output or a file, or with a split size numbered files
/// (`NAME.1.EXT`, `NAME.2.EXT`, ...), opened when first written to so that a refused export
/// leaves nothing behind.
pub(crate) struct SplitSink {
    out: Output,
    /// Number of the current part (0 before the first; always 1 when not splitting).
    part: u32,
    file: Option<Part>,
    pending: Vec<u8>,
    /// Bytes written to the current part.
    written: u64,
}

impl SplitSink {
    pub(crate) fn new(out: &Output) -> SplitSink {
        SplitSink { out: out.clone(), part: 0, file: None, pending: Vec::new(), written: 0 }
    }

    fn path_of(&self, part: u32) -> Option<PathBuf> {
        let path = self.out.path.as_ref()?;
        if self.out.split_size.is_none() {
            return Some(path.clone());
        }
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let name = match path.extension() {
            Some(ext) => format!("{stem}.{part}.{}", ext.to_string_lossy()),
            None => format!("{stem}.{part}"),
        };
        Some(path.with_file_name(name))
    }

    /// Whether nothing was written to the current part yet.
    pub(crate) fn at_start(&self) -> bool {
        self.file.is_none()
    }

    /// Whether the output is split into files of a size.
    pub(crate) fn splits(&self) -> bool {
        self.out.split_size.is_some()
    }

    /// Whether the current part has reached the split size: time to end it.
    pub(crate) fn full(&self) -> bool {
        self.out.split_size.is_some_and(|s| self.written >= s)
    }

    /// Bytes written to the current part.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<(), ExportError> {
        self.write_with(|out| out.extend_from_slice(bytes))
    }

    /// Appends the bytes `fill` appends to the vector it is given: encoded in place, they
    /// are not copied from a buffer of the caller's.
    pub(crate) fn write_with(&mut self, fill: impl FnOnce(&mut Vec<u8>)) -> Result<(), ExportError> {
        if self.file.is_none() {
            self.part += 1;
            let part = Part::open(self.path_of(self.part))?;
            self.pending = part.empty_chunk();
            self.file = Some(part);
            self.written = 0;
        }
        let before = self.pending.len();
        fill(&mut self.pending);
        self.written += (self.pending.len() - before) as u64;
        if self.pending.len() >= CHUNK {
            let part = self.file.as_mut().expect("opened above");
            let chunk = std::mem::replace(&mut self.pending, part.empty_chunk());
            part.send(chunk)?;
        }
        Ok(())
    }

    /// Writes out and closes the current part: the next write starts a new one.
    pub(crate) fn end_part(&mut self) -> Result<(), ExportError> {
        if let Some(mut part) = self.file.take() {
            let rest = std::mem::take(&mut self.pending);
            if !rest.is_empty() {
                part.send(rest)?;
            }
            part.close()?;
        }
        Ok(())
    }

    /// Closes the output; returns how many files were written.
    pub(crate) fn finish(mut self) -> Result<u32, ExportError> {
        self.end_part()?;
        Ok(self.part)
    }
}
