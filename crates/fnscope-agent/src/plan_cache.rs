//! The analysis of a module (its functions and whether each can be hooked) cached on disk, so
//! that a program started again does not read, decode and scan the same files again: that
//! was nearly all of the start-up time of big programs (a second for `cc1plus`), paid by every
//! process of a build.
//!
//! One file per module version and return-address mode, in the folder the recorder names
//! (`FNSCOPE_CACHE`, one per agent build, so a new fnscope never reads an old analysis). A file
//! is found by a hash of the module's path, device, inode, size and modification time, holds
//! that key in full, and says which debug files the names came from with their stamps: a
//! debug package installed or changed since makes it stale. It ends with a checksum of the
//! rest. Anything unexpected in a file (a wrong checksum, another version, a key that does not
//! match) means "not cached": the module is analysed again and the file replaced.
//!
//! What a warm start-up reads is kept cheap to use: each hookable function's displaced bytes
//! when they move by copying (no decoding then), and for the unwinder's pre-hooks a file of
//! their own with just their hooks (the whole analysis with return addresses kept would be
//! read for three functions). A first analysis of a module whose functions are
//! traced and whose unwinder gets pre-hooks tells both from one decoding, on every processor.

use fnscope_abi::skip_reason;
use fnscope_symbols::Function;
use fnscope_x86::{Hook, HookForm, ReturnAddress, Verdict};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// What [`analyse`] returns: the module's functions, its build-id and a verdict per function.
///
/// It is the cache file itself, mapped whole and checked once, its fields then read in place:
/// decoding tens of thousands of functions into vectors and strings (and the page faults of
/// that fresh memory) took a sixth of a warm start-up. A first analysis is encoded into the
/// same bytes, so there is one form. Every offset the accessors follow was checked by
/// [`Analysis::parse`].
pub struct Analysis {
    /// A cache file: header, body, checksum.
    bytes: crate::sys::Bytes,
    /// Where the functions' records start, [`RECORD`] bytes each.
    records: usize,
    /// How many functions there are.
    count: usize,
    /// Where the table text, the skip details and the displaced bytes start in `bytes`.
    text: usize,
    details: usize,
    as_is: usize,
    /// The raw names that the table spells otherwise (with a tab or line feed), by function.
    odd: Vec<(u32, String)>,
    /// The module's GNU build-id.
    pub build_id: Option<Vec<u8>>,
    /// The debug files the names came from, with their stamps (see [`debug_files`]).
    debug: Vec<(PathBuf, Option<[u64; 5]>)>,
    /// Whether it came from the cache.
    pub cached: bool,
}

/// Bytes per function in a cache file: address (8), size (8), offset of its table fields in
/// the text (4) and of their end (4), flags (1: [`HAS_CFI`], [`NAMED`], [`SKIP`], [`AS_IS`]),
/// the length of the fields before the name (1), relocate length or skip reason (1), hook
/// form (1), island offset (2), two bytes unused, then for a hook its donor (4) and the offset
/// of its displaced bytes (4), for a skip the offset and length of its details (4 and 4).
const RECORD: usize = 40;
const HAS_CFI: u8 = 1;
const NAMED: u8 = 2;
const SKIP: u8 = 4;
/// The displaced bytes move as they are (see [`Analysis::as_is`]).
const AS_IS: u8 = 8;

/// The 32-bit field at `at` of a record.
fn u32_field(record: &[u8], at: usize) -> usize {
    u32::from_le_bytes([record[at], record[at + 1], record[at + 2], record[at + 3]]) as usize
}

/// A function's verdict as [`Analysis::verdict`] reads it.
pub enum VerdictRef<'a> {
    /// See [`Verdict::Hookable`].
    Hookable(Hook),
    /// See [`Verdict::Skip`]: the reason and details.
    Skip(&'static str, &'a str),
}

impl Analysis {
    fn record(&self, i: usize) -> &[u8] {
        &self.bytes[self.records + RECORD * i..self.records + RECORD * (i + 1)]
    }

    fn word<const N: usize>(&self, i: usize, at: usize) -> [u8; N] {
        let mut w = [0u8; N];
        w.copy_from_slice(&self.record(i)[at..at + N]);
        w
    }

    fn u32_at(&self, i: usize, at: usize) -> usize {
        u32_field(self.record(i), at)
    }

    /// `len` bytes at `at` of the text that starts at `text` in `bytes`.
    ///
    /// # Safety
    /// `text` is `self.text` or `self.details`, and `at` and `len` come from one record as
    /// [`Analysis::parse`] checked them: the text is UTF-8 (checked whole) and the span starts
    /// and ends on character boundaries within it.
    unsafe fn span(&self, text: usize, at: usize, len: usize) -> &str {
        let b = &self.bytes[text + at..text + at + len];
        // SAFETY: UTF-8 on character boundaries, as the caller promises.
        unsafe { std::str::from_utf8_unchecked(b) }
    }

    /// How many functions there are.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Function `i`'s link-time address.
    pub fn address(&self, i: usize) -> u64 {
        u64::from_le_bytes(self.word(i, 0))
    }

