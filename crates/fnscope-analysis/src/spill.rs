//! Each thread's calls in the order they started, from records in the order they returned,
//! in memory bounded independent of the number of calls.
//!
//! A record's place in its thread's call tree is known when it arrives: its subtree is the run
//! of records `first..=own` (post-order positions within the thread) that ends with it, and
//! `first` follows from a stack with one entry per depth. Sorting by `(first, own descending)`
//! is the pre-order (entry order). The sort is external: sorted runs of at most
//! [`MEMORY_CALLS`] calls are spilled to an unlinked temporary file per thread (in the system
//! temp dir, `TMPDIR`), merged [`FAN`] at a time when they pile up, and read back with a k-way
//! merge.

use crate::AnalysisError;
use fnscope_abi::Record;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Calls kept in memory over all threads before the largest buffer is spilled (48 bytes each,
/// and as much again while a buffer is put in entry order): `replay` stays within 48 MB.
pub(crate) const MEMORY_CALLS: usize = 256 * 1024;
/// Runs of one level merged into one run of the next level.
const FAN: usize = 16;
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

/// Appends a run block by block: `u32 bytes, u32 calls`, then per call varints of the
/// differences to the previous call of the block (sorted runs make them small).
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
        let b = &mut self.block;
        put(b, c.first.wrapping_sub(self.prev.first));
        put(b, c.own.wrapping_sub(c.first));
        let dt = c.t_entry.wrapping_sub(self.prev.t_entry) as i64;
        put(b, ((dt << 1) ^ (dt >> 63)) as u64);
        put(b, c.ticks());
        put(b, u64::from(c.func));
        put(b, u64::from(c.depth_flags));
        put(b, u64::from(c.image));
        put(b, u64::from(c.id));
        put(b, c.data);
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

/// Reads a run back, one block at a time.
struct RunReader<'a> {
    file: &'a File,
    at: u64,
    end: u64,
    bytes: Vec<u8>,
    calls: Vec<Call>,
    next: usize,
}

