//! Per-thread state and the slow paths the stubs call.

use crate::{region, stubs, sys};
use core::mem::offset_of;
use core::ptr::{addr_of_mut, read_volatile, write_volatile};
use fnscope_abi::{ChunkHeader, Record, CHUNK_FLAG_LAST, RECORD_SIZE, REC_FLAG_UNWOUND};

/// One thread's tracing state. The first fields are read by the stubs at fixed offsets.
#[repr(C)]
pub struct ThreadState {
    /// Next free shadow-stack entry.
    pub ss_top: u64,
    /// End of usable shadow-stack entries; 0 in the state of untraced threads.
    pub ss_limit: u64,
    /// Next record slot.
    pub buf_ptr: u64,
    /// End of the record area; 0 forces the slow path (no chunk, or chunk being swapped).
    pub buf_end: u64,
    /// First shadow-stack entry.
    pub ss_base: u64,
    /// Chunk being filled, or null.
    pub chunk: *mut ChunkHeader,
    /// Chunk filled before it, not yet published (see `refill`), or null.
    pub prev_chunk: *mut ChunkHeader,
    /// Records in `prev_chunk`.
    pub prev_nrec: u32,
    /// Sequence number of the next chunk of this thread.
    pub seq: u64,
    /// Records dropped since the last chunk was taken.
    pub lost: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Non-zero while a slow path runs (a signal handler's records are then dropped).
    pub in_slow: u32,
    /// Non-zero once the thread (or process) is finishing: records are dropped.
    pub exited: u32,
    /// The thread's own stack, `[stack_lo, stack_hi)` (0, 0 if unknown).
    pub stack_lo: u64,
    /// See `stack_lo`.
    pub stack_hi: u64,
    /// Number of exceptions in `inflight`.
    pub unwinding: u32,
    /// Exception objects being unwound through restored frames (the frames are re-armed
    /// when the last one is caught): a rethrow enters the unwinder twice with the same object, and an
    /// exception thrown and caught inside a destructor during unwinding must not re-arm the
    /// frames the outer one is still unwinding.
    pub inflight: [u64; MAX_INFLIGHT],
}

/// Exceptions tracked at once per thread; beyond that, frames are re-armed only when all
/// are caught.
pub const MAX_INFLIGHT: usize = 8;

/// One shadow-stack entry, 32 bytes, laid out as the stubs write it.
#[repr(C)]
pub struct ShadowEntry {
    /// The caller's real return address.
    pub ret: u64,
    /// Time-stamp counter at entry.
    pub t_entry: u64,
    /// Function id.
    pub id: u64,
    /// Address of the stack slot holding the return address (rsp at entry).
    pub slot: u64,
}

const _: () = {
    assert!(offset_of!(ThreadState, ss_top) == 0);
    assert!(offset_of!(ThreadState, ss_limit) == 8);
    assert!(offset_of!(ThreadState, buf_ptr) == 16);
    assert!(offset_of!(ThreadState, buf_end) == 24);
    assert!(offset_of!(ThreadState, ss_base) == 32);
    assert!(core::mem::size_of::<ShadowEntry>() == 32);
    assert!(core::mem::size_of::<ThreadState>() <= 4096);
};

/// Shadow-stack entries per thread: calls nested deeper than this are not recorded.
pub const SHADOW_ENTRIES: usize = 1 << 16;
const SHADOW_BYTES: usize = SHADOW_ENTRIES * core::mem::size_of::<ShadowEntry>();

struct Disabled(core::cell::UnsafeCell<ThreadState>);
// SAFETY: the stubs only ever `xadd` to and subtract from `ss_top` of this state; its value
// is never used because `ss_limit` is 0, so racy updates from several threads are harmless.
unsafe impl Sync for Disabled {}

/// State of threads that must not be traced (agent inactive, thread starting or failing to
/// set up): its `ss_limit` of 0 sends every call down the stub's untraced path.
static DISABLED: Disabled = Disabled(core::cell::UnsafeCell::new(ThreadState {
    ss_top: 0,
    ss_limit: 0,
    buf_ptr: 0,
    buf_end: 0,
    ss_base: 0,
    chunk: core::ptr::null_mut(),
    prev_chunk: core::ptr::null_mut(),
    prev_nrec: 0,
    seq: 0,
    lost: 0,
    pid: 0,
    tid: 0,
    in_slow: 0,
    exited: 1,
    stack_lo: 0,
    stack_hi: 0,
    unwinding: 0,
    inflight: [0; MAX_INFLIGHT],
}));

fn disabled() -> *mut ThreadState {
    DISABLED.0.get()
}

/// This thread's live state, if it has one.
pub fn current() -> Option<*mut ThreadState> {
    // SAFETY: reads this thread's TLS word.
    let st = unsafe { stubs::fnscope_tls_get() };
    if st.is_null() || st == disabled() {
        None
    } else {
        Some(st)
    }
}

static mut KEY: libc::pthread_key_t = 0;

/// Start-up: thread-exit and fork hooks. Must run before any function is hooked.
pub fn install_process_hooks() {
    // SAFETY: called once, single-threaded, at start-up; KEY is written only here.
    unsafe {
        libc::pthread_key_create(addr_of_mut!(KEY), Some(thread_exit));
        libc::pthread_atfork(None, None, Some(after_fork_child));
    }
}

/// Asks for `thread_exit` to run when the calling thread ends (count mode, which keeps no
/// state pointer of its own there).
pub fn register_exit() {
    // SAFETY: KEY was created at start-up; any non-null value makes the destructor run.
    unsafe { libc::pthread_setspecific(KEY, core::ptr::dangling::<libc::c_void>()) };
}

/// First hooked call of a thread: sets up its state. Called by the entry stub.
#[no_mangle]
extern "C" fn fnscope_thread_init() {
    // SAFETY: marks this thread untraced first, so that hooked functions called below (libc's,
    // when libc is hooked) take the untraced path instead of coming back here.
    unsafe { stubs::fnscope_tls_set(disabled()) };
    if !crate::active() {
        return;
    }
    let mem = sys::mmap_anon(4096 + SHADOW_BYTES);
    if mem.is_null() {
        return;
    }
    let st = mem as *mut ThreadState;
    let base = mem as u64 + 4096;
    // SAFETY: `mem` is a fresh zeroed private mapping large enough for the state page and the
    // shadow stack; the entry stub reads `ss_base - 32` as a sentinel, which is the state page.
    unsafe {
        (*st).ss_base = base;
        (*st).ss_top = base;
        (*st).ss_limit = base + SHADOW_BYTES as u64;
        (*st).pid = sys::getpid();
        (*st).tid = sys::gettid();
        let (lo, hi) = own_stack();
        (*st).stack_lo = lo;
        (*st).stack_hi = hi;
        libc::pthread_setspecific(KEY, st as *const libc::c_void);
        stubs::fnscope_tls_set(st);
    }
}

/// Bounds of the calling thread's stack, or (0, 0).
fn own_stack() -> (u64, u64) {
    // SAFETY: a zeroed attr is valid input for pthread_getattr_np, which fills it; it is
    // destroyed after use. Called from the thread-start slow path with tracing disabled.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if ok {
            (addr as u64, addr as u64 + size as u64)
        } else {
            (0, 0)
        }
    }
}

