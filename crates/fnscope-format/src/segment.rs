//! One thread segment encoded into the payloads of its CALLDATA and EVENTS chunks: the
//! writer's encoder, and one per worker of [`crate::compact`], which encodes RAW chunks on
//! every processor.

use crate::{events, events_head, invalid, io_err, CallData, FormatError, ThreadSegment};
use fnscope_abi::Record;
use std::io;
use std::path::{Path, PathBuf};

/// The payloads of one segment's chunks, kept by their owner from segment to segment.
#[derive(Default)]
pub(crate) struct SegmentPayloads {
    /// The CALLDATA chunk's payload; empty when no call of the segment has data.
    pub(crate) calldata: Vec<u8>,
    /// The EVENTS chunk's payload.
    pub(crate) events: Vec<u8>,
}

/// Encodes segments: the column encoder's buffers and the compressors, made once.
pub(crate) struct SegmentEncoder {
    /// The trace file the segments belong to, for error messages.
    path: PathBuf,
    /// How the file's version stores times.
    timing: events::Timing,
    /// The uncompressed columns of the segment being encoded.
    columns: Vec<u8>,
    /// The column encoder's buffers.
    scratch: events::ColumnScratch,
    /// The uncompressed varints of a CALLDATA chunk.
    data_varints: events::VarintBuf,
    /// Compressor of EVENTS chunks before version 6, and of the writer's COUNTS and SUMMARY
    /// chunks.
    zstd: zstd::bulk::Compressor<'static>,
    /// Compressors of EVENTS chunks' two frames, for files of version 6 on: the structure
    /// columns, and the time columns (from version 7, a block per time stream).
    frames: Option<(zstd::bulk::Compressor<'static>, zstd::zstd_safe::CCtx<'static>)>,
    /// Compressor of CALLDATA chunks (a level of its own), made with the first one.
    data_zstd: Option<zstd::bulk::Compressor<'static>>,
    /// The segment [`SegmentEncoder::join`] builds, from [`SegmentEncoder::start`] to
    /// [`SegmentEncoder::finish`].
    joined: Option<Joined>,
    /// The data units' vectors of the last segment joined, kept for the next.
    spare_data: CallData,
}

/// A segment joined from several chunks: its header fields, the data units of its calls and
/// how many records it has so far (its columns are in the encoder's scratch).
struct Joined {
    head: ThreadSegment,
    nrec: usize,
}

impl SegmentEncoder {
    /// An encoder of segments of a file of format `version` at `path`.
    pub(crate) fn new(path: &Path, version: u32) -> Result<SegmentEncoder, FormatError> {
        Ok(SegmentEncoder {
            path: path.to_path_buf(),
            timing: crate::timing_of(version),
            columns: Vec::new(),
            scratch: Default::default(),
            data_varints: Default::default(),
            zstd: events::compressor().map_err(io_err("set up compression for", path))?,
            frames: if version >= crate::TIME_FRAME_SINCE {
                let structure = events::structure_compressor().map_err(io_err("set up compression for", path))?;
                Some((structure, events::time_compressor().map_err(io_err("set up compression for", path))?))
            } else {
                None
            },
            data_zstd: None,
            joined: None,
            spare_data: CallData::default(),
        })
    }

    /// The trace file the segments belong to.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a frame of `src` to `p`, with the settings of EVENTS chunks (level and shortest
    /// match).
    pub(crate) fn compress(&mut self, src: &[u8], p: &mut Vec<u8>) -> io::Result<()> {
        append_frame(&mut self.zstd, src, p)
    }

    /// Encodes one thread's records from one shared-memory chunk, and the data units of those
    /// calls that have one, into `out`; `head` gives the segment's header fields (its own
    /// records and data are not read).
    pub(crate) fn encode(&mut self, head: &ThreadSegment, records: &[Record], data: &CallData, out: &mut SegmentPayloads) -> Result<(), FormatError> {
        debug_assert!(self.joined.is_none(), "a segment being joined keeps its columns in the scratch this takes");
        self.scratch.start();
        self.scratch.add(records, self.timing);
        self.payloads(head, records.len(), data, out)
    }

    /// Starts a segment that [`SegmentEncoder::join`] adds records to, with the header fields
    /// of `head` (its own records and data are not read), dropping one started before.
    pub(crate) fn start(&mut self, head: &ThreadSegment) {
        let mut data = std::mem::take(&mut self.spare_data);
        data.clear();
        self.joined = Some(Joined { head: ThreadSegment { records: Vec::new(), data, ..*head }, nrec: 0 });
        self.scratch.start();
    }

    /// Adds one chunk's records, the next ones of the thread, to the segment started last,
    /// with the data units of those calls that have one; `flags` join the segment's.
    pub(crate) fn join(&mut self, records: &[Record], data: &CallData, flags: u32) -> Result<(), FormatError> {
        let Some(j) = &mut self.joined else {
            return Err(invalid("write", &self.path, "records joined to no segment"));
        };
        if j.nrec + records.len() > u32::MAX as usize {
            return Err(invalid("write", &self.path, "over 2^32 records in a segment"));
        }
        let base = j.nrec as u32;
        for (record, words) in data.iter() {
            j.head.data.push(base + record, words);
        }
        j.nrec += records.len();
        j.head.flags |= flags;
        self.scratch.add(records, self.timing);
        Ok(())
    }

    /// The segment started last and not finished: its header fields, and the records joined
    /// so far.
    pub(crate) fn joined(&self) -> Option<(&ThreadSegment, usize)> {
        self.joined.as_ref().map(|j| (&j.head, j.nrec))
    }

