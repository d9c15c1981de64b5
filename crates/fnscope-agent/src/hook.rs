//! Start-up: find the modules to trace, decide what to hook, build trampolines, patch.

use crate::stubs::{self, SLOT_CODE_OFFSET, SLOT_ID_OFFSET, SLOT_UNIT_OFFSET};
use fnscope_abi::skip_reason;
use crate::plan_cache::VerdictRef;
use fnscope_x86::{Hook, HookForm, ReturnAddress, Stage};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A loaded ELF object of this process.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// File path.
    pub path: PathBuf,
    /// Load bias (run-time address minus link-time address).
    pub bias: u64,
    /// Lowest and highest run-time addresses of its PT_LOAD segments.
    pub lo: u64,
    /// See `lo`.
    pub hi: u64,
    /// Whether it has text relocations: its code then depends on where it was loaded.
    pub textrel: bool,
}

/// Every object loaded in this process, the main executable first.
pub fn loaded_objects() -> Vec<Loaded> {
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: the dynamic linker passes a valid `info` for the duration of the callback, and
        // `data` is the Vec we passed to dl_iterate_phdr.
        unsafe {
            let out = &mut *(data as *mut Vec<Loaded>);
            let info = &*info;
            let name = if info.dlpi_name.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(info.dlpi_name).to_string_lossy().into_owned()
            };
            let path = if out.is_empty() && name.is_empty() {
                crate::sys::readlink(Path::new("/proc/self/exe"))
            } else {
                PathBuf::from(name)
            };
            let (mut lo, mut hi, mut textrel) = (u64::MAX, 0u64, false);
            for i in 0..info.dlpi_phnum as usize {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type == libc::PT_LOAD {
                    let a = info.dlpi_addr + ph.p_vaddr;
                    lo = lo.min(a);
                    hi = hi.max(a + ph.p_memsz);
                }
                if ph.p_type == libc::PT_DYNAMIC {
                    // The dynamic section of a loaded object is mapped: (tag, value) pairs ended
                    // by DT_NULL (0). DT_TEXTREL is 22; DT_FLAGS (30) may say DF_TEXTREL (4).
                    let mut d = (info.dlpi_addr + ph.p_vaddr) as *const [u64; 2];
                    while (*d)[0] != 0 {
                        let [tag, value] = *d;
                        textrel |= tag == 22 || (tag == 30 && value & 4 != 0);
                        d = d.add(1);
                    }
                }
            }
            if hi > 0 {
                out.push(Loaded { path, bias: info.dlpi_addr, lo, hi, textrel });
            }
            0
        }
    }
    let mut v: Vec<Loaded> = Vec::new();
    // SAFETY: the callback only appends to `v`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut v as *mut Vec<Loaded> as *mut libc::c_void) };
    v
}

/// What happened to one module.
pub struct ModuleResult {
    /// Functions hooked.
    pub hooked: usize,
    /// Functions skipped.
    pub skipped: usize,
    /// The jumps to write (after the image table naming them is out), by address.
    pub patches: Vec<Patch>,
    /// Whether the module's analysis came from the cache.
    pub cached: bool,
}

/// A jump to write for a function: at its entry, or in an island its entry jumps to (see
/// [`fnscope_x86::Hook`]).
#[derive(Clone, Copy, Debug)]
pub struct Patch {
    /// Where and what.
    pub jump: fnscope_x86::Patch,
    /// The function's id (the pre-hook kind for pre-hooks).
    pub id: u32,
    /// For an island in a neighbour's first bytes: the neighbour's id. Its entry jump must be
    /// written first, or those bytes still run.
    pub after: Option<u32>,
}

/// One function to patch, planned.
struct Planned<'a> {
    addr: u64,
    /// Size of the function's code (0 when unknown).
    size: u64,
    hook: Hook,
    /// Pre-hook kind (trace slots get their id when built).
    id: u32,
    index: usize,
    /// The displaced bytes as the file has them, when they move by copying (see
    /// [`crate::plan_cache::Analysis::as_is`]).
    as_is: Option<&'a [u8]>,
}

/// A trampoline area: a header holding the stub addresses, then slots.
pub(crate) struct Area {
    pub(crate) base: u64,
    pub(crate) len: usize,
}

/// Bytes of an area's header ([`write_area_header`]); slots follow.
pub(crate) const AREA_HEADER: usize = 64;
/// Offset in an area's header of the jump to its stub (word 0), and of the jump to
/// `fnscope_entry_args` (word 16).
const THUNK_STUB: u64 = 32;
const THUNK_ARGS: u64 = 48;

/// Writes an area's header at `base`: the address of `stub` (word 0, where count slots'
/// first calls and the thunk below jump through), the agent's TLS offset (word 8, read by
/// count slots), the address of `fnscope_entry_args` (word 16), and two thunks, `jmp [rip +
/// word]` to each stub (at [`THUNK_STUB`] and [`THUNK_ARGS`]). A slot whose stub lies out of
/// a direct jump's reach (every slot of a main executable: the agent's library is terabytes
/// away) in an area of more than [`THUNK_FROM`] slots jumps directly to a thunk instead of
/// through the word itself, so that one indirect jump serves the whole area: a jump through a
/// pointer in each of thousands of slots cost 5.7-7 ns a call once a program calls a thousand
/// functions or more (`bench/tools/many_functions.py`). Plain tracing slots jump to a copy
/// of the stubs in their area instead where one could be placed (see `build_slots`); the
/// thunks serve the slots with values to record, pre-hooks, Mono's methods, and areas
/// without a copy.
///
/// # Safety
/// `base` is the start of a writable mapping of at least [`AREA_HEADER`] bytes that nothing
/// runs yet.
pub(crate) unsafe fn write_area_header(base: u64, stub: u64) {
    let mut h = [0xccu8; AREA_HEADER];
    h[0..8].copy_from_slice(&stub.to_le_bytes());
    h[8..16].copy_from_slice(&stubs::fnscope_tls_offset().to_le_bytes());
    h[16..24].copy_from_slice(&(stubs::fnscope_entry_args as *const () as u64).to_le_bytes());
    for (at, word) in [(THUNK_STUB, 0u64), (THUNK_ARGS, 16)] {
        let at = at as usize;
        // jmp qword ptr [rip + disp32]: FF /4 with ModRM 00 100 101.
        h[at..at + 2].copy_from_slice(&[0xff, 0x25]);
        h[at + 2..at + 6].copy_from_slice(&((word as i64 - (at as i64 + 6)) as i32).to_le_bytes());
    }
    // SAFETY: per the caller's guarantee, AREA_HEADER writable bytes at `base`.
    unsafe { core::ptr::copy_nonoverlapping(h.as_ptr(), base as *mut u8, AREA_HEADER) };
}

pub(crate) fn round_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

/// One line of /proc/self/maps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mapping {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    /// `PROT_*` bits.
    pub(crate) prot: u32,
    /// A shared mapping (`s`): its writes reach the file, so it is never replaced by a copy.
    pub(crate) shared: bool,
    /// Offset in the file mapped.
    pub(crate) offset: u64,
    /// Device (as `st_dev` has it) and inode of the file mapped; inode 0: none.
    pub(crate) file: (u64, u64),
}

/// The process's mappings, by address. Read with raw system calls: this runs while the
/// program's functions (and perhaps libc's) are being patched.
pub(crate) fn mappings() -> Vec<Mapping> {
    let text = crate::sys::read_file(Path::new("/proc/self/maps")).unwrap_or_default();
    let mut v: Vec<Mapping> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next()?.split_once('-')?;
            let perms = f.next()?.as_bytes();
            let bit = |i: usize, c: u8, p: u32| if perms.get(i) == Some(&c) { p } else { 0 };
            let prot = bit(0, b'r', PROT_READ) | bit(1, b'w', PROT_WRITE) | bit(2, b'x', PROT_EXEC);
            let shared = perms.get(3) == Some(&b's');
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let (major, minor) = f.next()?.split_once(':')?;
            let (major, minor) = (u64::from_str_radix(major, 16).ok()?, u64::from_str_radix(minor, 16).ok()?);
            // glibc's makedev: how `stat` reports the same device.
            let dev = (major & 0xfffff000) << 32 | (major & 0xfff) << 8 | (minor & 0xffffff00) << 12 | (minor & 0xff);
            let inode = f.next()?.parse().ok()?;
            Some(Mapping { lo: u64::from_str_radix(a, 16).ok()?, hi: u64::from_str_radix(b, 16).ok()?, prot, shared, offset, file: (dev, inode) })
        })
        .collect();
    v.sort_by_key(|m| m.lo);
    v
}

