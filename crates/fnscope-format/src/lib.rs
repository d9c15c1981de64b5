//! The fnscope trace file, `DIR/trace.fns`: a versioned sequence of checksummed chunks.
//!
//! The recorder writes it with [`TraceWriter`]; analysis reads it back, one chunk at a time,
//! with [`TraceReader`]. The byte layout is documented in `docs/FORMAT.md`.
//!
//! A reader never needs the whole file in memory, and a file cut short (recorder killed, disk
//! full) still yields every complete chunk, with [`TraceReader::truncated`] telling that the
//! trace ended abruptly.

#![warn(missing_docs)]

mod compact;
mod events;
mod image;
mod segment;
mod torn;

pub use compact::{compact, Compacted};
pub use torn::end_torn_trace;

pub use image::{FuncEntry, ImageTable, ModuleEntry, SkipEntry, ValuesEntry};

use fnscope_abi::Record;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// Version of the trace file format written by this crate; readers refuse newer versions.
///
/// Version 2 made each chunk's checksum cover its kind and length too; version 1 files
/// (checksum of the payload only) are still read. Version 3 added RAW chunks, which a version
/// 2 reader would skip, losing their calls (only files holding one said 3). Version 4 stores
/// a leaf's times as the gap since the previous exit and its duration (see docs/FORMAT.md),
/// which an older reader would misread: every file says 4. Version 5 compresses IMAGE
/// chunks' tables. Version 6 compresses EVENTS chunks' time columns in a zstd frame of their
/// own, which a version 5 reader might not make room for. Version 7 splits the time columns
/// into six streams by the kind of record (see docs/FORMAT.md), which a version 6 reader
/// would read as two.
pub const FORMAT_VERSION: u32 = 7;
/// First version whose IMAGE chunks hold their table as two zstd frames (see
/// [`TraceWriter::write_image`]).
const PACKED_IMAGES_SINCE: u32 = 5;
/// zstd level of image tables: a big program's table (3 MiB for `cc1plus`) compresses while
/// the program starts, and level 1 keeps that to about 10 ms for a 4.7-fold smaller table.
const IMAGE_ZSTD_LEVEL: i32 = 1;
/// Compressed image table bodies a writer keeps for reuse, most recent first.
const PACKED_BODIES_KEPT: usize = 4;
/// First version whose EVENTS chunks hold two zstd frames, the time columns in the second.
const TIME_FRAME_SINCE: u32 = 6;
/// First version whose EVENTS chunks hold their time columns as six streams by record class.
const TIME_CLASSES_SINCE: u32 = 7;
/// First version whose EVENTS chunks store leaves' times as gap and duration.
const LEAF_GAPS_SINCE: u32 = 4;
/// First version whose chunk checksums cover kind and length too.
const CHECKSUM_OF_HEAD_SINCE: u32 = 2;
/// First version with RAW chunks.
const RAW_SINCE: u32 = 3;
/// Oldest format version this crate reads.
pub const OLDEST_READABLE_VERSION: u32 = 1;
/// First eight bytes of a trace file.
pub const MAGIC: [u8; 8] = *b"FNSCOPE\0";
/// Name of the trace file inside a trace directory.
pub const TRACE_FILE: &str = "trace.fns";
/// Size of the file header: magic, version, flags.
pub const FILE_HEADER_SIZE: u64 = 16;
/// Size of a chunk header: kind, payload length, CRC-32.
pub const CHUNK_HEADER_SIZE: u64 = 12;

/// Chunk kind: [`Meta`] as JSON.
pub const KIND_META: u32 = 1;
/// Chunk kind: an image table (u32 sid, then the table text).
pub const KIND_IMAGE: u32 = 2;
/// Chunk kind: one thread segment (see docs/FORMAT.md).
pub const KIND_EVENTS: u32 = 3;
/// Chunk kind: [`EndInfo`] as JSON.
pub const KIND_END: u32 = 4;
/// Chunk kind: call counts of one thread (count mode).
pub const KIND_COUNTS: u32 = 5;
/// Chunk kind: per-function totals of one module over several runs (merged traces).
pub const KIND_SUMMARY: u32 = 6;
/// Chunk kind: the data units (arguments, return values, injections) of the calls of the
/// EVENTS chunk that follows it. Readers that do not know it skip it and see the calls
/// without their values.
pub const KIND_CALLDATA: u32 = 7;
/// Chunk kind: one thread segment as the agent wrote it in shared memory, uncompressed (the
/// EVENTS header, then the 24-byte slots, data slots included). The recorder writes these when
/// it falls behind the program, and turns them into EVENTS (and CALLDATA) chunks when the
/// program has ended ([`compact`]); a recorder stopped before that leaves them, and they read
/// like the EVENTS chunk they stand for.
pub const KIND_RAW: u32 = 8;

/// The checksum stored in a chunk header (format version 2 on): CRC-32 (IEEE) of the header's
/// first 8 bytes (kind and length, little-endian) followed by the payload, so that a changed
/// kind or length is caught like a changed payload.
pub fn chunk_checksum(kind: u32, payload: &[u8]) -> u32 {
    u32::from_le_bytes(chunk_head(kind, payload.len() as u32, &[payload])[8..].try_into().expect("4 bytes"))
}

/// The 12-byte header of a chunk of `kind` whose payload of `len` bytes is `parts` one after
/// the other (a payload written in pieces is checksummed without being put together).
fn chunk_head(kind: u32, len: u32, parts: &[&[u8]]) -> [u8; CHUNK_HEADER_SIZE as usize] {
    let mut head = [0u8; CHUNK_HEADER_SIZE as usize];
    head[0..4].copy_from_slice(&kind.to_le_bytes());
    head[4..8].copy_from_slice(&len.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&head[..8]);
    for p in parts {
        h.update(p);
    }
    head[8..12].copy_from_slice(&h.finalize().to_le_bytes());
    head
}

/// The fixed header of an EVENTS (or RAW) payload; `nrec` counts records (RAW: slots).
#[allow(clippy::too_many_arguments)]
fn events_head(image_sid: u32, pid: u32, tid: u32, seq: u64, nrec: u32, lost: u64, flags: u32) -> [u8; EVENTS_HEADER_SIZE] {
    let mut e = [0u8; EVENTS_HEADER_SIZE];
    e[0..4].copy_from_slice(&image_sid.to_le_bytes());
    e[4..8].copy_from_slice(&pid.to_le_bytes());
    e[8..12].copy_from_slice(&tid.to_le_bytes());
    e[12..20].copy_from_slice(&seq.to_le_bytes());
    e[20..24].copy_from_slice(&nrec.to_le_bytes());
    e[24..32].copy_from_slice(&lost.to_le_bytes());
    e[32..36].copy_from_slice(&flags.to_le_bytes());
    e
}

/// The segment an EVENTS (or RAW) payload's fixed header describes, without its records
/// (the caller checked the payload is at least [`EVENTS_HEADER_SIZE`] long).
fn segment_head(p: &[u8]) -> ThreadSegment {
    ThreadSegment { image_sid: le32(p, 0), pid: le32(p, 4), tid: le32(p, 8), seq: le64(p, 12), lost: le64(p, 24), flags: le32(p, 32), ..Default::default() }
}

