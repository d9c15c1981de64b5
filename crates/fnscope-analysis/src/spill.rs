//! Each thread's calls in the order they started, from records in the order they returned,
//! in memory bounded independent of the number of calls.
//!
//! A record's place in its thread's call tree is known when it arrives: its subtree is the run
//! of records `first..=own` (post-order positions within the thread) that ends with it, and
//! `first` follows from a stack with one entry per depth. Sorting by `(first, own descending)`
//! is the pre-order (entry order). The sort is external: buffers of at most [`BUFFER_CALLS`]
//! calls, [`MEMORY_CALLS`] over all threads, are put in entry order and spilled to an unlinked
//! temporary file per thread (in the system temp dir, `TMPDIR`).
//!
//! A buffer's calls whose subtree starts inside it sort after every call of earlier buffers
//! (their `first` is past the earlier buffers' `own`s), so those parts of the runs are read
//! back one run after the other: each call is written once and read once, with no merge.
//! Only the calls whose subtree started in an earlier buffer (callers of the buffer's first
//! call, a chain no longer than the depth) belong further back; they are few, kept apart,
//! sorted in runs of their own (merged [`FAN`] at a time when they pile up) and merged into
//! the sequence by key.

use crate::AnalysisError;
use fnscope_abi::Record;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Calls kept in memory over all threads before the thread holding most is spilled (56 bytes
/// each, and as much again for the buffer being put in entry order).
pub(crate) const MEMORY_CALLS: usize = 256 * 1024;
/// Calls of one thread's buffer that make it spill, whatever the other threads hold: 3.5 MiB,
/// and as much again while it is put in entry order, so that a spill's passes over the buffer
/// stay in the last-level cache of the hosts measured. With buffers of up to 256 Ki calls,
/// `replay` of a 126 M-call tree took 24.9 s and 41 MB, with 64 Ki 21.5 s and 20 MB.
pub(crate) const BUFFER_CALLS: usize = 64 * 1024;
/// Runs of one level merged into one run of the next level.
const FAN: usize = 16;
/// Calls kept apart (see the module comment) held in memory before they are spilled.
const CHAIN_CALLS: usize = 16 * 1024;
/// Calls per block of a spilled run: the unit a reader decodes at a time.
const BLOCK_CALLS: usize = 1024;

/// One call with its place in its thread's call tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    /// Post-order position of the first record of the call's subtree.
    pub first: u64,
    /// Post-order position of the call's own record.
    pub own: u64,
    pub t_entry: u64,
    pub t_exit: u64,
    /// Function index in [`crate::names::Names`].
    pub func: u32,
    /// The high half of `Record::id_depth`: depth and flags.
    pub depth_flags: u32,
    /// Image session id and function id of the record.
    pub image: u32,
    pub id: u32,
    /// Where the call's argument and return-value words are kept
    /// ([`crate::calldata::CallData`]), 0 when it has none.
    pub data: u64,
}

impl Call {
    fn key(&self) -> (u64, Reverse<u64>) {
        (self.first, Reverse(self.own))
    }

    /// Whether the trace holds calls made by this one.
    pub fn has_callees(&self) -> bool {
        self.first < self.own
    }

    /// Whether `later`, which comes after this call in entry order, was made inside it.
    pub fn contains(&self, later: &Call) -> bool {
        later.own < self.own
    }

    pub fn depth(&self) -> u32 {
        self.depth_flags & 0x00ff_ffff
    }

    pub fn flags(&self) -> u32 {
        self.depth_flags >> 24
    }

    pub fn ticks(&self) -> u64 {
        self.t_exit.wrapping_sub(self.t_entry)
    }
}

/// Places records in their thread's call tree as they arrive (see the module comment).
#[derive(Default)]
struct Placer {
    next: u64,
    /// Groups of calls whose caller has not returned yet: `(depth, first of the group's first
    /// call)`, depths strictly increasing.
    open: Vec<(u32, u64)>,
}