/// pthread key destructor: the thread is ending; hand its chunk to the recorder.
extern "C" fn thread_exit(p: *mut libc::c_void) {
    if crate::count_mode() {
        crate::count::thread_exit();
        return;
    }
    let st = p as *mut ThreadState;
    // SAFETY: `p` is the state this thread registered in `fnscope_thread_init`. Entries still
    // on its shadow stack are calls that `pthread_exit` (a forced unwind) or a cancellation
    // ended.
    unsafe {
        emit_open_calls(st, stubs::tsc());
        finish(st);
        // Hooked code that runs in later destructors of this thread goes untraced; the state
        // and shadow stack are given back unless a frame on the stack could still return into
        // the exit stub (then they stay: a few pages, rather than a crash).
        stubs::fnscope_tls_set(disabled());
        let exit = stubs::fnscope_exit as *const () as u64;
        let mut p = (*st).ss_top;
        let mut armed = false;
        while p > (*st).ss_base {
            p -= 32;
            armed |= read_volatile((*(p as *const ShadowEntry)).slot as *const u64) == exit;
        }
        if !armed {
            sys::munmap(st as *mut u8, 4096 + SHADOW_BYTES);
        }
    }
}

/// Publishes the thread's chunk as its last and drops any later record.
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn finish(st: *mut ThreadState) {
    // SAFETY: the caller guarantees `st` is this thread's live state.
    unsafe {
        write_volatile(addr_of_mut!((*st).exited), 1);
        write_volatile(addr_of_mut!((*st).buf_end), 0);
        publish_all(st, CHUNK_FLAG_LAST);
        region::add_lost((*st).lost);
        (*st).lost = 0;
    }
}

