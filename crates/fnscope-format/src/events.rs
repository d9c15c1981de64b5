//! Compact encoding of a thread segment's records (the body of an EVENTS chunk).
//!
//! The records are turned into varint columns, concatenated and compressed with zstd: in
//! one frame before format version 6, from 6 on the structure columns in one and the time
//! columns in another ([`time_compressor`]), which from version 7 are six streams by record
//! class ([`Timing::Classes`]).
//! Columns compress far better than interleaved fields because each one is a stream of
//! similar small numbers. See docs/FORMAT.md for the byte-level description.

use fnscope_abi::Record;

/// zstd level. The recorder compresses every record the program makes, on a core the program
/// may want, so the fastest level that keeps traces small wins: against level 3, level 1 took
/// 69.5 instead of 85 ns of whole-tree CPU per call of fib at the same 0.67 bytes per call, and
/// 63 instead of 70 ns for python3.11 at 0.78 instead of 0.79 bytes (other workloads: -10% to
/// +14% bytes, 4-17 ns less CPU). Negative levels saved 1-2 ns more for 15-25% more bytes.
pub(crate) const ZSTD_LEVEL: i32 = 1;

/// Shortest match zstd looks for in EVENTS frames (from version 6, the structure columns'),
/// instead of level 1's 6 bytes for inputs of 16 to 256 KiB (a full chunk's columns) and 5
/// below: in the column bytes of real traces, shorter matches cost more to find and encode
/// than they save. With 7, compression took 6-12% less time and traces were as small or
/// smaller (per record: fib 9.85 against 10.93 ns, 0.658 against 0.670 bytes; python3.11
/// 9.86 against 11.24 ns, 0.840 against 0.843; a `make -j2` of gcc 11.56 against 12.25 ns,
/// 1.067 against 1.068; 400 segments of each trace, best of 25; measured on the version 5
/// frame of all columns).
pub(crate) const ZSTD_MIN_MATCH: u32 = 7;

/// A compressor for EVENTS frames before version 6 and for COUNTS and SUMMARY chunks:
/// [`ZSTD_LEVEL`] with [`ZSTD_MIN_MATCH`]. From version 6, [`structure_compressor`] is the
/// structure columns' one.
pub(crate) fn compressor() -> std::io::Result<zstd::bulk::Compressor<'static>> {
    let mut c = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    c.set_parameter(zstd::zstd_safe::CParameter::MinMatch(ZSTD_MIN_MATCH))?;
    Ok(c)
}

/// A compressor for the structure columns' frame of EVENTS chunks (format version 6 on):
/// [`compressor`] with literals stored as they are. Huffman-coding them took a fifth of zstd's
/// time on that frame for a thirtieth of a trace's size: over 200 real segments (best of 9),
/// 1.18 against 1.48 ns a record of fib for 0.075 against 0.053 bytes, 0.84 against 1.13 ns
/// of python3.11 for 0.097 against 0.086 bytes; fib's whole-tree CPU 0.33 ns a call less
/// (`bench/ab.py`, 7 rounds of 11).
pub(crate) fn structure_compressor() -> std::io::Result<zstd::bulk::Compressor<'static>> {
    use zstd::zstd_safe::{CParameter, ParamSwitch};
    let mut c = compressor()?;
    c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Disable))?;
    Ok(c)
}