    /// The index of the function at (link-time) `addr`, if there is one: functions come in
    /// address order, one per address, as the inventory lists them.
    pub fn index_of(&self, addr: u64) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.address(mid) < addr {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo < self.count() && self.address(lo) == addr).then_some(lo)
    }

    /// Function `i`'s size in bytes (0 if unknown).
    pub fn size(&self, i: usize) -> u64 {
        u64::from_le_bytes(self.word(i, 8))
    }

    fn flags(&self, i: usize) -> u8 {
        self.record(i)[24]
    }

    /// Whether `.eh_frame` describes function `i`.
    pub fn has_cfi(&self, i: usize) -> bool {
        self.flags(i) & HAS_CFI != 0
    }

    /// Function `i`'s raw (mangled) name; `None` for a piece of code known only from
    /// `.eh_frame`.
    pub fn name(&self, i: usize) -> Option<&str> {
        if self.flags(i) & NAMED == 0 {
            return None;
        }
        match self.odd.binary_search_by_key(&(i as u32), |o| o.0) {
            Ok(k) => Some(&self.odd[k].1),
            Err(_) => Some(self.spelled(i)),
        }
    }

    /// Function `i`'s image-table fields: address (hex), tab, size, tab, name as the table
    /// spells it (tabs and line feeds made spaces, `sub_<address>` for no name).
    pub fn fields(&self, i: usize) -> &str {
        let at = self.u32_at(i, 16);
        // SAFETY: the record's fields span, checked by `parse`.
        unsafe { self.span(self.text, at, self.u32_at(i, 20) - at) }
    }

    /// The start of [`Analysis::fields`]: address, tab, size, tab.
    pub fn place(&self, i: usize) -> &str {
        // SAFETY: the record's place span, checked by `parse`.
        unsafe { self.span(self.text, self.u32_at(i, 16), usize::from(self.record(i)[25])) }
    }

    /// The end of [`Analysis::fields`]: the name as the table spells it.
    pub fn spelled(&self, i: usize) -> &str {
        let name_at = self.u32_at(i, 16) + usize::from(self.record(i)[25]);
        // SAFETY: the record's name span, checked by `parse`.
        unsafe { self.span(self.text, name_at, self.u32_at(i, 20) - name_at) }
    }

    /// Function `i`'s verdict.
    pub fn verdict(&self, i: usize) -> VerdictRef<'_> {
        let r = self.record(i);
        if r[24] & SKIP != 0 {
            // SAFETY: a skip record's details span, checked by `parse`.
            let detail = unsafe { self.span(self.details, self.u32_at(i, 32), self.u32_at(i, 36)) };
            return VerdictRef::Skip(REASONS[usize::from(r[26])], detail);
        }
        let island_offset = i16::from_le_bytes(self.word(i, 28));
        let form = match r[27] {
            0 => HookForm::Entry,
            1 => HookForm::Padding,
            2 => HookForm::Island { island_offset },
            _ => HookForm::Borrowed { island_offset, donor: self.u32_at(i, 32) },
        };
        VerdictRef::Hookable(Hook { relocate_len: r[26], form })
    }

    /// The bytes the hook of function `i` displaces, as the file has them, when they run
    /// unchanged at any address and fall through ([`fnscope_x86::moves_as_is`]): a slot then
    /// takes a copy and a jump back, with no decoding, if the code in memory is the same.
    pub fn as_is(&self, i: usize) -> Option<&[u8]> {
        let r = self.record(i);
        if r[24] & SKIP != 0 || r[24] & AS_IS == 0 {
            return None;
        }
        let at = self.as_is + self.u32_at(i, 36);
        Some(&self.bytes[at..at + usize::from(r[26])])
    }

    /// The analysis in cache file `bytes` for `key`, if the file is whole, of this version, for
    /// `key`, every offset in it within bounds and, for a file read back (`cached`), its debug
    /// files as they were.
    fn parse(bytes: impl Into<crate::sys::Bytes>, key: &str, cached: bool) -> Option<Analysis> {
        let bytes = bytes.into();
        let base = bytes.as_ptr() as usize;
        let mut r = open_as(&bytes, key, cached)?;
        let start = |b: &[u8]| b.as_ptr() as usize - base;
        let id = r.bytes()?.to_vec();
        let build_id = (r.u64()? == 1).then_some(id);
        let count = usize::try_from(r.u64()?).ok()?;
        let text_str = r.text()?;
        let text = start(text_str.as_bytes());
        let details_str = r.text()?;
        let details = start(details_str.as_bytes());
        let as_is_bytes = r.bytes()?;
        let as_is = start(as_is_bytes);
        let mut odd: Vec<(u32, String)> = Vec::new();
        for _ in 0..r.u64()? {
            let i = u32::try_from(r.u64()?).ok()?;
            if odd.last().is_some_and(|l| l.0 >= i) || i as usize >= count {
                return None;
            }
            odd.push((i, r.text()?.to_string()));
        }
        let records = r.bytes()?;
        if records.len() != count.checked_mul(RECORD)? || r.at != r.b.len() {
            return None;
        }
        let records = start(records);
        let debug = r.debug;
        let within = |s: &str, at: usize, len: usize| at.checked_add(len).is_some_and(|end| s.is_char_boundary(at) && s.is_char_boundary(end));
        for rec in bytes[records..records + count * RECORD].chunks_exact(RECORD) {
            let word = |at: usize| u32_field(rec, at);
            let (at, end, flags, place) = (word(16), word(20), rec[24], usize::from(rec[25]));
            if end < at + place || !within(text_str, at, place) || !within(text_str, at, end - at) {
                return None;
            }
            let good = if flags & SKIP != 0 {
                usize::from(rec[26]) < REASONS.len() && within(details_str, word(32), word(36))
            } else {
                let as_is_end = word(36) + usize::from(rec[26]);
                (1..=fnscope_x86::MAX_PATCH_LEN).contains(&usize::from(rec[26]))
                    && rec[27] <= 3
                    && (rec[27] != 3 || word(32) < count)
                    && (flags & AS_IS == 0 || as_is_end <= as_is_bytes.len())
            };
            if !good {
                return None;
            }
        }
        Some(Analysis { records, count, text, details, as_is, odd, build_id, debug, cached, bytes })
    }
}

/// [`Analysis::as_is`] of each function given its verdict: where its prologue starts in the
/// bytes returned (its length is the hook's `relocate_len`), if it moves as it is.
fn as_is_of(inv: &fnscope_symbols::Inventory, data: &[u8], verdicts: &[Verdict], threads: usize) -> (Vec<Option<u32>>, Vec<u8>) {
    // Each prologue is decoded again (42,000 of `cc1plus`'s): on `threads` threads, each
    // taking a run of functions.
    let prologue = |k: usize| {
        let h = verdicts[k].hook()?;
        let code = inv.code_bytes(data, inv.functions[k].address).and_then(|c| c.get(..usize::from(h.relocate_len)));
        code.filter(|c| fnscope_x86::moves_as_is(c))
    };
    let n = verdicts.len().min(inv.functions.len());
    let found: Vec<Option<&[u8]>> = fnscope_x86::parallel_runs(n, threads, |r| r.map(prologue).collect());
    let mut bytes = Vec::new();
    let ranges = found
        .into_iter()
        .map(|c| {
            let at = bytes.len() as u32;
            bytes.extend_from_slice(c?);
            Some(at)
        })
        .collect();
    (ranges, bytes)
}

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Uses `dir` for cached analyses from now on (none: nothing is cached).
pub fn set_dir(dir: PathBuf) {
    let _ = DIR.set(dir);
}