impl Placer {
    fn place(&mut self, rec: &Record, func: u32, image: u32, data: u64) -> Call {
        let own = self.next;
        self.next += 1;
        let d = rec.depth();
        let mut first = own;
        while let Some(&(gd, gf)) = self.open.last() {
            if gd <= d {
                break;
            }
            first = gf;
            self.open.pop();
        }
        if d == 0 {
            // A call at depth 0 completes a tree: nothing before it can be adopted any more.
            self.open.clear();
        } else if self.open.last().is_none_or(|&(gd, _)| gd != d) {
            self.open.push((d, first));
        }
        Call {
            first,
            own,
            t_entry: rec.t_entry,
            t_exit: rec.t_exit,
            func,
            depth_flags: (rec.id_depth >> 32) as u32,
            image,
            id: rec.id(),
            data,
        }
    }
}

/// A sorted run in a spill file.
#[derive(Clone, Copy)]
struct Run {
    offset: u64,
    len: u64,
    level: u32,
}

/// An unlinked temporary file, gone when closed.
struct SpillFile {
    file: File,
    end: u64,
}

pub(crate) fn temp_err(source: std::io::Error) -> AnalysisError {
    AnalysisError::Temp {
        dir: std::env::temp_dir(),
        source,
    }
}

/// A new temporary file in `TMPDIR`, unlinked at once, so that nothing is left behind
/// whatever happens to this process.
pub(crate) fn unlinked_temp_file() -> Result<File, AnalysisError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path: PathBuf = std::env::temp_dir().join(format!(
        "fnscope-replay-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(temp_err)?;
    std::fs::remove_file(&path).map_err(temp_err)?;
    Ok(file)
}

impl SpillFile {
    fn create() -> Result<SpillFile, AnalysisError> {
        Ok(SpillFile { file: unlinked_temp_file()?, end: 0 })
    }

    /// Writes `calls` (sorted) as a run at the end of the file.
    fn write_run(&mut self, calls: &[Call], level: u32) -> Result<Run, AnalysisError> {
        let mut w = RunWriter::new(&self.file, self.end, level);
        for c in calls {
            w.push(c)?;
        }
        let run = w.finish()?;
        self.end = run.offset + run.len;
        Ok(run)
    }

    /// Gives the disk space of consumed runs back; the file keeps its size.
    fn release(&self, runs: &[Run]) {
        use std::os::fd::AsRawFd;
        for r in runs {
            // SAFETY: fallocate on our own file descriptor; failure only keeps the space.
            unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    r.offset as libc::off_t,
                    r.len as libc::off_t,
                );
            }
        }
    }
}

/// Appends `v` as an LEB128 varint (7 bits a byte, low first).
pub fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads the LEB128 varint at `*at` and moves past it; `None` when `b` ends inside it.
pub fn get(b: &[u8], at: &mut usize) -> Option<u64> {
    // Most values fit in one byte.
    let byte = *b.get(*at)?;
    if byte < 0x80 {
        *at += 1;
        return Some(u64::from(byte));
    }
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Appends a run block by block: `u32 bytes, u32 calls`, then per call a byte saying which
/// fields repeat the previous call's (in entry order a call is mostly of the function and one
/// level below the previous one, and has no data), then varints of the other fields, as
/// differences to the previous call of the block where that makes them small.
struct RunWriter<'a> {
    file: &'a File,
    start: u64,
    end: u64,
    level: u32,
    block: Vec<u8>,
    count: u32,
    prev: Call,
}

const ZERO: Call = Call {
    first: 0,
    own: 0,
    t_entry: 0,
    t_exit: 0,
    func: 0,
    depth_flags: 0,
    image: 0,
    id: 0,
    data: 0,
};