/// A compressor for the time columns' frame of EVENTS chunks (format version 6 on), a
/// streaming context so that each time stream can end a block: entropy coding alone. Time stamps are noisy small numbers that repeat too little for matches to
/// pay: looking for them took two thirds of zstd's time on the time columns and saved 2% of
/// their size on fib, 3% on a `make -j2` of gcc and 10% on python3.11. A step of
/// [`zstd::zstd_safe::TARGETLENGTH_MAX`] bytes between match attempts (the fast strategy's
/// acceleration) makes zstd skip the search, and literal compression, which zstd turns off
/// with acceleration, is turned back on so the literals are Huffman-coded.
///
/// Against the version 5 frame of all columns at [`ZSTD_LEVEL`] and [`ZSTD_MIN_MATCH`], the
/// two frames took 3.4 instead of 9.9 ns per record of fib, 5.6 instead of 10.4 for python3.11
/// and 6.0 instead of 13.3 for a `make -j2` of gcc, for 0.654 instead of 0.642, 0.886 instead
/// of 0.836 and 1.027 instead of 1.052 bytes (400 real segments of each trace, best of 15).
/// Whole traces rewritten by `examples/versions.rs --old 5`: 0.658 against 0.646, 0.762
/// against 0.689 and 1.50 against 1.54 bytes per call, in 65-77% of the writer's time.
pub(crate) fn time_compressor() -> std::io::Result<zstd::zstd_safe::CCtx<'static>> {
    use zstd::zstd_safe::{CParameter, ParamSwitch};
    let mut c = zstd::zstd_safe::CCtx::try_create().ok_or_else(|| std::io::Error::other("zstd could not make a compression context"))?;
    for p in [
        CParameter::CompressionLevel(ZSTD_LEVEL),
        CParameter::MinMatch(ZSTD_MIN_MATCH),
        CParameter::TargetLength(zstd::zstd_safe::TARGETLENGTH_MAX),
        CParameter::LiteralCompressionMode(ParamSwitch::Enable),
    ] {
        c.set_parameter(p).map_err(|code| std::io::Error::other(zstd::zstd_safe::get_error_name(code)))?;
    }
    Ok(c)
}

/// zstd level of CALLDATA frames.
pub(crate) const DATA_ZSTD_LEVEL: i32 = 1;

/// Largest decoded column data accepted, so that a crafted or damaged length cannot make the
/// reader allocate without bound. A shared-memory chunk (256 KiB by default) decodes to well under twice its size.
pub(crate) const MAX_DECODED: usize = 256 << 20;

/// Most bytes one record can take in the columns (four 10-byte varints plus a flags varint).
const MAX_RECORD_BYTES: usize = 42;

/// The time-stamp predictor shared by the encoder and the decoder.
///
/// Post-order gives every parent after its children. A parent's entry is just before its
/// first child's entry, and a leaf's entry is just before its own exit and just after the
/// previous record's exit, so times are stored as small distances (see [`Timing`]). `groups` holds, for each
/// depth with an open sibling group, the entry time of the group's first record; depths are
/// strictly increasing, so stale groups (left by lost records) are dropped in passing and the
/// stack never holds more entries than there are distinct depths.
#[derive(Default)]
struct Predictor {
    groups: Vec<(u32, u64)>,
}

impl Predictor {
    /// Entry time of the first child of a record at `depth`, if its children were seen.
    #[inline]
    fn take_children(&mut self, depth: u32) -> Option<u64> {
        let child = depth.saturating_add(1);
        while let Some(&(d, t)) = self.groups.last() {
            if d < child {
                break;
            }
            self.groups.pop();
            if d == child {
                return Some(t);
            }
        }
        None
    }

    #[inline]
    fn note(&mut self, depth: u32, t_entry: u64) {
        if self.groups.last().map(|g| g.0) != Some(depth) {
            self.groups.push((depth, t_entry));
        }
    }
}

fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A buffer for varints, grown once to the most a batch can take and kept from batch to
/// batch (the recorder encodes a chunk every few hundred microseconds and must keep up with
/// the program).
#[derive(Default)]
pub(crate) struct VarintBuf {
    buf: Vec<u8>,
}

impl VarintBuf {
    /// A writer for at most `max_values` varints after the first `at` bytes.
    pub(crate) fn writer(&mut self, at: usize, max_values: usize) -> Varints<'_> {
        let need = at + max_values * 10;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        Varints { buf: &mut self.buf, at }
    }
}