/// Largest payload a reader accepts; bigger lengths can only come from damage.
const MAX_PAYLOAD: u32 = 1 << 30;
/// Size of the fixed part of an EVENTS payload.
const EVENTS_HEADER_SIZE: usize = 36;
/// Size of a CALLDATA chunk's fixed header.
const CALLDATA_HEADER_SIZE: usize = 20;
/// Bytes before the zstd frame in a COUNTS payload: sid, pid, tid, count of counters.
const COUNTS_HEADER_SIZE: usize = 16;

/// What was traced and how; the first chunk of a trace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Meta {
    /// Command line of the traced program.
    pub command: Vec<String>,
    /// Working directory it ran in.
    pub cwd: String,
    /// Wall-clock time when recording started, in ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Time-stamp counter read at the same moment as `start_unix_ns`.
    pub tsc_at_start: u64,
    /// Host name.
    pub host: String,
    /// Version of the fnscope that recorded.
    pub fnscope_version: String,
    /// Recording mode: `"time"` for paired entry/exit records, `"count"` for call counts
    /// only, `"merged"` for a trace made by `fnscope merge` out of several runs.
    pub mode: String,
    /// Recorded with `record --flight`: the calls are in the snapshots (`snapshot-N` folders
    /// next to this file), not here. Absent (false) otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub flight: bool,
}

/// The META JSON of a merged trace: [`Meta`] plus the list of runs it was made of.
#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct MergedMeta {
    #[serde(flatten)]
    meta: Meta,
    runs: Vec<RunInfo>,
}

/// One recorded run that went into a merged trace (listed in the `runs` array of its META).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct RunInfo {
    /// The trace it was read from, as named to `fnscope merge`.
    pub trace: String,
    /// Command line of the traced program.
    pub command: Vec<String>,
    /// Host name.
    pub host: String,
    /// Wall-clock start of the recording, in ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Recording mode of the run: `"time"` or `"count"`.
    pub mode: String,
}

/// Per-function totals of one module over the runs of a merged trace: the payload of a
/// SUMMARY chunk.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct ModuleSummary {
    /// Path of the module file.
    pub path: String,
    /// GNU build-id in hex, when the module has one.
    pub build_id: Option<String>,
    /// Every function of the module that some run listed, hooked or not.
    pub functions: Vec<FunctionSummary>,
}

/// One function's totals over the runs of a merged trace. Calls come from every run;
/// times only from the runs that recorded them (`timed_calls` of the calls).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default)]
pub struct FunctionSummary {
    /// Link-time address in the module.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Symbol name as found in the ELF file (mangled), `sub_<hex address>` when unnamed.
    pub name: String,
    /// Whether some run hooked the function; when false, `reason` says why none could.
    pub hooked: bool,
    /// One of the `fnscope_abi::skip_reason` codes; empty when hooked.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Specifics of `reason`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Calls, summed over the runs.
    pub calls: u64,
    /// Fewest calls in one run (0 when some run did not call it).
    pub calls_min: u64,
    /// Most calls in one run.
    pub calls_max: u64,
    /// Calls made in the runs that recorded times: the divisor of the average call time.
    pub timed_calls: u64,
    /// Summed duration of the timed calls, in ns.
    pub total_ns: u64,
    /// Summed self time of the timed calls, in ns.
    pub self_ns: u64,
    /// Shortest timed call, in ns (0 without timed calls).
    pub min_ns: u64,
    /// Longest timed call, in ns.
    pub max_ns: u64,
}

/// How the run ended; the last chunk of a complete trace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct EndInfo {
    /// Wall-clock time when recording stopped, in ns since the Unix epoch.
    pub end_unix_ns: u64,
    /// Time-stamp counter read at the same moment as `end_unix_ns`.
    pub tsc_at_end: u64,
    /// Calibration: time-stamp counter ticks per nanosecond.
    pub ticks_per_ns: f64,
    /// Exit status of the traced program, if it exited.
    pub exit_status: Option<i32>,
    /// Signal that killed the traced program, if one did.
    pub killed_by_signal: Option<i32>,
    /// Records dropped because the shared region was full.
    pub lost_records: u64,
    /// Returns that matched no open call of their thread (code that moves its own return
    /// address); each was matched to the newest call it could be the return of.
    pub unmatched_returns: u64,
    /// Process ids that were traced.
    pub processes: Vec<u32>,
    /// Names of the traced threads, as the recorder last read them (`/proc/PID/task/TID/comm`)
    /// while they ran; threads that ended before it looked have none.
    pub threads: Vec<ThreadName>,
    /// Why the recorder stopped writing the trace before the program ended (a full disk):
    /// the trace holds the calls written before, and `unwritten_calls` more were made after.
    pub write_error: Option<String>,
    /// Calls recorded after the trace file could no longer be written ([`EndInfo::write_error`]):
    /// not in the trace.
    pub unwritten_calls: u64,
    /// Process images that ran untraced because their agent could not set up after it had
    /// begun (an image table it could not write: a full disk); their calls are not in the trace.
    pub untraced_images: u32,
}

/// A thread's name, in [`EndInfo::threads`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default)]
pub struct ThreadName {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Its name (at most 15 bytes on Linux).
    pub name: String,
}

/// The records of one thread from one shared-memory chunk, or from several consecutive ones
/// ([`TraceWriter::join_segment`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadSegment {
    /// Image session id of the writer; selects the image table that names `Record::id`.
    pub image_sid: u32,
    /// Process id of the writer.
    pub pid: u32,
    /// Thread id (kernel tid) of the writer.
    pub tid: u32,
    /// Sequence number of the segment's first chunk within its thread, from 0: increasing,
    /// with gaps where chunks were joined.
    pub seq: u64,
    /// Records the thread dropped just before this segment.
    pub lost: u64,
    /// `fnscope_abi::CHUNK_FLAG_*` bits.
    pub flags: u32,
    /// Calls in the order they returned (post-order).
    pub records: Vec<Record>,
    /// The data units of those calls that have one (flag `REC_FLAG_DATA`), in record order.
    pub data: CallData,
}

/// The data units (see `fnscope_abi::data`: header, entry words, return words) of some calls
/// of a segment, by record index, held in two flat vectors: the recorder stores one per
/// chunk, not one allocation per call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallData {
    /// Record index and start of its unit in `words`, record indices increasing.
    units: Vec<(u32, u32)>,
    words: Vec<u64>,
}

impl CallData {
    /// Adds the unit of record `record` (after those of earlier records).
    pub fn push(&mut self, record: u32, words: &[u64]) {
        self.units.push((record, self.words.len() as u32));
        self.words.extend_from_slice(words);
    }

    /// Removes every unit, keeping the memory.
    pub fn clear(&mut self) {
        self.units.clear();
        self.words.clear();
    }

