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

use fnscope_abi::skip_reason;
use fnscope_symbols::{Function, SymSource};
use fnscope_x86::{Hook, HookForm, ReturnAddress, Verdict};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What [`analyse`] returns: the module's functions, its build-id and a verdict per function.
pub struct Analysis {
    /// As `fnscope_symbols` lists them.
    pub functions: Vec<Function>,
    /// The module's GNU build-id.
    pub build_id: Option<Vec<u8>>,
    /// One per function.
    pub verdicts: Vec<Verdict>,
    /// Whether it came from the cache.
    pub cached: bool,
}

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Uses `dir` for cached analyses from now on (none: nothing is cached).
pub fn set_dir(dir: PathBuf) {
    let _ = DIR.set(dir);
}

const MAGIC: &[u8; 8] = b"FNSPLAN1";

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
    let key = DIR.get().and_then(|dir| {
        let stamp = crate::sys::file_stamp(path)?;
        let key = format!("{}\0{:?}\0{ra:?}", path.display(), stamp);
        Some((dir.join(format!("{:016x}.plan", fnv(key.as_bytes()))), key))
    });
    if let Some((file, key)) = &key {
        if let Some(a) = crate::sys::read_file(file).ok().and_then(|b| decode(&b, key)) {
            return Ok(a);
        }
    }
    let data = crate::sys::read_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let inv = fnscope_symbols::load_bytes(path, &data).map_err(|e| e.to_string())?;
    let verdicts = fnscope_x86::analyze_for(&inv, &data, ra);
    let debug = debug_files(inv.debug_file.as_deref(), inv.build_id.as_deref());
    let a = Analysis { functions: inv.functions, build_id: inv.build_id, verdicts, cached: false };
    if let Some((file, key)) = &key {
        let tmp = file.with_extension(format!("tmp{}", crate::sys::getpid()));
        // A cache that cannot be written costs the next start-up the analysis, nothing more.
        if crate::sys::write_file(&tmp, &encode(key, &debug, &a)).is_ok() && crate::sys::rename(&tmp, file).is_err() {
            crate::sys::unlink(&tmp);
        }
    }
    Ok(a)
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

fn encode(key: &str, debug: &[(PathBuf, Option<[u64; 5]>)], a: &Analysis) -> Vec<u8> {
    let mut o = Vec::with_capacity(64 * a.functions.len() + 256);
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
    put_bytes(&mut o, a.build_id.as_deref().unwrap_or_default());
    put(&mut o, u64::from(a.build_id.is_some()));
    put(&mut o, a.functions.len() as u64);
    for (f, v) in a.functions.iter().zip(&a.verdicts) {
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
            }
            Verdict::Skip { reason, detail } => {
                put(&mut o, 1);
                put_bytes(&mut o, reason.as_bytes());
                put_bytes(&mut o, detail.as_bytes());
            }
        }
    }
    let sum = fnv(&o);
    put(&mut o, sum);
    o
}

/// Reads a cache file's bytes in order; every read is bounds-checked.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
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

/// The analysis in a cache file, if the file is whole, of this version and for `key`, and
/// the debug files are as they were.
fn decode(b: &[u8], key: &str) -> Option<Analysis> {
    // The last word sums the rest: a file damaged anywhere is not used.
    let (body, sum) = b.split_at_checked(b.len().checked_sub(8)?)?;
    if fnv(body).to_le_bytes() != sum {
        return None;
    }
    let b = body;
    let mut r = Reader { b: b.get(MAGIC.len()..)?, at: 0 };
    if &b[..MAGIC.len()] != MAGIC || r.bytes()? != key.as_bytes() {
        return None;
    }
    for _ in 0..r.u64()? {
        let path = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(r.bytes()?));
        let present = r.u64()? == 1;
        let stamp = [r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?];
        if crate::sys::file_stamp(&path) != present.then_some(stamp) {
            return None;
        }
    }
    let id = r.bytes()?.to_vec();
    let build_id = (r.u64()? == 1).then_some(id);
    let n = usize::try_from(r.u64()?).ok()?;
    // Each function takes at least 7 words: a count beyond what the file holds is damage.
    if n > b.len() / 56 {
        return None;
    }
    let mut functions = Vec::with_capacity(n);
    let mut verdicts = Vec::with_capacity(n);
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
                Verdict::Hookable(Hook { relocate_len: h as u8, form })
            }
            1 => {
                let reason = r.text()?;
                let reason = *REASONS.iter().find(|&&c| c == reason)?;
                Verdict::Skip { reason, detail: r.text()?.to_string() }
            }
            _ => return None,
        });
    }
    (r.at == r.b.len()).then_some(Analysis { functions, build_id, verdicts, cached: true })
}

/// The `&'static str` the symbols crate gives for why a piece of code is not an entry, from
/// its text (a cached one); `None` for a text it does not give.
fn static_why(why: &str) -> Option<&'static str> {
    fnscope_symbols::NOT_ENTRY_REASONS.iter().copied().find(|&w| w == why)
}
