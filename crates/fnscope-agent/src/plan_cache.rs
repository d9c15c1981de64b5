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
//! read for three functions). A first analysis of a module needed in both return-address
//! modes does both at once, decoding the module once, on every processor.

use fnscope_abi::skip_reason;
use fnscope_symbols::{Function, SymSource};
use fnscope_x86::{Hook, HookForm, ReturnAddress, Verdict};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// What [`analyse`] returns: the module's functions, its build-id and a verdict per function.
pub struct Analysis {
    /// As `fnscope_symbols` lists them.
    pub functions: Vec<Function>,
    /// The module's GNU build-id.
    pub build_id: Option<Vec<u8>>,
    /// One per function.
    pub verdicts: Vec<Verdict>,
    /// The debug files the names came from, with their stamps (see [`debug_files`]).
    debug: Vec<(PathBuf, Option<[u64; 5]>)>,
    /// Per function: where in `as_is_bytes` the bytes its hook displaces are, if they move by
    /// copying (see [`Analysis::as_is`]); empty otherwise.
    as_is: Vec<(u32, u8)>,
    /// See `as_is`.
    as_is_bytes: Vec<u8>,
    /// Whether it came from the cache.
    pub cached: bool,
}

impl Analysis {
    /// The bytes the hook of function `i` displaces, as the file has them, when they run
    /// unchanged at any address and fall through ([`fnscope_x86::moves_as_is`]): a slot then
    /// takes a copy and a jump back, with no decoding, if the code in memory is the same.
    pub fn as_is(&self, i: usize) -> Option<&[u8]> {
        let &(at, len) = self.as_is.get(i)?;
        (len > 0).then(|| self.as_is_bytes.get(at as usize..at as usize + usize::from(len))).flatten()
    }
}

/// [`Analysis::as_is`] of each function given its verdict.
fn as_is_of(inv: &fnscope_symbols::Inventory, data: &[u8], verdicts: &[Verdict]) -> (Vec<(u32, u8)>, Vec<u8>) {
    let mut bytes = Vec::new();
    let ranges = inv
        .functions
        .iter()
        .zip(verdicts)
        .map(|(f, v)| {
            let Some(h) = v.hook() else { return (0, 0) };
            let code = inv.code_bytes(data, f.address).and_then(|c| c.get(..usize::from(h.relocate_len)));
            match code.filter(|c| fnscope_x86::moves_as_is(c)) {
                Some(c) => {
                    let at = bytes.len() as u32;
                    bytes.extend_from_slice(c);
                    (at, h.relocate_len)
                }
                None => (0, 0),
            }
        })
        .collect();
    (ranges, bytes)
}

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Uses `dir` for cached analyses from now on (none: nothing is cached).
pub fn set_dir(dir: PathBuf) {
    let _ = DIR.set(dir);
}

const MAGIC: &[u8; 8] = b"FNSPLAN2";

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
    if let Some((file, key)) = &key {
        if let Some(a) = read_cached(file, key, decode_analysis) {
            return Ok(a);
        }
    }
    analyse_file(path, ra, false)
}

/// The pre-hookable functions among those at (link-time) `addresses` of the module at `path`:
/// address, size and hook of each whose entry can take a jump with its return address kept.
/// A few words cached on their own: the whole analysis in that mode would take longer to read
/// than everything else a start-up does. `traced`: the module is about to be analysed in
/// timing mode too, so an analysis made here does both modes at once.
pub fn entry_hooks(path: &Path, addresses: &[u64], traced: bool) -> Result<Vec<(u64, u64, Hook)>, String> {
    let key = cache_key(path, &format!("entries {addresses:x?}"));
    if let Some((file, key)) = &key {
        if let Some(e) = read_cached(file, key, decode_entries) {
            return Ok(e);
        }
    }
    let a = match take_spare(path, ReturnAddress::Kept) {
        Some(a) => a,
        None => match cache_key(path, &format!("{:?}", ReturnAddress::Kept)) {
            Some((file, k)) if !traced => match read_cached(&file, &k, decode_analysis) {
                Some(a) => a,
                None => analyse_file(path, ReturnAddress::Kept, false)?,
            },
            _ => analyse_file(path, ReturnAddress::Kept, traced)?,
        },
    };
    let mut entries = Vec::new();
    for &addr in addresses {
        let Some(i) = a.functions.iter().position(|f| f.address == addr) else { continue };
        if let Verdict::Hookable(hook @ Hook { form: HookForm::Entry, .. }) = a.verdicts[i] {
            entries.push((addr, a.functions[i].size, hook));
        }
    }
    if let Some((file, key)) = &key {
        let mut o = header(key, &a.debug);
        put(&mut o, entries.len() as u64);
        for (addr, size, hook) in &entries {
            put(&mut o, *addr);
            put(&mut o, *size);
            put(&mut o, u64::from(hook.relocate_len));
        }
        store(file, o);
    }
    Ok(entries)
}