/// The index of the mapping (of [`mappings`], sorted and disjoint) that holds `addr`.
fn mapping_holding(maps: &[Mapping], addr: u64) -> Option<usize> {
    maps.partition_point(|m| m.lo <= addr).checked_sub(1).filter(|&i| addr < maps[i].hi)
}

pub(crate) const PROT_READ: u32 = 1;
pub(crate) const PROT_WRITE: u32 = 2;
pub(crate) const PROT_EXEC: u32 = 4;

/// Free gaps of the address space, from /proc/self/maps.
fn maps_ranges() -> Vec<(u64, u64)> {
    mappings().iter().map(|m| (m.lo, m.hi)).collect()
}

/// Maps `len` bytes (at least: see [`map_near`]) read-write within ±2 GiB of every address in
/// `[lo, hi)`, preferring the space just below the module (above it, the heap of an
/// executable wants to grow), every page faulted in.
pub(crate) fn alloc_near(lo: u64, hi: u64, len: usize) -> Option<Area> {
    // An area of a huge page or more (a big module's trampolines) in whole huge pages: a fresh
    // 4 KiB page costs about 2.5 us on a virtual machine, four times what its bytes cost in a
    // huge page. Where no gap in reach takes one so aligned, pages will do.
    (len as u64 >= HUGE_PAGE).then(|| map_near(lo, hi, len, true)).flatten().or_else(|| map_near(lo, hi, len, false))
}

/// [`alloc_near`] of `len` bytes rounded up to whole pages, or with `huge` to whole huge
/// pages at a huge page's alignment.
///
/// It first tries a place at a fixed distance below the module (that depends only on `len`),
/// so that the jumps into the area are the same bytes from run to run, and a copy of code
/// holding them can be kept ([`crate::code_cache`]): an area of up to 1 MiB (the unwinder's
/// pre-hooks) in the MiB below the module, a bigger one 4 MiB further down than its length,
/// rounded up to huge pages (the huge pages around it stay clear of the small one).
fn map_near(lo: u64, hi: u64, len: usize, huge: bool) -> Option<Area> {
    const PAGE: u64 = 4096;
    const REACH: u64 = (1 << 31) - (1 << 20);
    const MADV_POPULATE_WRITE: usize = 23;
    let align = if huge { HUGE_PAGE } else { PAGE };
    // The bytes that will be written: where the kernel gives no huge pages, the rest of the
    // last one is not worth faulting in.
    let want = round_up(len, PAGE as usize);
    let try_at = |c: u64, len: u64| {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; on success the range
        // is a fresh anonymous mapping that only we use.
        let p = unsafe {
            crate::sys::syscall6(
                9, // mmap
                c as usize,
                len as usize,
                (PROT_READ | PROT_WRITE) as usize,
                // Populated: every page is written next, and one call faults them all in. Huge
                // pages are asked for once the mapping is made, and populated then.
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE | if huge { 0 } else { libc::MAP_POPULATE }) as usize,
                usize::MAX,
                0,
            )
        };
        if p < 0 {
            return false;
        }
        if p as u64 != c {
            // Old kernels ignore NOREPLACE and place the mapping elsewhere.
            crate::sys::munmap(p as *mut u8, len as usize);
            return false;
        }
        true
    };
    let populate = |at: u64| {
        if huge {
            crate::sys::advise_huge_pages(at & !(HUGE_PAGE - 1), round_up((at + want as u64) as usize, HUGE_PAGE as usize) - (at & !(HUGE_PAGE - 1)) as usize);
            // SAFETY: advice on the fresh mapping just made; it only faults its pages in (a
            // kernel without it refuses, and the pages come as they are written).
            unsafe { crate::sys::syscall6(28, at as usize, want, MADV_POPULATE_WRITE, 0, 0, 0) };
        }
    };
    let below = if want <= 1 << 20 { 1 << 20 } else { round_up(want, HUGE_PAGE as usize) as u64 + 4 * HUGE_PAGE };
    if let Some(at) = lo.checked_sub(below).filter(|&at| at >= PAGE * 16 && hi - at <= REACH) {
        let (from, to) = if huge { (at & !(HUGE_PAGE - 1), round_up((at + want as u64) as usize, HUGE_PAGE as usize) as u64) } else { (at, at + want as u64) };
        if try_at(from, to - from) {
            populate(at);
            return Some(Area { base: at, len: (to - at) as usize });
        }
    }
    let len = round_up(len, align as usize) as u64;
    let maps = maps_ranges();
    let mut candidates: Vec<u64> = Vec::new();
    let mut prev_end = PAGE * 16;
    for &(a, b) in &maps {
        let bottom = round_up(prev_end as usize, align as usize) as u64;
        if a > bottom && a - bottom >= len {
            // Gap [prev_end, a): try its top end, then its bottom end.
            candidates.push((a - len) & !(align - 1));
            candidates.push(bottom);
        }
        prev_end = prev_end.max(b);
    }
    candidates.push(round_up(prev_end as usize, align as usize) as u64);
    candidates.retain(|&c| {
        c.checked_add(len).is_some_and(|end| end <= hi.saturating_add(REACH) && end <= lo.saturating_add(REACH))
            && c >= hi.saturating_sub(REACH)
            && lo.saturating_sub(REACH) <= c
    });
    candidates.sort_by_key(|&c| if c + len <= lo { (0, lo - c) } else { (1, c.abs_diff(hi)) });
    for c in candidates {
        if try_at(c, len) {
            populate(c);
            return Some(Area { base: c, len: len as usize });
        }
    }
    None
}

pub(crate) fn set_prot(addr: u64, len: usize, prot: u32) -> Result<(), crate::sys::Errno> {
    let start = addr & !4095;
    let end = round_up((addr + len as u64) as usize, 4096) as u64;
    crate::sys::mprotect(start, (end - start) as usize, prot)
}

/// Writes the jumps of `module`, returning one patch of each function that could not be
/// hooked, with the reason. Called at start-up (one thread) or for a library just loaded by
/// `dlopen`, whose code no other thread is running yet.
///
/// A mapping dense with jumps is patched in a copy that replaces it (see [`write_in_copy`]);
/// the others stage by stage (see [`Stage`]): a function whose island could not be written
/// keeps its entry as it was, and no island goes into a neighbour whose entry jump failed.
pub fn write_patches(module: &Loaded, patches: &[Patch]) -> Vec<(Patch, String)> {
    let maps = mappings();
    let copied = write_dense_in_copies(module, patches, &maps);
    let done = |p: &Patch| copied.iter().any(|&(lo, hi)| lo <= p.jump.address && p.jump.address < hi);
    let mut failed: Vec<(Patch, String)> = Vec::new();
    // Ids of the functions that failed so far: a whole module can fail (a mapping that
    // cannot be made writable), and a list searched per patch would then be quadratic.
    let mut failed_ids: std::collections::HashSet<u32> = std::collections::HashSet::new();
    for stage in STAGES {
        let mut todo = Vec::new();
        for p in patches.iter().filter(|p| p.jump.stage == stage && !done(p)) {
            if failed_ids.contains(&p.id) {
                continue;
            }
            match p.after {
                Some(donor) if failed_ids.contains(&donor) => {
                    failed_ids.insert(p.id);
                    failed.push((*p, "the neighbour holding its island could not be patched".to_string()));
                }
                _ => todo.push(*p),
            }
        }
        todo.sort_by_key(|p| p.jump.address);
        for f in write_sorted(&todo, &maps) {
            failed_ids.insert(f.0.id);
            failed.push(f);
        }
    }
    failed
}

/// The stages in the order their patches are written: no jump leads to bytes not yet written.
const STAGES: [Stage; 4] = [Stage::Island, Stage::Entry, Stage::BorrowedIsland, Stage::ShortJump];

/// A mapping with a jump on at least one page in this many is patched in a copy.
const DENSE: u64 = 4;
const HUGE_PAGE: u64 = 2 << 20;