/// The function (index, image and id) is the previous call's.
const SAME_FUNCTION: u8 = 1;
/// Depth and flags are the previous call's.
const SAME_DEPTH: u8 = 2;
/// Depth and flags are the previous call's depth plus one, flags clear.
const DEEPER: u8 = 4;
/// The call has argument data.
const HAS_DATA: u8 = 8;

/// Writes `v` as an LEB128 varint at `out[*at..]` (which has room for 10 bytes).
#[inline]
fn put_at(out: &mut [u8], at: &mut usize, mut v: u64) {
    while v >= 0x80 {
        out[*at] = v as u8 | 0x80;
        *at += 1;
        v >>= 7;
    }
    out[*at] = v as u8;
    *at += 1;
}

impl<'a> RunWriter<'a> {
    fn new(file: &'a File, end: u64, level: u32) -> RunWriter<'a> {
        RunWriter {
            file,
            start: end,
            end,
            level,
            block: vec![0; 8],
            count: 0,
            prev: ZERO,
        }
    }

    fn push(&mut self, c: &Call) -> Result<(), AnalysisError> {
        let p = &self.prev;
        // Encoded in a fixed array and appended at once: pushing byte by byte onto the
        // block checked its capacity at every byte.
        let mut e = [0u8; 1 + 9 * 10];
        let mut at = 1;
        let mut how = 0;
        if (c.func, c.image, c.id) == (p.func, p.image, p.id) {
            how |= SAME_FUNCTION;
        }
        if c.depth_flags == p.depth_flags {
            how |= SAME_DEPTH;
        } else if c.depth_flags == p.depth_flags.wrapping_add(1) && c.flags() == 0 {
            how |= DEEPER;
        }
        if c.data != 0 {
            how |= HAS_DATA;
        }
        e[0] = how;
        put_at(&mut e, &mut at, c.first.wrapping_sub(p.first));
        put_at(&mut e, &mut at, c.own.wrapping_sub(c.first));
        let dt = c.t_entry.wrapping_sub(p.t_entry) as i64;
        put_at(&mut e, &mut at, ((dt << 1) ^ (dt >> 63)) as u64);
        put_at(&mut e, &mut at, c.ticks());
        if how & SAME_FUNCTION == 0 {
            put_at(&mut e, &mut at, u64::from(c.func));
            put_at(&mut e, &mut at, u64::from(c.image));
            put_at(&mut e, &mut at, u64::from(c.id));
        }
        if how & (SAME_DEPTH | DEEPER) == 0 {
            put_at(&mut e, &mut at, u64::from(c.depth_flags));
        }
        if how & HAS_DATA != 0 {
            put_at(&mut e, &mut at, c.data);
        }
        self.block.extend_from_slice(&e[..at]);
        self.prev = *c;
        self.count += 1;
        if self.count as usize == BLOCK_CALLS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), AnalysisError> {
        if self.count == 0 {
            return Ok(());
        }
        let bytes = (self.block.len() - 8) as u32;
        self.block[0..4].copy_from_slice(&bytes.to_le_bytes());
        self.block[4..8].copy_from_slice(&self.count.to_le_bytes());
        self.file
            .write_all_at(&self.block, self.end)
            .map_err(temp_err)?;
        self.end += self.block.len() as u64;
        self.block.truncate(8);
        self.count = 0;
        self.prev = ZERO;
        Ok(())
    }

    fn finish(mut self) -> Result<Run, AnalysisError> {
        self.flush()?;
        Ok(Run {
            offset: self.start,
            len: self.end - self.start,
            level: self.level,
        })
    }
}

/// Reads a run back, one block at a time, each read taking the next block's head along.
struct RunReader<'a> {
    file: &'a File,
    at: u64,
    end: u64,
    /// The head of the block at `at`: its bytes and calls.
    head: Option<(usize, usize)>,
    bytes: Vec<u8>,
    calls: Vec<Call>,
    next: usize,
}

