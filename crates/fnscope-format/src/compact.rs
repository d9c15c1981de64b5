//! [`compact`]: a trace file rewritten with its RAW chunks encoded, on every processor.
//!
//! The recorder compacts once the program has ended, while the user waits, and nothing else
//! runs then: a `make -j2` whose recorder fell behind leaves hundreds of RAW chunks, whose
//! encoding took a third of the traced build's wall time on one core. The calling thread
//! reads and writes the file; workers encode RAW chunks as they come; chunks are written in
//! the order they were read.

use crate::segment::{SegmentEncoder, SegmentPayloads};
use crate::{io_err, raw_parts, split_data_into, CallData, FormatError, TraceReader, TraceWriter, CHECKSUM_OF_HEAD_SINCE, KIND_RAW, RAW_SLOT_COUNT_MISMATCH};
use fnscope_abi::Record;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Mutex;

/// RAW chunks at the workers, per worker: enough to keep each busy while the calling thread
/// reads and writes.
const IN_FLIGHT_PER_WORKER: usize = 4;
/// Chunks read and not yet written, per RAW chunk at the workers: they wait behind the oldest
/// RAW chunk not encoded yet, and bound the memory with it (chunks of 256 KiB by default).
const QUEUED_PER_IN_FLIGHT: usize = 4;
/// Most threads that encode.
const MAX_WORKERS: usize = 8;

/// What [`compact`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compacted {
    /// RAW chunks turned into EVENTS (and CALLDATA) chunks.
    pub raw_chunks: u64,
    /// Size of the file before.
    pub bytes_before: u64,
    /// Size of the file after.
    pub bytes_after: u64,
}

/// Rewrites the trace file at `path` with every RAW chunk encoded and compressed as the EVENTS
/// chunk (and CALLDATA chunk) it stands for, every other chunk copied unchanged, in the same
/// order and format version (a version 1 file, whose checksums are not written any more,
/// becomes version 2): byte for byte the file that [`TraceWriter::write_segment`] would have
/// written for each chunk (not joined: [`TraceWriter::join_segment`]). The new file replaces the old one only once it is whole: if anything fails (a
/// damaged chunk, a file cut short, an error writing), the old one stays, and it reads the
/// same. `progress` is told the bytes read so far and the size. RAW chunks are encoded on
/// every processor (at most 8).
pub fn compact(path: &Path, progress: impl FnMut(u64, u64)) -> Result<Compacted, FormatError> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS);
    compact_with(path, workers, workers * IN_FLIGHT_PER_WORKER, progress)
}