/// How jumps are written (`FNSCOPE_PATCH`, see [`fnscope_abi::ENV_PATCH`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Patching {
    /// Big modules in a copy where the kernel gives huge pages, the rest in place.
    Auto = 0,
    /// Big modules in a copy, huge pages or not.
    Copy = 1,
    /// Always in place.
    InPlace = 2,
}

static PATCHING: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(Patching::Auto as u8);

/// Sets how jumps are written, from the agent's settings.
pub fn set_patching(p: Patching) {
    PATCHING.store(p as u8, std::sync::atomic::Ordering::Relaxed);
}

/// Patches each mapping of `module` that gets jumps on many of its pages through
/// [`write_in_copy`]; returns the address ranges done. A mapping qualifies only when it is
/// private, and every function with a patch in it has all its patches in it (a short jump's
/// island, a borrowed island's donor): no patch of a copied mapping can then fail or wait on
/// account of another mapping's, as the stages of [`write_patches`] require.
fn write_dense_in_copies(module: &Loaded, patches: &[Patch], maps: &[Mapping]) -> Vec<(u64, u64)> {
    const NONE: usize = usize::MAX;
    let patching = PATCHING.load(std::sync::atomic::Ordering::Relaxed);
    if patching == Patching::InPlace as u8 {
        return Vec::new();
    }
    // Patches come mostly in address order: the mapping of the last one is tried first.
    let mut recent = NONE;
    let mut mapping_of = |a: u64| {
        if recent == NONE || a < maps[recent].lo || a >= maps[recent].hi {
            recent = mapping_holding(maps, a).unwrap_or(NONE);
        }
        (recent != NONE).then_some(recent)
    };
    // The mapping of each patch (NONE: it crosses into the next one, or lies in none); a
    // mapping that a patch crosses out of or into is written in place.
    let mut eligible: Vec<bool> = maps
        .iter()
        .map(|m| !m.shared && m.prot & PROT_READ != 0 && round_up(m.lo as usize, HUGE_PAGE as usize) as u64 + HUGE_PAGE <= m.hi)
        .collect();
    let at: Vec<usize> = patches
        .iter()
        .map(|p| {
            let (a, last) = (p.jump.address, p.jump.address + p.jump.bytes().len() as u64 - 1);
            match (mapping_of(a), mapping_of(last)) {
                (Some(i), Some(j)) if i == j => i,
                (i, j) => {
                    for k in [i, j].into_iter().flatten() {
                        eligible[k] = false;
                    }
                    NONE
                }
            }
        })
        .collect();
    if !at.iter().any(|&i| i != NONE && eligible[i]) {
        return Vec::new();
    }
    // Each function's mapping, by id; NONE once its patches are found in two, or outside any.
    // UNSEEN: no patch has that id. A module's ids are one run of the process's (pre-hooks
    // use a handful of kinds), so the table spans only this call's.
    const UNSEEN: usize = NONE - 1;
    let first = patches.iter().map(|p| p.id).min().unwrap_or(0);
    let span = patches.iter().map(|p| (p.id - first) as usize + 1).max().unwrap_or(0);
    let mut home = vec![UNSEEN; span];
    for (p, &i) in patches.iter().zip(&at) {
        let h = &mut home[(p.id - first) as usize];
        *h = if *h == UNSEEN || *h == i { i } else { NONE };
    }
    let home_of = |id: u32| id.checked_sub(first).and_then(|k| home.get(k as usize)).copied();
    for (p, &i) in patches.iter().zip(&at) {
        let whole = home_of(p.id) == Some(i) && p.after.is_none_or(|d| home_of(d) == Some(i));
        if i != NONE && !whole {
            eligible[i] = false;
        }
    }
    let mut groups: Vec<Vec<&Patch>> = vec![Vec::new(); maps.len()];
    for (p, &i) in patches.iter().zip(&at) {
        if i != NONE && eligible[i] {
            groups[i].push(p);
        }
    }
    let mut done = Vec::new();
    let mut huge = None;
    for (i, group) in groups.into_iter().enumerate() {
        let m = &maps[i];
        if group.is_empty() {
            continue;
        }
        let mut seen = vec![0u64; ((m.hi - m.lo) / 4096).div_ceil(64) as usize];
        let mut pages = 0;
        for p in &group {
            let k = ((p.jump.address - m.lo) / 4096) as usize;
            pages += u64::from(seen[k / 64] & 1 << (k % 64) == 0);
            seen[k / 64] |= 1 << (k % 64);
        }
        if pages * DENSE < (m.hi - m.lo) / 4096 {
            continue;
        }
        if patching != Patching::Copy as u8 && !*huge.get_or_insert_with(huge_pages_available) {
            break;
        }
        if write_in_copy(module, &group, m) {
            done.push((m.lo, m.hi));
        }
    }
    done
}

/// Whether the kernel gives this process 2 MiB transparent huge pages when memory asks for
/// them: not turned off for the process (`PR_SET_THP_DISABLE`), for that size (kernels with
/// a setting per size), or for all.
fn huge_pages_available() -> bool {
    const SYS_PRCTL: usize = 157;
    const PR_GET_THP_DISABLE: usize = 42;
    // SAFETY: PR_GET_THP_DISABLE only reads the process's flag.
    if unsafe { crate::sys::syscall6(SYS_PRCTL, PR_GET_THP_DISABLE, 0, 0, 0, 0, 0) } == 1 {
        return false;
    }
    let setting = |file: &str| {
        let text = crate::sys::read_file(&Path::new("/sys/kernel/mm/transparent_hugepage").join(file)).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        ["always", "madvise", "inherit", "never"].into_iter().find(|s| text.contains(&format!("[{s}]")))
    };
    match setting("hugepages-2048kB/enabled") {
        Some("always" | "madvise") => true,
        Some("never") => false,
        _ => matches!(setting("enabled"), Some("always" | "madvise")),
    }
}

/// Patches a whole mapping of `module` at once: a private copy of it, in transparent huge
/// pages, gets the jumps and then takes the mapping's place in one `mremap`. Written in place,
/// every page with a jump costs the kernel a fault, a fresh 4 KiB page and a copy; on the
/// 2-core EPYC VM that was 27 ms of a warm `cc1plus --version` start-up (42,163 jumps on most
/// of its 5,400 code pages), against a few milliseconds for a 2 MiB page each 512 of them.
/// Afterwards /proc/<pid>/maps shows that code as anonymous memory, not as the file's.
/// Returns false (and leaves the mapping as it was) if the copy could not be made or put in
/// place.
fn write_in_copy(module: &Loaded, patches: &[&Patch], m: &Mapping) -> bool {
    let len = (m.hi - m.lo) as usize;
    // In the order the stages would write them, in case two ever overlap.
    let ordered: Vec<&Patch> = STAGES.iter().flat_map(|&stage| patches.iter().filter(move |p| p.jump.stage == stage)).copied().collect();
    debug_assert_eq!(ordered.len(), patches.len(), "a stage missing from STAGES");
    let cached = code_file(module, m, &ordered);
    if let Some(file) = &cached {
        if map_cached(module, file, m) {
            return true;
        }
    }
    let room = len + HUGE_PAGE as usize;
    let r = crate::sys::mmap_anon(room);
    if r.is_null() {
        return false;
    }
    let base = r as u64;
    // At the mapping's offset within a huge page, so that its huge pages stay whole when moved.
    let copy = base + (m.lo.wrapping_sub(base) & (HUGE_PAGE - 1));
    crate::sys::advise_huge_pages(copy, len);
    // SAFETY: `[m.lo, m.hi)` is a readable private mapping (the caller checked, from the maps
    // read just before, while the module's code is not yet patched and nothing unmaps it) of
    // a module's code, which nothing writes while it is patched; `[copy, copy + len)` lies in
    // the fresh read-write mapping just made, of `len` plus a huge page's bytes.
    unsafe { core::ptr::copy_nonoverlapping(m.lo as *const u8, copy as *mut u8, len) };
    for p in &ordered {
        let bytes = p.jump.bytes();
        // SAFETY: the patch lies wholly inside the mapping (the caller checked), so at the
        // same offset inside the copy; see `write_sorted` for why its bytes may be written.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), (copy + (p.jump.address - m.lo)) as *mut u8, bytes.len()) };
    }
    if let Some(file) = &cached {
        // SAFETY: `[copy, copy + len)` lies in the mapping made above, written just now.
        crate::code_cache::store(file, unsafe { core::slice::from_raw_parts(copy as *const u8, len) });
    }
    if crate::sys::mprotect(copy, len, m.prot).is_err() {
        crate::sys::munmap(r, room);
        return false;
    }
    // SAFETY: `[copy, copy + len)` is the one mapping made above, holding the module's code as
    // it was plus the jumps.
    if !unsafe { move_over(copy, m, &module.path) } {
        crate::sys::munmap(r, room);
        return false;
    }
    // The copy left the mapping made for it; what was around it is unmapped now.
    if copy > base {
        crate::sys::munmap(r, (copy - base) as usize);
    }
    let end = copy + len as u64;
    if base + (room as u64) > end {
        crate::sys::munmap(end as *mut u8, (base + room as u64 - end) as usize);
    }
    if crate::verbose() {
        crate::warn(&format!(
            "pid {}: {}: code at {:#x}-{:#x} ({:.1} MiB, {} jumps) patched in a copy that took its place{}",
            crate::sys::getpid(),
            module.path.display(),
            m.lo,
            m.hi,
            len as f64 / (1 << 20) as f64,
            patches.len(),
            if cached.is_some() { " (kept for later runs)" } else { "" }
        ));
    }
    true
}