fn damaged() -> AnalysisError {
    temp_err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "a temporary file of the replay reads back differently from what was written",
    ))
}

fn block_head(b: &[u8]) -> (usize, usize) {
    let bytes = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
    (bytes, count)
}

impl<'a> RunReader<'a> {
    fn new(file: &'a File, run: &Run) -> RunReader<'a> {
        RunReader {
            file,
            at: run.offset,
            end: run.offset + run.len,
            head: None,
            bytes: Vec::new(),
            calls: Vec::with_capacity(BLOCK_CALLS),
            next: 0,
        }
    }

    fn next(&mut self) -> Result<Option<Call>, AnalysisError> {
        if self.next == self.calls.len() {
            if self.at >= self.end {
                return Ok(None);
            }
            self.load_block()?;
        }
        self.next += 1;
        Ok(Some(self.calls[self.next - 1]))
    }

    fn load_block(&mut self) -> Result<(), AnalysisError> {
        let (bytes, count) = match self.head {
            Some(h) => h,
            None => {
                let mut head = [0u8; 8];
                self.file.read_exact_at(&mut head, self.at).map_err(temp_err)?;
                block_head(&head)
            }
        };
        let body = self.at + 8;
        let next = body + bytes as u64;
        let with_head = if next + 8 <= self.end { 8 } else { 0 };
        self.bytes.resize(bytes + with_head, 0);
        self.file.read_exact_at(&mut self.bytes, body).map_err(temp_err)?;
        self.head = (with_head > 0).then(|| block_head(&self.bytes[bytes..]));
        self.at = next;
        self.calls.clear();
        self.next = 0;
        let (b, mut i, mut p) = (&self.bytes[..bytes], 0usize, ZERO);
        for _ in 0..count {
            let how = *b.get(i).ok_or_else(damaged)?;
            i += 1;
            let mut field = || get(b, &mut i).ok_or_else(damaged);
            let first = p.first.wrapping_add(field()?);
            let own = first.wrapping_add(field()?);
            let z = field()?;
            let t_entry = p.t_entry.wrapping_add(((z >> 1) as i64 ^ -((z & 1) as i64)) as u64);
            let t_exit = t_entry.wrapping_add(field()?);
            let (func, image, id) = if how & SAME_FUNCTION != 0 {
                (p.func, p.image, p.id)
            } else {
                (field()? as u32, field()? as u32, field()? as u32)
            };
            let depth_flags = if how & SAME_DEPTH != 0 {
                p.depth_flags
            } else if how & DEEPER != 0 {
                p.depth_flags.wrapping_add(1)
            } else {
                field()? as u32
            };
            let data = if how & HAS_DATA != 0 { field()? } else { 0 };
            p = Call {
                first,
                own,
                t_entry,
                t_exit,
                func,
                depth_flags,
                image,
                id,
                data,
            };
            self.calls.push(p);
        }
        Ok(())
    }
}

/// Where a merge takes calls from.
enum Source<'a> {
    Run(RunReader<'a>),
    Memory(std::vec::IntoIter<Call>),
}

impl Source<'_> {
    fn next(&mut self) -> Result<Option<Call>, AnalysisError> {
        match self {
            Source::Run(r) => r.next(),
            Source::Memory(m) => Ok(m.next()),
        }
    }
}

/// A call's sort key and the index of the source it came from.
type Head = Reverse<((u64, Reverse<u64>), usize)>;

/// Calls of sorted sources, in entry order.
struct HeapMerge<'a> {
    sources: Vec<Source<'a>>,
    heap: BinaryHeap<Head>,
    heads: Vec<Option<Call>>,
}