/// The cache's folder, if caching is on.
pub(crate) fn dir() -> Option<&'static Path> {
    DIR.get().map(PathBuf::as_path)
}

const MAGIC: &[u8; 8] = b"FNSPLAN3";

/// Every skip reason a verdict can carry, so that a cached one maps back to its constant.
const REASONS: [&str; 14] = [
    skip_reason::TOO_SHORT,
    skip_reason::UNRELOCATABLE,
    skip_reason::BRANCH_INTO_PATCH,
    skip_reason::CALL_IN_PATCH,
    skip_reason::NOT_ENTRY,
    skip_reason::DENYLIST,
    skip_reason::READS_RETURN_ADDRESS,
    skip_reason::UNDECODABLE,
    skip_reason::NO_TRAMPOLINE,
    skip_reason::NOT_CODE,
    skip_reason::PATCH_FAILED,
    skip_reason::NO_CFI,
    skip_reason::STACK_WALKER,
    skip_reason::FILTERED,
];

/// The functions of the module at `path` and their verdicts in return-address mode `ra`: from
/// the cache when it holds this version of the file, else analysed (and cached).
pub fn analyse(path: &Path, ra: ReturnAddress) -> Result<Analysis, String> {
    if let Some(a) = take_spare(path, ra) {
        return Ok(a);
    }
    let key = cache_key(path, &format!("{ra:?}"));
    if let Some(a) = key.as_ref().and_then(|(file, key)| read_analysis(file, key)) {
        return Ok(a);
    }
    Ok(analyse_file(path, ra, &[], key)?.0)
}

/// The pre-hookable functions among those at (link-time) `addresses` of the module at `path`:
/// address, size and hook of each whose entry can take a jump with its return address kept.
/// A few words cached on their own: the whole analysis in that mode would take longer to read
/// than everything else a start-up does. `traced`: the module is about to be analysed in
/// timing mode too, so that analysis is made here, and tells the entries too.
pub fn entry_hooks(path: &Path, addresses: &[u64], traced: bool) -> Result<Vec<(u64, u64, Hook)>, String> {
    let key = cache_key(path, &format!("entries {addresses:x?}"));
    if let Some((file, key)) = &key {
        if let Some(e) = read_cached(file, key, decode_entries) {
            return Ok(e);
        }
    }
    let (entries, a) = if traced {
        // The module is about to be analysed for tracing: that analysis, made now and kept
        // for it, tells which of these entries can take a hook with the return address kept.
        let (a, kept) = analyse_file(path, ReturnAddress::Replaced, addresses, cache_key(path, &format!("{:?}", ReturnAddress::Replaced)))?;
        let size = |addr: u64| a.index_of(addr).map_or(0, |i| a.size(i));
        let entries = addresses.iter().zip(kept).filter_map(|(&addr, hook)| Some((addr, size(addr), hook?))).collect();
        (entries, a)
    } else {
        let key = cache_key(path, &format!("{:?}", ReturnAddress::Kept));
        let a = match key.as_ref().and_then(|(file, k)| read_analysis(file, k)) {
            Some(a) => a,
            None => analyse_file(path, ReturnAddress::Kept, &[], key)?.0,
        };
        let mut entries = Vec::new();
        for &addr in addresses {
            let Some(i) = a.index_of(addr) else { continue };
            if let VerdictRef::Hookable(hook @ Hook { form: HookForm::Entry, .. }) = a.verdict(i) {
                entries.push((addr, a.size(i), hook));
            }
        }
        (entries, a)
    };
    if let Some((file, key)) = &key {
        let mut o = header(key, &a.debug);
        put(&mut o, entries.len() as u64);
        for (addr, size, hook) in &entries {
            put(&mut o, *addr);
            put(&mut o, *size);
            put(&mut o, u64::from(hook.relocate_len));
        }
        store(file, &seal(o));
    }
    if traced {
        keep_spare(path, ReturnAddress::Replaced, a);
    }
    Ok(entries)
}

/// The timing-mode analysis made by [`entry_hooks`] for a module about to be traced, until it
/// is asked for (or start-up is over: [`forget_spare`]).
static SPARE: Mutex<Option<(PathBuf, ReturnAddress, Analysis)>> = Mutex::new(None);