/// Writes LEB128 varints at a cursor that stays in a register: with `Vec::push`, the
/// vector's length goes through memory for every byte and chains each value to the one before.
pub(crate) struct Varints<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Varints<'_> {
    /// Appends `v`.
    #[inline]
    pub(crate) fn put(&mut self, v: u64) {
        assert!(self.buf.len() - self.at >= 10, "more varints than the writer was made for");
        // SAFETY: there is room for the longest varint, checked just above.
        unsafe { self.put_unchecked(v) }
    }

    /// Appends `v` without checking for room: the record encoder's loop, where a check per
    /// byte (or per value) took 15% of its time.
    ///
    /// # Safety
    /// Fewer values than the writer was made for ([`VarintBuf::writer`]'s `max_values`) were
    /// put so far, so that the 10 bytes a varint may take are there.
    #[inline]
    pub(crate) unsafe fn put_unchecked(&mut self, mut v: u64) {
        debug_assert!(self.buf.len() - self.at >= 10);
        // SAFETY: `at + 10 <= buf.len()` per the caller's guarantee, and at most 10 bytes are
        // written.
        unsafe {
            while v >= 0x80 {
                *self.buf.get_unchecked_mut(self.at) = v as u8 | 0x80;
                self.at += 1;
                v >>= 7;
            }
            *self.buf.get_unchecked_mut(self.at) = v as u8;
        }
        self.at += 1;
    }

    /// What was written.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.at]
    }
}

/// Reads a LEB128 varint at `*at`, moving past it.
pub(crate) fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut c = Col { b: b.get(*at..)? };
    let before = c.b.len();
    let v = c.get().ok()?;
    *at += before - c.b.len();
    Some(v)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// How a record's two time stamps are split between the time columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timing {
    /// Format version 7 on: [`Timing::LeafGaps`]'s values, each pair in the streams of its
    /// record's [`class`]. Each stream is compressed in a zstd block of its own, with its own
    /// Huffman table: the three kinds of record time different stretches of code (a parent's
    /// return after its last child's, a call made right after its sibling returned, a first
    /// call in a subtree), and one table for all of them fits none. 13-17% fewer bytes than
    /// version 6 on fib and python3.11 (see docs/FORMAT.md).
    Classes,
    /// Format versions 4 to 6. A call with children in the segment: its exit after the
    /// previous record's exit, and its entry before its first child's. A leaf: the gap from
    /// the previous record's exit to its entry, then its duration. In version 3 a leaf's exit
    /// column held gap plus duration, the sum of two noisy numbers; each alone takes fewer
    /// bits (5-11% fewer bytes per call, measured on fib and python3.11 traces).
    LeafGaps,
    /// Versions 1 to 3: every record's exit after the previous record's exit, the entry
    /// before `base` (the first child's entry, or the record's own exit).
    Exits,
}

/// Time streams of a segment: two (exits, entries) per record class of [`Timing::Classes`].
/// Older timings use the first two alone.
pub(crate) const TIME_STREAMS: usize = 6;

/// The class of a record of [`Timing::Classes`], which picks its pair of time streams: 0 a
/// record with children in the segment, 1 a leaf at the depth of the record before it (a
/// sibling's call, or the first record), 2 any other leaf (the first call of a subtree).
#[inline]
fn class(has_children: bool, depth: u32, prev_depth: u32) -> usize {
    if has_children {
        0
    } else if depth == prev_depth {
        1
    } else {
        2
    }
}

/// Where the time streams lie in what [`encode_columns`] appended: stream `i` is
/// `bounds[i]..bounds[i + 1]`.
#[cfg(test)]
pub(crate) type TimeBounds = [usize; TIME_STREAMS + 1];

/// Encodes records into the uncompressed column layout, appended to `out`. Returns where in
/// `out` the time streams lie: the column lengths, shape and ids lie before them.
#[cfg(test)]
pub(crate) fn encode_columns(records: &[Record], out: &mut Vec<u8>, scratch: &mut ColumnScratch, timing: Timing) -> TimeBounds {
    scratch.start();
    scratch.add(records, timing);
    let streams = scratch.finish(out, timing);
    let mut bounds = [0; TIME_STREAMS + 1];
    bounds[0] = out.len();
    for (i, t) in streams.iter().enumerate() {
        out.extend_from_slice(t);
        bounds[i + 1] = out.len();
    }
    bounds
}

