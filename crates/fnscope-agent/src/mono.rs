//! Managed code on Mono: methods are hooked when the runtime has compiled them.
//!
//! Mono's methods have no code until its JIT compiles them (or it loads their ahead-of-time
//! compiled code), so there is nothing to hook at start-up. Mono's profiler API tells a
//! registered profiler about each method whose native code is ready (`jit_done`: the method
//! and its `MonoJitInfo`, which gives the code's start and size), before that code runs; the
//! agent hooks it there like any other function, with the same slots and stubs, and names it
//! as Mono does (`mono_method_full_name`, with the signature). The profiler API serves only to
//! learn of code: its enter/leave instrumentation is not used.
//!
//! The runtime is found with `dlsym`: linked into the `mono` launcher, or `libmonosgen-2.0.so`
//! loaded by a program that embeds it (at start-up, or later through `dlopen`, which the agent
//! interposes). A program without it is not touched.
//!
//! The callback runs on the compiling thread while Mono holds its own locks. It takes the
//! agent's tracer lock (no path holding that lock waits for Mono), allocates from the agent's
//! allocator and writes files with raw system calls. The new code has not run yet (Mono
//! publishes it after the callback), so writing its entry jump races with nobody; code loaded
//! ahead of time might be reached by a direct call already, so the jump is written with one
//! aligned 8-byte store where the entry allows.
//!
//! Timing mode replaces return addresses, and Mono's exception handling walks managed frames
//! by return address. When an exception is thrown (`exception_throw`, before Mono's first
//! walk) every hooked frame of the thread gets its real return address back, as for C++
//! exceptions ([`crate::thread::unwind_begins`]); when a `catch` clause runs, frames below the
//! catching method's newest hooked frame are recorded as unwound and the live ones re-armed
//! ([`crate::thread::unwind_caught`]).

use crate::hook::{self, Area, SlotKind, AREA_HEADER, COUNT_CODE_OFFSET, COUNT_TAIL, PROT_EXEC, PROT_READ, PROT_WRITE};
use crate::stubs::{self, SLOT_CODE_OFFSET};
use crate::{count, thread, Tracer};
use fnscope_x86::{ReturnAddress, Verdict};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

/// Name of the module that holds Mono's methods in image tables.
pub const MODULE_NAME: &str = "[mono]";

/// Bytes of each trampoline area for managed methods (slots are 48 to 96 bytes).
const AREA_LEN: usize = 1 << 20;

/// `MONO_PROFILER_CODE_BUFFER_METHOD` (profiler.h).
const CODE_BUFFER_METHOD: c_int = 0;

/// `MONO_EXCEPTION_CLAUSE_NONE`: a `catch` clause (metadata.h).
const CLAUSE_CATCH: c_int = 0;

/// The runtime functions the callbacks use, found once.
struct Api {
    code_start: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    code_size: unsafe extern "C" fn(*mut c_void) -> c_int,
    full_name: unsafe extern "C" fn(*mut c_void, c_int) -> *mut c_char,
    free: unsafe extern "C" fn(*mut c_void),
}

static API: OnceLock<Api> = OnceLock::new();
static ATTACHED: AtomicBool = AtomicBool::new(false);

/// What the agent knows of Mono's code. Only touched under the tracer lock.
struct State {
    /// Index of [`MODULE_NAME`] in the image table, once listed.
    module: Option<u32>,
    /// Trampoline areas for managed methods, with the bytes used in each and the stub their
    /// slots jump to.
    areas: Vec<(Area, usize, u64)>,
    /// Hooked code by entry address: the function id and the jump written there, to tell a
    /// method reported twice from new code at a freed method's address.
    by_addr: HashMap<u64, (u32, [u8; fnscope_x86::JMP_LEN])>,
    /// Function id and entry address of each hooked method, by `MonoMethod` pointer.
    by_method: HashMap<usize, (u32, u64)>,
    /// The process's mappings as last read: reading them again for each method would cost
    /// more than all the rest of hooking it. See [`MAPS_STALE`].
    maps: Vec<hook::Mapping>,
}