/// Drops an analysis [`entry_hooks`] made that no module asked for (the main executable was
/// left alone after all).
pub fn forget_spare() {
    SPARE.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// Keeps analysis `a` of the module at `path` in mode `ra` for the next [`analyse`] of it,
/// made when start-up looked at the module before tracing it.
pub fn keep_spare(path: &Path, ra: ReturnAddress, a: Analysis) {
    *SPARE.lock().unwrap_or_else(|e| e.into_inner()) = Some((path.to_path_buf(), ra, a));
}

fn take_spare(path: &Path, ra: ReturnAddress) -> Option<Analysis> {
    let mut g = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    if g.as_ref().is_some_and(|(p, r, _)| p == path && *r == ra) {
        return g.take().map(|s| s.2);
    }
    None
}

/// The cache file for `path` as it is now and what is cached of it (`what`), and the key it
/// must hold; `None` when nothing is cached.
fn cache_key(path: &Path, what: &str) -> Option<(PathBuf, String)> {
    let dir = DIR.get()?;
    let stamp = crate::sys::file_stamp(path)?;
    let key = format!("{}\0{:?}\0{what}", path.display(), stamp);
    Some((dir.join(format!("{:016x}.plan", fnv(key.as_bytes()))), key))
}

/// The analysis cached in `file` for `key`, if usable.
fn read_analysis(file: &Path, key: &str) -> Option<Analysis> {
    Analysis::parse(crate::sys::map_file(file).ok()?, key, true)
}

fn read_cached<T>(file: &Path, key: &str, decode: impl FnOnce(Reader<'_>) -> Option<T>) -> Option<T> {
    let b = crate::sys::map_file(file).ok()?;
    decode(open(&b, key)?)
}

/// `o` with its checksum.
fn seal(mut o: Vec<u8>) -> Vec<u8> {
    let sum = checksum(&o);
    put(&mut o, sum);
    o
}

/// Writes a cache file whole (sealed), under a temporary name of its own, then renamed: a
/// cache file, once in place, never changes (readers map it, see [`crate::sys::map_file`]).
fn store(file: &Path, o: &[u8]) {
    static STORED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = STORED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = file.with_extension(format!("tmp{}.{}.{n}", crate::sys::getpid(), crate::sys::gettid()));
    // A cache that cannot be written costs the next start-up the analysis, nothing more. A
    // temporary file that exists already is another writer's (same ids in another pid
    // namespace): it is left alone.
    match crate::sys::write_new_file(&tmp, o) {
        Ok(()) => {
            if crate::sys::rename(&tmp, file).is_err() {
                crate::sys::unlink(&tmp);
            }
        }
        Err(crate::sys::Errno::EXISTS) => {}
        Err(_) => crate::sys::unlink(&tmp),
    }
}

/// Reads and analyses the module at `path` in mode `ra` and caches the result under `key`
/// (its [`cache_key`] in that mode); also tells which functions at `kept_entries` can take an
/// entry hook with their return address kept (see [`fnscope_x86::analyze_with_kept_entries`]).
fn analyse_file(path: &Path, ra: ReturnAddress, kept_entries: &[u64], key: Option<(PathBuf, String)>) -> Result<(Analysis, Vec<Option<Hook>>), String> {
    // Mapped, not read: the module's 36 MB (`cc1plus`) would be as many megabytes of fresh
    // memory and a copy. The program has the same file mapped already, so a file cut short
    // under the mapping (which would fault here) faults in the program's own code too.
    let data = crate::sys::map_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let threads = threads();
    let inv = fnscope_symbols::load_bytes_on(path, &data, threads).map_err(|e| e.to_string())?;
    let debug = debug_files(inv.debug_file.as_deref(), inv.build_id.as_deref());
    let (verdicts, kept) = fnscope_x86::analyze_with_kept_entries(&inv, &data, ra, threads, kept_entries);
    let as_is = as_is_of(&inv, &data, &verdicts, threads);
    let k = key.as_ref().map_or("", |(_, k)| k.as_str());
    let bug = || format!("{}: the analysis cannot be encoded (a bug of fnscope)", path.display());
    let o = seal(encode(k, &debug, inv.build_id.as_deref(), &inv.functions, &verdicts, &as_is).ok_or_else(bug)?);
    if let Some((file, _)) = &key {
        store(file, &o);
    }
    Ok((Analysis::parse(o, k, false).ok_or_else(bug)?, kept))
}

/// The checksum ending a cache file: a multiply-rotate hash of 8-byte words in four
/// independent lanes, so that it does not take longer than reading the file (FNV-1a, a byte
/// at a time, took 7 ms for the 5 MB analysis of `cc1plus`).
pub(crate) fn checksum(b: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lanes = [0xcbf2_9ce4_8422_2325u64, 1, 2, 3];
    let mut words = b.chunks_exact(32);
    for block in &mut words {
        for (lane, w) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            let mut x = [0u8; 8];
            x.copy_from_slice(w);
            *lane = (*lane ^ u64::from_le_bytes(x)).wrapping_mul(K).rotate_left(31);
        }
    }
    let tail = fnv(words.remainder());
    lanes.iter().fold(tail ^ b.len() as u64, |h, &l| (h ^ l).wrapping_mul(K).rotate_left(31))
}

/// Threads a first analysis may use: every processor (at most 8) at start-up, when creating a
/// thread runs the C library's own `pthread_create` and not one the program defines (the agent
/// never runs the program's code at start-up).
fn threads() -> usize {
    // Once tracing runs (a library loaded later), helper threads would run hooked code (the C
    // library's, with `--lib libc`) and show up in the trace.
    if crate::active() {
        return 1;
    }
    // SAFETY: dlsym with RTLD_DEFAULT and a valid C string only looks a symbol up.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"pthread_create".as_ptr()) } as u64;
    let libc_own = crate::hook::loaded_objects().iter().any(|o| {
        o.lo <= p && p < o.hi && o.path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
    });
    if libc_own { crate::sys::cpus().min(8) } else { 1 }
}

/// FNV-1a, 64 bits: a file name for a key (the key itself is checked in the file).
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

/// The debug files names may come from, with their stamps (`None`: absent): the one used,
/// and the build-id path where a debug package would put one.
fn debug_files(used: Option<&Path>, build_id: Option<&[u8]>) -> Vec<(PathBuf, Option<[u64; 5]>)> {
    let mut v: Vec<PathBuf> = used.map(Path::to_path_buf).into_iter().collect();
    if let Some(id) = build_id.filter(|id| id.len() > 1) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        v.push(PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..])));
    }
    v.into_iter().map(|p| {
        let s = crate::sys::file_stamp(&p);
        (p, s)
    }).collect()
}