/// [`compact`] with at most `workers` encoding threads, at most `in_flight` RAW chunks at
/// the workers, and at most [`QUEUED_PER_IN_FLIGHT`] times as many chunks read and not yet
/// written.
pub(crate) fn compact_with(path: &Path, workers: usize, in_flight: usize, mut progress: impl FnMut(u64, u64)) -> Result<Compacted, FormatError> {
    let in_flight = in_flight.max(1);
    let queued = in_flight * QUEUED_PER_IN_FLIGHT;
    let mut reader = TraceReader::open(path)?;
    let path = reader.path().to_path_buf();
    let size = std::fs::metadata(&path).map_err(io_err("read", &path))?.len();
    let tmp = path.with_extension("fns.compacting");
    // The chunks copied unchanged keep their meaning only in a file of their version (from 2:
    // a writer's checksums cover kind and length, and a version 1 file holds no RAW chunks).
    let version = reader.version().max(CHECKSUM_OF_HEAD_SINCE);
    let mut writer = TraceWriter::create_as(&tmp, version)?;
    let mut done = Compacted { bytes_before: size, ..Default::default() };
    let result = Worker::make(&path, version, workers).and_then(|encoders| {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done_rx) = mpsc::channel::<Job>();
        let job_rx = Mutex::new(job_rx);
        std::thread::scope(|s| {
            let (mut started, mut refused) = (0, None);
            for w in encoders {
                let (jobs, finished) = (&job_rx, done_tx.clone());
                // Fewer threads than asked for (a limit on processes) only make it slower.
                match std::thread::Builder::new().name("fnscope-compact".into()).spawn_scoped(s, move || w.run(jobs, finished)) {
                    Ok(_) => started += 1,
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            // Jobs come back while a worker holds a sender: with none, a job never would.
            drop(done_tx);
            if let (0, Some(e)) = (started, refused) {
                return Err(io_err("start a thread to encode the chunks of", &path)(e));
            }
            let mut order = InOrder::default();
            let mut read = || -> Result<(), FormatError> {
                loop {
                    let at = reader.offset();
                    let Some((kind, payload)) = reader.next_verbatim()? else { break };
                    if kind != KIND_RAW {
                        order.copy(kind, payload, &mut writer)?;
                    } else {
                        let mut job = order.raw(at);
                        // Swapped, not copied: the job takes the reader's buffer and leaves
                        // its own (of a chunk written already), so no chunk is copied or
                        // allocated for on the way to its worker.
                        reader.swap_payload(&mut job.payload);
                        job_tx.send(job).expect("the jobs' receiver outlives this loop");
                    }
                    while order.at_workers >= in_flight || (order.at_workers > 0 && order.queue.len() >= queued) {
                        order.finished(done_rx.recv().expect("every job comes back"));
                        done.raw_chunks += order.write(&mut writer)?;
                    }
                    for job in done_rx.try_iter() {
                        order.finished(job);
                    }
                    done.raw_chunks += order.write(&mut writer)?;
                    progress(reader.offset(), size);
                }
                if reader.truncated() {
                    return Err(FormatError::Corrupt { path: path.clone(), offset: reader.offset(), what: "the file ends inside a chunk or before its END chunk: not compacted".into() });
                }
                Ok(())
            };
            let r = read();
            // Workers stop once the jobs are all taken.
            drop(job_tx);
            while order.at_workers > 0 {
                order.finished(done_rx.recv().expect("every job comes back"));
            }
            // The chunks read before a damaged one come first in the file: a RAW chunk among
            // them that cannot be encoded is the error to report.
            if !order.broken {
                done.raw_chunks += order.write(&mut writer)?;
            }
            r?;
            writer.flush()?;
            done.bytes_after = writer.bytes_written();
            progress(size, size);
            Ok(())
        })
    });
    drop(writer);
    match result.and_then(|()| std::fs::rename(&tmp, &path).map_err(io_err("replace", &path))) {
        Ok(()) => Ok(done),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The chunks read and not yet written, in file order: a RAW chunk's place is filled when its
/// worker hands it back, and chunks are written from the front while they are ready.
#[derive(Default)]
struct InOrder {
    /// From the first chunk not written yet on.
    queue: VecDeque<Pending>,
    /// Index of the chunk at the front of `queue`.
    first: u64,
    /// RAW chunks with the workers.
    at_workers: usize,
    /// Jobs written, to be used again.
    spare: Vec<Job>,
    /// Set when writing failed: nothing more is written.
    broken: bool,
}

impl InOrder {
    /// A job for the RAW chunk at `at`, next in the file.
    fn raw(&mut self, at: u64) -> Job {
        let mut job = self.spare.pop().unwrap_or_default();
        (job.at, job.index) = (at, self.first + self.queue.len() as u64);
        self.queue.push_back(Pending::Raw(None));
        self.at_workers += 1;
        job
    }

    /// The chunk of `kind` next in the file, copied as it is: at once when nothing waits
    /// before it, else when its turn comes (a copy of it waits).
    fn copy(&mut self, kind: u32, payload: &[u8], writer: &mut TraceWriter) -> Result<(), FormatError> {
        if self.queue.is_empty() {
            self.first += 1;
            let r = writer.emit(kind, payload);
            self.broken |= r.is_err();
            r
        } else {
            self.queue.push_back(Pending::Copy(kind, payload.to_vec()));
            Ok(())
        }
    }

    /// Takes back a job from a worker.
    fn finished(&mut self, job: Job) {
        self.at_workers -= 1;
        let k = (job.index - self.first) as usize;
        self.queue[k] = Pending::Raw(Some(job));
    }

    /// Writes the chunks ready at the front; returns how many were RAW. A RAW chunk that could
    /// not be encoded stops everything: the first such chunk in the file is the one reported.
    fn write(&mut self, writer: &mut TraceWriter) -> Result<u64, FormatError> {
        let r = self.write_ready(writer);
        self.broken |= r.is_err();
        r
    }

    /// [`InOrder::write`], whose failures mark the queue broken.
    fn write_ready(&mut self, writer: &mut TraceWriter) -> Result<u64, FormatError> {
        let mut raws = 0;
        while let Some(p) = self.queue.front_mut() {
            match p {
                Pending::Copy(kind, payload) => writer.emit(*kind, payload)?,
                Pending::Raw(None) => break,
                Pending::Raw(Some(job)) => {
                    if let Some(e) = job.failed.take() {
                        return Err(e);
                    }
                    writer.emit_segment(&job.out)?;
                    raws += 1;
                }
            }
            if let Some(Pending::Raw(Some(job))) = self.queue.pop_front() {
                self.spare.push(job);
            }
            self.first += 1;
        }
        Ok(raws)
    }
}

/// A chunk read and not yet written.
enum Pending {
    /// Written again as it is: kind and payload.
    Copy(u32, Vec<u8>),
    /// A RAW chunk, once its worker has encoded it.
    Raw(Option<Job>),
}

/// A RAW chunk handed to a worker, and what it became. Jobs are used again, buffers and all:
/// fresh buffers for every chunk would each be memory to fault in.
#[derive(Default)]
struct Job {
    /// Its place among the chunks read.
    index: u64,
    /// Its offset in the file, for an error about it.
    at: u64,
    /// The RAW chunk's payload.
    payload: Vec<u8>,
    /// Its segment's chunks.
    out: SegmentPayloads,
    /// Why it could not be encoded.
    failed: Option<FormatError>,
}

/// One thread's encoder and buffers.
struct Worker {
    enc: SegmentEncoder,
    /// The RAW chunk's slots.
    slots: Vec<Record>,
    /// Its call records, without the data slots.
    calls: Vec<Record>,
    /// Its data units.
    data: CallData,
}

impl Worker {
    /// `n` workers (at least one) for a file of `version` at `path`.
    fn make(path: &Path, version: u32, n: usize) -> Result<Vec<Worker>, FormatError> {
        (0..n.max(1))
            .map(|_| Ok(Worker { enc: SegmentEncoder::new(path, version)?, slots: Vec::new(), calls: Vec::new(), data: CallData::default() }))
            .collect()
    }

    /// Encodes jobs until there are no more. A panic (a bug) fails its job rather than leave
    /// the calling thread waiting for it; that failure stops the compaction when its turn
    /// comes, so whatever the panic left in this worker's buffers is never written.
    fn run(mut self, jobs: &Mutex<mpsc::Receiver<Job>>, finished: mpsc::Sender<Job>) {
        // The lock is held only while waiting for a job, by code that cannot panic.
        while let Ok(mut job) = jobs.lock().map_err(drop).and_then(|rx| rx.recv().map_err(drop)) {
            if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.encode(&mut job))) {
                let why = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
                job.failed = Some(FormatError::Corrupt { path: self.enc.path().to_path_buf(), offset: job.at, what: format!("encoding this RAW chunk failed (a bug in fnscope: {why})") });
            }
            if finished.send(job).is_err() {
                break;
            }
        }
    }

    /// Encodes the job's RAW chunk into its EVENTS and CALLDATA payloads.
    fn encode(&mut self, job: &mut Job) {
        job.failed = None;
        let Some(h) = raw_parts(&job.payload, &mut self.slots) else {
            job.failed = Some(FormatError::Corrupt { path: self.enc.path().to_path_buf(), offset: job.at, what: RAW_SLOT_COUNT_MISMATCH.into() });
            return;
        };
        split_data_into(&self.slots, &mut self.calls, &mut self.data);
        if let Err(e) = self.enc.encode(&h, &self.calls, &self.data, &mut job.out) {
            job.failed = Some(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure to encode the chunk at `at`.
    fn failure(at: u64) -> FormatError {
        FormatError::Corrupt { path: "t.fns".into(), offset: at, what: "test".into() }
    }

    /// Runs `f` on a fresh queue and a writer of a scratch file; returns the chunks written
    /// (kind and payload).
    fn written(name: &str, f: impl FnOnce(&mut InOrder, &mut TraceWriter)) -> Vec<(u32, Vec<u8>)> {
        let path = crate::tests::tmpdir(name).join("t.fns");
        let mut w = TraceWriter::create(&path).unwrap();
        f(&mut InOrder::default(), &mut w);
        w.flush().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let chunk = |at: usize| {
            let body = at + crate::CHUNK_HEADER_SIZE as usize;
            (crate::le32(&bytes, at), bytes[body..body + crate::le32(&bytes, at + 4) as usize].to_vec())
        };
        crate::tests::chunk_offsets(&bytes).into_iter().map(chunk).collect()
    }

    /// Jobs come back in any order; chunks are written in file order, and of two failed RAW
    /// chunks the first in the file is reported even when the later one came back first.
    #[test]
    fn chunks_are_written_in_file_order() {
        let got = written("inorder", |order, w| {
            order.copy(1, b"first", w).unwrap();
            let mut a = order.raw(100);
            order.copy(2, b"after a", w).unwrap();
            let mut b = order.raw(200);
            let mut c = order.raw(300);
            assert_eq!((a.index, b.index, c.index), (1, 3, 4));
            b.out.events = b"b events".to_vec();
            c.failed = Some(failure(300));
            order.finished(c);
            order.finished(b);
            // `a` is still out: nothing after it may be written.
            assert_eq!(order.write(w).unwrap(), 0);
            a.failed = Some(failure(100));
            order.finished(a);
            match order.write(w) {
                Err(FormatError::Corrupt { offset: 100, .. }) => {}
                r => panic!("{:?}", r.map_err(|e| e.to_string())),
            }
            assert!(order.broken);
        });
        // Only the chunk before `a`.
        assert_eq!(got, [(1, b"first".to_vec())]);
    }

    /// Without failures, everything is written in order once the jobs are back.
    #[test]
    fn jobs_back_out_of_order_are_written_in_order() {
        let got = written("inorder2", |order, w| {
            let mut jobs: Vec<Job> = (0..5u8).map(|k| order.raw(u64::from(k))).collect();
            order.copy(9, b"last", w).unwrap();
            for (k, j) in jobs.iter_mut().enumerate() {
                j.out.events = vec![k as u8; 3];
            }
            for j in jobs.into_iter().rev() {
                order.finished(j);
            }
            assert_eq!(order.write(w).unwrap(), 5);
            assert_eq!(order.at_workers, 0);
            assert!(order.queue.is_empty());
        });
        let want: Vec<(u32, Vec<u8>)> = (0..5u8).map(|k| (crate::KIND_EVENTS, vec![k; 3])).chain([(9, b"last".to_vec())]).collect();
        assert_eq!(got, want);
    }
}