/// Set when the mappings may have changed in a way that matters to [`State::maps`]: Mono
/// freed code (a chunk of it may be unmapped, and something else mapped there) or a library
/// was loaded (Mono loads ahead-of-time code with `dlopen`, read-execute).
static MAPS_STALE: AtomicBool = AtomicBool::new(true);

/// Notes that mappings may have changed (see [`MAPS_STALE`]); called after `dlopen`.
pub fn mappings_changed() {
    MAPS_STALE.store(true, Ordering::Release);
}

static STATE: LazyLock<Mutex<State>> =
    LazyLock::new(|| Mutex::new(State { module: None, areas: Vec::new(), by_addr: HashMap::new(), by_method: HashMap::new(), maps: Vec::new() }));

/// Looks a symbol up among all loaded objects.
fn sym(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a valid C string only looks a symbol up.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// Whether a Mono runtime is loaded in this process.
pub fn present() -> bool {
    !sym(c"mono_profiler_create").is_null()
}

/// Why `obj`'s code must keep its return addresses, if it is the Mono runtime: Mono's own
/// stack walks (exceptions, `Environment.StackTrace`) step through its native frames too, and
/// lose their way at a replaced return address.
pub fn runtime_in(obj: &hook::Loaded) -> Option<&'static str> {
    let f = sym(c"mono_profiler_create") as u64;
    (f >= obj.lo && f < obj.hi).then_some("the Mono runtime walks its own stacks through its native frames")
}

/// Registers the agent as a Mono profiler if a Mono runtime is loaded and this was not done
/// yet. Called at the end of start-up and after each `dlopen`.
pub fn attach() {
    if ATTACHED.load(Ordering::Acquire) || !present() {
        return;
    }
    let names: [&CStr; 11] = [
        c"mono_profiler_create",
        c"mono_profiler_set_jit_done_callback",
        c"mono_profiler_set_method_free_callback",
        c"mono_profiler_set_exception_throw_callback",
        c"mono_profiler_set_exception_clause_callback",
        c"mono_jit_info_get_code_start",
        c"mono_jit_info_get_code_size",
        c"mono_method_full_name",
        c"mono_free",
        c"mono_profiler_set_jit_code_buffer_callback",
        c"mono_profiler_set_jit_chunk_destroyed_callback",
    ];
    let p: Vec<*mut c_void> = names.iter().map(|n| sym(n)).collect();
    if let Some(i) = p.iter().position(|p| p.is_null()) {
        crate::warn(&format!("Mono found but {} is missing: managed methods are not traced", names[i].to_string_lossy()));
        ATTACHED.store(true, Ordering::Release);
        return;
    }
    if ATTACHED.swap(true, Ordering::AcqRel) {
        return;
    }
    type Create = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
    type SetCallback = unsafe extern "C" fn(*mut c_void, *const c_void);
    static PROFILER: u64 = 0;
    // SAFETY: the pointers are Mono's exported functions of these names, whose C signatures
    // (mono/metadata/profiler.h, jit-info and debug-helpers) these types repeat; the profiler
    // pointer is opaque to Mono and handed back to the callbacks, which ignore it.
    unsafe {
        let _ = API.set(Api {
            code_start: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void) -> *mut c_void>(p[5]),
            code_size: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void) -> c_int>(p[6]),
            full_name: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, c_int) -> *mut c_char>(p[7]),
            free: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(p[8]),
        });
        let handle = std::mem::transmute::<*mut c_void, Create>(p[0])(&PROFILER as *const u64 as *mut c_void);
        if handle.is_null() {
            crate::warn("Mono refused a profiler: managed methods are not traced");
            return;
        }
        let set = |i: usize, cb: *const c_void| std::mem::transmute::<*mut c_void, SetCallback>(p[i])(handle, cb);
        set(9, jit_code_buffer as *const c_void);
        set(10, jit_chunk_destroyed as *const c_void);
        set(1, jit_done as *const c_void);
        set(2, method_free as *const c_void);
        if !crate::count_mode() {
            set(3, exception_throw as *const c_void);
            let enable = sym(c"mono_profiler_enable_clauses");
            if !enable.is_null() && std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(enable)() != 0 {
                set(4, exception_clause as *const c_void);
            }
        }
    }
}