/// Publishes the chunk held back by the last swap and the one being filled (which gets
/// `flags`).
///
/// # Safety
/// `st` must be the calling thread's state, with `buf_end` already 0.
unsafe fn publish_all(st: *mut ThreadState, flags: u32) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        let prev = (*st).prev_chunk;
        if !prev.is_null() {
            (*st).prev_chunk = core::ptr::null_mut();
            region::publish(prev, (*st).prev_nrec, 0);
        }
        let c = (*st).chunk;
        if !c.is_null() {
            (*st).chunk = core::ptr::null_mut();
            region::publish(c, filled(st, c), flags);
        }
    }
}

/// Records written to chunk `c` so far.
///
/// # Safety
/// `c` must be the chunk `st` is filling.
unsafe fn filled(st: *mut ThreadState, c: *mut ChunkHeader) -> u32 {
    let start = c as u64 + fnscope_abi::CHUNK_HEADER_SIZE as u64;
    let cap = region::capacity() as u64;
    // SAFETY: per the caller's guarantee.
    let ptr = unsafe { read_volatile(addr_of_mut!((*st).buf_ptr)) };
    (ptr.saturating_sub(start) / RECORD_SIZE as u64).min(cap) as u32
}

/// After `fork`, in the child: the chunk being filled belongs to the parent's thread. Start a
/// stream of the child's own; the shadow stack (private memory) was copied and stays valid.
extern "C" fn after_fork_child() {
    if crate::count_mode() {
        crate::count::after_fork_child();
        return;
    }
    let Some(st) = current() else { return };
    // SAFETY: `st` is this thread's state; the child has only this thread.
    unsafe {
        (*st).chunk = core::ptr::null_mut();
        (*st).prev_chunk = core::ptr::null_mut();
        (*st).buf_end = 0;
        (*st).buf_ptr = 0;
        (*st).seq = 0;
        (*st).lost = 0;
        (*st).pid = sys::getpid();
        (*st).tid = sys::gettid();
    }
}

/// Hands the calling thread's chunk over now, so that its next records go to a chunk
/// carrying the current image session id.
pub fn restart_stream() {
    let Some(st) = current() else { return };
    // SAFETY: `st` is this thread's state; `in_slow` keeps a signal handler's records out of
    // the chunk while it is swapped.
    unsafe {
        if (*st).exited != 0 || (*st).in_slow != 0 {
            return;
        }
        let mask = sys::block_signals();
        write_volatile(addr_of_mut!((*st).in_slow), 1);
        write_volatile(addr_of_mut!((*st).buf_end), 0);
        publish_all(st, 0);
        write_volatile(addr_of_mut!((*st).in_slow), 0);
        sys::restore_signals(mask);
    }
}