    /// Encodes the segment started last into `out`; false if there is none.
    pub(crate) fn finish(&mut self, out: &mut SegmentPayloads) -> Result<bool, FormatError> {
        let Some(mut j) = self.joined.take() else {
            return Ok(false);
        };
        let data = std::mem::take(&mut j.head.data);
        let r = self.payloads(&j.head, j.nrec, &data, out);
        // Kept for the next segment: its allocation.
        self.spare_data = data;
        r.map(|()| true)
    }

    /// Encodes the columns [`events::ColumnScratch`] holds, of `nrec` records, and `data`
    /// into `out`, under `head`'s header fields.
    fn payloads(&mut self, head: &ThreadSegment, nrec: usize, data: &CallData, out: &mut SegmentPayloads) -> Result<(), FormatError> {
        let ThreadSegment { image_sid, pid, tid, seq, lost, flags, .. } = *head;
        out.calldata.clear();
        if !data.is_empty() {
            self.call_data(pid, tid, seq, data, &mut out.calldata)?;
        }
        let nrec = u32::try_from(nrec).map_err(|_| invalid("write", &self.path, "over 2^32 records in a segment"))?;
        self.columns.clear();
        let streams = self.scratch.finish(&mut self.columns, self.timing);
        out.events.clear();
        out.events.extend_from_slice(&events_head(image_sid, pid, tid, seq, nrec, lost, flags));
        let compressed = match &mut self.frames {
            // The time streams straight from the encoder's buffers: zstd copies its input anyway.
            Some((structure, time)) => append_frame(structure, &self.columns, &mut out.events)
                .and_then(|()| append_blocks(time, &streams, &mut out.events)),
            None => {
                for t in streams {
                    self.columns.extend_from_slice(t);
                }
                append_frame(&mut self.zstd, &self.columns, &mut out.events)
            }
        };
        compressed.map_err(io_err("compress records for", &self.path))
    }

    /// Appends a CALLDATA chunk's payload to `p`: `u32 pid, u32 tid, u64 seq, u32 units`, then
    /// one zstd frame of varints, per unit: record index minus the previous unit's (the
    /// first: the index), number of words, the words.
    fn call_data(&mut self, pid: u32, tid: u32, seq: u64, data: &CallData, p: &mut Vec<u8>) -> Result<(), FormatError> {
        let zstd = match &mut self.data_zstd {
            Some(z) => z,
            None => self.data_zstd.insert(zstd::bulk::Compressor::new(events::DATA_ZSTD_LEVEL).map_err(io_err("set up compression for", &self.path))?),
        };
        let mut out = self.data_varints.writer(0, 2 * data.len() + data.word_count());
        let mut prev = 0u32;
        for (record, words) in data.iter() {
            out.put(u64::from(record.wrapping_sub(prev)));
            out.put(words.len() as u64);
            for &w in words {
                out.put(w);
            }
            prev = record;
        }
        p.extend_from_slice(&pid.to_le_bytes());
        p.extend_from_slice(&tid.to_le_bytes());
        p.extend_from_slice(&seq.to_le_bytes());
        p.extend_from_slice(&(data.len() as u32).to_le_bytes());
        append_frame(zstd, out.bytes(), p).map_err(io_err("compress call data for", &self.path))
    }
}

/// Appends one zstd frame of `streams`, one after the other, each in blocks of its own: a
/// block boundary gives the next stream a Huffman table of its own. The frame states its
/// decoded size.
fn append_blocks(zstd: &mut zstd::zstd_safe::CCtx<'static>, streams: &[&[u8]], p: &mut Vec<u8>) -> io::Result<()> {
    use zstd::zstd_safe::zstd_sys::ZSTD_EndDirective as End;
    use zstd::zstd_safe::{InBuffer, OutBuffer};
    let err = |code| io::Error::other(zstd::zstd_safe::get_error_name(code));
    zstd.reset(zstd::zstd_safe::ResetDirective::SessionOnly).map_err(err)?;
    zstd.set_pledged_src_size(Some(streams.iter().map(|s| s.len() as u64).sum())).map_err(err)?;
    // Room for every stream's worst case: each is bounded apart, with its own block headers.
    let room: usize = streams.iter().map(|s| zstd::zstd_safe::compress_bound(s.len())).sum();
    p.reserve(room + 32);
    let mut step = |input: &[u8], end: End| -> io::Result<()> {
        let mut input = InBuffer::around(input);
        loop {
            if p.len() == p.capacity() {
                p.reserve(4096);
            }
            let at = p.len();
            let mut output = OutBuffer::around_pos(p, at);
            let left = zstd.compress_stream2(&mut output, &mut input, end).map_err(err)?;
            if left == 0 && input.pos() == input.src.len() {
                return Ok(());
            }
        }
    };
    for s in streams.iter().filter(|s| !s.is_empty()) {
        step(s, End::ZSTD_e_flush)?;
    }
    step(&[], End::ZSTD_e_end)
}

/// Appends a zstd frame of `src` to `p`, compressed in place: through a cursor at its end,
/// zstd writes behind what `p` holds, with no buffer in between.
fn append_frame(zstd: &mut zstd::bulk::Compressor<'static>, src: &[u8], p: &mut Vec<u8>) -> io::Result<()> {
    p.reserve(zstd::zstd_safe::compress_bound(src.len()));
    let at = p.len() as u64;
    let mut cur = io::Cursor::new(p);
    cur.set_position(at);
    zstd.compress_to_buffer(src, &mut cur).map(drop)
}