/// Mono generated code: for `MONO_PROFILER_CODE_BUFFER_METHOD`, a method's code, final but
/// not yet published (other threads cannot reach it): hook it now. Code of other kinds
/// (trampolines, helpers) is not a method of the program's.
extern "C" fn jit_code_buffer(_prof: *mut c_void, buffer: *const u8, size: u64, kind: c_int, data: *const c_void) {
    let _quiet = crate::thread::quiet();
    if kind == CODE_BUFFER_METHOD && !data.is_null() {
        hook_reported(data as *mut c_void, buffer as u64, size);
    }
}

/// Mono compiled `method` or loaded its ahead-of-time code. Compiled code was hooked when its
/// buffer was reported (this comes after Mono published it, when another thread may be
/// running it already); code loaded ahead of time is hooked here.
extern "C" fn jit_done(_prof: *mut c_void, method: *mut c_void, jinfo: *mut c_void) {
    let _quiet = crate::thread::quiet();
    let Some(api) = API.get() else { return };
    if jinfo.is_null() {
        return;
    }
    // SAFETY: Mono passes a valid MonoJitInfo for the duration of the callback.
    let (start, size) = unsafe { ((api.code_start)(jinfo) as u64, (api.code_size)(jinfo)) };
    hook_reported(method, start, u64::try_from(size).unwrap_or(0));
}

/// Hooks the code `[start, start + size)` of `method` unless it is hooked already.
fn hook_reported(method: *mut c_void, start: u64, size: u64) {
    let Some(api) = API.get() else { return };
    if !crate::active() || start == 0 || size == 0 || method.is_null() {
        return;
    }
    let known = |st: &State| st.by_addr.get(&start).is_some_and(|(_, jump)| {
        // SAFETY: Mono reported at least `size` bytes of code at `start`, and the jump was
        // written there before, so `start` holds at least JMP_LEN bytes.
        unsafe { std::slice::from_raw_parts(start as *const u8, jump.len()) == jump }
    });
    if crate::with_tracer(|_| known(&STATE.lock().unwrap_or_else(|e| e.into_inner()))) != Some(false) {
        return;
    }
    // SAFETY: Mono passes a valid MonoMethod for the duration of the callback; the name is a
    // NUL-terminated string Mono allocated for us to free with mono_free.
    let name = unsafe {
        let raw = (api.full_name)(method, 1);
        let name = if raw.is_null() { format!("method_{start:x}") } else { CStr::from_ptr(raw).to_string_lossy().into_owned() };
        if !raw.is_null() {
            (api.free)(raw as *mut c_void);
        }
        name
    };
    crate::with_tracer(|t| {
        let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if known(&st) {
            return;
        }
        if let Err(e) = hook_method(t, &mut st, method as usize, start, size, &name) {
            crate::warn(&format!("managed method {name}: {e}"));
        }
    });
}

/// Mono frees `method`'s code (dynamic methods, unloaded domains). Nothing runs it any more;
/// forgetting it lets code compiled later at the same address be hooked under its own name.
extern "C" fn method_free(_prof: *mut c_void, method: *mut c_void) {
    let _quiet = crate::thread::quiet();
    mappings_changed();
    crate::with_tracer(|_| {
        let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, addr)) = st.by_method.remove(&(method as usize)) {
            st.by_addr.remove(&addr);
        }
    });
}