    /// Number of units.
    pub fn len(&self) -> usize {
        self.units.len()
    }

    /// Whether no call has a unit.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Words of all units together.
    pub fn word_count(&self) -> usize {
        self.words.len()
    }

    /// Each unit's record index and words, in record order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u64])> + '_ {
        self.units.iter().enumerate().map(|(k, &(record, start))| {
            let end = self.units.get(k + 1).map_or(self.words.len(), |u| u.1 as usize);
            (record, &self.words[start as usize..end])
        })
    }
}

/// Separates the records a thread wrote into a chunk into call records and the data units of
/// the calls that have one (each unit's data slots come right before its record). Data slots
/// without the record they announce (the thread died between the two writes) are dropped.
pub fn split_data(raw: &[Record]) -> (Vec<Record>, CallData) {
    let mut records = Vec::new();
    let mut data = CallData::default();
    split_data_into(raw, &mut records, &mut data);
    (records, data)
}

/// [`split_data`] into buffers the caller keeps from chunk to chunk (they are cleared first):
/// the recorder splits a chunk every few hundred microseconds, and fresh buffers of that size
/// would each be a new mapping to fault in.
pub fn split_data_into(raw: &[Record], records: &mut Vec<Record>, data: &mut CallData) {
    records.clear();
    records.reserve(raw.len());
    data.clear();
    data.words.reserve(raw.len() * 2);
    // Words of the unit being read go straight to their place; an orphan's are taken back.
    let mut start = 0usize;
    let mut want = 0usize;
    let mut tag = 0u64;
    for (k, r) in raw.iter().enumerate() {
        if k % 8 == 0 {
            // The chunk was written by the program on another core: asking for its lines
            // ahead keeps this pass (the first to touch them) from waiting on each one.
            prefetch(raw.as_ptr().wrapping_add(k + 32));
        }
        if fnscope_abi::data::is_data_tag(r.id_depth) {
            if r.id_depth != tag || want == 0 {
                data.words.truncate(start);
                tag = r.id_depth;
                want = fnscope_abi::data::tag_words(tag);
                if let Some(h) = fnscope_abi::data::implied_header(tag) {
                    data.words.push(h);
                    want += 1;
                }
            }
            data.words.extend_from_slice(&[r.t_entry, r.t_exit]);
            continue;
        }
        if r.flags() & fnscope_abi::REC_FLAG_DATA != 0 && want > 0 && data.words.len() - start >= want {
            data.words.truncate(start + want);
            data.units.push((records.len() as u32, start as u32));
            start = data.words.len();
        } else {
            data.words.truncate(start);
        }
        want = 0;
        records.push(*r);
    }
    data.words.truncate(start);
}

/// What is wrong with a RAW chunk that [`raw_parts`] refuses.
const RAW_SLOT_COUNT_MISMATCH: &str = "RAW chunk's length does not match its slot count";

/// A RAW chunk's payload: its header (as a segment without records), its slots put in
/// `slots` (cleared first), or `None` when its length does not match the slot count it gives.
fn raw_parts(p: &[u8], slots: &mut Vec<Record>) -> Option<ThreadSegment> {
    let body = p.get(EVENTS_HEADER_SIZE..)?;
    let nslots = le32(p, 20) as usize;
    if body.len() != nslots.checked_mul(fnscope_abi::RECORD_SIZE)? {
        return None;
    }
    slots.clear();
    slots.extend(body.chunks_exact(fnscope_abi::RECORD_SIZE).map(|s| Record { t_entry: le64(s, 0), t_exit: le64(s, 8), id_depth: le64(s, 16) }));
    Some(segment_head(p))
}

/// Asks for the cache line at `p` (a hint: any address is allowed, none is read).
#[inline]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint that never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// One chunk of a trace file, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Chunk {
    /// What was traced.
    Meta(Meta),
    /// An image table.
    Image {
        /// Image session id.
        sid: u32,
        /// The parsed table.
        table: ImageTable,
    },
    /// One thread segment.
    Events(ThreadSegment),
    /// How the run ended.
    End(EndInfo),
    /// Call counts (count mode).
    Counts(CountsSegment),
    /// Per-function totals of one module (merged traces).
    Summary(ModuleSummary),
}

/// Call counts of one thread of one process image (count mode): `counts[id]` is how many
/// times function `id` of image `sid` was entered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountsSegment {
    /// Image session id.
    pub sid: u32,
    /// Process id.
    pub pid: u32,
    /// Thread id; 0 for the threads of the process that had ended, added together.
    pub tid: u32,
    /// One count per function id.
    pub counts: Vec<u64>,
}

/// Most function ids a COUNTS chunk may hold; bounds what a damaged header can make a reader
/// allocate.
const MAX_COUNTS: u32 = 1 << 26;

/// Errors of reading and writing trace files.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// There is no trace where one was expected.
    #[error("no trace at {}: record one with `fnscope record -o DIR -- PROGRAM`, then pass that DIR with -i", path.display())]
    NoTrace {
        /// The path that does not exist (the folder's `trace.fns` for a folder).
        path: PathBuf,
    },
    /// The operating system refused a file operation.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done ("open", "read", "write", ...).
        action: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The file does not start with the trace magic.
    #[error(
        "{} is not an fnscope trace (it does not start with `FNSCOPE`): pass a trace \
         directory written by `fnscope record`, or the trace.fns file inside it",
        path.display()
    )]
    NotATrace {
        /// The file concerned.
        path: PathBuf,
    },
    /// The file was written by a newer fnscope.
    #[error(
        "trace format version {version} is newer than this fnscope (supports {FORMAT_VERSION}): \
         upgrade fnscope"
    )]
    NewerVersion {
        /// Version found in the file header.
        version: u32,
    },
    /// A chunk failed its checksum or does not decode.
    #[error(
        "{} is damaged at byte offset {offset}: {what}; the chunks before that offset are \
         intact, but this fnscope cannot read past the damage",
        path.display()
    )]
    Corrupt {
        /// The file concerned.
        path: PathBuf,
        /// Offset of the start of the damaged chunk (or header).
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// An image table does not parse.
    #[error(
        "image table {sid}, line {line}: {msg} (the agent that wrote it does not match this \
         fnscope; record again with the same fnscope version)"
    )]
    BadImageTable {
        /// Image session id.
        sid: u32,
        /// 1-based line number, 0 when the problem concerns the whole table.
        line: usize,
        /// What is wrong.
        msg: String,
    },
}