fn put(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// The start of every cache file: magic, key, and the debug files with their stamps.
fn header(key: &str, debug: &[(PathBuf, Option<[u64; 5]>)]) -> Vec<u8> {
    let mut o = Vec::new();
    o.extend_from_slice(MAGIC);
    put_bytes(&mut o, key.as_bytes());
    put(&mut o, debug.len() as u64);
    for (p, stamp) in debug {
        put_bytes(&mut o, p.as_os_str().as_encoded_bytes());
        put(&mut o, u64::from(stamp.is_some()));
        for v in stamp.unwrap_or_default() {
            put(&mut o, v);
        }
    }
    o
}

/// The cache file of a first analysis (without its checksum): the functions' table text, skip
/// details and displaced bytes, then a [`RECORD`] per function pointing into them.
/// `None` if a verdict carries a skip reason missing from [`REASONS`].
fn encode(key: &str, debug: &[(PathBuf, Option<[u64; 5]>)], build_id: Option<&[u8]>, functions: &[Function], verdicts: &[Verdict], as_is: &(Vec<Option<u32>>, Vec<u8>)) -> Option<Vec<u8>> {
    let mut text = String::with_capacity(48 * functions.len());
    let mut details = String::new();
    let mut odd = Vec::new();
    let mut records = Vec::with_capacity(RECORD * functions.len());
    for (i, (f, v)) in functions.iter().zip(verdicts).enumerate() {
        let at = text.len() as u32;
        crate::hook::push_number::<16>(&mut text, f.address);
        text.push('\t');
        crate::hook::push_number::<10>(&mut text, f.size);
        text.push('\t');
        let place = text.len() as u32 - at;
        match &f.name {
            Some(n) if n.contains(['\t', '\n']) => {
                text.push_str(&n.replace(['\t', '\n'], " "));
                odd.push((i as u64, n.as_str()));
            }
            Some(n) => text.push_str(n),
            None => {
                text.push_str("sub_");
                crate::hook::push_number::<16>(&mut text, f.address);
            }
        }
        let mut r = [0u8; RECORD];
        r[0..8].copy_from_slice(&f.address.to_le_bytes());
        r[8..16].copy_from_slice(&f.size.to_le_bytes());
        r[16..20].copy_from_slice(&at.to_le_bytes());
        r[20..24].copy_from_slice(&(text.len() as u32).to_le_bytes());
        r[24] = if f.has_cfi { HAS_CFI } else { 0 } | if f.name.is_some() { NAMED } else { 0 };
        r[25] = place as u8;
        match v {
            Verdict::Hookable(h) => {
                let (form, island, donor) = match h.form {
                    HookForm::Entry => (0, 0, 0),
                    HookForm::Padding => (1, 0, 0),
                    HookForm::Island { island_offset } => (2, island_offset, 0),
                    HookForm::Borrowed { island_offset, donor } => (3, island_offset, donor as u32),
                };
                r[26] = h.relocate_len;
                r[27] = form;
                r[28..30].copy_from_slice(&island.to_le_bytes());
                r[32..36].copy_from_slice(&donor.to_le_bytes());
                if let Some(&Some(at)) = as_is.0.get(i) {
                    r[24] |= AS_IS;
                    r[36..40].copy_from_slice(&at.to_le_bytes());
                }
            }
            Verdict::Skip { reason, detail } => {
                r[24] |= SKIP;
                r[26] = REASONS.iter().position(|c| c == reason)? as u8;
                r[32..36].copy_from_slice(&(details.len() as u32).to_le_bytes());
                r[36..40].copy_from_slice(&(detail.len() as u32).to_le_bytes());
                details.push_str(detail);
            }
        }
        records.extend_from_slice(&r);
    }
    let mut o = header(key, debug);
    o.reserve(text.len() + details.len() + as_is.1.len() + records.len() + 64);
    put_bytes(&mut o, build_id.unwrap_or_default());
    put(&mut o, u64::from(build_id.is_some()));
    put(&mut o, functions.len() as u64);
    put_bytes(&mut o, text.as_bytes());
    put_bytes(&mut o, details.as_bytes());
    put_bytes(&mut o, &as_is.1);
    put(&mut o, odd.len() as u64);
    for (i, name) in odd {
        put(&mut o, i);
        put_bytes(&mut o, name.as_bytes());
    }
    put_bytes(&mut o, &records);
    Some(o)
}

/// Reads a cache file's bytes in order; every read is bounds-checked.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    /// The debug files the header lists.
    debug: Vec<(PathBuf, Option<[u64; 5]>)>,
}

impl<'a> Reader<'a> {
    fn u64(&mut self) -> Option<u64> {
        let v = self.b.get(self.at..self.at + 8)?;
        self.at += 8;
        Some(u64::from_le_bytes(v.try_into().ok()?))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        let v = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(v)
    }

    fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }
}

/// A reader of the body of a cache file (after its header), if the file is whole, of this
/// version and for `key`, and the debug files are as they were.
fn open<'a>(b: &'a [u8], key: &str) -> Option<Reader<'a>> {
    open_as(b, key, true)
}

/// [`open`], checking the debug files' stamps only with `check_stamps` (a file just made
/// needs no check, and a debug file changing between making and reading would fail it).
fn open_as<'a>(b: &'a [u8], key: &str, cached: bool) -> Option<Reader<'a>> {
    // The last word sums the rest: a file damaged anywhere is not used. (Bytes just sealed
    // here need no second sum.)
    let (body, sum) = b.split_at_checked(b.len().checked_sub(8)?)?;
    if cached && checksum(body).to_le_bytes() != sum {
        return None;
    }
    let mut r = Reader { b: body.get(MAGIC.len()..)?, at: 0, debug: Vec::new() };
    if &body[..MAGIC.len()] != MAGIC || r.bytes()? != key.as_bytes() {
        return None;
    }
    for _ in 0..r.u64()? {
        let path = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(r.bytes()?));
        let present = r.u64()? == 1;
        let stamp = [r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?];
        if cached && crate::sys::file_stamp(&path) != present.then_some(stamp) {
            return None;
        }
        r.debug.push((path, present.then_some(stamp)));
    }
    Some(r)
}

/// The cached pre-hookable functions (see [`entry_hooks`]).
fn decode_entries(mut r: Reader<'_>) -> Option<Vec<(u64, u64, Hook)>> {
    let n = usize::try_from(r.u64()?).ok()?;
    if n > r.b.len() / 24 {
        return None;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let (addr, size) = (r.u64()?, r.u64()?);
        let relocate_len = u8::try_from(r.u64()?).ok()?;
        v.push((addr, size, Hook { relocate_len, form: HookForm::Entry }));
    }
    (r.at == r.b.len()).then_some(v)
}

/// Prologues that did not move by copying (see [`Analysis::as_is`]) into slots of one kind in
/// an earlier run of a module, kept so that a later run copies them instead of decoding them
/// and, for most, running the block encoder again (a microsecond or so each, and its first use
/// costs a millisecond more in every process: the encoder's code and tables paged in).
///
/// A moved prologue depends on where the function and its slot are in two ways only: 32-bit
/// displacements that aim out of the slot (at the function's module) change with the distance
/// from the function to the slot, and 64-bit absolute addresses of the module (a return
/// address, a `lea` of the function itself made a constant) change with the function's
/// address. An entry knows where both kinds are, found when it was made by moving the
/// function and the slot and watching which bytes change, so it serves any run: the same
/// prologue bytes are moved along with a library loaded elsewhere or its slots put elsewhere.
/// An entry whose changes could not be explained that way, and any entry of a non-PIE
/// executable (not probed: see `fixed`), serves only the same addresses.
pub struct Relocations {
    /// The file and its key; `None` when nothing is cached.
    file: Option<(PathBuf, String)>,
    /// Sorted by `rel`.
    entries: Vec<Moved>,
    /// Each entry's bytes, one after the other: the original ones, the moved ones, and the
    /// offsets in the moved ones of the displacements, then of the addresses.
    data: Vec<u8>,
    /// Entries used this run.
    hits: usize,
    /// Prologues moved this run that the cache did not hold, with their bytes as in `data`.
    fresh: Vec<(Moved, Vec<u8>)>,
    /// Whether the module lies where it was linked (a non-PIE executable): it lands at the
    /// same address every run, and its slots too as long as their layout is the same (the
    /// same filters), so new entries are not probed for their fields (three more encodings
    /// each, a twentieth of a first start-up of `cc1plus`).
    fixed: bool,
}