/// Mono gives a chunk of code memory back.
extern "C" fn jit_chunk_destroyed(_prof: *mut c_void, _chunk: *const u8) {
    mappings_changed();
}

/// A managed exception is thrown; Mono walks the thread's managed frames next. No frame is
/// gone yet (hence the limit 0), whatever stack this runs on (a stack overflow is handled on
/// the alternate signal stack).
extern "C" fn exception_throw(_prof: *mut c_void, exception: *mut c_void) {
    thread::unwind_begins(0, exception as u64);
}

/// A clause of `method` runs for `exception`. For a `catch`, the frames below the method's
/// are gone and the rest live on.
extern "C" fn exception_clause(_prof: *mut c_void, method: *mut c_void, _index: u32, kind: c_int, exception: *mut c_void) {
    if kind != CLAUSE_CATCH || exception.is_null() {
        return;
    }
    let id = crate::with_tracer(|_| STATE.lock().unwrap_or_else(|e| e.into_inner()).by_method.get(&(method as usize)).map(|m| m.0)).flatten();
    match id.and_then(thread::newest_slot_of) {
        Some(slot) => thread::unwind_caught(slot, exception as u64),
        None => thread::unwind_caught_unknown(exception as u64),
    }
}

/// Hooks the code `[start, start + size)` of `method`: lists it in the image table (file
/// first, so that every id a record carries is named), builds its slot and writes its jump.
fn hook_method(t: &mut Tracer, st: &mut State, method: usize, start: u64, size: u64, name: &str) -> Result<(), String> {
    let midx = match st.module {
        Some(m) => m,
        None => {
            let (m, line) = t.table.add_generated_module(MODULE_NAME);
            t.append_table(&line)?;
            st.module = Some(m);
            m
        }
    };
    let walker = t.kind == SlotKind::Trace && walks_stack(name);
    if !walker && !kept_by_filters(t, start, name) {
        let line = format!("skip\t{midx}\t{start:x}\t{size}\t{}\tleft out by --filter/--exclude\t{}\n", fnscope_abi::skip_reason::FILTERED, name.replace(['\t', '\n'], " "));
        return t.append_table(&line);
    }
    let kind = if walker { SlotKind::Prehook } else { t.kind };
    let ra = if kind == SlotKind::Trace { ReturnAddress::Replaced } else { ReturnAddress::Kept };
    // SAFETY: Mono reported `size` bytes of code at `start`; it stays mapped while the method
    // can run.
    let code = unsafe { std::slice::from_raw_parts(start as *const u8, size as usize) };
    let hook = match fnscope_x86::analyze_code(code, start, ra) {
        Verdict::Hookable(h) => h,
        Verdict::Skip { reason, detail } => {
            let line = format!("skip\t{midx}\t{start:x}\t{size}\t{reason}\t{}\t{}\n", detail.replace(['\t', '\n'], " "), name.replace(['\t', '\n'], " "));
            return t.append_table(&line);
        }
    };
    let code_offset = if kind == SlotKind::Count { COUNT_CODE_OFFSET } else { SLOT_CODE_OFFSET };
    let slot_len = hook::round_up(code_offset + fnscope_x86::max_relocated_len(hook.relocate_len.into()), 16);
    let target = match kind {
        SlotKind::Trace => stubs::fnscope_entry as *const () as u64,
        SlotKind::Prehook => stubs::fnscope_prehook as *const () as u64,
        SlotKind::Count => stubs::fnscope_count_init as *const () as u64,
    };
    let (slot, area_base) = take_slot(st, start, start + size, slot_len, target)?;
    let code_at = slot + code_offset as u64;
    let reloc = fnscope_x86::relocate(&code[..hook.relocate_len.into()], start, code_at).map_err(|e| e.to_string())?;
    let entry = if kind == SlotKind::Count { slot + COUNT_TAIL as u64 } else { slot };
    let jumps = hook.patches(start, entry).ok_or("trampoline out of reach")?;
    let [jump] = jumps.as_slice() else { return Err("unexpected hook form".into()) };
    let bytes: [u8; fnscope_x86::JMP_LEN] = jump.bytes().try_into().map_err(|_| "unexpected jump length")?;
    let max_id = if kind == SlotKind::Count { count::capacity() } else { u32::MAX };
    let (id, line) = if walker {
        let line = format!(
            "skip\t{midx}\t{start:x}\t{size}\t{}\tMono walks the stack here: a pre-hook gives hooked frames their return addresses back\t{}\n",
            fnscope_abi::skip_reason::STACK_WALKER,
            name.replace(['\t', '\n'], " ")
        );
        (crate::unwind::KIND_WALK, line)
    } else {
        t.table.add_generated_func(midx, start, size, name, max_id).ok_or("no counter left for it (count mode)")?
    };
    let head: &[u8] = match kind {
        SlotKind::Count => &hook::count_head(slot, area_base, id),
        // JIT-compiled methods come by the thousand: through the area's thunk.
        _ => &hook::trace_head(slot, area_base, target, true, id),
    };
    // SAFETY: `take_slot` reserved `slot_len` bytes at `slot` in a read-write-execute area of
    // ours that no jump leads into yet; the head and the relocated prologue fit (`slot_len`
    // bounds the relocation by `max_relocated_len`).
    unsafe {
        core::ptr::copy_nonoverlapping(head.as_ptr(), slot as *mut u8, head.len());
        core::ptr::copy_nonoverlapping(reloc.as_ptr(), code_at as *mut u8, reloc.len().min(slot_len - code_offset));
    }
    if kind == SlotKind::Trace {
        thread::set_range(id, start, start + size);
    }
    t.append_table(&line)?;
    if kind == SlotKind::Count {
        count::set_nfuncs(t.table.ids());
    }
    if let Err(e) = write_jump(st, start, &bytes) {
        if !walker {
            // The table said it was hooked; say now that it is not, and why.
            let line = t.table.unhooked(id, &e);
            t.append_table(&line)?;
        }
        return Err(e);
    }
    st.by_addr.insert(start, (id, bytes));
    if !walker {
        st.by_method.insert(method, (id, start));
    }
    Ok(())
}