/// An error for what the caller asked to write that the format cannot hold.
fn invalid(action: &'static str, path: &Path, why: impl Into<String>) -> FormatError {
    FormatError::Io { action, path: path.to_path_buf(), source: io::Error::new(io::ErrorKind::InvalidInput, why.into()) }
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FormatError + 'a {
    move |source| FormatError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a trace file chunk by chunk.
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<TraceFile>,
    written: u64,
    payload: Vec<u8>,
    /// Uncompressed bytes of a COUNTS or SUMMARY chunk.
    columns: Vec<u8>,
    /// Encoder of EVENTS and CALLDATA chunks; its compressor also makes COUNTS and SUMMARY
    /// chunks.
    enc: segment::SegmentEncoder,
    /// The last segment's payloads, kept for their buffers.
    segment: segment::SegmentPayloads,
    /// Compressor of image tables, made with the first one.
    image_zstd: Option<zstd::bulk::Compressor<'static>>,
    /// The last few image table bodies compressed, with their frames: a build starts the
    /// same compiler many times, each process with the same table but for its first lines.
    packed_bodies: Vec<PackedBody>,
    /// Where image table bodies compressed in earlier recordings are kept, if anywhere.
    frame_store: Option<Box<dyn FrameStore>>,
    /// RAW chunks written.
    raw_chunks: u64,
    /// Format version in the header, which decides how EVENTS chunks store times and whether
    /// RAW chunks may be written.
    version: u32,
    /// The sequence number a chunk must have to join the segment [`TraceWriter::join_segment`]
    /// holds.
    join_next: u64,
}

/// Most records [`TraceWriter::join_segment`] joins into one segment: three chunks of the
/// default 256 KiB. A segment's compression has a cost of its own, whatever its size (six
/// Huffman tables for the time streams, the frames' set-up): over 200 real chunks of fib and
/// python3.11, encoding and compressing them took 11.2 and 10.9 ns a record one chunk a
/// segment, 10.4 and 10.0 two, 9.8 and 9.5 three, 9.7 and 9.7 four; and three chunks a
/// segment made 4% and 3% fewer bytes (a parent whose children are in the chunk before is
/// stored as a parent, not as a leaf).
pub const JOIN_RECORDS: usize = 1 << 15;

impl TraceWriter {
    /// Creates (or truncates) the trace file at `path` and writes the file header.
    pub fn create(path: &Path) -> Result<TraceWriter, FormatError> {
        Self::create_as(path, FORMAT_VERSION)
    }