/// One prologue moved by the block encoder.
#[derive(Clone, Copy)]
struct Moved {
    /// The function's address from the module's lowest address.
    rel: u64,
    /// Its run-time address.
    addr: u64,
    /// The slot's code address minus `addr`.
    delta: u64,
    /// Whether the offsets of the displacements and addresses are known (else the entry serves
    /// only the same `addr` and `delta`).
    known: bool,
    /// Where its bytes start in `data`, and how many of each kind there are.
    at: u32,
    orig_len: u8,
    out_len: u8,
    displacements: u8,
    addresses: u8,
}

impl Moved {
    fn len(&self) -> usize {
        [self.orig_len, self.out_len, self.displacements, self.addresses].iter().map(|&n| usize::from(n)).sum()
    }
}

/// How far [`fields_of`] moves a function and its slot together, to find the absolute
/// addresses: every byte of the low six changes, so a truncated address would show too.
const PROBE_SHIFT: u64 = 0x3456_789a_bcd0;

/// How far it moves the slot alone, to find the displacements: every byte of the distance
/// changes, and the slot stays within reach of what it aims at.
const PROBE_SLIDE: u64 = 0x0012_3457;

impl Relocations {
    /// The prologues cached for `what` (a slot kind) of the module at `path`, loaded with
    /// `bias`; none if nothing is cached or the file is stale or damaged.
    pub fn of(path: &Path, what: &str, bias: u64) -> Relocations {
        let file = cache_key(path, &format!("relocated {what}"));
        let (entries, data) = file.as_ref().and_then(|(f, key)| read_cached(f, key, decode_relocations)).unwrap_or_default();
        Relocations { file, entries, data, hits: 0, fresh: Vec::new(), fixed: bias == 0 }
    }

    /// `orig`, the prologue of the function at `addr` (`rel` from the module's lowest address),
    /// moved to `new_addr`: from the cache when it holds it, else by the block encoder.
    pub fn relocate(&mut self, rel: u64, orig: &[u8], addr: u64, new_addr: u64) -> Result<Cow<'_, [u8]>, fnscope_x86::RelocError> {
        let delta = new_addr.wrapping_sub(addr);
        if let Some(out) = cached(&self.entries, &self.data, rel, orig, addr, delta) {
            self.hits += 1;
            return Ok(out);
        }
        let out = fnscope_x86::relocate(orig, addr, new_addr)?;
        if self.file.is_some() && out.len() <= usize::from(u8::MAX) {
            let fields = if self.fixed { None } else { fields_of(orig, addr, new_addr, &out) };
            let (displacements, addresses) = fields.clone().unwrap_or_default();
            let m = Moved {
                rel,
                addr,
                delta,
                known: fields.is_some(),
                at: 0,
                orig_len: orig.len() as u8,
                out_len: out.len() as u8,
                displacements: displacements.len() as u8,
                addresses: addresses.len() as u8,
            };
            self.fresh.push((m, [orig, &out, &displacements, &addresses].concat()));
        }
        Ok(Cow::Owned(out))
    }

    /// Stores what this run moved along with the entries it did not replace, when most of the
    /// prologues had to be moved anew (a first run, a module changed, another slot layout).
    pub fn finish(self) {
        let Some((file, key)) = &self.file else { return };
        if self.fresh.len() <= self.hits {
            return;
        }
        let mut all: Vec<(Moved, &[u8])> = self.fresh.iter().map(|(m, b)| (*m, b.as_slice())).collect();
        all.sort_by_key(|(m, _)| m.rel);
        let fresh = all.len();
        for m in &self.entries {
            if all[..fresh].binary_search_by_key(&m.rel, |(f, _)| f.rel).is_err() {
                if let Some(b) = self.data.get(m.at as usize..m.at as usize + m.len()) {
                    all.push((*m, b));
                }
            }
        }
        all.sort_by_key(|(m, _)| m.rel);
        let mut o = header(key, &[]);
        put(&mut o, all.len() as u64);
        for (m, b) in &all {
            put(&mut o, m.rel);
            put(&mut o, m.addr);
            put(&mut o, m.delta);
            let counts = [m.orig_len, m.out_len, m.displacements, m.addresses];
            put(&mut o, u64::from(m.known) | counts.iter().enumerate().map(|(k, &n)| u64::from(n) << (8 * (k + 1))).sum::<u64>());
            put_bytes(&mut o, b);
        }
        store(file, &seal(o));
    }
}

/// Of [`Relocations`] `entries` and `data`: the cached bytes of `rel`'s prologue `orig` at
/// `addr`, for a slot `delta` bytes from it, if the cache holds them.
fn cached<'a>(entries: &[Moved], data: &'a [u8], rel: u64, orig: &[u8], addr: u64, delta: u64) -> Option<Cow<'a, [u8]>> {
    let m = entries[entries.binary_search_by_key(&rel, |m| m.rel).ok()?];
    let mut at = m.at as usize;
    let mut take = |n: u8| {
        let part = data.get(at..at + usize::from(n));
        at += usize::from(n);
        part
    };
    let (cached_orig, out, displacements, addresses) = (take(m.orig_len)?, take(m.out_len)?, take(m.displacements)?, take(m.addresses)?);
    if cached_orig != orig {
        return None;
    }
    if m.addr == addr && m.delta == delta {
        return Some(Cow::Borrowed(out));
    }
    if !m.known {
        return None;
    }
    moved_along(out, displacements, addresses, delta.wrapping_sub(m.delta), addr.wrapping_sub(m.addr)).map(Cow::Owned)
}