/// Swaps a full chunk for a new one. Returns 0 when the stub may retry, 1 when it must drop
/// its record.
#[no_mangle]
extern "C" fn fnscope_buffer_full(st: *mut ThreadState) -> u32 {
    // SAFETY: the exit stub passes this thread's state.
    unsafe {
        if read_volatile(addr_of_mut!((*st).in_slow)) != 0 || (*st).exited != 0 {
            (*st).lost += 1;
            return 1;
        }
        // Signals stay blocked until `in_slow` is clear again: one that arrived meanwhile is
        // delivered as the mask is restored, and its records must find a usable chunk.
        let mask = sys::block_signals();
        write_volatile(addr_of_mut!((*st).in_slow), 1);
        let ok = refill(st);
        write_volatile(addr_of_mut!((*st).in_slow), 0);
        sys::restore_signals(mask);
        if ok {
            0
        } else {
            (*st).lost += 1;
            1
        }
    }
}

/// Publishes the current chunk (if any) and takes a new one.
///
/// # Safety
/// `st` must be the calling thread's state, with `in_slow` set and signals blocked, so that
/// a handler's records never meet a half-swapped state.
unsafe fn refill(st: *mut ThreadState) -> bool {
    // SAFETY: per the caller's guarantee. The chunk just filled is published one swap later:
    // a signal handler that filled it may have interrupted an exit stub between reserving its
    // slot and writing it, and that write must land before the recorder reads the chunk.
    unsafe {
        write_volatile(addr_of_mut!((*st).buf_end), 0);
        let c = (*st).chunk;
        if !c.is_null() {
            let n = filled(st, c);
            (*st).chunk = core::ptr::null_mut();
            let prev = (*st).prev_chunk;
            if !prev.is_null() {
                region::publish(prev, (*st).prev_nrec, 0);
            }
            (*st).prev_chunk = c;
            (*st).prev_nrec = n;
        }
        let lost = (*st).lost;
        match region::acquire((*st).pid, (*st).tid, (*st).seq, lost) {
            Some(t) => {
                (*st).seq += 1;
                (*st).lost = 0;
                region::add_lost(lost);
                (*st).chunk = t.chunk;
                write_volatile(addr_of_mut!((*st).buf_ptr), t.start);
                write_volatile(addr_of_mut!((*st).buf_end), t.end);
                true
            }
            None => false,
        }
    }
}

/// Writes one record from Rust (slow paths), taking a new chunk if needed.
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn emit(st: *mut ThreadState, rec: Record) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        if (*st).exited != 0 {
            (*st).lost += 1;
            return;
        }
        let mut ptr = read_volatile(addr_of_mut!((*st).buf_ptr));
        if ptr + RECORD_SIZE as u64 > read_volatile(addr_of_mut!((*st).buf_end)) {
            let mask = sys::block_signals();
            let prev = read_volatile(addr_of_mut!((*st).in_slow));
            write_volatile(addr_of_mut!((*st).in_slow), 1);
            let ok = refill(st);
            write_volatile(addr_of_mut!((*st).in_slow), prev);
            sys::restore_signals(mask);
            if !ok {
                (*st).lost += 1;
                return;
            }
            ptr = (*st).buf_ptr;
        }
        write_volatile(addr_of_mut!((*st).buf_ptr), ptr + RECORD_SIZE as u64);
        let r = ptr as *mut Record;
        write_volatile(addr_of_mut!((*r).t_entry), rec.t_entry);
        write_volatile(addr_of_mut!((*r).t_exit), rec.t_exit);
        write_volatile(addr_of_mut!((*r).id_depth), rec.id_depth);
    }
}