/// The analysis of the other mode made along with the last one (see [`analyse_file`]), until
/// it is asked for.
static SPARE: Mutex<Option<(PathBuf, ReturnAddress, Analysis)>> = Mutex::new(None);

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

fn read_cached<T>(file: &Path, key: &str, decode: impl FnOnce(Reader<'_>) -> Option<T>) -> Option<T> {
    let b = crate::sys::read_file(file).ok()?;
    decode(open(&b, key)?)
}

/// Writes a cache file whole (under a temporary name, then renamed), with its checksum.
fn store(file: &Path, mut o: Vec<u8>) {
    let sum = checksum(&o);
    put(&mut o, sum);
    let tmp = file.with_extension(format!("tmp{}", crate::sys::getpid()));
    // A cache that cannot be written costs the next start-up the analysis, nothing more.
    if crate::sys::write_file(&tmp, &o).is_ok() && crate::sys::rename(&tmp, file).is_err() {
        crate::sys::unlink(&tmp);
    }
}

/// Reads and analyses the module at `path` in mode `ra` and caches the result; with `both`,
/// in the other mode too, cached and kept for [`take_spare`].
fn analyse_file(path: &Path, ra: ReturnAddress, both: bool) -> Result<Analysis, String> {
    let data = crate::sys::read_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let inv = fnscope_symbols::load_bytes(path, &data).map_err(|e| e.to_string())?;
    let debug = debug_files(inv.debug_file.as_deref(), inv.build_id.as_deref());
    let other = match ra {
        ReturnAddress::Replaced => ReturnAddress::Kept,
        ReturnAddress::Kept => ReturnAddress::Replaced,
    };
    let threads = threads();
    let (verdicts, spare) = if both {
        let (replaced, kept) = fnscope_x86::analyze_both(&inv, &data, threads);
        match ra {
            ReturnAddress::Replaced => (replaced, Some(kept)),
            ReturnAddress::Kept => (kept, Some(replaced)),
        }
    } else {
        (fnscope_x86::analyze_on(&inv, &data, ra, threads), None)
    };
    let (as_is, as_is_bytes) = as_is_of(&inv, &data, &verdicts);
    let spare = spare.map(|v| {
        let (as_is, as_is_bytes) = as_is_of(&inv, &data, &v);
        (v, as_is, as_is_bytes)
    });
    let a = Analysis { functions: inv.functions, build_id: inv.build_id, verdicts, debug, as_is, as_is_bytes, cached: false };
    if let Some((file, key)) = cache_key(path, &format!("{ra:?}")) {
        store(&file, encode(&key, &a));
    }
    if let Some((verdicts, as_is, as_is_bytes)) = spare {
        let s = Analysis {
            functions: a.functions.clone(),
            build_id: a.build_id.clone(),
            verdicts,
            debug: a.debug.clone(),
            as_is,
            as_is_bytes,
            cached: false,
        };
        if let Some((file, key)) = cache_key(path, &format!("{other:?}")) {
            store(&file, encode(&key, &s));
        }
        *SPARE.lock().unwrap_or_else(|e| e.into_inner()) = Some((path.to_path_buf(), other, s));
    }
    Ok(a)
}

/// The checksum ending a cache file: a multiply-rotate hash of 8-byte words in four
/// independent lanes, so that it does not take longer than reading the file (FNV-1a, a byte
/// at a time, took 7 ms for the 5 MB analysis of `cc1plus`).
fn checksum(b: &[u8]) -> u64 {
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

fn encode(key: &str, a: &Analysis) -> Vec<u8> {
    let mut o = header(key, &a.debug);
    o.reserve(64 * a.functions.len());
    put_bytes(&mut o, a.build_id.as_deref().unwrap_or_default());
    put(&mut o, u64::from(a.build_id.is_some()));
    put(&mut o, a.functions.len() as u64);
    for (i, (f, v)) in a.functions.iter().zip(&a.verdicts).enumerate() {
        put(&mut o, f.address);
        put(&mut o, f.size);
        let source = match f.source {
            SymSource::Symtab => 0,
            SymSource::Dynsym => 1,
            SymSource::EhFrame => 2,
            SymSource::DebugFile => 3,
        };
        put(&mut o, u64::from(f.entry) | u64::from(f.has_cfi) << 1 | u64::from(f.name.is_some()) << 2 | source << 3);
        put_bytes(&mut o, f.name.as_deref().unwrap_or_default().as_bytes());
        put_bytes(&mut o, f.not_entry_why.unwrap_or_default().as_bytes());
        match v {
            Verdict::Hookable(h) => {
                let (form, island, donor) = match h.form {
                    HookForm::Entry => (0, 0, 0),
                    HookForm::Padding => (1, 0, 0),
                    HookForm::Island { island_offset } => (2, island_offset, 0),
                    HookForm::Borrowed { island_offset, donor } => (3, island_offset, donor as u64),
                };
                put(&mut o, 0);
                put(&mut o, u64::from(h.relocate_len) | form << 8 | u64::from(island as u16) << 16);
                put(&mut o, donor);
                put_bytes(&mut o, a.as_is(i).unwrap_or_default());
            }
            Verdict::Skip { reason, detail } => {
                put(&mut o, 1);
                put_bytes(&mut o, reason.as_bytes());
                put_bytes(&mut o, detail.as_bytes());
            }
        }
    }
    o
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
    // The last word sums the rest: a file damaged anywhere is not used.
    let (body, sum) = b.split_at_checked(b.len().checked_sub(8)?)?;
    if checksum(body).to_le_bytes() != sum {
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
        if crate::sys::file_stamp(&path) != present.then_some(stamp) {
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

/// The cached analysis.
fn decode_analysis(mut r: Reader<'_>) -> Option<Analysis> {
    let b = r.b;
    let id = r.bytes()?.to_vec();
    let build_id = (r.u64()? == 1).then_some(id);
    let n = usize::try_from(r.u64()?).ok()?;
    // Each function takes at least 7 words: a count beyond what the file holds is damage.
    if n > b.len() / 56 {
        return None;
    }
    let mut functions = Vec::with_capacity(n);
    let mut verdicts = Vec::with_capacity(n);
    let mut as_is = Vec::with_capacity(n);
    let mut as_is_bytes = Vec::new();
    for _ in 0..n {
        let address = r.u64()?;
        let size = r.u64()?;
        let flags = r.u64()?;
        let name = r.text()?;
        let why = r.text()?;
        let source = match flags >> 3 {
            0 => SymSource::Symtab,
            1 => SymSource::Dynsym,
            2 => SymSource::EhFrame,
            3 => SymSource::DebugFile,
            _ => return None,
        };
        functions.push(Function {
            name: (flags & 4 != 0).then(|| name.to_string()),
            address,
            size,
            entry: flags & 1 != 0,
            not_entry_why: if why.is_empty() { None } else { Some(static_why(why)?) },
            source,
            has_cfi: flags & 2 != 0,
        });
        verdicts.push(match r.u64()? {
            0 => {
                let h = r.u64()?;
                let donor = usize::try_from(r.u64()?).ok()?;
                let island_offset = (h >> 16) as u16 as i16;
                let form = match (h >> 8) & 0xff {
                    0 => HookForm::Entry,
                    1 => HookForm::Padding,
                    2 => HookForm::Island { island_offset },
                    3 if donor < n => HookForm::Borrowed { island_offset, donor },
                    _ => return None,
                };
                let code = r.bytes()?;
                if !code.is_empty() && code.len() != usize::from(h as u8) {
                    return None;
                }
                as_is.push((as_is_bytes.len() as u32, code.len() as u8));
                as_is_bytes.extend_from_slice(code);
                Verdict::Hookable(Hook { relocate_len: h as u8, form })
            }
            1 => {
                as_is.push((0, 0));
                let reason = r.text()?;
                let reason = *REASONS.iter().find(|&&c| c == reason)?;
                Verdict::Skip { reason, detail: r.text()?.to_string() }
            }
            _ => return None,
        });
    }
    (r.at == r.b.len()).then_some(Analysis { functions, build_id, verdicts, debug: r.debug, as_is, as_is_bytes, cached: true })
}

/// The `&'static str` the symbols crate gives for why a piece of code is not an entry, from
/// its text (a cached one); `None` for a text it does not give.
fn static_why(why: &str) -> Option<&'static str> {
    fnscope_symbols::NOT_ENTRY_REASONS.iter().copied().find(|&w| w == why)
}