/// Whether `--filter`/`--exclude` keep the method `name` (module [`MODULE_NAME`]). Stack-walk
/// pre-hooks are installed whatever the filters say: without them Mono would lose its way.
fn kept_by_filters(t: &Tracer, start: u64, name: &str) -> bool {
    let filter = t.filters.for_module(std::path::Path::new(MODULE_NAME));
    filter.keeps_all() || filter.keeps(Some(name), start)
}

/// Whether Mono's native code behind the managed-to-native wrapper `name` walks the calling
/// thread's managed stack: stack traces, and the lookups of a caller's method or assembly
/// (those that take a `StackCrawlMark`, `Type.GetType(string)` among them).
fn walks_stack(name: &str) -> bool {
    const WALKERS: &[&str] = &[
        "System.Diagnostics.StackFrame:get_frame_info ",
        "System.Diagnostics.StackTrace:get_trace ",
        "System.Reflection.Assembly:GetCallingAssembly ",
        "System.Reflection.Assembly:GetExecutingAssembly ",
        "System.Reflection.MethodBase:GetCurrentMethod ",
        "System.Reflection.RuntimeMethodInfo:GetCurrentMethod ",
    ];
    name.strip_prefix("(wrapper managed-to-native) ")
        .is_some_and(|m| m.contains("StackCrawlMark") || WALKERS.iter().any(|w| m.starts_with(w)))
}