/// `out` with its `displacements` for a slot `slid` bytes further from the function, and its
/// `addresses` for a function `shifted` bytes further; `None` if a displacement would not fit.
fn moved_along(out: &[u8], displacements: &[u8], addresses: &[u8], slid: u64, shifted: u64) -> Option<Vec<u8>> {
    let mut v = out.to_vec();
    for &f in displacements {
        let field = v.get_mut(usize::from(f)..usize::from(f) + 4)?;
        let old = i32::from_le_bytes(field.try_into().ok()?);
        let new = i32::try_from(i64::from(old).checked_sub(slid as i64)?).ok()?;
        field.copy_from_slice(&new.to_le_bytes());
    }
    for &f in addresses {
        let field = v.get_mut(usize::from(f)..usize::from(f) + 8)?;
        let old = u64::from_le_bytes(field.try_into().ok()?);
        field.copy_from_slice(&old.wrapping_add(shifted).to_le_bytes());
    }
    Some(v)
}

/// The offsets in `out` (`orig` moved from `addr` to `new_addr`) of its 32-bit displacements
/// that aim out of the slot and of its 64-bit absolute addresses of the module: the bytes that
/// change when the slot alone is moved must be displacements changed by the distance moved,
/// and those that change when both are moved must be addresses changed by as much. `None`
/// when the output changes in another way (its length, another field), or the offsets found
/// do not predict the output for both moved another way.
fn fields_of(orig: &[u8], addr: u64, new_addr: u64, out: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let slid = fnscope_x86::relocate(orig, addr, new_addr.wrapping_add(PROBE_SLIDE)).ok()?;
    let displacements = changed_fields(out, &slid, 4, |a, b| a.wrapping_sub(PROBE_SLIDE) & 0xffff_ffff == b)?;
    let shifted = fnscope_x86::relocate(orig, addr.wrapping_add(PROBE_SHIFT), new_addr.wrapping_add(PROBE_SHIFT)).ok()?;
    let addresses = changed_fields(out, &shifted, 8, |a, b| a.wrapping_add(PROBE_SHIFT) == b)?;
    let (addr2, new2) = (addr.wrapping_sub(PROBE_SHIFT), new_addr.wrapping_sub(PROBE_SHIFT).wrapping_sub(PROBE_SLIDE));
    let check = fnscope_x86::relocate(orig, addr2, new2).ok()?;
    let predicted = moved_along(out, &displacements, &addresses, PROBE_SLIDE.wrapping_neg(), PROBE_SHIFT.wrapping_neg())?;
    (predicted == check).then_some((displacements, addresses))
}

/// The offsets of the `width`-byte little-endian fields that cover every byte in which `a` and
/// `b` differ, each field's values related by `moved(a, b)`; `None` if there are none such.
fn changed_fields(a: &[u8], b: &[u8], width: usize, moved: impl Fn(u64, u64) -> bool) -> Option<Vec<u8>> {
    if a.len() != b.len() {
        return None;
    }
    let value = |v: &[u8], f: usize| {
        let mut w = [0u8; 8];
        w[..width].copy_from_slice(&v[f..f + width]);
        u64::from_le_bytes(w)
    };
    let mut fields: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < a.len() {
        if a[i] == b[i] {
            i += 1;
            continue;
        }
        let free_from = fields.last().map_or(0, |&l| usize::from(l) + width);
        let f = (i.saturating_sub(width - 1).max(free_from)..=i)
            .filter(|&f| f + width <= a.len())
            .find(|&f| moved(value(a, f), value(b, f)))?;
        fields.push(u8::try_from(f).ok()?);
        i = f + width;
    }
    Some(fields)
}