impl<'a> HeapMerge<'a> {
    fn new(mut sources: Vec<Source<'a>>) -> Result<HeapMerge<'a>, AnalysisError> {
        let mut heap = BinaryHeap::with_capacity(sources.len());
        let mut heads = Vec::with_capacity(sources.len());
        for (i, s) in sources.iter_mut().enumerate() {
            let h = s.next()?;
            if let Some(c) = &h {
                heap.push(Reverse((c.key(), i)));
            }
            heads.push(h);
        }
        Ok(HeapMerge {
            sources,
            heap,
            heads,
        })
    }

    fn next(&mut self) -> Result<Option<Call>, AnalysisError> {
        let Some(&Reverse((_, i))) = self.heap.peek() else {
            return Ok(None);
        };
        let c = self.heads[i].take();
        self.heads[i] = self.sources[i].next()?;
        match &self.heads[i] {
            // The source's next call replaces it at the top: a run holds whole subtrees,
            // which come out one after the other, so it mostly stays there and the sift
            // down costs a compare or two instead of a pop and a push.
            Some(n) => {
                let key = n.key();
                *self.heap.peek_mut().expect("peeked above") = Reverse((key, i));
            }
            None => {
                self.heap.pop();
            }
        }
        Ok(c)
    }
}

/// Sorted runs read one after the other, then the calls held in memory: a run's calls sort
/// after the previous run's (see the module comment).
struct Sequence<'a> {
    file: Option<&'a File>,
    runs: std::vec::IntoIter<Run>,
    reading: Option<RunReader<'a>>,
    memory: std::vec::IntoIter<Call>,
}

impl Sequence<'_> {
    fn next(&mut self) -> Result<Option<Call>, AnalysisError> {
        loop {
            if let Some(r) = &mut self.reading {
                if let Some(c) = r.next()? {
                    return Ok(Some(c));
                }
            }
            match (self.runs.next(), self.file) {
                (Some(run), Some(file)) => self.reading = Some(RunReader::new(file, &run)),
                _ => return Ok(self.memory.next()),
            }
        }
    }
}

/// One thread's calls in entry order: the sequence of runs merged with the few calls kept
/// apart.
pub(crate) struct Merge<'a> {
    sequence: Sequence<'a>,
    next_in_sequence: Option<Call>,
    chain: HeapMerge<'a>,
    next_in_chain: Option<Call>,
}

impl Merge<'_> {
    /// Whether calls are read back from the spill file.
    pub fn reads_files(&self) -> bool {
        self.sequence.reading.is_some()
            || !self.sequence.runs.as_slice().is_empty()
            || self.chain.sources.iter().any(|s| matches!(s, Source::Run(_)))
    }

    /// The next call in entry order.
    pub fn next(&mut self) -> Result<Option<Call>, AnalysisError> {
        let from_chain = match (&self.next_in_sequence, &self.next_in_chain) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(s), Some(c)) => c.key() < s.key(),
        };
        if from_chain {
            let c = self.next_in_chain.take();
            self.next_in_chain = self.chain.next()?;
            Ok(c)
        } else {
            let c = self.next_in_sequence.take();
            self.next_in_sequence = self.sequence.next()?;
            Ok(c)
        }
    }
}