/// Moves the mapping `[from, from + len)` (`len` that of `m`) over mapping `m` of `module`
/// with one `mremap`. False when `m` is left as it was (the caller then owns `from` still).
///
/// # Safety
/// `[from, from + len)` is one mapping of the agent's own that nothing else uses, holding
/// what `m` is to hold: `m`'s code as it was, plus jumps.
unsafe fn move_over(from: u64, m: &Mapping, module: &Path) -> bool {
    let len = (m.hi - m.lo) as usize;
    // SAFETY: per the caller's guarantee; if the call fails after the kernel unmapped `m.lo`,
    // the code is put there below.
    if unsafe { crate::sys::mremap_over(from, len, m.lo) }.is_err() {
        // The kernel unmaps the target before it moves the pages, and a move can still fail
        // (out of memory): the module's code may be gone, and `from` is all there is of it.
        if crate::sys::is_mapped(m.lo) {
            return false;
        }
        // SAFETY: as above; nothing is mapped at `m.lo` now.
        if unsafe { crate::sys::mremap_over(from, len, m.lo) }.is_err() {
            crate::warn(&format!("{}: its code could not be put back at {:#x} after patching; stopping", module.display(), m.lo));
            std::process::abort();
        }
    }
    true
}

/// Jumps this agent wrote in place so far (address, bytes): a copy of code made later holds
/// them, so the name of its cache file must tell them ([`crate::code_cache`]).
static IN_PLACE: std::sync::Mutex<Vec<(u64, Vec<u8>)>> = std::sync::Mutex::new(Vec::new());

/// The cache file of the copy of mapping `m` of `module` with `ordered` written into it, when
/// such a copy can be kept: a mapping of the module's file as loaded (not code the program
/// moved elsewhere, not a module with text relocations).
fn code_file(module: &Loaded, m: &Mapping, ordered: &[&Patch]) -> Option<PathBuf> {
    let stamp = crate::sys::file_stamp(&module.path)?;
    if module.textrel || m.file != (stamp[0], stamp[1]) {
        return None;
    }
    let earlier: Vec<(u64, Vec<u8>)> = IN_PLACE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(a, b)| *a >= m.lo && a + b.len() as u64 <= m.hi)
        .map(|(a, b)| (a - m.lo, b.clone()))
        .collect();
    let len = (m.hi - m.lo) as usize;
    crate::code_cache::file_for(&module.path, m.offset, len, m.prot, &earlier, ordered.iter().map(|p| (p.jump.address - m.lo, p.jump.bytes())))
}

/// Puts the copy kept in `file` in the place of mapping `m` of `module`; false (and `m` left
/// as it was) when there is none or it cannot be used (a cache on a `noexec` file system).
fn map_cached(module: &Loaded, file: &Path, m: &Mapping) -> bool {
    let len = (m.hi - m.lo) as usize;
    let Some(at) = crate::code_cache::map(file, len) else { return false };
    // SAFETY: `at` is the private mapping of the kept copy just made and checked, holding
    // `m`'s code as loaded plus the same jumps (the file's name says so).
    if crate::sys::mprotect(at, len, m.prot).is_err() || !unsafe { move_over(at, m, &module.path) } {
        crate::sys::munmap(at as *mut u8, len);
        return false;
    }
    if crate::verbose() {
        crate::warn(&format!(
            "pid {}: {}: code at {:#x}-{:#x} ({:.1} MiB) patched by mapping the copy kept by an earlier run",
            crate::sys::getpid(),
            module.path.display(),
            m.lo,
            m.hi,
            len as f64 / (1 << 20) as f64
        ));
    }
    true
}

/// Writes patches sorted by address, a run at a time. A run never crosses from one mapping
/// into another (a program that remaps its own code, as node does for huge pages, leaves gaps
/// between the pieces) and each mapping gets its own protection back afterwards.
fn write_sorted(patches: &[Patch], maps: &[Mapping]) -> Vec<(Patch, String)> {
    let mapping_of = |a: u64| mapping_holding(maps, a);
    let mut failed = Vec::new();
    let mut i = 0;
    while i < patches.len() {
        let first = patches[i].jump.address;
        let len = |p: &Patch| p.jump.bytes().len() as u64;
        let (Some(m), Some(m_end)) = (mapping_of(first), mapping_of(first + len(&patches[i]) - 1)) else {
            failed.push((patches[i], format!("no mapping holds the code at {first:#x}")));
            i += 1;
            continue;
        };
        // Neighbours within 64 KiB and the same mapping share one mprotect pair. A patch
        // straddling two mappings (`m != m_end`) goes alone, over both.
        let mut j = i;
        while m == m_end
            && j + 1 < patches.len()
            && patches[j + 1].jump.address - patches[j].jump.address < 1 << 16
            && patches[j + 1].jump.address + len(&patches[j + 1]) <= maps[m].hi
        {
            j += 1;
        }
        let last = patches[j].jump.address + len(&patches[j]);
        if let Err(e) = set_prot(first, (last - first) as usize, PROT_READ | PROT_WRITE | PROT_EXEC) {
            let why = format!("cannot make its code writable: {e}");
            failed.extend(patches[i..=j].iter().map(|p| (*p, why.clone())));
            i = j + 1;
            continue;
        }
        let mut in_place = IN_PLACE.lock().unwrap_or_else(|e| e.into_inner());
        for p in &patches[i..=j] {
            let bytes = p.jump.bytes();
            // SAFETY: the page range was made writable just above; the bytes lie within a
            // function the analysis found hookable (whole instructions, no branch into them)
            // or in padding it found free (no symbol, FDE or reference, after a ret or jmp).
            unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), p.jump.address as *mut u8, bytes.len()) };
            in_place.push((p.jump.address, bytes.to_vec()));
        }
        drop(in_place);
        for map in &maps[m..=m_end] {
            let lo = first.max(map.lo);
            let hi = last.min(map.hi);
            // Best effort: the code is patched either way, only left writable if this fails.
            let _ = set_prot(lo, (hi - lo) as usize, map.prot);
        }
        i = j + 1;
    }
    failed
}

/// Whether an object found at a load address already looked at is a new load: `probe` is a
/// function patched in the earlier one, which holds its original bytes again if the library
/// was unloaded and loaded anew.
pub fn reloaded(obj: &Loaded, probe: Option<fnscope_x86::Patch>) -> bool {
    let Some(probe) = probe else { return false };
    let (addr, bytes) = (probe.address, probe.bytes());
    let end = addr + bytes.len() as u64;
    if addr < obj.lo || end > obj.hi {
        return true;
    }
    let readable = mappings().iter().any(|m| m.lo <= addr && end <= m.hi && m.prot & PROT_READ != 0);
    // SAFETY: the bytes lie in a readable mapping of the object now loaded there.
    readable && unsafe { std::slice::from_raw_parts(addr as *const u8, bytes.len()) } != bytes
}