/// The cached moved prologues (see [`Relocations`]), sorted by `rel`, and their bytes.
fn decode_relocations(mut r: Reader<'_>) -> Option<(Vec<Moved>, Vec<u8>)> {
    let n = usize::try_from(r.u64()?).ok()?;
    // Each entry takes at least 5 words: a count beyond what the file holds is damage.
    if n > r.b.len() / 40 {
        return None;
    }
    let mut entries: Vec<Moved> = Vec::with_capacity(n);
    let mut data = Vec::new();
    for _ in 0..n {
        let (rel, addr, delta, flags) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let bytes = r.bytes()?;
        let m = Moved {
            rel,
            addr,
            delta,
            known: flags & 1 != 0,
            at: u32::try_from(data.len()).ok()?,
            orig_len: (flags >> 8) as u8,
            out_len: (flags >> 16) as u8,
            displacements: (flags >> 24) as u8,
            addresses: (flags >> 32) as u8,
        };
        if m.len() != bytes.len() || entries.last().is_some_and(|l| l.rel >= rel) {
            return None;
        }
        data.extend_from_slice(bytes);
        entries.push(m);
    }
    (r.at == r.b.len()).then_some((entries, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prologues of every kind the block encoder moves, at `rel` in a module: a RIP-relative
    /// load, a short `je` (widened), a `call` (its return address becomes an absolute
    /// constant), a `lea` of itself (an absolute constant), and the same `lea` in 32 bits (a
    /// truncated constant, which no cached entry may move along).
    const PROLOGUES: [(u64, &[u8]); 5] = [
        (0x1000, &[0x48, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00]),
        (0x1100, &[0x55, 0x85, 0xff, 0x74, 0x20]),
        (0x1200, &[0x55, 0xe8, 0x00, 0x01, 0x00, 0x00]),
        (0x1300, &[0x48, 0x8d, 0x05, 0xf9, 0xff, 0xff, 0xff]),
        (0x1400, &[0x8d, 0x05, 0xfa, 0xff, 0xff, 0xff]),
    ];

    fn function(name: Option<&str>, address: u64, size: u64) -> Function {
        Function { name: name.map(str::to_string), address, size, entry: true, not_entry_why: None, source: fnscope_symbols::SymSource::Symtab, has_cfi: address.is_multiple_of(2) }
    }

    #[test]
    fn an_analysis_reads_back_as_written_and_damage_is_refused() {
        let functions = [
            function(Some("main"), 0x1040, 35),
            function(None, 0x2000, 0),
            function(Some("odd\tname\nhere"), 0x2100, 7),
            function(Some("_ZN4core3fmt5write17h0123456789abcdefE"), 0x2200, 1234),
            function(Some("größe"), 0x2301, 9),
        ];
        let verdicts = [
            Verdict::Hookable(Hook { relocate_len: 5, form: HookForm::Entry }),
            Verdict::Skip { reason: skip_reason::TOO_SHORT, detail: "0 bytes, ünder".to_string() },
            Verdict::Hookable(Hook { relocate_len: 6, form: HookForm::Island { island_offset: -12 } }),
            Verdict::Hookable(Hook { relocate_len: 7, form: HookForm::Borrowed { island_offset: 40, donor: 2 } }),
            Verdict::Skip { reason: skip_reason::NO_CFI, detail: String::new() },
        ];
        let as_is = (vec![Some(0), None, None, Some(5), None], vec![0x55, 0x48, 0x89, 0xe5, 0x90, 1, 2, 3, 4, 5, 6, 7]);
        let file = seal(encode("key", &[], Some(&[1, 2]), &functions, &verdicts, &as_is).unwrap());
        let a = Analysis::parse(file.clone(), "key", true).unwrap();
        assert!(a.cached);
        assert_eq!((a.count(), a.build_id.as_deref()), (functions.len(), Some(&[1u8, 2][..])));
        for (i, f) in functions.iter().enumerate() {
            assert_eq!((a.address(i), a.size(i), a.has_cfi(i), a.name(i)), (f.address, f.size, f.has_cfi, f.name.as_deref()), "function {i}");
            assert_eq!(format!("{}{}", a.place(i), a.spelled(i)), a.fields(i));
            let same = match (a.verdict(i), &verdicts[i]) {
                (VerdictRef::Hookable(h), Verdict::Hookable(w)) => h == *w,
                (VerdictRef::Skip(r, d), Verdict::Skip { reason, detail }) => r == *reason && d == detail,
                _ => false,
            };
            assert!(same, "verdict of function {i}");
        }
        assert_eq!(a.fields(0), "1040\t35\tmain");
        assert_eq!(a.spelled(1), "sub_2000");
        assert_eq!(a.spelled(2), "odd name here");
        assert_eq!((a.place(4), a.spelled(4)), ("2301\t9\t", "größe"));
        assert_eq!(a.as_is(0), Some(&[0x55, 0x48, 0x89, 0xe5, 0x90][..]));
        assert_eq!(a.as_is(3), Some(&[1, 2, 3, 4, 5, 6, 7][..]));
        assert_eq!((a.as_is(1), a.as_is(2)), (None, None));
        assert!(Analysis::parse(file.clone(), "another key", true).is_none());
        // Damage under a good checksum: the last record's text end cut into "ß", a reason
        // out of range, a donor beyond the functions, displaced bytes beyond their blob.
        let last = file.len() - 8 - RECORD;
        let end = u32::from_le_bytes(file[last + 20..last + 24].try_into().unwrap());
        let damaged = |at: usize, bytes: &[u8]| {
            let mut d = file[..file.len() - 8].to_vec();
            d[at..at + bytes.len()].copy_from_slice(bytes);
            Analysis::parse(seal(d), "key", true).is_none()
        };
        assert!(damaged(last + 20, &(end - 2).to_le_bytes()), "a name cut in a character");
        assert!(damaged(last + 20, &(end + 1).to_le_bytes()), "a name past the text");
        assert!(damaged(last + 26, &[REASONS.len() as u8]), "an unknown reason");
        let third = last - RECORD;
        assert!(damaged(third + 32, &9u32.to_le_bytes()), "a donor beyond the functions");
        assert!(damaged(third + 36, &6u32.to_le_bytes()), "displaced bytes past their blob");
        assert!(damaged(third + 26, &[fnscope_x86::MAX_PATCH_LEN as u8 + 1]), "more bytes to displace than a patch takes");
        assert!(damaged(third + 26, &[0]), "no bytes to displace");
    }

    /// Moves every prologue of a module at `lo` into slots starting `below` bytes under it,
    /// checking each result against the block encoder; returns how many came from the cache.
    fn move_all(module: &Path, lo: u64, below: u64) -> usize {
        move_loaded(module, lo, below, lo)
    }

    /// [`move_all`] for a module loaded with `bias`.
    fn move_loaded(module: &Path, lo: u64, below: u64, bias: u64) -> usize {
        let mut r = Relocations::of(module, "test", bias);
        for (k, (rel, orig)) in PROLOGUES.iter().enumerate() {
            let (addr, new_addr) = (lo + rel, lo - below + 64 * k as u64);
            let want = fnscope_x86::relocate(orig, addr, new_addr).unwrap();
            let got = r.relocate(*rel, orig, addr, new_addr).unwrap().into_owned();
            assert_eq!(got, want, "prologue at +{rel:#x}, module at {lo:#x}, slots {below:#x} below");
        }
        let hits = r.hits;
        r.finish();
        hits
    }

    #[test]
    fn cached_prologues_are_what_the_encoder_makes_wherever_the_module_and_slots_go() {
        let dir = std::env::temp_dir().join(format!("fnscope-relocs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let module = dir.join("module");
        std::fs::write(&module, b"a module").unwrap();
        set_dir(dir.clone());
        let lo = 0x5555_5555_0000;
        assert_eq!(move_all(&module, lo, 0x10_0000), 0, "nothing was cached yet");
        assert_eq!(move_all(&module, lo, 0x10_0000), 5, "the same places: every prologue from the cache");
        // Slots elsewhere, then the module elsewhere too: the others are moved along; the
        // truncated constant cannot be, so its entry serves only the places it was made for.
        assert_eq!(move_all(&module, lo, 0x38_1000), 4);
        assert_eq!(move_all(&module, 0x7f12_3456_0000, 0x23_4000), 4);
        // A module where it was linked is not probed: its entries serve the same places only.
        let fixed = dir.join("fixed");
        std::fs::write(&fixed, b"an executable").unwrap();
        assert_eq!(move_loaded(&fixed, 0x40_0000, 0x10_0000, 0), 0);
        assert_eq!(move_loaded(&fixed, 0x40_0000, 0x10_0000, 0), 5);
        assert_eq!(move_loaded(&fixed, 0x40_0000, 0x20_0000, 0), 0);
        // A prologue whose bytes changed is never taken from the cache.
        let mut r = Relocations::of(&module, "test", lo);
        let changed = [0x48, 0x8b, 0x05, 0x00, 0x20, 0x00, 0x00];
        let (addr, new_addr) = (lo + 0x1000, lo - 0x10_0000);
        assert_eq!(r.relocate(0x1000, &changed, addr, new_addr).unwrap().into_owned(), fnscope_x86::relocate(&changed, addr, new_addr).unwrap());
        assert_eq!(r.hits, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