/// The columns of one segment as they are built, kept by the writer from segment to segment:
/// fresh ones for every chunk the recorder writes would be a page-faulting allocation each.
/// A segment's records may come in several slices ([`ColumnScratch::add`]): the recorder
/// joins a thread's consecutive chunks into one segment.
#[derive(Default)]
pub(crate) struct ColumnScratch {
    shape: VarintBuf,
    ids: VarintBuf,
    times: [VarintBuf; TIME_STREAMS],
    pred: Predictor,
    /// Where the slices added so far left the encoder.
    at: Resume,
}

/// The column encoder's state between two slices of a segment's records.
#[derive(Default, Clone, Copy)]
struct Resume {
    prev_depth: u32,
    prev_id: u32,
    prev_exit: u64,
    /// Bytes written to `shape`, `ids` and each time stream.
    shape: usize,
    ids: usize,
    times: [usize; TIME_STREAMS],
}

impl ColumnScratch {
    /// Starts a segment.
    pub(crate) fn start(&mut self) {
        self.pred.groups.clear();
        self.at = Resume::default();
    }

    /// Encodes `records`, the segment's next ones, into the columns.
    pub(crate) fn add(&mut self, records: &[Record], timing: Timing) {
        let n = records.len();
        let ColumnScratch { shape, ids, times, pred: kept, at } = self;
        // A local copy: behind `self`, the predictor's stack length and pointer were loaded
        // again after every byte the loop stored (a `u8` store may alias anything), 0.2 ns a
        // record of the recorder's time.
        let mut pred = std::mem::take(kept);
        // A record takes two varints of shape (the flags only when it has some), one of each other.
        let (mut shape, mut ids) = (shape.writer(at.shape, 2 * n), ids.writer(at.ids, n));
        let mut starts = at.times.into_iter();
        let mut times = times.each_mut().map(|t| t.writer(starts.next().unwrap_or_default(), n));
        let leaf_gaps = timing != Timing::Exits;
        let classes = timing == Timing::Classes;
        let (mut prev_depth, mut prev_id, mut prev_exit) = (at.prev_depth, at.prev_id, at.prev_exit);
        for r in records {
            let hi = (r.id_depth >> 32) as u32;
            let (depth, flags) = (hi & 0x00ff_ffff, hi >> 24);
            let id = r.id_depth as u32;
            let dd = zigzag(depth as i64 - prev_depth as i64);
            // SAFETY (every `put_unchecked` of the loop): there are `n` records; `shape` was made
            // for two values a record and gets one, or two with flags; `ids` and each time
            // stream were made for one a record and get at most one (a record's two time values
            // go to two different streams).
            unsafe {
                shape.put_unchecked(dd << 1 | (flags != 0) as u64);
                if flags != 0 {
                    shape.put_unchecked(flags as u64);
                }
                ids.put_unchecked(zigzag(id.wrapping_sub(prev_id) as i32 as i64));
            }
            let first_child = pred.take_children(depth);
            let (exit_delta, entry_delta) = match first_child {
                Some(first_child) => (r.t_exit.wrapping_sub(prev_exit), first_child.wrapping_sub(r.t_entry)),
                None => ((if leaf_gaps { r.t_entry } else { r.t_exit }).wrapping_sub(prev_exit), r.t_exit.wrapping_sub(r.t_entry)),
            };
            let c = if classes { class(first_child.is_some(), depth, prev_depth) } else { 0 };
            // SAFETY: see the shape column's above.
            unsafe {
                times[2 * c].put_unchecked(exit_delta);
                times[2 * c + 1].put_unchecked(entry_delta);
            }
            pred.note(depth, r.t_entry);
            (prev_depth, prev_id, prev_exit) = (depth, id, r.t_exit);
        }
        *kept = pred;
        *at = Resume {
            prev_depth,
            prev_id,
            prev_exit,
            shape: shape.at,
            ids: ids.at,
            times: times.map(|t| t.at),
        };
    }