/// Pops the top shadow entry as a call that did not return normally.
///
/// # Safety
/// `st` must be the calling thread's state with a non-empty shadow stack.
unsafe fn pop_unwound(st: *mut ThreadState, now: u64) {
    // SAFETY: per the caller's guarantee the top entry exists.
    unsafe {
        let top = read_volatile(addr_of_mut!((*st).ss_top)) - 32;
        let e = top as *const ShadowEntry;
        let depth = ((top - (*st).ss_base) / 32) as u32;
        emit(st, Record::new((*e).t_entry, now, (*e).id as u32, depth, REC_FLAG_UNWOUND));
        write_volatile(addr_of_mut!((*st).ss_top), top);
    }
}

/// Pops, as calls that did not return normally, the top entries whose return-address slot
/// is below `limit`: their frames are gone.
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn pop_below(st: *mut ThreadState, limit: u64, now: u64) {
    // SAFETY: per the caller's guarantee; the top entry exists whenever top > base.
    unsafe {
        loop {
            let top = read_volatile(addr_of_mut!((*st).ss_top));
            if top <= (*st).ss_base || (*((top - 32) as *const ShadowEntry)).slot >= limit {
                break;
            }
            pop_unwound(st, now);
        }
    }
}

fn fatal(msg: &[u8]) -> ! {
    sys::write_stderr(msg);
    // SAFETY: abort never returns; nothing else is sound once a return address is lost.
    unsafe { libc::abort() }
}

/// The exit stub found that the top shadow entry is not this frame's. Either frames above
/// it were left without returning (`longjmp`, an exception caught without the unwinder
/// hooks), or the program switches stacks (coroutines: `swapcontext`, hand-written
/// switches), so entries of several stacks interleave. `rsp` is the exit stub's
/// return-address slot.
///
/// The newest entry for this slot is moved to the top, for the stub to pop. Entries above it
/// are dead when both they and `rsp` lie on the thread's own stack below `rsp` (frames a
/// `longjmp` skipped): they are recorded as unwound. Entries on other stacks belong to
/// suspended coroutines and are kept, in order.
#[no_mangle]
extern "C" fn fnscope_exit_mismatch(st: *mut ThreadState, rsp: u64) {
    let now = stubs::tsc();
    // SAFETY: the exit stub passes this thread's state; entries between `ss_base` and
    // `ss_top` are initialised. A signal handler running meanwhile pushes and pops at
    // `ss_top`, above every entry touched here, which only move down.
    unsafe {
        let base = (*st).ss_base;
        let top = read_volatile(addr_of_mut!((*st).ss_top));
        let mut k = top;
        loop {
            if k <= base {
                fatal(b"fnscope: a hooked function returned but its return address is not on the shadow stack; aborting (please report this program)\n");
            }
            k -= 32;
            if (*(k as *const ShadowEntry)).slot == rsp {
                break;
            }
        }
        let matched = core::ptr::read(k as *const ShadowEntry);
        let (lo, hi) = ((*st).stack_lo, (*st).stack_hi);
        let on_stack = |a: u64| a >= lo && a < hi;
        let mut w = k;
        let mut r = k + 32;
        while r < top {
            let e = core::ptr::read(r as *const ShadowEntry);
            if e.slot < rsp && on_stack(rsp) && on_stack(e.slot) {
                let depth = ((r - base) / 32) as u32;
                emit(st, Record::new(e.t_entry, now, e.id as u32, depth, REC_FLAG_UNWOUND));
            } else {
                core::ptr::write(w as *mut ShadowEntry, e);
                w += 32;
            }
            r += 32;
        }
        core::ptr::write(w as *mut ShadowEntry, matched);
        write_volatile(addr_of_mut!((*st).ss_top), w + 32);
    }
}