/// Reserves `len` bytes for a slot within reach of `[lo, hi)` in an area whose slots jump to
/// `target`, an existing area or a new one. Returns the slot and its area's base.
fn take_slot(st: &mut State, lo: u64, hi: u64, len: usize, target: u64) -> Result<(u64, u64), String> {
    const REACH: u64 = (1 << 31) - (1 << 20);
    let fits = |a: &Area, used: usize| {
        let (s, e) = (a.base + used as u64, a.base + (used + len) as u64);
        used + len <= a.len && e <= lo.saturating_add(REACH) && s >= hi.saturating_sub(REACH)
    };
    if let Some((a, used, _)) = st.areas.iter_mut().rev().find(|(a, used, t)| *t == target && fits(a, *used)) {
        let slot = a.base + *used as u64;
        *used += len;
        return Ok((slot, a.base));
    }
    let area = hook::alloc_near(lo, hi, AREA_LEN).ok_or_else(|| format!("no free memory within 2 GiB of {lo:#x}"))?;
    // SAFETY: a fresh read-write mapping of AREA_LEN bytes, more than the header's.
    unsafe { hook::write_area_header(area.base, target) };
    // Slots are added while other threads run the area's earlier ones, so it stays
    // executable (and writable) throughout instead of changing protection per method.
    hook::set_prot(area.base, area.len, PROT_READ | PROT_WRITE | PROT_EXEC).map_err(|e| format!("cannot make the trampolines executable: {e}"))?;
    let (slot, base) = (area.base + AREA_HEADER as u64, area.base);
    st.areas.push((area, AREA_HEADER + len, target));
    Ok((slot, base))
}

/// Writes the 5-byte entry jump at `at`, making the page writable for the time it takes if
/// it is not (code loaded ahead of time is mapped read-execute; JIT code is writable).
fn write_jump(st: &mut State, at: u64, bytes: &[u8; fnscope_x86::JMP_LEN]) -> Result<(), String> {
    let first = at & !4095;
    let last = (at + bytes.len() as u64 - 1) & !4095;
    let pages: &[u64] = if first == last { &[first] } else { &[first, last] };
    let lookup = |st: &State| -> Option<Vec<u32>> {
        pages.iter().map(|&p| st.maps.iter().find(|m| m.lo <= p && p < m.hi).map(|m| m.prot)).collect()
    };
    let mut prots = if MAPS_STALE.load(Ordering::Acquire) { None } else { lookup(st) };
    if prots.is_none() {
        MAPS_STALE.store(false, Ordering::Release);
        st.maps = hook::mappings();
        prots = lookup(st);
    }
    let prots = prots.ok_or_else(|| format!("no mapping holds the code at {at:#x}"))?;
    // Each page keeps its own protection: a jump may straddle two mappings.
    for (&p, &prot) in pages.iter().zip(&prots) {
        if prot & PROT_WRITE == 0 {
            hook::set_prot(p, 4096, prot | PROT_WRITE).map_err(|e| format!("cannot make its code writable: {e}"))?;
        }
    }
    let word = at & !7;
    if at + bytes.len() as u64 <= word + 8 {
        // One aligned store: a thread that reaches the entry meanwhile runs either the old
        // bytes or the whole jump.
        // SAFETY: the aligned 8 bytes lie in the (now writable) mapped code; the bytes outside
        // the jump keep their values.
        unsafe {
            let w = &*(word as *const core::sync::atomic::AtomicU64);
            let mut v = w.load(Ordering::Relaxed).to_le_bytes();
            let off = (at - word) as usize;
            v[off..off + bytes.len()].copy_from_slice(bytes);
            w.store(u64::from_le_bytes(v), Ordering::Release);
        }
    } else {
        // SAFETY: the bytes lie in the (now writable) entry of the code Mono reported, whose
        // first whole instructions the analysis found movable.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) };
    }
    for (&p, &prot) in pages.iter().zip(&prots) {
        if prot & PROT_WRITE == 0 {
            // Best effort: the jump is written either way, only left writable if this fails.
            let _ = hook::set_prot(p, 4096, prot);
        }
    }
    Ok(())
}