    /// A writer of format `version` (2 to [`FORMAT_VERSION`]), for readers of that version:
    /// its EVENTS chunks as that version stores them, the version in the header. RAW chunks
    /// need version 3 or later. Other versions are refused: version 1 checksums are not
    /// written, and a newer version is not known.
    pub fn create_as(path: &Path, version: u32) -> Result<TraceWriter, FormatError> {
        if !(CHECKSUM_OF_HEAD_SINCE..=FORMAT_VERSION).contains(&version) {
            return Err(invalid("create", path, format!("fnscope writes format versions {CHECKSUM_OF_HEAD_SINCE} to {FORMAT_VERSION}, not {version}")));
        }
        // The encoder first: a failure leaves no file behind.
        let enc = segment::SegmentEncoder::new(path, version)?;
        let file = File::create(path).map_err(io_err("create", path))?;
        let mut w = TraceWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, TraceFile { file, abandoned: false }),
            written: 0,
            payload: Vec::new(),
            columns: Vec::new(),
            enc,
            segment: Default::default(),
            image_zstd: None,
            packed_bodies: Vec::new(),
            frame_store: None,
            raw_chunks: 0,
            version,
            join_next: 0,
        };
        let mut head = [0u8; FILE_HEADER_SIZE as usize];
        head[..8].copy_from_slice(&MAGIC);
        head[8..12].copy_from_slice(&version.to_le_bytes());
        w.put(&head)?;
        Ok(w)
    }

    /// Writes `b`, after the segment [`TraceWriter::join_segment`] holds, if any: whatever is
    /// written after it comes after it in the file.
    fn put(&mut self, b: &[u8]) -> Result<(), FormatError> {
        self.write_joined()?;
        self.out.write_all(b).map_err(io_err("write", &self.path))?;
        self.written += b.len() as u64;
        Ok(())
    }

    /// Writes `self.payload` as one chunk of `kind`.
    fn chunk(&mut self, kind: u32) -> Result<(), FormatError> {
        let payload = std::mem::take(&mut self.payload);
        let r = self.emit(kind, &payload);
        self.payload = payload;
        self.payload.clear();
        r
    }

    /// Writes `payload` as one chunk of `kind`.
    fn emit(&mut self, kind: u32, payload: &[u8]) -> Result<(), FormatError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&l| l <= MAX_PAYLOAD);
        match len {
            Some(len) => self.put(&chunk_head(kind, len, &[payload])).and_then(|_| self.put(payload)),
            None => Err(invalid("write", &self.path, format!("a chunk of {} bytes is over the 1 GiB limit", payload.len()))),
        }
    }

    /// Writes the META chunk; write it first.
    pub fn write_meta(&mut self, m: &Meta) -> Result<(), FormatError> {
        self.payload.clear();
        // Serializing plain structs of strings and numbers into memory cannot fail.
        serde_json::to_writer(&mut self.payload, m).expect("Meta serializes");
        self.chunk(KIND_META)
    }

    /// Writes the META chunk of a merged trace: `m` plus the runs it was made of.
    pub fn write_merged_meta(&mut self, m: &Meta, runs: &[RunInfo]) -> Result<(), FormatError> {
        self.payload.clear();
        let mm = MergedMeta {
            meta: m.clone(),
            runs: runs.to_vec(),
        };
        serde_json::to_writer(&mut self.payload, &mm).expect("Meta serializes");
        self.chunk(KIND_META)
    }

    /// Takes image table bodies compressed in earlier recordings from `store`, and keeps
    /// those it compresses there (see [`FrameStore`]).
    pub fn set_frame_store(&mut self, store: Box<dyn FrameStore>) {
        self.frame_store = Some(store);
    }

    /// Writes an IMAGE chunk holding `table_text` (the agent's `images/<sid>.txt`).
    ///
    /// From version 5 the table is stored as two zstd frames: its head (the lines before the
    /// first `func` or `skip` line: process, arguments, modules) and the rest, its body. A
    /// body the same as one of the last few written is not compressed again: its frame is
    /// reused. Before version 5 the text is stored as it is.
    pub fn write_image(&mut self, sid: u32, table_text: &str) -> Result<(), FormatError> {
        self.payload.clear();
        self.payload.extend_from_slice(&sid.to_le_bytes());
        if self.version < PACKED_IMAGES_SINCE {
            self.payload.extend_from_slice(table_text.as_bytes());
            return self.chunk(KIND_IMAGE);
        }
        let (head, body) = table_text.as_bytes().split_at(image::body_start(table_text));
        let path = &self.path;
        let zstd = match &mut self.image_zstd {
            Some(z) => z,
            None => self.image_zstd.insert(zstd::bulk::Compressor::new(IMAGE_ZSTD_LEVEL).map_err(io_err("set up compression for", path))?),
        };
        let head = zstd.compress(head).map_err(io_err("compress an image table for", path))?;
        let at = match self.packed_bodies.iter().position(|p| *p.text == *body) {
            Some(at) => at,
            None => {
                let kept = self.frame_store.as_ref().and_then(|s| s.get(body)).filter(|f| frame_holds(f, body.len()));
                let frame = match kept {
                    Some(f) => f,
                    None => {
                        let f = zstd.compress(body).map_err(io_err("compress an image table for", path))?;
                        if let Some(s) = &self.frame_store {
                            s.put(body, &f);
                        }
                        f
                    }
                };
                self.packed_bodies.truncate(PACKED_BODIES_KEPT - 1);
                self.packed_bodies.push(PackedBody { text: body.into(), frame: frame.into() });
                self.packed_bodies.len() - 1
            }
        };
        self.packed_bodies[..=at].rotate_right(1);
        // A frame holds at most a chunk's bytes, which fit in a u32.
        self.payload.extend_from_slice(&(head.len() as u32).to_le_bytes());
        self.payload.extend_from_slice(&head);
        self.payload.extend_from_slice(&self.packed_bodies[0].frame);
        self.chunk(KIND_IMAGE)
    }

    /// Writes an EVENTS chunk: one thread's records from one shared-memory chunk, in the
    /// order the agent wrote them; before it, a CALLDATA chunk of the data units in `data`
    /// if there are any.
    #[allow(clippy::too_many_arguments)]
    pub fn write_segment(
        &mut self,
        image_sid: u32,
        pid: u32,
        tid: u32,
        seq: u64,
        lost: u64,
        flags: u32,
        records: &[Record],
        data: &CallData,
    ) -> Result<(), FormatError> {
        // First: its columns are in the encoder, which this segment's take.
        self.write_joined()?;
        let mut seg = std::mem::take(&mut self.segment);
        let head = ThreadSegment { image_sid, pid, tid, seq, lost, flags, ..Default::default() };
        let r = self.enc.encode(&head, records, data, &mut seg).and_then(|()| self.emit_segment(&seg));
        self.segment = seg;
        r
    }

    /// Writes one thread's records from one shared-memory chunk as
    /// [`TraceWriter::write_segment`] does, or joins them to the segment written just before
    /// when they continue it: the same thread and image session, the next sequence number, no
    /// record lost between them, and flags of the same kind (a thread's last chunk may join,
    /// and ends the segment). Fewer segments take less time to compress and fewer bytes (see
    /// [`JOIN_RECORDS`]). A joined segment is written when the next chunk does not continue
    /// it, when one more chunk of the same size would take it over [`JOIN_RECORDS`] records,
    /// when anything else is written, and at [`TraceWriter::flush`]; until then its records
    /// are not in [`TraceWriter::bytes_written`], and [`TraceWriter::joined_records`] counts
    /// them.
    #[allow(clippy::too_many_arguments)]
    pub fn join_segment(
        &mut self,
        image_sid: u32,
        pid: u32,
        tid: u32,
        seq: u64,
        lost: u64,
        flags: u32,
        records: &[Record],
        data: &CallData,
    ) -> Result<(), FormatError> {
        let continues = self.enc.joined().is_some_and(|(head, nrec)| {
            (head.image_sid, head.pid, head.tid) == (image_sid, pid, tid)
                && seq == self.join_next
                && lost == 0
                && flags & !fnscope_abi::CHUNK_FLAG_LAST == head.flags
                && nrec + records.len() <= JOIN_RECORDS
        });
        if !continues {
            self.write_joined()?;
            let head = ThreadSegment { image_sid, pid, tid, seq, lost, flags: flags & !fnscope_abi::CHUNK_FLAG_LAST, ..Default::default() };
            self.enc.start(&head);
        }
        self.enc.join(records, data, flags)?;
        self.join_next = seq.wrapping_add(1);
        let full = self.enc.joined().is_some_and(|(_, nrec)| nrec + records.len() > JOIN_RECORDS);
        if flags & fnscope_abi::CHUNK_FLAG_LAST != 0 || full {
            self.write_joined()?;
        }
        Ok(())
    }

    /// Records in the segment [`TraceWriter::join_segment`] holds, not written yet.
    pub fn joined_records(&self) -> usize {
        self.enc.joined().map_or(0, |(_, nrec)| nrec)
    }

    /// Writes the segment [`TraceWriter::join_segment`] holds, if any, now. Anything else
    /// written writes it first; a caller that keeps track of which calls the file holds
    /// (the recorder, to say what a trace cut after a failed write keeps) writes it apart, so
    /// that the calls are in the file when the call returns.
    pub fn write_joined(&mut self) -> Result<(), FormatError> {
        let mut seg = std::mem::take(&mut self.segment);
        let r = self.enc.finish(&mut seg).and_then(|any| if any { self.emit_segment(&seg) } else { Ok(()) });
        self.segment = seg;
        r
    }

    /// Writes a segment's chunks: its CALLDATA chunk if it has one, then its EVENTS chunk.
    fn emit_segment(&mut self, seg: &segment::SegmentPayloads) -> Result<(), FormatError> {
        if !seg.calldata.is_empty() {
            self.emit(KIND_CALLDATA, &seg.calldata)?;
        }
        self.emit(KIND_EVENTS, &seg.events)
    }

    /// Writes a RAW chunk: the EVENTS header, then `slots` (call records and data slots, as
    /// in shared memory) byte for byte. Costs a copy where [`TraceWriter::write_segment`]
    /// costs an encoding and a compression: the recorder's way of keeping up with a program
    /// that fills chunks faster than they compress.
    #[allow(clippy::too_many_arguments)]
    pub fn write_raw_segment(&mut self, image_sid: u32, pid: u32, tid: u32, seq: u64, lost: u64, flags: u32, slots: &[Record]) -> Result<(), FormatError> {
        let too_big = || invalid("write", &self.path, "a segment over the 1 GiB chunk limit");
        if self.version < RAW_SINCE {
            let why = format!("RAW chunks need format version {RAW_SINCE}: a version {} reader would skip their calls", self.version);
            return Err(invalid("write", &self.path, why));
        }
        let nslots = u32::try_from(slots.len()).map_err(|_| too_big())?;
        // SAFETY: `Record` is `repr(C)` of three `u64`s (no padding), so its slice is
        // `24 * len` initialised bytes; the format is little-endian, as every target is.
        let body = unsafe { std::slice::from_raw_parts(slots.as_ptr() as *const u8, std::mem::size_of_val(slots)) };
        let len = u32::try_from(EVENTS_HEADER_SIZE + body.len()).ok().filter(|&l| l <= MAX_PAYLOAD).ok_or_else(too_big)?;
        let events = events_head(image_sid, pid, tid, seq, nslots, lost, flags);
        self.put(&chunk_head(KIND_RAW, len, &[&events, body]))?;
        self.put(&events)?;
        // Straight from shared memory to the file: through the buffer it would be one more copy.
        self.out.flush().map_err(io_err("write", &self.path))?;
        self.out.get_mut().write_all(body).map_err(io_err("write", &self.path))?;
        self.written += body.len() as u64;
        self.raw_chunks += 1;
        Ok(())
    }

    /// RAW chunks written so far: when there are some, [`compact`] the file once it is done.
    pub fn raw_chunks(&self) -> u64 {
        self.raw_chunks
    }

    /// Writes a COUNTS chunk.
    pub fn write_counts(&mut self, c: &CountsSegment) -> Result<(), FormatError> {
        let n = u32::try_from(c.counts.len()).ok().filter(|&n| n <= MAX_COUNTS).ok_or_else(|| invalid("write", &self.path, "too many counters in one chunk"))?;
        self.columns.clear();
        for v in &c.counts {
            self.columns.extend_from_slice(&v.to_le_bytes());
        }
        let p = &mut self.payload;
        p.clear();
        p.extend_from_slice(&c.sid.to_le_bytes());
        p.extend_from_slice(&c.pid.to_le_bytes());
        p.extend_from_slice(&c.tid.to_le_bytes());
        p.extend_from_slice(&n.to_le_bytes());
        self.enc.compress(&self.columns, &mut self.payload).map_err(io_err("compress counts for", &self.path))?;
        self.chunk(KIND_COUNTS)
    }

    /// Writes a SUMMARY chunk: `s` as JSON in one zstd frame.
    pub fn write_summary(&mut self, s: &ModuleSummary) -> Result<(), FormatError> {
        self.columns.clear();
        serde_json::to_writer(&mut self.columns, s).expect("ModuleSummary serializes");
        self.payload.clear();
        self.enc.compress(&self.columns, &mut self.payload).map_err(io_err("compress the summary for", &self.path))?;
        self.chunk(KIND_SUMMARY)
    }

    /// Writes the END chunk; a trace without it is reported as truncated.
    pub fn write_end(&mut self, e: &EndInfo) -> Result<(), FormatError> {
        self.payload.clear();
        serde_json::to_writer(&mut self.payload, e).expect("EndInfo serializes");
        self.chunk(KIND_END)
    }

    /// Bytes written so far, file header included (not the segment
    /// [`TraceWriter::join_segment`] holds).
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Hands buffered data to the operating system, so that it survives a crash of the
    /// recorder (not of the machine: no fsync).
    pub fn flush(&mut self) -> Result<(), FormatError> {
        self.write_joined()?;
        self.out.flush().map_err(io_err("write", &self.path))
    }

    /// Drops what the writer holds without writing it, after a write failed (a full disk):
    /// flushed later, when room was made ([`end_torn_trace`]), it would land past the end
    /// the file was given. Nothing is written after this.
    pub fn abandon(&mut self) {
        self.out.get_mut().abandoned = true;
    }
}