/// Which stub a slot jumps to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// Tracing: `fnscope_entry`.
    Trace,
    /// Unwinder support: `fnscope_prehook`, with the hook kind in the id field.
    Prehook,
    /// Count mode: the slot increments the function's counter itself.
    Count,
}

impl SlotKind {
    /// A word for the kind, naming its moved prologues in the cache.
    fn name(self) -> &'static str {
        match self {
            SlotKind::Trace => "trace",
            SlotKind::Prehook => "prehook",
            SlotKind::Count => "count",
        }
    }
}

/// Head of a tracing (or pre-hook) slot at `slot`, in the area at `area` ([`write_area_header`]):
/// see [`crate::stubs`]. It jumps to `stub` (the area's stub, or `fnscope_entry_args`)
/// directly where the stub lies within reach (the agent's library near a hooked library);
/// else, with `via_thunk`, directly to the area's thunk for that stub, or without, through the
/// header's word itself (one taken branch fewer, for areas of few slots: see [`THUNK_FROM`]).
pub(crate) fn trace_head(slot: u64, area: u64, stub: u64, via_thunk: bool, id: u32) -> [u8; SLOT_CODE_OFFSET] {
    let mut head = [0xccu8; SLOT_CODE_OFFSET];
    // mov [rsp-8], r11: REX.WR 89 /r, ModRM 01 011 100, SIB rsp, disp8 -8.
    head[0..5].copy_from_slice(&[0x4c, 0x89, 0x5c, 0x24, 0xf8]);
    // lea r11, [rip + disp32]: REX.WR 8D /r with ModRM 00 011 101.
    head[5..8].copy_from_slice(&[0x4c, 0x8d, 0x1d]);
    head[8..12].copy_from_slice(&((SLOT_CODE_OFFSET as i32) - 12).to_le_bytes());
    // The header's word and thunk for the stub; the header lies in the slot's own area,
    // always within reach.
    let (word, thunk) = if stub == stubs::fnscope_entry_args as *const () as u64 { (area + 16, area + THUNK_ARGS) } else { (area, area + THUNK_STUB) };
    let direct = fnscope_x86::jmp_rel32(slot + 12, stub);
    match direct.or_else(|| if via_thunk { fnscope_x86::jmp_rel32(slot + 12, thunk) } else { None }) {
        Some(jmp) => head[12..12 + jmp.len()].copy_from_slice(&jmp),
        None => {
            // jmp qword ptr [rip + disp32] to the header's word for the stub.
            head[12..14].copy_from_slice(&[0xff, 0x25]);
            head[14..18].copy_from_slice(&((word as i64 - (slot as i64 + 18)) as i32).to_le_bytes());
        }
    }
    head[SLOT_ID_OFFSET..SLOT_ID_OFFSET + 4].copy_from_slice(&id.to_le_bytes());
    head
}

/// Areas of more slots than this jump to out-of-reach stubs through the header's thunks
/// ([`write_area_header`]); smaller ones through the header's words, a taken branch fewer
/// (fib's two functions: 0.2-0.4 ns a call less, within the noise of the in-process bench).
const THUNK_FROM: usize = 64;

/// Bytes before a count slot's entry: the first-call tail.
pub(crate) const COUNT_TAIL: usize = 16;
/// Offset of the relocated prologue in a count slot.
pub(crate) const COUNT_CODE_OFFSET: usize = COUNT_TAIL + 33;

/// Head of a counting slot: see [`crate::count`].
pub(crate) fn count_head(slot: u64, area: u64, id: u32) -> [u8; COUNT_CODE_OFFSET] {
    let rip_rel = |at: usize, len: usize, target: u64| -> [u8; 4] {
        ((target as i64 - (slot as i64 + (at + len) as i64)) as i32).to_le_bytes()
    };
    let e = COUNT_TAIL;
    let mut h = [0xccu8; COUNT_CODE_OFFSET];
    // tail: lea r11, [rip + entry+5]; jmp qword ptr [rip + area+0] (fnscope_count_init).
    h[0..3].copy_from_slice(&[0x4c, 0x8d, 0x1d]);
    h[3..7].copy_from_slice(&rip_rel(0, 7, slot + e as u64 + 5));
    h[7..9].copy_from_slice(&[0xff, 0x25]);
    h[9..13].copy_from_slice(&rip_rel(7, 6, area));
    // entry: mov [rsp-8], r11
    h[e..e + 5].copy_from_slice(&[0x4c, 0x89, 0x5c, 0x24, 0xf8]);
    // mov r11, [rip + area+8] (the TLS offset)
    h[e + 5..e + 8].copy_from_slice(&[0x4c, 0x8b, 0x1d]);
    h[e + 8..e + 12].copy_from_slice(&rip_rel(e + 5, 7, area + 8));
    // mov r11, fs:[r11]
    h[e + 12..e + 16].copy_from_slice(&[0x64, 0x4d, 0x8b, 0x1b]);
    // test r11, r11
    h[e + 16..e + 19].copy_from_slice(&[0x4d, 0x85, 0xdb]);
    // jz tail (rel8, backwards to the slot's start)
    h[e + 19] = 0x74;
    h[e + 20] = (0i64 - (e as i64 + 21)) as i8 as u8;
    // inc qword ptr [r11 + id*8]
    h[e + 21..e + 24].copy_from_slice(&[0x49, 0xff, 0x83]);
    h[e + 24..e + 28].copy_from_slice(&(id.wrapping_mul(8)).to_le_bytes());
    // mov r11, [rsp-8]
    h[e + 28..e + 33].copy_from_slice(&[0x4c, 0x8b, 0x5c, 0x24, 0xf8]);
    h
}

/// How many functions ahead [`build_slots`] asks for a function's first bytes.
const PREFETCH_AHEAD: usize = 16;