/// Puts one thread's calls, held in the order they arrived (post-order, `own` consecutive),
/// in entry order (the order of [`Call::key`]) in linear time; sorting them was a fifth of a
/// walk. A call's subtree is the run `first..=own`, so the calls whose subtree starts among
/// these are bucketed by `first`; calls sharing one (a call and the chain of its first
/// callees) arrived innermost first and go outermost first. Calls whose subtree starts
/// earlier all contain the first call held: a chain of its callers, no longer than the
/// depth, sorted ahead of the rest. Returns how many they are.
///
/// `calls` may come back in another vector's memory: the calls are scattered into a second
/// buffer that then takes the first one's place, rather than being copied back.
fn sort_entry_order(calls: &mut Vec<Call>) -> usize {
    let n = calls.len();
    if n == 0 {
        // Nothing to scatter: the scratch copy stays where it is, for the next buffer.
        return 0;
    }
    let base = calls[0].own;
    // Out of arrival order (which the bucket pass below also finds) or too many for the
    // buckets' u32 ends: sorted.
    let sort = |calls: &mut Vec<Call>| {
        let base = calls.iter().map(|c| c.own).min().unwrap_or(0);
        calls.sort_unstable_by_key(Call::key);
        calls.partition_point(|c| c.first < base)
    };
    if n > u32::MAX as usize / 2 {
        return sort(calls);
    }
    thread_local! {
        /// Bucket ends and the scattered copy, kept from one buffer to the next: fresh ones
        /// were tens of megabytes of page faults at every spill, a third of a walk's time.
        static SCRATCH: std::cell::RefCell<(Vec<u32>, Vec<Call>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    SCRATCH.with_borrow_mut(|(end, sorted)| {
        // `end[b + 1]`: where bucket `b` (first = base + b) ends, filled from there down.
        // One pass over the calls checks they are in arrival order, sets the calls kept
        // apart aside and counts the buckets: each pass over a spilled buffer is memory
        // traffic the size of the buffer.
        end.clear();
        end.resize(n + 1, 0);
        let mut in_order = true;
        let mut earlier: Vec<u32> = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            in_order &= c.own == base + i as u64;
            match c.first.checked_sub(base) {
                None => earlier.push(i as u32),
                Some(b) if b < n as u64 => end[b as usize + 1] += 1,
                Some(_) => in_order = false,
            }
        }
        if !in_order {
            return sort(calls);
        }
        earlier.sort_unstable_by_key(|&i| calls[i as usize].key());
        end[0] = earlier.len() as u32;
        for b in 1..=n {
            end[b] += end[b - 1];
        }
        // Scattered into a copy: moving calls in place along the permutation's cycles was
        // twice as slow (each move waits for the previous one's cache miss). Every place of
        // the copy is written below (the buckets and the earlier calls cover `0..n`), so what
        // it holds (a buffer swapped in by the last spill) is kept and only its growth
        // zeroed: zeroing all of it was as much memory traffic as the scatter.
        sorted.truncate(n);
        sorted.resize(n, ZERO);
        for (k, &i) in earlier.iter().enumerate() {
            sorted[k] = calls[i as usize];
        }
        for c in calls.iter().filter(|c| c.first >= base) {
            let e = &mut end[(c.first - base) as usize + 1];
            *e -= 1;
            sorted[*e as usize] = *c;
        }
        std::mem::swap(calls, sorted);
        earlier.len()
    })
}

/// The thread's spill file, created when first needed.
fn spill_file(file: &mut Option<SpillFile>) -> Result<&mut SpillFile, AnalysisError> {
    if file.is_none() {
        *file = Some(SpillFile::create()?);
    }
    Ok(file.as_mut().expect("created above"))
}

thread_local! {
    /// The largest buffer spilled, emptied, for the next buffer that fills up: allocating
    /// buffers afresh cost a page fault every few calls. Holds no more than the budget.
    static SPARE: std::cell::RefCell<Vec<Call>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One thread's calls waiting to be read in entry order.
#[derive(Default)]
pub(crate) struct ThreadCalls {
    placer: Placer,
    memory: Vec<Call>,
    /// Runs of calls whose subtree starts in their run, in the order spilled.
    runs: Vec<Run>,
    /// Calls whose subtree starts in an earlier run, in the order they arrived.
    chain: Vec<Call>,
    /// Sorted runs of them.
    chain_runs: Vec<Run>,
    file: Option<SpillFile>,
}

impl ThreadCalls {
    /// Adds the thread's next record; true when it completed a tree (a depth-0 call).
    pub fn push(&mut self, rec: &Record, func: u32, image: u32, data: u64) -> bool {
        if self.memory.len() == self.memory.capacity() {
            SPARE.with_borrow_mut(|spare| {
                if spare.capacity() > self.memory.capacity() {
                    spare.extend_from_slice(&self.memory);
                    std::mem::swap(spare, &mut self.memory);
                    spare.clear();
                    spare.shrink_to(0);
                }
            });
        }
        self.memory.push(self.placer.place(rec, func, image, data));
        rec.depth() == 0
    }

    /// Gives the buffer's memory to [`SPARE`] if larger than what is there.
    fn give_back_memory(&mut self) {
        self.memory.clear();
        SPARE.with_borrow_mut(|spare| {
            if self.memory.capacity() > spare.capacity() {
                std::mem::swap(spare, &mut self.memory);
            }
        });
        self.memory.shrink_to(BLOCK_CALLS);
    }

    /// Whether the buffer holds [`BUFFER_CALLS`] and should be spilled.
    pub fn buffer_full(&self) -> bool {
        self.memory.len() >= BUFFER_CALLS
    }

    /// Calls held in memory.
    pub fn in_memory(&self) -> usize {
        self.memory.len() + self.chain.len()
    }

    /// Writes the calls held in memory to disk as a sorted run, and the calls kept apart too
    /// when they are many, or more than that run (this thread holds most because of them).
    pub fn spill(&mut self) -> Result<(), AnalysisError> {
        if self.memory.is_empty() && self.chain.is_empty() {
            return Ok(());
        }
        let earlier = sort_entry_order(&mut self.memory);
        self.chain.extend_from_slice(&self.memory[..earlier]);
        let rest = self.memory.len() - earlier;
        if rest > 0 {
            let run = spill_file(&mut self.file)?.write_run(&self.memory[earlier..], 0)?;
            self.runs.push(run);
        }
        self.give_back_memory();
        if self.chain.len() >= CHAIN_CALLS || self.chain.len() > rest {
            self.spill_chain()?;
        }
        Ok(())
    }

    /// Writes the calls kept apart as a sorted run; merges their runs when [`FAN`] of one
    /// level have piled up.
    fn spill_chain(&mut self) -> Result<(), AnalysisError> {
        self.chain.sort_unstable_by_key(Call::key);
        let run = spill_file(&mut self.file)?.write_run(&self.chain, 0)?;
        self.chain_runs.push(run);
        self.chain.clear();
        self.chain.shrink_to(BLOCK_CALLS);
        loop {
            let top = self.chain_runs.last().map_or(0, |r| r.level);
            let same = self.chain_runs.iter().rev().take_while(|r| r.level == top).count();
            if same < FAN {
                return Ok(());
            }
            let merged: Vec<Run> = self.chain_runs.split_off(self.chain_runs.len() - same);
            let file = self.file.as_mut().expect("runs live in the spill file");
            // Readers and the writer use positioned I/O on one file: they do not disturb
            // each other.
            let run = {
                let sources = merged.iter().map(|r| Source::Run(RunReader::new(&file.file, r)));
                let mut m = HeapMerge::new(sources.collect())?;
                let mut w = RunWriter::new(&file.file, file.end, top + 1);
                while let Some(c) = m.next()? {
                    w.push(&c)?;
                }
                w.finish()?
            };
            file.end = run.offset + run.len;
            file.release(&merged);
            self.chain_runs.push(run);
        }
    }

    /// Every call held, in entry order. Nothing is held afterwards; call
    /// [`ThreadCalls::reset_file`] once the merge is read to give the disk space back.
    pub fn drain(&mut self) -> Result<Merge<'_>, AnalysisError> {
        let earlier = sort_entry_order(&mut self.memory);
        let mut memory = std::mem::take(&mut self.memory);
        let mut chain = std::mem::take(&mut self.chain);
        chain.extend(memory.drain(..earlier));
        chain.sort_unstable_by_key(Call::key);
        let runs = std::mem::take(&mut self.runs);
        let chain_runs = std::mem::take(&mut self.chain_runs);
        let file = self.file.as_ref().map(|f| &f.file);
        let mut chain_sources: Vec<Source<'_>> = Vec::with_capacity(chain_runs.len() + 1);
        if let Some(f) = file {
            chain_sources.extend(chain_runs.iter().map(|r| Source::Run(RunReader::new(f, r))));
        }
        chain_sources.push(Source::Memory(chain.into_iter()));
        let mut chain = HeapMerge::new(chain_sources)?;
        let mut sequence = Sequence {
            file,
            runs: runs.into_iter(),
            reading: None,
            memory: memory.into_iter(),
        };
        Ok(Merge {
            next_in_sequence: sequence.next()?,
            sequence,
            next_in_chain: chain.next()?,
            chain,
        })
    }

    /// Empties the spill file after a [`ThreadCalls::drain`] was read.
    pub fn reset_file(&mut self) -> Result<(), AnalysisError> {
        if let Some(f) = &mut self.file {
            f.file.set_len(0).map_err(temp_err)?;
            f.end = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Depths of a pseudo-random forest in post-order (the order records arrive), with some
    /// trees cut off at the start as if their first calls were in an earlier buffer.
    fn post_order(seed: u64, calls: usize) -> Vec<u32> {
        let mut x = seed;
        let mut rand = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        fn tree(depth: u32, out: &mut Vec<u32>, left: &mut usize, rand: &mut dyn FnMut(u64) -> u64) {
            while *left > 1 && depth < 40 && rand(3) != 0 {
                *left -= 1;
                tree(depth + 1, out, left, rand);
            }
            out.push(depth);
        }
        let mut out = Vec::new();
        let mut left = calls;
        while left > 0 {
            left -= 1;
            tree(0, &mut out, &mut left, &mut rand);
        }
        out
    }

    #[test]
    fn linear_entry_order_is_the_sort_order() {
        for seed in 1..40u64 {
            let depths = post_order(seed * 7919, 3000);
            let mut placer = Placer::default();
            let calls: Vec<Call> =
                depths.iter().enumerate().map(|(i, &d)| placer.place(&Record::new(i as u64, i as u64 + 1, 0, d, 0), 0, 0, 0)).collect();
            // Buffers cut anywhere, as spills cut them.
            let mut at = 0;
            while at < calls.len() {
                let len = (1 + (seed as usize * 131 + at) % 700).min(calls.len() - at);
                let mut fast = calls[at..at + len].to_vec();
                let earlier = sort_entry_order(&mut fast);
                assert!(fast[..earlier].iter().all(|c| c.first < calls[at].own));
                assert!(fast[earlier..].iter().all(|c| c.first >= calls[at].own));
                let mut want = calls[at..at + len].to_vec();
                want.sort_unstable_by_key(Call::key);
                assert_eq!(fast, want, "seed {seed}, calls {at}..{}", at + len);
                at += len;
            }
        }
    }

    /// Buffers not in arrival order, or with a subtree starting past the buffer, go the
    /// sorting way and still come back in key order with the calls kept apart counted.
    #[test]
    fn calls_out_of_arrival_order_are_sorted() {
        let depths = post_order(17, 500);
        let mut placer = Placer::default();
        let calls: Vec<Call> =
            depths.iter().enumerate().map(|(i, &d)| placer.place(&Record::new(i as u64, i as u64 + 1, 0, d, 0), 0, 0, 0)).collect();
        let mut shuffled = calls[100..400].to_vec();
        shuffled.swap(3, 250);
        let mut past = calls[100..400].to_vec();
        past[7].first = 1000;
        for mut buf in [shuffled, past] {
            let mut want = buf.clone();
            want.sort_unstable_by_key(Call::key);
            let earlier = sort_entry_order(&mut buf);
            assert_eq!(buf, want);
            assert!(earlier > 0, "the callers of the buffer's first call are kept apart");
            assert_eq!(earlier, want.iter().filter(|c| c.first < 100).count());
        }
    }
}