/// The trace file under a [`TraceWriter`]'s buffer, which writes nothing once the writer is
/// abandoned ([`TraceWriter::abandon`]).
struct TraceFile {
    file: File,
    abandoned: bool,
}

impl Write for TraceFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.abandoned {
            return Ok(buf.len());
        }
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        // Errors here have nowhere to go; callers that care call `flush` themselves. An
        // abandoned writer writes nothing, the joined segment included.
        let _ = self.write_joined();
        let _ = self.out.flush();
    }
}

/// How EVENTS chunks of format `version` store times.
fn timing_of(version: u32) -> events::Timing {
    if version >= TIME_CLASSES_SINCE {
        events::Timing::Classes
    } else if version >= LEAF_GAPS_SINCE {
        events::Timing::LeafGaps
    } else {
        events::Timing::Exits
    }
}

/// Keeps compressed image table bodies from one recording to the next. A program's table body
/// (its functions with their ids, addresses and verdicts) is the same each run, and a big
/// one (2.9 MiB for `cc1plus`) takes the recorder longer to compress than the program takes
/// to start: with the frame kept, a short-lived big program's trace is complete sooner after
/// it ends.
pub trait FrameStore: Send {
    /// A zstd frame holding `body`, if one was kept. [`TraceWriter::write_image`] still
    /// checks that the frame is whole and holds `body.len()` bytes; that they are `body`'s
    /// bytes is the store's to make sure of.
    fn get(&self, body: &[u8]) -> Option<Vec<u8>>;
    /// Keeps `frame`, the zstd frame just made of `body`.
    fn put(&self, body: &[u8], frame: &[u8]);
}

/// Whether `frame` is one whole zstd frame that says it holds `len` bytes.
fn frame_holds(frame: &[u8], len: usize) -> bool {
    zstd::zstd_safe::find_frame_compressed_size(frame) == Ok(frame.len())
        && zstd::zstd_safe::get_frame_content_size(frame).ok().flatten() == Some(len as u64)
}

/// An image table body as written, and its zstd frame.
struct PackedBody {
    text: Box<[u8]>,
    frame: Box<[u8]>,
}

/// Reads a trace file chunk by chunk.
pub struct TraceReader {
    path: PathBuf,
    input: BufReader<File>,
    /// Offset of the next chunk header.
    offset: u64,
    /// Format version of the file, which decides what the chunk checksums cover and how
    /// EVENTS chunks store times.
    version: u32,
    done: bool,
    truncated: bool,
    seen_end: bool,
    skip_events: bool,
    runs: Vec<RunInfo>,
    payload: Vec<u8>,
    columns: Vec<u8>,
    unzstd: zstd::bulk::Decompressor<'static>,
    /// The last CALLDATA chunk read: `(pid, tid, seq)` of the EVENTS chunk it belongs to.
    pending_data: Option<((u32, u32, u64), CallData)>,
}

/// Reads until `buf` is full or the input ends; returns how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