/// Builds the slots for `plans` (in function index order) in a new area near the module
/// `obj`, moving prologues through its cached relocations (stored again if most were new),
/// and returns the patches to write. Plans whose prologue cannot be relocated, or whose
/// island's donor could not be built, are returned in the error list with a reason.
#[allow(clippy::too_many_arguments)]
fn build_slots(
    obj: &Loaded,
    plans: &[Planned],
    kind: SlotKind,
    next_id: &mut u32,
    max_id: u32,
    descs: &mut std::collections::HashMap<usize, crate::args::Desc>,
) -> Result<Built, String> {
    let (lo, hi) = (obj.lo, obj.hi);
    let mut relocs = crate::plan_cache::Relocations::of(&obj.path, kind.name(), obj.bias);
    let code_offset = match kind {
        SlotKind::Trace | SlotKind::Prehook => SLOT_CODE_OFFSET,
        SlotKind::Count => COUNT_CODE_OFFSET,
    };
    // A prologue copied as it is takes its own bytes and a 5-byte jump back: half the room of
    // the worst case of re-encoding, so half the pages to fault in and fill.
    let slot_len = |p: &Planned| {
        let code = if p.as_is.is_some() { usize::from(p.hook.relocate_len) + fnscope_x86::JMP_LEN } else { fnscope_x86::max_relocated_len(p.hook.relocate_len.into()) };
        round_up(code_offset + code, 16)
    };
    // Tracing slots' areas set room aside after the header for a copy of the stubs, used
    // where the agent's library lies out of their reach (see `stubs::place_copy`).
    let header = if kind == SlotKind::Trace { AREA_HEADER + stubs::COPY_ROOM } else { AREA_HEADER };
    let total = header + plans.iter().map(slot_len).sum::<usize>();
    let area = alloc_near(lo, hi, total).ok_or_else(|| format!("no free memory within 2 GiB of {lo:#x}"))?;
    let target = match kind {
        SlotKind::Trace => stubs::fnscope_entry as *const () as u64,
        SlotKind::Prehook => stubs::fnscope_prehook as *const () as u64,
        SlotKind::Count => stubs::fnscope_count_init as *const () as u64,
    };
    // SAFETY: the area is a fresh read-write mapping of `area.len` bytes, at least the header's
    // (`total` counts it); every write below stays inside it (slot offsets are summed from the
    // same lengths that sized it).
    unsafe { write_area_header(area.base, target) };
    let copy_at = area.base + AREA_HEADER as u64;
    // The stub the plain tracing slots jump to: a copy beside them when the agent's is out
    // of reach, so that their jump is direct.
    let near = if kind == SlotKind::Trace && fnscope_x86::jmp_rel32(copy_at, target).is_none() {
        // SAFETY: COPY_ROOM bytes of the fresh area after its header, set aside above; the
        // area is made executable below, before any patch makes a slot reachable, and areas
        // are never unmapped.
        match unsafe { stubs::place_copy(copy_at) } {
            Ok(entry) => entry,
            Err(e) => {
                if crate::verbose() {
                    crate::warn(&format!("{}: slots jump to the stubs through a thunk: {e}", obj.path.display()));
                }
                target
            }
        }
    } else {
        target
    };
    let via_thunk = plans.len() > THUNK_FROM;
    let mut args_lines = String::new();
    let mut patches = Vec::with_capacity(plans.len());
    // The jumps of every slot, in the order built (see `patches_into`).
    let mut jumps = Vec::with_capacity(plans.len());
    let mut failed = Vec::new();
    let mut ids = Vec::with_capacity(plans.len());
    let mut off = header;
    // Donors first, so that a borrower finds its donor's id (plans come in index order, and
    // so do the ids of the first pass).
    let borrows = |p: &&Planned| matches!(p.hook.form, HookForm::Borrowed { .. });
    let mut first_pass = None;
    let order: Vec<&Planned> = plans.iter().filter(|p| !borrows(p)).chain(plans.iter().filter(borrows)).collect();
    for (k, &p) in order.iter().enumerate() {
        // Each function's first bytes are a cache miss of their own (functions lie hundreds of
        // bytes apart, too far for the hardware to guess): asked for this far ahead, they
        // arrive while the slots before are built. A prefetch never faults.
        if let Some(ahead) = order.get(k + PREFETCH_AHEAD) {
            // SAFETY: SSE is part of x86-64's baseline, and a prefetch of any address, mapped
            // or not, only hints the cache.
            unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ahead.addr as *const i8) };
        }
        let after = match p.hook.form {
            HookForm::Borrowed { donor, .. } => match ids[..*first_pass.get_or_insert(ids.len())].binary_search_by_key(&donor, |&(i, _)| i) {
                Ok(k) => Some(ids[k].1),
                Err(_) => {
                    failed.push((p.index, "the neighbour holding its island could not be hooked".to_string()));
                    continue;
                }
            },
            _ => None,
        };
        let slot = area.base + off as u64;
        let code_at = slot + code_offset as u64;
        let len = slot_len(p);
        // SAFETY: the slot lies inside the fresh area, `len` bytes from `off` (the lengths
        // summed to size the area); nothing runs it until its patch is written.
        let mem = unsafe { std::slice::from_raw_parts_mut(slot as *mut u8, len) };
        // SAFETY: reads `relocate_len` bytes of a function's code in a mapped executable
        // segment.
        let orig = unsafe { std::slice::from_raw_parts(p.addr as *const u8, p.hook.relocate_len.into()) };
        let code = &mut mem[code_offset..];
        // Compared here, where the bytes are read for the copy anyway: reading tens of
        // thousands of functions' first bytes costs a cache miss each, and a page fault for
        // every sixteen pages.
        if p.as_is == Some(orig) {
            // The area lies within a 32-bit displacement of the whole module (`alloc_near`).
            let Some(jmp) = fnscope_x86::jmp_rel32(code_at + orig.len() as u64, p.addr + orig.len() as u64) else {
                failed.push((p.index, "trampoline out of reach".to_string()));
                continue;
            };
            code[..orig.len()].copy_from_slice(orig);
            code[orig.len()..orig.len() + jmp.len()].copy_from_slice(&jmp);
        } else {
            match relocs.relocate(p.addr - lo, orig, p.addr, code_at) {
                // A slot sized for a copy is short for some moves: the code in memory is not
                // the file's (a text relocation, someone else's patch), rarely.
                Ok(r) if r.len() > code.len() => {
                    failed.push((p.index, format!("its prologue moved takes {} bytes, more than its trampoline holds (its code in memory differs from the file's)", r.len())));
                    continue;
                }
                Ok(r) => code[..r.len()].copy_from_slice(&r),
                Err(e) => {
                    failed.push((p.index, e.to_string()));
                    continue;
                }
            }
        }
        let entry = match kind {
            SlotKind::Trace | SlotKind::Prehook => slot,
            SlotKind::Count => slot + COUNT_TAIL as u64,
        };
        let before = jumps.len();
        if !p.hook.patches_into(p.addr, entry, &mut jumps) {
            failed.push((p.index, "trampoline out of reach".to_string()));
            continue;
        }
        if kind != SlotKind::Prehook && *next_id >= max_id {
            jumps.truncate(before);
            failed.push((p.index, "no counter left for it (libraries loaded late in count mode)".to_string()));
            continue;
        }
        // Ids are handed out only to slots actually built, so they stay dense.
        let id = match kind {
            SlotKind::Trace | SlotKind::Count => {
                let id = *next_id;
                *next_id += 1;
                id
            }
            SlotKind::Prehook => p.id,
        };
        ids.push((p.index, id));
        if kind == SlotKind::Trace {
            crate::thread::set_range(id, p.addr, p.addr + p.size.max(1));
        }
        match kind {
            // Functions with values to record or injections have a stub of their own.
            SlotKind::Trace => {
                let desc = if descs.is_empty() { None } else { descs.remove(&p.index) };
                let (stub, unit) = match desc.and_then(|d| crate::args::register(id, d)) {
                    Some((line, unit)) => {
                        args_lines.push_str(&line);
                        (stubs::fnscope_entry_args as *const () as u64, unit)
                    }
                    None => (near, 0),
                };
                mem[..SLOT_CODE_OFFSET].copy_from_slice(&trace_head(slot, area.base, stub, via_thunk, id));
                mem[SLOT_UNIT_OFFSET..SLOT_ID_OFFSET].copy_from_slice(&unit.to_le_bytes());
            }
            SlotKind::Prehook => mem[..SLOT_CODE_OFFSET].copy_from_slice(&trace_head(slot, area.base, target, via_thunk, id)),
            SlotKind::Count => mem[..COUNT_CODE_OFFSET].copy_from_slice(&count_head(slot, area.base, id)),
        }
        patches.extend(jumps[before..].iter().map(|&jump| Patch { jump, id, after }));
        off += len;
    }
    set_prot(area.base, area.len, PROT_READ | PROT_EXEC).map_err(|e| format!("cannot make the trampolines executable: {e}"))?;
    relocs.finish();
    Ok(Built { patches, failed, ids, args_lines })
}

/// Result of [`build_slots`].
struct Built {
    /// Jumps to write.
    patches: Vec<Patch>,
    /// Plans (by function index) whose prologue could not be moved, with the reason.
    failed: Vec<(usize, String)>,
    /// Function index and id of every slot built.
    ids: Vec<(usize, u32)>,
    /// Image-table lines of the functions that record values (`args`).
    args_lines: String,
}

/// Image table being written (`images/<sid>.txt`).
pub struct ImageTable {
    text: String,
    next_id: u32,
    modules: u32,
}