impl<'a> RunReader<'a> {
    fn new(file: &'a File, run: &Run) -> RunReader<'a> {
        RunReader {
            file,
            at: run.offset,
            end: run.offset + run.len,
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
        let mut head = [0u8; 8];
        self.file.read_exact_at(&mut head, self.at).map_err(temp_err)?;
        let bytes = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let count = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        self.bytes.resize(bytes, 0);
        self.file
            .read_exact_at(&mut self.bytes, self.at + 8)
            .map_err(temp_err)?;
        self.at += 8 + bytes as u64;
        self.calls.clear();
        self.next = 0;
        let (b, mut i, mut prev) = (&self.bytes, 0usize, ZERO);
        let damaged = || {
            temp_err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a temporary file of the replay reads back differently from what was written",
            ))
        };
        for _ in 0..count {
            let mut field = || get(b, &mut i).ok_or_else(damaged);
            let first = prev.first.wrapping_add(field()?);
            let own = first.wrapping_add(field()?);
            let z = field()?;
            let t_entry = prev.t_entry.wrapping_add(((z >> 1) as i64 ^ -((z & 1) as i64)) as u64);
            let t_exit = t_entry.wrapping_add(field()?);
            let func = field()? as u32;
            let depth_flags = field()? as u32;
            let image = field()? as u32;
            let id = field()? as u32;
            let data = field()?;
            prev = Call {
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
            self.calls.push(prev);
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
pub(crate) struct Merge<'a> {
    sources: Vec<Source<'a>>,
    heap: BinaryHeap<Head>,
    heads: Vec<Option<Call>>,
}

impl<'a> Merge<'a> {
    fn new(mut sources: Vec<Source<'a>>) -> Result<Merge<'a>, AnalysisError> {
        let mut heap = BinaryHeap::with_capacity(sources.len());
        let mut heads = Vec::with_capacity(sources.len());
        for (i, s) in sources.iter_mut().enumerate() {
            let h = s.next()?;
            if let Some(c) = &h {
                heap.push(Reverse((c.key(), i)));
            }
            heads.push(h);
        }
        Ok(Merge {
            sources,
            heap,
            heads,
        })
    }

    /// The next call in entry order.
    pub fn next(&mut self) -> Result<Option<Call>, AnalysisError> {
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

/// Puts one thread's calls, held in the order they arrived (post-order, `own` consecutive),
/// in entry order (the order of [`Call::key`]) in linear time; sorting them was a fifth of a
/// walk. A call's subtree is the run `first..=own`, so the calls whose subtree starts among
/// these are bucketed by `first`; calls sharing one (a call and the chain of its first
/// callees) arrived innermost first and go outermost first. Calls whose subtree starts
/// earlier all contain the first call held: a chain of its callers, no longer than the
/// depth, sorted ahead of the rest.
fn sort_entry_order(calls: &mut [Call]) {
    let n = calls.len();
    let base = calls.first().map_or(0, |c| c.own);
    if n > u32::MAX as usize / 2 || calls.iter().enumerate().any(|(i, c)| c.own != base + i as u64) {
        calls.sort_unstable_by_key(Call::key);
        return;
    }
    let mut earlier: Vec<u32> = (0..n as u32).filter(|&i| calls[i as usize].first < base).collect();
    earlier.sort_unstable_by_key(|&i| calls[i as usize].key());
    thread_local! {
        /// Bucket ends and the scattered copy, kept from one buffer to the next: fresh ones
        /// were tens of megabytes of page faults at every spill, a third of a walk's time.
        static SCRATCH: std::cell::RefCell<(Vec<u32>, Vec<Call>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    SCRATCH.with_borrow_mut(|(end, sorted)| {
        // `end[b + 1]`: where bucket `b` (first = base + b) ends, filled from there down.
        end.clear();
        end.resize(n + 1, 0);
        for c in calls.iter().filter(|c| c.first >= base) {
            end[(c.first - base) as usize + 1] += 1;
        }
        end[0] = earlier.len() as u32;
        for b in 1..=n {
            end[b] += end[b - 1];
        }
        // Scattered into a copy: moving calls in place along the permutation's cycles was
        // twice as slow (each move waits for the previous one's cache miss).
        sorted.clear();
        sorted.resize(n, ZERO);
        for (k, &i) in earlier.iter().enumerate() {
            sorted[k] = calls[i as usize];
        }
        for c in calls.iter().filter(|c| c.first >= base) {
            let e = &mut end[(c.first - base) as usize + 1];
            *e -= 1;
            sorted[*e as usize] = *c;
        }
        calls.copy_from_slice(sorted);
    });
}

/// One thread's calls waiting to be read in entry order.
#[derive(Default)]
pub(crate) struct ThreadCalls {
    placer: Placer,
    memory: Vec<Call>,
    runs: Vec<Run>,
    file: Option<SpillFile>,
}

impl ThreadCalls {
    /// Adds the thread's next record; true when it completed a tree (a depth-0 call).
    pub fn push(&mut self, rec: &Record, func: u32, image: u32, data: u64) -> bool {
        self.memory.push(self.placer.place(rec, func, image, data));
        rec.depth() == 0
    }

    /// Calls held in memory.
    pub fn in_memory(&self) -> usize {
        self.memory.len()
    }

    /// Writes the calls held in memory to disk as a sorted run; merges runs when [`FAN`] of
    /// one level have piled up.
    pub fn spill(&mut self) -> Result<(), AnalysisError> {
        if self.memory.is_empty() {
            return Ok(());
        }
        sort_entry_order(&mut self.memory);
        let file = match &mut self.file {
            Some(f) => f,
            None => self.file.insert(SpillFile::create()?),
        };
        self.runs.push(file.write_run(&self.memory, 0)?);
        self.memory.clear();
        self.memory.shrink_to(BLOCK_CALLS);
        loop {
            let top = self.runs.last().map_or(0, |r| r.level);
            let same = self.runs.iter().rev().take_while(|r| r.level == top).count();
            if same < FAN {
                return Ok(());
            }
            let merged: Vec<Run> = self.runs.split_off(self.runs.len() - same);
            let file = self.file.as_mut().expect("runs live in the spill file");
            // Readers and the writer use positioned I/O on one file: they do not disturb
            // each other.
            let run = {
                let sources = merged.iter().map(|r| Source::Run(RunReader::new(&file.file, r)));
                let mut m = Merge::new(sources.collect())?;
                let mut w = RunWriter::new(&file.file, file.end, top + 1);
                while let Some(c) = m.next()? {
                    w.push(&c)?;
                }
                w.finish()?
            };
            file.end = run.offset + run.len;
            file.release(&merged);
            self.runs.push(run);
        }
    }

    /// Every call held, in entry order. Nothing is held afterwards; call
    /// [`ThreadCalls::reset_file`] once the merge is read to give the disk space back.
    pub fn drain(&mut self) -> Result<Merge<'_>, AnalysisError> {
        sort_entry_order(&mut self.memory);
        let mut sources: Vec<Source<'_>> = Vec::with_capacity(self.runs.len() + 1);
        let memory = std::mem::take(&mut self.memory);
        let runs = std::mem::take(&mut self.runs);
        if let Some(f) = &self.file {
            sources.extend(runs.iter().map(|r| Source::Run(RunReader::new(&f.file, r))));
        }
        sources.push(Source::Memory(memory.into_iter()));
        Merge::new(sources)
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
                sort_entry_order(&mut fast);
                let mut want = calls[at..at + len].to_vec();
                want.sort_unstable_by_key(Call::key);
                assert_eq!(fast, want, "seed {seed}, calls {at}..{}", at + len);
                at += len;
            }
        }
    }
}