impl TraceReader {
    /// Opens a trace: `path` is a trace directory (its `trace.fns` is read) or the file
    /// itself. Checks the magic and the version.
    pub fn open(path: &Path) -> Result<TraceReader, FormatError> {
        let path = if path.is_dir() {
            path.join(TRACE_FILE)
        } else {
            path.to_path_buf()
        };
        let file = File::open(&path).map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                FormatError::NoTrace { path: path.clone() }
            } else {
                FormatError::Io { action: "open", path: path.clone(), source }
            }
        })?;
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut head = [0u8; FILE_HEADER_SIZE as usize];
        let n = read_full(&mut input, &mut head).map_err(io_err("read", &path))?;
        if n < 8 || head[..8] != MAGIC {
            return Err(FormatError::NotATrace { path });
        }
        if n < head.len() {
            return Err(FormatError::Corrupt {
                path,
                offset: 0,
                what: "the file ends inside its 16-byte header".into(),
            });
        }
        let version = le32(&head, 8);
        if version > FORMAT_VERSION {
            return Err(FormatError::NewerVersion { version });
        }
        if version < OLDEST_READABLE_VERSION {
            return Err(FormatError::Corrupt {
                path,
                offset: 8,
                what: format!("format version {version}"),
            });
        }
        let unzstd =
            zstd::bulk::Decompressor::new().map_err(io_err("set up decompression for", &path))?;
        Ok(TraceReader {
            path,
            input,
            offset: FILE_HEADER_SIZE,
            version,
            done: false,
            truncated: false,
            seen_end: false,
            skip_events: false,
            runs: Vec::new(),
            payload: Vec::new(),
            columns: Vec::new(),
            unzstd,
            pending_data: None,
        })
    }

    /// Path of the trace file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Offset of the next chunk, i.e. bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The runs that the META chunk read so far lists: those a merged trace was made of,
    /// empty for a recorded trace.
    pub fn runs(&self) -> &[RunInfo] {
        &self.runs
    }

    /// When `skip` is true, EVENTS chunks are passed over without being read or checked:
    /// a quick pass that collects META, IMAGE and END only.
    pub fn set_skip_events(&mut self, skip: bool) {
        self.skip_events = skip;
    }

    /// Whether the trace ended abruptly: true once the reader met a partial chunk at the end
    /// of the file, or the end of the file without an END chunk.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Reads the next chunk. `Ok(None)` at the end of the file, including a file cut short
    /// (then [`TraceReader::truncated`] is true). Chunks of unknown kinds are skipped, so
    /// that later fnscope versions can add optional chunks without a new format version. A
    /// checksum or decoding failure is an error naming the offset; the reader is finished
    /// after an error.
    pub fn next_chunk(&mut self) -> Result<Option<Chunk>, FormatError> {
        while !self.done {
            match self.read_one() {
                Ok(Some(c)) => return Ok(Some(c)),
                Ok(None) => {}
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            }
        }
        Ok(None)
    }

    fn corrupt(&self, offset: u64, what: impl Into<String>) -> FormatError {
        FormatError::Corrupt {
            path: self.path.clone(),
            offset,
            what: what.into(),
        }
    }

    fn stop_truncated<T>(&mut self) -> Result<Option<T>, FormatError> {
        self.done = true;
        self.truncated = true;
        Ok(None)
    }

    /// Reads one chunk; `Ok(None)` for a skipped chunk or the end (then `done` is set).
    fn read_one(&mut self) -> Result<Option<Chunk>, FormatError> {
        let Some((at, Some(kind))) = self.read_payload()? else { return Ok(None) };
        let p = &self.payload;
        let chunk = match kind {
            KIND_META => {
                let mm: MergedMeta = serde_json::from_slice(p)
                    .map_err(|e| self.corrupt(at, format!("bad META: {e}")))?;
                self.runs = mm.runs;
                Chunk::Meta(mm.meta)
            }
            KIND_END => {
                self.seen_end = true;
                Chunk::End(
                    serde_json::from_slice(p)
                        .map_err(|e| self.corrupt(at, format!("bad END: {e}")))?,
                )
            }
            KIND_IMAGE => {
                if p.len() < 4 {
                    return Err(self.corrupt(at, "IMAGE chunk shorter than 4 bytes"));
                }
                let sid = le32(p, 0);
                let packed = if self.version >= PACKED_IMAGES_SINCE { Some(self.unpack_image(at)?) } else { None };
                let text = std::str::from_utf8(packed.as_deref().unwrap_or(&self.payload[4..]))
                    .map_err(|_| self.corrupt(at, "image table is not UTF-8"))?;
                Chunk::Image { sid, table: ImageTable::parse(sid, text)? }
            }
            KIND_EVENTS => Chunk::Events(self.decode_events(at)?),
            KIND_RAW => Chunk::Events(self.decode_raw(at)?),
            KIND_COUNTS => Chunk::Counts(self.decode_counts(at)?),
            KIND_SUMMARY => Chunk::Summary(self.decode_summary(at)?),
            KIND_CALLDATA => {
                self.pending_data = Some(self.decode_call_data(at)?);
                return Ok(None);
            }
            _ => return Ok(None),
        };
        Ok(Some(chunk))
    }

    /// The file's format version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Gives the payload of the chunk [`TraceReader::next_verbatim`] returned last to the
    /// caller, who gives `buf` in exchange: the reader clears it before it reads into it.
    pub(crate) fn swap_payload(&mut self, buf: &mut Vec<u8>) {
        std::mem::swap(&mut self.payload, buf);
    }

    /// Reads one chunk's header and payload (into `self.payload`) and checks its checksum:
    /// its offset and kind (`None` for a chunk passed over unread). `Ok(None)` at the end, or
    /// at a chunk cut short (then `done` is set).
    fn read_payload(&mut self) -> Result<Option<(u64, Option<u32>)>, FormatError> {
        let at = self.offset;
        let mut head = [0u8; CHUNK_HEADER_SIZE as usize];
        let n = read_full(&mut self.input, &mut head).map_err(io_err("read", &self.path))?;
        if n == 0 {
            self.done = true;
            self.truncated |= !self.seen_end;
            return Ok(None);
        }
        if n < head.len() {
            return self.stop_truncated();
        }
        let (kind, len, crc) = (le32(&head, 0), le32(&head, 4), le32(&head, 8));
        if len > MAX_PAYLOAD {
            return Err(self.corrupt(at, format!("chunk length {len} is impossibly large")));
        }
        let body = at + CHUNK_HEADER_SIZE;
        if (kind == KIND_EVENTS || kind == KIND_CALLDATA || kind == KIND_RAW) && self.skip_events {
            let end = body + len as u64;
            let size = self
                .input
                .get_ref()
                .metadata()
                .map_err(io_err("read", &self.path))?
                .len();
            if end > size {
                return self.stop_truncated();
            }
            self.input
                .seek_relative(len as i64)
                .map_err(io_err("read", &self.path))?;
            self.offset = end;
            return Ok(Some((at, None)));
        }
        self.payload.clear();
        let got = (&mut self.input)
            .take(len as u64)
            .read_to_end(&mut self.payload)
            .map_err(io_err("read", &self.path))?;
        if got < len as usize {
            return self.stop_truncated();
        }
        self.offset = body + len as u64;
        let expected = if self.version >= CHECKSUM_OF_HEAD_SINCE {
            chunk_checksum(kind, &self.payload)
        } else {
            crc32fast::hash(&self.payload)
        };
        if expected != crc {
            return Err(self.corrupt(at, "checksum mismatch"));
        }
        Ok(Some((at, Some(kind))))
    }


    /// The next chunk as it is in the file, its checksum checked: its kind and payload.
    /// `Ok(None)` at the end of the file or at a chunk cut short (then
    /// [`TraceReader::truncated`] is true).
    pub fn next_verbatim(&mut self) -> Result<Option<(u32, &[u8])>, FormatError> {
        while !self.done {
            match self.read_payload() {
                Ok(Some((_, None))) | Ok(None) => {}
                Ok(Some((_, Some(kind)))) => {
                    self.seen_end |= kind == KIND_END;
                    return Ok(Some((kind, &self.payload)));
                }
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            }
        }
        Ok(None)
    }

    /// The table text of an IMAGE chunk of version 5 on: its head frame and its body frame,
    /// one after the other.
    fn unpack_image(&mut self, at: u64) -> Result<Vec<u8>, FormatError> {
        let p = &self.payload;
        let head_len = p.get(4..8).map(|b| le32(b, 0) as usize);
        let Some((head, body)) = head_len.and_then(|n| p[8..].split_at_checked(n)) else {
            return Err(self.corrupt(at, "IMAGE chunk shorter than its head"));
        };
        // Each frame states its decoded size; `MAX_PAYLOAD` caps what damage can make us
        // allocate.
        let size = |frame| zstd::zstd_safe::get_frame_content_size(frame).ok().flatten();
        let (Some(head_size), Some(body_size)) = (size(head), size(body)) else {
            return Err(self.corrupt(at, "image table is not two zstd frames of known size"));
        };
        if head_size.saturating_add(body_size) > MAX_PAYLOAD as u64 {
            return Err(self.corrupt(at, "image table of over 1 GiB"));
        }
        let (head_size, body_size) = (head_size as usize, body_size as usize);
        let mut text = Vec::with_capacity(head_size + body_size);
        let mut cur = io::Cursor::new(&mut text);
        for (frame, n) in [(head, head_size), (body, body_size)] {
            // The cursor makes zstd append to what the frame before gave.
            match self.unzstd.decompress_to_buffer(frame, &mut cur) {
                Ok(got) if got == n => cur.set_position(cur.position() + n as u64),
                _ => return Err(self.corrupt(at, "image table does not decompress")),
            }
        }
        Ok(text)
    }

    fn decode_counts(&mut self, at: u64) -> Result<CountsSegment, FormatError> {
        let p = &self.payload;
        if p.len() < COUNTS_HEADER_SIZE {
            return Err(self.corrupt(at, "COUNTS chunk shorter than its header"));
        }
        let (sid, pid, tid, n) = (le32(p, 0), le32(p, 4), le32(p, 8), le32(p, 12));
        if n > MAX_COUNTS {
            return Err(self.corrupt(at, format!("{n} counters in one chunk is impossibly many")));
        }
        let frame = &p[COUNTS_HEADER_SIZE..];
        self.columns.clear();
        self.columns.reserve(n as usize * 8);
        if self.unzstd.decompress_to_buffer(frame, &mut self.columns).is_err() || self.columns.len() != n as usize * 8 {
            return Err(self.corrupt(at, "counts do not decompress"));
        }
        let counts = self.columns.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
        Ok(CountsSegment { sid, pid, tid, counts })
    }

    fn decode_summary(&mut self, at: u64) -> Result<ModuleSummary, FormatError> {
        let frame = &self.payload[..];
        // The frame states its decoded size; `MAX_PAYLOAD` caps what damage can make us
        // allocate.
        let want = match zstd::zstd_safe::get_frame_content_size(frame) {
            Ok(Some(n)) if n <= MAX_PAYLOAD as u64 => n as usize,
            _ => return Err(self.corrupt(at, "SUMMARY chunk is not a zstd frame of known size")),
        };
        self.columns.clear();
        self.columns.reserve(want);
        if self
            .unzstd
            .decompress_to_buffer(frame, &mut self.columns)
            .is_err()
        {
            return Err(self.corrupt(at, "summary does not decompress"));
        }
        serde_json::from_slice(&self.columns)
            .map_err(|e| self.corrupt(at, format!("bad SUMMARY: {e}")))
    }

    fn decode_events(&mut self, at: u64) -> Result<ThreadSegment, FormatError> {
        let p = &self.payload;
        if p.len() < EVENTS_HEADER_SIZE {
            return Err(self.corrupt(at, "EVENTS chunk shorter than its header"));
        }
        let mut seg = segment_head(p);
        let nrec = le32(p, 20);
        let frames = &p[EVENTS_HEADER_SIZE..];
        let bound = events::decoded_bound(nrec);
        self.columns.clear();
        // The decoded size is read from the frames (version 6 has two) so that the buffer grows
        // only as far as the data needs; `bound` caps it for damaged or hostile headers.
        let want = match zstd::zstd_safe::find_decompressed_size(frames) {
            Ok(Some(n)) if n <= bound as u64 => n as usize,
            _ => bound,
        };
        self.columns.reserve(want);
        let r = self.unzstd.decompress_to_buffer(frames, &mut self.columns);
        if r.is_err() {
            return Err(self.corrupt(at, "record data does not decompress"));
        }
        events::decode_columns(&self.columns, nrec, &mut seg.records, timing_of(self.version))
            .map_err(|what| self.corrupt(at, what))?;
        if let Some((key, data)) = self.pending_data.take() {
            if key == (seg.pid, seg.tid, seg.seq) {
                if data.units.last().is_some_and(|u| u.0 >= nrec) {
                    return Err(self.corrupt(at, "call data for a record the segment does not have"));
                }
                seg.data = data;
            }
        }
        Ok(seg)
    }

    fn decode_raw(&mut self, at: u64) -> Result<ThreadSegment, FormatError> {
        let mut slots = Vec::new();
        let head = raw_parts(&self.payload, &mut slots).ok_or_else(|| self.corrupt(at, RAW_SLOT_COUNT_MISMATCH))?;
        let (records, data) = split_data(&slots);
        Ok(ThreadSegment { records, data, ..head })
    }

    fn decode_call_data(&mut self, at: u64) -> Result<((u32, u32, u64), CallData), FormatError> {
        let p = &self.payload;
        if p.len() < CALLDATA_HEADER_SIZE {
            return Err(self.corrupt(at, "CALLDATA chunk shorter than its header"));
        }
        let key = (le32(p, 0), le32(p, 4), le64(p, 8));
        let units = le32(p, 16) as usize;
        let frame = &p[CALLDATA_HEADER_SIZE..];
        // At most one unit per record of a segment (32,768 records joined), each of at most MAX_WORDS
        // varints: anything bigger is damage, refused before anything is allocated for it.
        if units > 1 << 20 {
            return Err(self.corrupt(at, format!("{units} call data units in one chunk is impossibly many")));
        }
        let bound = units * (20 + 10 * fnscope_abi::data::MAX_WORDS);
        let bound = match zstd::zstd_safe::get_frame_content_size(frame) {
            Ok(Some(n)) if n <= bound as u64 => n as usize,
            _ => bound,
        };
        let bytes = match self.unzstd.decompress(frame, bound) {
            Ok(b) => b,
            Err(_) => return Err(self.corrupt(at, "call data does not decompress")),
        };
        let mut data = CallData::default();
        let mut i = 0usize;
        let mut record = 0u32;
        for k in 0..units {
            let bad = || self.corrupt(at, "damaged call data");
            let delta = events::get_varint(&bytes, &mut i).ok_or_else(bad)?;
            record = if k == 0 { delta as u32 } else { record.checked_add(u32::try_from(delta).map_err(|_| bad())?).filter(|_| delta > 0).ok_or_else(bad)? };
            let n = events::get_varint(&bytes, &mut i).ok_or_else(bad)? as usize;
            if n > fnscope_abi::data::MAX_WORDS || n > bytes.len() - i {
                return Err(bad());
            }
            data.units.push((record, data.words.len() as u32));
            for _ in 0..n {
                data.words.push(events::get_varint(&bytes, &mut i).ok_or_else(bad)?);
            }
        }
        if i != bytes.len() {
            return Err(self.corrupt(at, "damaged call data (trailing bytes)"));
        }
        Ok((key, data))
    }
}

#[cfg(test)]
mod tests;