impl ImageTable {
    /// Starts a table for this process image.
    pub fn new(pid: u32) -> ImageTable {
        let mut text = format!("{}\t{}\npid\t{}\n", fnscope_abi::image::MAGIC, fnscope_abi::image::VERSION, pid);
        let exe = crate::sys::readlink(Path::new("/proc/self/exe"));
        let _ = writeln!(text, "exe\t{}", exe.display());
        let cmdline = crate::sys::read_file(Path::new("/proc/self/cmdline")).unwrap_or_default();
        for a in cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()) {
            let a = String::from_utf8_lossy(a).replace(['\t', '\n'], " ");
            let _ = writeln!(text, "arg\t{a}");
        }
        ImageTable { text, next_id: 0, modules: 0 }
    }

    /// Appends whole lines (ending in a newline) to the table.
    pub fn push_lines(&mut self, lines: &str) {
        self.text.push_str(lines);
    }

    /// Ids handed out so far.
    pub fn ids(&self) -> u32 {
        self.next_id
    }

    /// The text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Notes that `--app-only` left the module at `path` alone as system code.
    pub fn system(&mut self, path: &Path) {
        let _ = writeln!(self.text, "system\t{}", path.display().to_string().replace(['\t', '\n'], " "));
    }

    /// Notes that function `id`, listed as hooked, could not be patched after all; returns
    /// the line added.
    pub fn unhooked(&mut self, id: u32, why: &str) -> String {
        let line = format!("unhooked\t{id}\t{}\n", why.replace(['\t', '\n'], " "));
        self.text.push_str(&line);
        line
    }

    /// Adds a module for code that has no file (a JIT's output): its load bias is 0, so its
    /// functions' addresses are run-time addresses. Returns its index and the line added.
    pub fn add_generated_module(&mut self, name: &str) -> (u32, String) {
        let midx = self.modules;
        self.modules += 1;
        let line = format!("module\t{midx}\t0\t-\t{name}\n");
        self.text.push_str(&line);
        (midx, line)
    }

    /// Hands out the next id (none at `max_id`) to a function of module `midx` at `addr`;
    /// returns the id and the line added.
    pub fn add_generated_func(&mut self, midx: u32, addr: u64, size: u64, name: &str, max_id: u32) -> Option<(u32, String)> {
        if self.next_id >= max_id {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let line = format!("func\t{id}\t{midx}\t{addr:x}\t{size}\t{}\n", name.replace(['\t', '\n'], " "));
        self.text.push_str(&line);
        Some((id, line))
    }
}

/// Appends `v` in base `BASE`, 10 or 16 (lower case). The table has a few numbers on each of
/// tens of thousands of lines, and `write!` took most of the time of writing it; the base is
/// a constant so that each digit costs a multiplication or a shift, not a division (with the
/// base an argument, this was 6% of a traced `cc1plus --version`).
pub(crate) fn push_number<const BASE: u64>(out: &mut String, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b"0123456789abcdef"[(v % BASE) as usize];
        v /= BASE;
        if v == 0 {
            break;
        }
    }
    // The digits are ASCII.
    out.push_str(std::str::from_utf8(&buf[at..]).unwrap_or_default());
}

/// Appends `text` with its tabs and line feeds made spaces (a table field).
fn push_field(out: &mut String, text: &str) {
    if text.contains(['\t', '\n']) {
        out.push_str(&text.replace(['\t', '\n'], " "));
    } else {
        out.push_str(text);
    }
}

/// Prepares hooks for every hookable function of `obj` (trampolines built, nothing patched
/// yet), adding them to `table`. Functions at the run-time addresses in `exclude`
/// (pre-hooked already) are skipped.
/// Ids are not handed out beyond `max_id`. Functions the record-time `filters` leave out are
/// listed as skipped.
pub fn plan_module(
    obj: &Loaded,
    table: &mut ImageTable,
    exclude: &[u64],
    kind: SlotKind,
    max_id: u32,
    filters: &crate::filter::Filters,
) -> Result<ModuleResult, String> {
    let ra = if kind == SlotKind::Trace { ReturnAddress::Replaced } else { ReturnAddress::Kept };
    let inv = crate::plan_cache::analyse(&obj.path, ra)?;
    let midx = table.modules;
    table.modules += 1;
    let build_id = inv.build_id.as_ref().map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>());
    let _ = writeln!(
        table.text,
        "module\t{midx}\t{:x}\t{}\t{}",
        obj.bias,
        build_id.as_deref().unwrap_or("-"),
        obj.path.display()
    );
    // Most functions are planned: one allocation (growing by doubling, each step is fresh
    // memory to fault in).
    let mut plans = Vec::with_capacity(inv.count());
    let mut skips: Vec<(usize, &'static str, Cow<'_, str>)> = Vec::new();
    // Timing mode changes return addresses; code its module describes for unwinders everywhere
    // else but not here is someone's generated code, whose runtime may walk it.
    let cfi_elsewhere = kind == SlotKind::Trace && (0..inv.count()).any(|i| inv.has_cfi(i));
    let walker = if kind == SlotKind::Trace { stack_walker(&obj.path).or_else(|| crate::mono::runtime_in(obj)) } else { None };
    if let Some(why) = walker {
        crate::warn(&format!(
            "not hooking {} in timing mode: {why}; `fnscope record --mode count` counts its calls",
            obj.path.display()
        ));
    }
    let v8_runtime = (0..inv.count()).any(|i| inv.name(i).is_some_and(|n| n.starts_with("_ZN2v88internal")));
    let v8 = kind == SlotKind::Trace && v8_runtime;
    let filter = filters.for_module(&obj.path);
    let keep_all = filter.keeps_all();
    for i in 0..inv.count() {
        match inv.verdict(i) {
            VerdictRef::Hookable(_) if !keep_all && !filter.keeps(inv.name(i), inv.address(i)) => {
                skips.push((i, skip_reason::FILTERED, "left out by --filter/--exclude".into()))
            }
            VerdictRef::Hookable(_) if walker.is_some() => {
                skips.push((i, skip_reason::STACK_WALKER, walker.unwrap_or_default().into()))
            }
            VerdictRef::Hookable(_) if v8_runtime && inv.name(i).is_some_and(|n| n.starts_with("Builtins_")) => skips.push((
                i,
                skip_reason::DENYLIST,
                "V8's embedded builtin: V8 copies them next to its generated code when it starts (short builtin calls), and the copy of a jump to fnscope leads nowhere".into(),
            )),
            VerdictRef::Hookable(_) if v8 && called_by_v8_generated_code(inv.name(i), inv.address(i)) => skips.push((
                i,
                skip_reason::STACK_WALKER,
                "called from V8's generated code, whose stack walker reads this return address".into(),
            )),
            VerdictRef::Hookable(_) if exclude.contains(&(obj.bias + inv.address(i))) => {
                skips.push((i, skip_reason::DENYLIST, "unwinder hook of fnscope".into()))
            }
            VerdictRef::Hookable(_) if cfi_elsewhere && !inv.has_cfi(i) => skips.push((
                i,
                skip_reason::NO_CFI,
                "no call frame information (generated or hand-written code): count mode hooks it".into(),
            )),
            VerdictRef::Hookable(hook) => {
                let addr = obj.bias + inv.address(i);
                plans.push(Planned { addr, size: inv.size(i), hook, id: 0, index: i, as_is: inv.as_is(i) })
            }
            VerdictRef::Skip(reason, detail) => skips.push((i, reason, detail.into())),
        }
    }
    // A function whose island lies in a neighbour's first bytes needs that neighbour hooked.
    let planned: Vec<usize> = plans.iter().map(|p| p.index).collect();
    plans.retain(|p| {
        let HookForm::Borrowed { donor, .. } = p.hook.form else { return true };
        if planned.binary_search(&donor).is_ok() {
            return true;
        }
        let (reason, why) = match &skips.iter().find(|s| s.0 == donor) {
            Some((_, reason, detail)) => (*reason, &**detail),
            None => ("", ""),
        };
        let own = if inv.size(p.index) < fnscope_x86::JMP_LEN as u64 { skip_reason::TOO_SHORT } else { skip_reason::BRANCH_INTO_PATCH };
        let detail = format!("its island would lie in {}, which is not hooked ({reason}: {why})", inv.spelled(donor));
        skips.push((p.index, own, detail.into()));
        false
    });
    let mut descs = if kind == SlotKind::Trace {
        crate::args::plan(&obj.path, &inv, &plans.iter().map(|p| p.index).collect::<Vec<_>>())
    } else {
        Default::default()
    };
    let built = build_slots(obj, &plans, kind, &mut table.next_id, max_id, &mut descs).map_err(|e| format!("{}: {e}", obj.path.display()))?;
    table.text.push_str(&built.args_lines);
    for (i, why) in built.failed {
        skips.push((i, skip_reason::UNRELOCATABLE, why.into()));
    }
    let out = &mut table.text;
    out.reserve(built.ids.len() * 48 + skips.len() * 96);
    let mut module = String::new();
    push_number::<10>(&mut module, u64::from(midx));
    module.push('\t');
    for &(i, id) in &built.ids {
        out.push_str("func\t");
        push_number::<10>(out, u64::from(id));
        out.push('\t');
        out.push_str(&module);
        out.push_str(inv.fields(i));
        out.push('\n');
    }
    for (i, reason, detail) in &skips {
        out.push_str("skip\t");
        out.push_str(&module);
        out.push_str(inv.place(*i));
        out.push_str(reason);
        out.push('\t');
        push_field(out, detail);
        out.push('\t');
        out.push_str(inv.spelled(*i));
        out.push('\n');
    }
    Ok(ModuleResult { hooked: built.ids.len(), skipped: skips.len(), patches: built.patches, cached: inv.cached })
}