/// An exception starts unwinding: give every hooked frame its real return address back so
/// that the unwinder sees an ordinary stack. `rsp` is the stack pointer at the unwinder's
/// entry: frames below it are already gone.
///
/// Tracing goes on meanwhile: calls made by cleanups (destructors, `pthread_cleanup_push`
/// handlers) run in new frames below the landing pad and return before the unwinder walks
/// on, so their exit stubs are never in its way. Every unwind restores every entry, even
/// with others in flight: frames entered since the last one have exit stubs again.
pub fn unwind_begins(rsp: u64, exception: u64) {
    let Some(st) = current() else { return };
    let now = stubs::tsc();
    // SAFETY: `st` is this thread's state; every slot written holds fnscope_exit, i.e. is a live
    // return-address slot we replaced ourselves.
    unsafe {
        let n = (*st).unwinding as usize;
        let known = (&(*st).inflight)[..n.min(MAX_INFLIGHT)].contains(&exception);
        if !known {
            if n < MAX_INFLIGHT {
                (*st).inflight[n] = exception;
            }
            (*st).unwinding += 1;
        }
        pop_below(st, rsp, now);
        set_return_addresses(st, false);
    }
}

/// Puts the real return address (`armed` false) or the exit stub (`armed` true) into the
/// return-address slot of every frame on the shadow stack that holds the other one.
///
/// # Safety
/// `st` must be the calling thread's state, and its entries' slots must be live frames.
unsafe fn set_return_addresses(st: *mut ThreadState, armed: bool) {
    let exit = stubs::fnscope_exit as *const () as u64;
    // SAFETY: per the caller's guarantee; a slot is only written when it holds the value this
    // agent put there (or the real address it replaced), i.e. it is that frame's return slot.
    unsafe {
        let mut p = (*st).ss_top;
        while p > (*st).ss_base {
            p -= 32;
            let e = p as *const ShadowEntry;
            let slot = (*e).slot as *mut u64;
            let (from, to) = if armed { ((*e).ret, exit) } else { (exit, (*e).ret) };
            if read_volatile(slot) == from {
                write_volatile(slot, to);
            }
        }
    }
}

/// Exception `exception` was caught by code whose stack pointer is `caller_rsp`. When no
/// other exception is in flight, frames below that are gone (recorded as unwound), and the
/// frames above are live again and get their exit stub back.
pub fn unwind_caught(caller_rsp: u64, exception: u64) {
    let Some(st) = current() else { return };
    // SAFETY: `st` is this thread's state; live entries' slots hold their real return address
    // (restored by `unwind_begins`), and we only swap it back when it still does.
    unsafe {
        let n = (*st).unwinding as usize;
        if n == 0 {
            return;
        }
        let tracked = n.min(MAX_INFLIGHT);
        if let Some(k) = (&(*st).inflight)[..tracked].iter().position(|&e| e == exception) {
            (*st).inflight[k] = (*st).inflight[tracked - 1];
            (*st).unwinding -= 1;
        } else if n > MAX_INFLIGHT {
            (*st).unwinding -= 1;
        }
        if (*st).unwinding != 0 {
            return;
        }
        let now = stubs::tsc();
        pop_below(st, caller_rsp, now);
        set_return_addresses(st, true);
    }
}

/// Records every call still on the shadow stack as ending at `now`, without popping them.
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn emit_open_calls(st: *mut ThreadState, now: u64) {
    // SAFETY: per the caller's guarantee; entries between base and top are initialised.
    unsafe {
        let mut p = (*st).ss_top;
        while p > (*st).ss_base {
            p -= 32;
            let e = p as *const ShadowEntry;
            let depth = ((p - (*st).ss_base) / 32) as u32;
            emit(st, Record::new((*e).t_entry, now, (*e).id as u32, depth, REC_FLAG_UNWOUND));
        }
    }
}

/// Process exit (the agent's destructor, inside `exit`): calls still open on this thread will
/// never return; record them as ending now and hand the chunk over.
pub fn process_exit() {
    let Some(st) = current() else { return };
    // SAFETY: `st` is this thread's state. Entries are not popped: `exit` never returns into
    // those frames, and leaving them keeps the stack consistent for hooked code that still
    // runs after us (later destructors), whose records are dropped.
    unsafe {
        emit_open_calls(st, stubs::tsc());
        finish(st);
    }
}