    /// Appends the segment's column lengths, shape and ids to `out`, and returns its time
    /// streams: the columns' layout is those bytes followed by the streams, which a caller
    /// compressing them apart need not copy.
    pub(crate) fn finish(&self, out: &mut Vec<u8>, timing: Timing) -> [&[u8]; TIME_STREAMS] {
        let at = &self.at;
        let times: [&[u8]; TIME_STREAMS] = std::array::from_fn(|i| &self.times[i].buf[..at.times[i]]);
        let (shape, ids) = (&self.shape.buf[..at.shape], &self.ids.buf[..at.ids]);
        put(out, shape.len() as u64);
        put(out, ids.len() as u64);
        let lengths = if timing == Timing::Classes { TIME_STREAMS - 1 } else { 1 };
        for t in &times[..lengths] {
            put(out, t.len() as u64);
        }
        out.extend_from_slice(shape);
        out.extend_from_slice(ids);
        times
    }
}

/// A cursor over one column; every read is bounds-checked.
struct Col<'a> {
    b: &'a [u8],
}

impl Col<'_> {
    /// Most values of a regular trace fit in one byte: that case must stay cheap.
    #[inline]
    fn get(&mut self) -> Result<u64, &'static str> {
        match self.b.split_first() {
            Some((&byte, rest)) if byte < 0x80 => {
                self.b = rest;
                Ok(byte as u64)
            }
            _ => self.get_long(),
        }
    }

    fn get_long(&mut self) -> Result<u64, &'static str> {
        let mut v = 0u64;
        for (i, &byte) in self.b.iter().enumerate().take(10) {
            v |= ((byte & 0x7f) as u64) << (7 * i);
            if byte < 0x80 {
                self.b = &self.b[i + 1..];
                return Ok(v);
            }
        }
        Err("a varint is cut short or longer than 10 bytes")
    }
}

/// Decodes `nrec` records from the uncompressed column layout.
pub(crate) fn decode_columns(data: &[u8], nrec: u32, out: &mut Vec<Record>, timing: Timing) -> Result<(), &'static str> {
    let classes = timing == Timing::Classes;
    let mut head = Col { b: data };
    // shape, ids, then every time stream but the last, which takes the rest.
    let mut lens = [0usize; TIME_STREAMS + 1];
    let known = if classes { TIME_STREAMS + 1 } else { 3 };
    for l in &mut lens[..known] {
        *l = usize::try_from(head.get()?).map_err(|_| "column length too large")?;
    }
    let mut rest = head.b;
    let mut take = |l: usize| {
        let at = l.min(rest.len());
        let (c, r) = rest.split_at(at);
        rest = r;
        Col { b: c }
    };
    let (mut shape, mut ids) = (take(lens[0]), take(lens[1]));
    let mut times: [Col; TIME_STREAMS] = std::array::from_fn(|i| if i + 1 < known - 1 { take(lens[i + 2]) } else { Col { b: &[] } });
    times[known - 2] = Col { b: rest };
    out.clear();
    out.reserve((nrec as usize).min(data.len() / 4));
    let mut pred = Predictor::default();
    let leaf_gaps = timing != Timing::Exits;
    let (mut depth, mut id, mut exit) = (0u32, 0u32, 0u64);
    for _ in 0..nrec {
        let s = shape.get()?;
        let dd = unzigzag(s >> 1);
        let flags = if s & 1 != 0 { shape.get()? } else { 0 };
        let d = depth as i64 + dd;
        if !(0..=0x00ff_ffff).contains(&d) || flags > 0xff || flags == 0 && s & 1 != 0 {
            return Err("a record's depth or flags are out of range");
        }
        let prev_depth = std::mem::replace(&mut depth, d as u32);
        id = id.wrapping_add(unzigzag(ids.get()?) as i32 as u32);
        let first_child = pred.take_children(depth);
        let c = if classes { class(first_child.is_some(), depth, prev_depth) } else { 0 };
        // The exits value lands on the exit, or on a leaf's entry (version 4 on).
        let landed = exit.wrapping_add(times[2 * c].get()?);
        let back = times[2 * c + 1].get()?;
        let t_entry;
        (t_entry, exit) = match first_child {
            Some(first_child) => (first_child.wrapping_sub(back), landed),
            None if leaf_gaps => (landed, landed.wrapping_add(back)),
            None => (landed.wrapping_sub(back), landed),
        };
        pred.note(depth, t_entry);
        let hi = depth | (flags as u32) << 24;
        out.push(Record {
            t_entry,
            t_exit: exit,
            id_depth: id as u64 | (hi as u64) << 32,
        });
    }
    if !(shape.b.is_empty() && ids.b.is_empty() && times.iter().all(|t| t.b.is_empty())) {
        return Err("the record columns have bytes left over");
    }
    Ok(())
}