/// Installs pre-hooks (kind in the id field) on functions given by run-time address.
/// `traced`: the module's functions are to be traced too (see [`crate::plan_cache::entry_hooks`]).
pub fn prehook(obj: &Loaded, targets: &[(u64, u32)], traced: bool) -> Result<usize, String> {
    let addresses: Vec<u64> = targets.iter().map(|&(addr, _)| addr - obj.bias).collect();
    // Only the entry form: padding this analysis hands out could go to another function in
    // the module's own analysis if its functions are traced too.
    let hooks = crate::plan_cache::entry_hooks(&obj.path, &addresses, traced)?;
    let mut plans = Vec::new();
    for (index, (address, size, hook)) in hooks.into_iter().enumerate() {
        let Some(&(addr, kind)) = targets.iter().find(|t| t.0 - obj.bias == address) else { continue };
        plans.push(Planned { addr, size, hook, id: kind, index, as_is: None });
    }
    if plans.is_empty() {
        return Ok(0);
    }
    let built = build_slots(obj, &plans, SlotKind::Prehook, &mut 0, u32::MAX, &mut Default::default())?;
    if let Some((_, why)) = write_patches(obj, &built.patches).into_iter().next() {
        return Err(why);
    }
    Ok(built.ids.len())
}

/// Why a module's runtime cannot run with changed return addresses, if it is one of those
/// known to walk their own native stacks.
fn stack_walker(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    (name == "libjvm.so").then_some("HotSpot walks its own native stacks and would crash on fnscope's return addresses")
}

/// V8 (node, and programs embedding it) calls runtime functions, C++ builtins and API
/// callbacks from its generated code through "exit frames", and its stack walker (run by the
/// garbage collector, among others) reads the return address of that call from the stack to
/// find the generated code it came from: it must stay as it is. `raw` is the symbol as the
/// module has it.
fn called_by_v8_generated_code(raw: Option<&str>, address: u64) -> bool {
    // Each name looked for below is spelled out in the mangled symbol too (a source name, or
    // the first mention a substitution refers back to), so only the symbols holding one are
    // demangled: demangling all of node's 72,000 took 200 ms of every start-up.
    if !raw.is_some_and(|r| ["Runtime_", "Builtin_", "CallbackInfo"].iter().any(|k| r.contains(k))) {
        return false;
    }
    let name = fnscope_symbols::display_name(raw, address);
    name.starts_with("v8::internal::Runtime_")
        || name.starts_with("v8::internal::Builtin_")
        || name.contains("FunctionCallbackInfo<")
        || name.contains("PropertyCallbackInfo<")
}

/// Whether `path` names the dynamic linker, the vDSO or this agent.
pub fn never_hook(path: &Path, obj: &Loaded) -> bool {
    let own = never_hook as *const () as u64;
    let s = path.to_string_lossy();
    s.is_empty() || s.contains("ld-linux") || s.contains("linux-vdso") || (own >= obj.lo && own < obj.hi)
}

#[cfg(test)]
mod tests {
    use super::{called_by_v8_generated_code, trace_head, AREA_HEADER, THUNK_ARGS, THUNK_STUB};
    use crate::stubs::{SLOT_CODE_OFFSET, SLOT_ID_OFFSET};
    use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Register};

    /// A slot's head decodes to its three instructions: the r11 spill, the address of the
    /// relocated prologue, and a jump: directly to the stub where it lies within reach of a
    /// 32-bit displacement, else directly to the area header's thunk for that stub, or (for
    /// small areas) through the header's word for it; the id follows. The header's thunks
    /// jump through those words.
    #[test]
    fn slot_heads_jump_to_their_stub() {
        let area = 0x7f00_0000_1000u64;
        let slot = area + AREA_HEADER as u64 + 0x40;
        let decode = |code: &[u8], ip: u64, n: usize| -> Vec<Instruction> {
            let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
            (0..n).map(|_| d.decode()).collect()
        };
        let args_stub = crate::stubs::fnscope_entry_args as *const () as u64;
        // The real args stub (the head knows it by its address): within reach of an area 1 GiB
        // below it, out of reach of one 1 TiB below.
        let near_args = args_stub - (1 << 30);
        for (area, stub, args, direct) in [
            (area, 0x7f00_4000_0000u64, false, true),
            (area, 0x5555_0000_0000, false, false),
            (area, slot + (1 << 32), false, false),
            (near_args, args_stub, true, true),
            (args_stub.wrapping_sub(1 << 40), args_stub, true, false),
        ] {
            let slot = area + AREA_HEADER as u64 + 0x40;
            for via_thunk in [false, true] {
                let head = trace_head(slot, area, stub, via_thunk, 0x0102_0304);
                let i = decode(&head[..18], slot, 3);
                assert_eq!((i[0].code(), i[0].memory_base(), i[0].memory_displacement64() as i64, i[0].op1_register()), (Code::Mov_rm64_r64, Register::RSP, -8, Register::R11));
                assert_eq!((i[1].code(), i[1].op0_register()), (Code::Lea_r64_m, Register::R11));
                assert_eq!(i[1].memory_displacement64(), slot + SLOT_CODE_OFFSET as u64);
                let case = format!("stub {stub:#x}, via_thunk {via_thunk}");
                if direct || via_thunk {
                    assert_eq!(i[2].code(), Code::Jmp_rel32_64, "{case}");
                    let thunk = area + if args { THUNK_ARGS } else { THUNK_STUB };
                    assert_eq!(i[2].near_branch_target(), if direct { stub } else { thunk }, "{case}");
                } else {
                    assert_eq!((i[2].code(), i[2].memory_base()), (Code::Jmp_rm64, Register::RIP), "{case}");
                    assert_eq!(i[2].memory_displacement64(), area + if args { 16 } else { 0 }, "{case}");
                }
                assert_eq!(head[SLOT_ID_OFFSET..SLOT_ID_OFFSET + 4], 0x0102_0304u32.to_le_bytes());
            }
        }
        let mut header = [0u64; AREA_HEADER / 8];
        let base = header.as_mut_ptr() as u64;
        let stub = 0x1234_5678_9abc;
        // SAFETY: `header` is AREA_HEADER writable bytes that nothing runs.
        unsafe { super::write_area_header(base, stub) };
        assert_eq!(header[0], stub);
        assert_eq!(header[2], crate::stubs::fnscope_entry_args as *const () as u64);
        // SAFETY: the bytes of `header`, read after the writes above.
        let bytes = unsafe { core::slice::from_raw_parts(base as *const u8, AREA_HEADER) };
        for (at, word) in [(THUNK_STUB, 0u64), (THUNK_ARGS, 16)] {
            let j = decode(&bytes[at as usize..], base + at, 1);
            assert_eq!((j[0].code(), j[0].memory_base()), (Code::Jmp_rm64, Register::RIP));
            assert_eq!(j[0].memory_displacement64(), base + word);
        }
    }

    #[test]
    fn v8_callees_are_found_in_mangled_symbols() {
        for (raw, want) in [
            (Some("_ZN2v88internal11Runtime_AddEiPmPNS0_7IsolateE"), true),
            (Some("_ZN2v88internal15Builtin_DateNowEiPmPNS0_7IsolateE"), true),
            (Some("_ZN4node2fs5CloseERKN2v820FunctionCallbackInfoINS1_5ValueEEE"), true),
            (Some("_ZN12v8_inspector9V8Console19CommandLineAPIScope22accessorSetterCallbackEN2v85LocalINS2_4NameEEENS3_INS2_5ValueEEERKNS2_20PropertyCallbackInfoIvEE"), true),
            (Some("_ZN2v88internal4Heap10SetGCStateENS1_9HeapStateE"), false),
            // A name that holds a key word but is not one of V8's callees.
            (Some("_ZN4node13Builtin_helperEv"), false),
            (Some("uv_run"), false),
            (None, false),
        ] {
            assert_eq!(called_by_v8_generated_code(raw, 0x1000), want, "{raw:?}");
        }
    }
}