/// Upper bound of the decoded column size for `nrec` records.
pub(crate) fn decoded_bound(nrec: u32) -> usize {
    (nrec as usize)
        .saturating_mul(MAX_RECORD_BYTES)
        .saturating_add(10 * (TIME_STREAMS + 1))
        .min(MAX_DECODED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(recs: &[Record]) {
        for timing in [Timing::Classes, Timing::LeafGaps, Timing::Exits] {
            let mut buf = Vec::new();
            encode_columns(recs, &mut buf, &mut ColumnScratch::default(), timing);
            let mut back = Vec::new();
            decode_columns(&buf, recs.len() as u32, &mut back, timing).unwrap();
            assert_eq!(back, recs, "{timing:?}");
        }
    }

    /// Post-order records of fib(n) at `depth`, each event a noisy number of ticks after the
    /// one before, as a busy CPU times them.
    fn noisy_fib(n: u32, depth: u32, t: &mut u64, rnd: &mut impl FnMut() -> u64, out: &mut Vec<Record>) {
        let entry = *t;
        *t += 20 + rnd() % 9 * 2;
        if n >= 2 {
            noisy_fib(n - 1, depth + 1, t, rnd, out);
            noisy_fib(n - 2, depth + 1, t, rnd, out);
        }
        *t += 24 + rnd() % 13 * 2;
        out.push(Record::new(entry, *t, 0, depth, 0));
        *t += 6 + rnd() % 5 * 2;
    }

    /// The records of [`noisy_fib`] of 20, with the noise drawn from a xorshift generator
    /// seeded with `x`.
    fn noisy_fib_20(mut x: u64) -> Vec<Record> {
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut recs, mut t) = (Vec::new(), 1u64 << 40);
        noisy_fib(20, 0, &mut t, &mut rnd, &mut recs);
        recs
    }

    /// Why format version 4 changed the timing columns: on a noisy trace, a leaf's gap and
    /// duration apart compress smaller than their sum.
    #[test]
    fn leaf_gaps_compress_smaller_than_exits() {
        let recs = noisy_fib_20(0x9e37_79b9_7f4a_7c15);
        let size = |timing| {
            let mut buf = Vec::new();
            encode_columns(&recs, &mut buf, &mut ColumnScratch::default(), timing);
            compressor().unwrap().compress(&buf).unwrap().len()
        };
        let (gaps, exits) = (size(Timing::LeafGaps), size(Timing::Exits));
        assert!(gaps * 100 < exits * 95, "leaf gaps {gaps} bytes, exits {exits} bytes for {} records", recs.len());
        round_trip(&recs);
    }

    /// Why format version 7 splits the time columns by record class: the classes' values
    /// fall in different ranges (here as in `noisy_fib`: a parent's exit follows its last
    /// child's by 30-62 ticks, a sibling's call follows the previous return by 6-14, a leaf
    /// lasts 44-84), and a Huffman table each codes them in fewer bits than one for all.
    /// The whole EVENTS payload is compared, as the writer makes it for each version.
    #[test]
    fn time_classes_compress_smaller_than_two_columns() {
        let recs = noisy_fib_20(0x2545_f491_4f6c_dd1d);
        let head = crate::ThreadSegment { image_sid: 0, pid: 1, tid: 1, seq: 0, lost: 0, flags: 0, records: Vec::new(), data: Default::default() };
        let size = |version| {
            let mut enc = crate::segment::SegmentEncoder::new(std::path::Path::new("t.fns"), version).unwrap();
            let mut out = crate::segment::SegmentPayloads::default();
            enc.encode(&head, &recs, &Default::default(), &mut out).unwrap();
            out.events.len()
        };
        let (v6, v7) = (size(6), size(7));
        assert!(v7 * 100 < v6 * 93, "version 7 {v7} bytes, version 6 {v6} bytes for {} records", recs.len());
    }

    /// The unchecked writer makes the bytes of plain LEB128 for values of every length, both
    /// sides of each length's boundary, back to back.
    #[test]
    fn varint_writer_matches_leb128() {
        let mut values = vec![0u64, 1, u64::MAX];
        for bits in 1..64 {
            values.extend([(1u64 << bits) - 1, 1 << bits, (1 << bits) + 1, 0x5555_5555_5555_5555 >> (64 - bits)]);
        }
        let mut expected = Vec::new();
        for &v in &values {
            put(&mut expected, v);
        }
        let mut buf = VarintBuf::default();
        let mut w = buf.writer(0, values.len());
        for &v in &values {
            w.put(v);
        }
        assert_eq!(w.bytes(), &expected[..]);
        let mut at = 0;
        for &v in &values {
            assert_eq!(get_varint(w.bytes(), &mut at), Some(v));
        }
    }

    #[test]
    fn lossless_for_any_values() {
        round_trip(&[]);
        round_trip(&[Record {
            t_entry: u64::MAX,
            t_exit: 0,
            id_depth: u64::MAX,
        }]);
        round_trip(&[
            Record {
                t_entry: 5,
                t_exit: 3,
                id_depth: 0,
            },
            Record {
                t_entry: 1 << 63,
                t_exit: 7,
                id_depth: 0x00ff_ffff_0000_0001,
            },
            Record::new(10, 20, 3, 0x00ff_ffff, 0xff),
            Record::new(10, 20, 3, 0, 1),
            Record::new(0, u64::MAX, u32::MAX - 1, 5, 0),
            Record::new(100, 90, 0, 4, 0),
        ]);
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let recs: Vec<Record> = (0..2000)
            .map(|_| Record {
                t_entry: rnd(),
                t_exit: rnd(),
                id_depth: rnd(),
            })
            .collect();
        round_trip(&recs);
        let recs: Vec<Record> = (0..2000)
            .map(|_| {
                Record::new(
                    rnd() % 1000,
                    rnd() % 1000,
                    (rnd() % 5) as u32,
                    (rnd() % 6) as u32,
                    0,
                )
            })
            .collect();
        round_trip(&recs);
    }

    #[test]
    fn rejects_short_columns() {
        let recs = [Record::new(1, 2, 3, 0, 0), Record::new(0, 5, 1, 0, 0)];
        for timing in [Timing::Classes, Timing::LeafGaps, Timing::Exits] {
            let mut buf = Vec::new();
            encode_columns(&recs, &mut buf, &mut ColumnScratch::default(), timing);
            let mut out = Vec::new();
            assert!(decode_columns(&buf, 3, &mut out, timing).is_err());
            assert!(decode_columns(&buf, 1, &mut out, timing).is_err());
            for cut in 0..buf.len() {
                assert!(decode_columns(&buf[..cut], 2, &mut out, timing).is_err());
            }
        }
    }
}
