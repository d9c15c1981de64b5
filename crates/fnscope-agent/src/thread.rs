//! Per-thread state and the slow paths the stubs call.

use crate::{region, stubs, sys};
use core::mem::offset_of;
use core::sync::atomic::{compiler_fence, AtomicU64, Ordering};
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
    /// The last entries [`fnscope_entry_dead`] removed, newest at `graveyard_next - 1`: if one
    /// of them was alive after all (code that calls from above its own return slot, as libffi
    /// does) its return still finds its way (see [`fnscope_exit_mismatch`]).
    pub graveyard: [ShadowEntry; GRAVEYARD],
    /// Where the next removed entry goes in `graveyard` (modulo its size).
    pub graveyard_next: u32,
    /// Exception objects being unwound through restored frames (the frames are re-armed
    /// when the last one is caught): a rethrow enters the unwinder twice with the same object, and an
    /// exception thrown and caught inside a destructor during unwinding must not re-arm the
    /// frames the outer one is still unwinding.
    pub inflight: [u64; MAX_INFLIGHT],
    /// The shadow-stack slot of the shared region this state lives in (0: private memory).
    pub slot: u64,
    /// While the thread forks: the slot whose state this private copy stands in for.
    pub fork_slot: u64,
    /// The thread's args stack (see [`crate::args`]), or 0.
    pub args_base: u64,
    /// Shadow entries below this one have a frame in the args stack (0: none has).
    pub args_limit: u64,
    /// The frame of shadow entry `e` (below `args_limit`) is at `(e << 4) + args_delta`: the
    /// stubs find it in two instructions.
    pub args_delta: u64,
    /// Where the pending backtrace's walk starts: the slot of `_Unwind_Backtrace`'s return
    /// address (0: none pending). See [`backtrace_begins`].
    pub walk_sp: u64,
    /// The return address `walk_sp` held when the walk began: while it still holds it, the
    /// walk may be running.
    pub walk_ret: u64,
    /// How many of `rearm` are in use.
    pub rearm_n: u32,
    /// The entries a backtrace disarmed, as they were then: only these get their exit stub
    /// back after the walk, and only while their entry is still there unchanged.
    pub rearm: [Disarmed; REARM],
}

/// Entries a backtrace remembers to re-arm; deeper ones stay disarmed (their ends are late).
pub const REARM: usize = 32;

/// A shadow entry disarmed by a backtrace: where it was and what it held.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Disarmed {
    /// Address of the entry on the shadow stack.
    pub at: u64,
    /// The entry as it was.
    pub entry: ShadowEntry,
}

/// Entries removed as gone that a thread remembers.
pub const GRAVEYARD: usize = 4;

/// Exceptions tracked at once per thread; beyond that, frames are re-armed only when all
/// are caught.
pub const MAX_INFLIGHT: usize = 8;

/// One shadow-stack entry, 32 bytes, laid out as the stubs write it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ShadowEntry {
    /// The caller's real return address.
    pub ret: u64,
    /// Time-stamp counter at entry.
    pub t_entry: u64,
    /// Function id.
    pub id: u64,
    /// Address of the stack slot holding the return address (rsp at entry); 0 while the
    /// entry is in progress (see [`ShadowEntry::in_progress`]).
    pub slot: u64,
}

impl ShadowEntry {
    /// Whether a stub is still writing this entry (its slot word is written last) or giving
    /// it back (the exit stub clears it before the pop): a signal handler that interrupted
    /// the stub sees such an entry below its own calls. It is neither a gone frame nor an
    /// open call: its other words may still be an older call's.
    pub fn in_progress(&self) -> bool {
        self.slot == 0
    }
}

/// Gives back the shadow entries from `to` up: their slot words are cleared before `ss_top`
/// comes down, so that a free entry is never taken for a live one (the rule the stubs keep:
/// see `stubs.rs`, in-progress entries).
///
/// # Safety
/// `st` must be the calling thread's state and `to` one of its entries at or below `ss_top`.
pub unsafe fn lower_top(st: *mut ThreadState, to: u64) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        clear_slots(to, read_volatile(addr_of_mut!((*st).ss_top)));
        write_volatile(addr_of_mut!((*st).ss_top), to);
    }
}

/// Clears the slot words of the shadow entries in `[from, to)`.
///
/// # Safety
/// The range must lie in a shadow stack the calling thread owns.
unsafe fn clear_slots(from: u64, to: u64) {
    let mut p = from;
    while p < to {
        // SAFETY: per the caller's guarantee.
        unsafe { write_volatile(addr_of_mut!((*(p as *mut ShadowEntry)).slot), 0) };
        p += 32;
    }
}

const _: () = {
    assert!(offset_of!(ThreadState, ss_top) == 0);
    assert!(offset_of!(ThreadState, ss_limit) == 8);
    assert!(offset_of!(ThreadState, buf_ptr) == 16);
    assert!(offset_of!(ThreadState, buf_end) == 24);
    assert!(offset_of!(ThreadState, ss_base) == 32);
    assert!(core::mem::size_of::<ShadowEntry>() == 32);
    assert!(offset_of!(ThreadState, ss_top) == fnscope_abi::STATE_SS_TOP);
    assert!(offset_of!(ThreadState, ss_base) == fnscope_abi::STATE_SS_BASE);
    assert!(offset_of!(ThreadState, seq) == fnscope_abi::STATE_SEQ);
    assert!(fnscope_abi::SLOT_STATE_OFFSET + core::mem::size_of::<ThreadState>() <= 4096 - 8);
    assert!(fnscope_abi::STACK_SLOT_SIZE == 4096 + SHADOW_BYTES);
};

/// Shadow-stack entries per thread: calls nested deeper than this are not recorded.
pub const SHADOW_ENTRIES: usize = fnscope_abi::SHADOW_ENTRIES;
const SHADOW_BYTES: usize = SHADOW_ENTRIES * core::mem::size_of::<ShadowEntry>();

/// Bytes of shadow stack a thread may use: `--depth` levels, or all of it.
static DEPTH_BYTES: AtomicU64 = AtomicU64::new(SHADOW_BYTES as u64);

/// Sets the record-time limits: `depth` outermost levels per thread (0: no limit), and calls
/// shorter than `min_ticks` left out. Called once at start-up, before any thread is traced.
pub fn set_limits(depth: u32, min_ticks: u64) {
    if depth > 0 {
        DEPTH_BYTES.store((depth as u64 * 32).min(SHADOW_BYTES as u64), Ordering::Relaxed);
    }
    stubs::MIN_TICKS.store(min_ticks, Ordering::Relaxed);
}

/// The `ss_limit` offset of a new thread: the stub's "shadow stack full" test is what keeps
/// calls beyond `--depth` out, at no cost to the others.
fn depth_bytes() -> u64 {
    DEPTH_BYTES.load(Ordering::Relaxed)
}

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
    graveyard: [ShadowEntry { ret: 0, t_entry: 0, id: 0, slot: 0 }; GRAVEYARD],
    graveyard_next: 0,
    inflight: [0; MAX_INFLIGHT],
    slot: 0,
    fork_slot: 0,
    args_base: 0,
    args_limit: 0,
    args_delta: 0,
    walk_sp: 0,
    walk_ret: 0,
    rearm_n: 0,
    rearm: [Disarmed { at: 0, entry: ShadowEntry { ret: 0, t_entry: 0, id: 0, slot: 0 } }; REARM],
}));

fn disabled() -> *mut ThreadState {
    DISABLED.0.get()
}

/// This thread's live state, if it has one (never in count mode, whose TLS word points at
/// the thread's counters).
pub fn current() -> Option<*mut ThreadState> {
    if crate::count_mode() {
        return None;
    }
    // SAFETY: reads this thread's TLS word.
    let st = unsafe { stubs::fnscope_tls_get() };
    if st.is_null() || st == disabled() {
        None
    } else {
        Some(st)
    }
}

/// While alive, the hooked functions this thread calls run untraced: they are the agent's
/// own calls (its `dlsym`, `pthread_setspecific` or `getcwd`, when libc is traced with
/// `--lib libc`), not the program's, which would otherwise be recorded (or counted) at the
/// depth of whatever the program was doing. The agent code that runs on a program's thread
/// after start-up takes one: the fork, exit, thread-exit, `dlopen`, `exec` and Mono hooks.
/// (The stubs' slow paths call no C library function at all: see [`crate::mem`].)
///
/// Signals are blocked meanwhile, so that a handler (the program's code, to be traced) never
/// runs with the thread quiet, nor jumps out of the agent code leaving it so. The program's
/// `errno` is put back at the end: the agent's calls must not change it.
#[must_use]
pub struct Quiet {
    how: QuietHow,
    mask: Option<u64>,
    errno: i32,
}

enum QuietHow {
    /// Nothing to do: no thread state, or an outer `Quiet` is in force.
    Nothing,
    /// A traced thread: its `ss_limit` is 0 meanwhile, so that entry stubs take their
    /// untraced path.
    Limit(*mut ThreadState, u64),
    /// No traced state (a thread not set up yet, or count mode): the TLS word points at a
    /// state that records or counts nothing.
    Swap { prev: *mut ThreadState, sink: *mut ThreadState },
}

/// [`Quiet`] for the calling thread.
pub fn quiet() -> Quiet {
    // SAFETY: reads this thread's TLS word.
    let w = unsafe { stubs::fnscope_tls_get() };
    let errno = stubs::errno();
    let nothing = Quiet { how: QuietHow::Nothing, mask: None, errno };
    let sink = if crate::count_mode() {
        crate::count::sink()
    } else if w.is_null() {
        disabled()
    } else {
        // SAFETY: a non-null TLS word in timing mode is this thread's state, or DISABLED
        // (limit 0). `ss_limit` goes to 0 once signals are blocked.
        unsafe {
            let limit = read_volatile(addr_of_mut!((*w).ss_limit));
            if limit == 0 {
                return nothing;
            }
            let mask = sys::block_signals();
            write_volatile(addr_of_mut!((*w).ss_limit), 0);
            return Quiet { how: QuietHow::Limit(w, limit), mask: Some(mask), errno };
        }
    };
    if sink.is_null() || w == sink {
        return nothing;
    }
    let mask = sys::block_signals();
    // SAFETY: sets this thread's TLS word; `Drop` puts it back.
    unsafe { stubs::fnscope_tls_set(sink) };
    Quiet { how: QuietHow::Swap { prev: w, sink }, mask: Some(mask), errno }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        // SAFETY: reads this thread's TLS word.
        let w = unsafe { stubs::fnscope_tls_get() };
        match self.how {
            QuietHow::Nothing => {}
            // The agent code may have moved the state (fork) or ended it (thread exit): the
            // state in the TLS word now had its limit set by that code.
            QuietHow::Limit(st, limit) => {
                if w == st {
                    // SAFETY: `st` is still this thread's state.
                    unsafe { write_volatile(addr_of_mut!((*st).ss_limit), limit) };
                }
            }
            QuietHow::Swap { prev, sink } => {
                if w == sink {
                    // SAFETY: sets this thread's TLS word back.
                    unsafe { stubs::fnscope_tls_set(prev) };
                }
            }
        }
        if let Some(mask) = self.mask {
            sys::restore_signals(mask);
        }
        stubs::set_errno(self.errno);
    }
}

static mut KEY: libc::pthread_key_t = 0;

/// Start-up: thread-exit and fork hooks. Must run before any function is hooked.
pub fn install_process_hooks() {
    // SAFETY: called once, single-threaded, at start-up; KEY is written only here.
    unsafe {
        libc::pthread_key_create(addr_of_mut!(KEY), Some(thread_exit));
        libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child));
    }
}

/// Asks for `thread_exit` to run when the calling thread ends (count mode, which keeps no
/// state pointer of its own there).
pub fn register_exit() {
    // SAFETY: KEY was created at start-up; any non-null value makes the destructor run.
    unsafe { libc::pthread_setspecific(KEY, core::ptr::dangling::<libc::c_void>()) };
}

/// First hooked call of a thread: sets up its state. Called by the entry stub, which retries
/// the call traced when this returns 1 and runs it untraced when it returns 0.
///
/// Before the agent is active (hooked functions that run while it sets up: a program's own
/// `getenv` or `malloc`, libc's when libc is hooked) the thread is left unset, so that its
/// first call after start-up sets it up: nothing start-up passes through disables a thread
/// for good.
#[no_mangle]
extern "C" fn fnscope_thread_init() -> u32 {
    if !crate::active() {
        return 0;
    }
    // SAFETY: marks this thread untraced first, so that hooked functions called below (libc's,
    // when libc is hooked) take the untraced path instead of coming back here.
    unsafe { stubs::fnscope_tls_set(disabled()) };
    let (pid, tid) = (sys::getpid(), sys::gettid());
    let Some(st) = new_state(region::claim_slot(pid, tid)) else { return 0 };
    // SAFETY: `st` is a zeroed state followed by its shadow stack (see `new_state`).
    unsafe {
        let base = (*st).ss_base_of();
        (*st).ss_base = base;
        (*st).ss_top = base;
        // The entry stub compares each new return slot with the slot of the entry below it:
        // below the first entry is this sentinel, above every slot.
        *((base - 8) as *mut u64) = u64::MAX;
        (*st).ss_limit = base + depth_bytes();
        (*st).pid = pid;
        (*st).tid = tid;
        let (lo, hi) = own_stack();
        (*st).stack_lo = lo;
        (*st).stack_hi = hi;
        if crate::args::enabled() {
            (*st).args_base = sys::mmap_anon(crate::args::ARGS_STACK_BYTES) as u64;
        }
        set_args_frames(st);
        libc::pthread_setspecific(KEY, st as *const libc::c_void);
        stubs::fnscope_tls_set(st);
    }
    1
}

/// A zeroed state in `slot` (a shadow-stack slot of the region), or in private memory when
/// `slot` is null, with `slot` set and its shadow stack right after its page.
fn new_state(slot: *mut u8) -> Option<*mut ThreadState> {
    let st = if slot.is_null() {
        let mem = sys::mmap_anon(4096 + SHADOW_BYTES);
        if mem.is_null() {
            return None;
        }
        mem as *mut ThreadState
    } else {
        // SAFETY: a slot is STACK_SLOT_SIZE bytes; its state lies in its first page and its
        // shadow stack of SHADOW_BYTES in the following ones.
        unsafe {
            let st = slot.add(fnscope_abi::SLOT_STATE_OFFSET) as *mut ThreadState;
            // An earlier owner's entries (a process killed with calls open) would be free
            // entries with a slot word: clear as many as it may have used.
            let used = (*st).ss_top.wrapping_sub((*st).ss_base).min(SHADOW_BYTES as u64);
            let ss = slot as u64 + 4096;
            clear_slots(ss, ss + used);
            core::ptr::write_bytes(st as *mut u8, 0, core::mem::size_of::<ThreadState>());
            st
        }
    };
    // SAFETY: `st` is zeroed and ours.
    unsafe { (*st).slot = slot as u64 };
    Some(st)
}

impl ThreadState {
    /// Address of the first shadow-stack entry: the page after the state's.
    fn ss_base_of(&self) -> u64 {
        match self.slot {
            0 => self as *const ThreadState as u64 + 4096,
            slot => slot + 4096,
        }
    }
}

/// Frees a state from [`new_state`].
///
/// # Safety
/// `st` must be unused from now on.
unsafe fn free_state(st: *mut ThreadState) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        if (*st).args_base != 0 {
            sys::munmap((*st).args_base as *mut u8, crate::args::ARGS_STACK_BYTES);
        }
        match (*st).slot {
            0 => sys::munmap(st as *mut u8, 4096 + SHADOW_BYTES),
            slot => region::release_slot(slot as *mut u8),
        }
    }
}

/// Notes that the calls open on this thread were recorded (or, `false`, that they were not
/// after all), so that the recorder does not close them again.
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn mark_closed(st: *mut ThreadState, closed: bool) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        if (*st).slot != 0 {
            region::set_closed((*st).slot as *mut u8, closed);
        }
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
extern "C" fn thread_exit(_registered: *mut libc::c_void) {
    if crate::count_mode() {
        crate::count::thread_exit();
        return;
    }
    // The state is the one in this thread's TLS word: the key's value is where the state was
    // when the thread started, and a forked child has moved it since.
    let Some(st) = current() else { return };
    let here = 0u8;
    let sp = core::ptr::addr_of!(here) as u64;
    let _quiet = quiet();
    // SAFETY: `st` is this thread's live state. Entries still
    // on its shadow stack are calls that `pthread_exit` (a forced unwind) or a cancellation
    // ended, or hooked frames that return only after this destructor (libc's `start_thread`
    // when libc is hooked).
    unsafe {
        emit_open_calls(st, stubs::tsc());
        finish(st);
        // They were recorded just above: they return past the exit stub from now on, and the
        // state and shadow stack can go; hooked code in later destructors runs untraced.
        disarm_all(st, sp);
        stubs::fnscope_tls_set(disabled());
        free_state(st);
    }
}

/// Forgets every open call of the thread without recording anything: frames below `sp`
/// (the caller's stack pointer) are gone, the others get their real return address back.
///
/// # Safety
/// `st` must be the calling thread's state, and `sp` below every live hooked frame.
unsafe fn disarm_all(st: *mut ThreadState, sp: u64) {
    // SAFETY: per the caller's guarantee; entries between base and top are initialised.
    unsafe {
        let top = (*st).ss_top;
        while (*st).ss_top > (*st).ss_base && (*(((*st).ss_top - 32) as *const ShadowEntry)).slot < sp {
            (*st).ss_top -= 32;
        }
        set_return_addresses(st, false);
        forget_walk(st);
        clear_slots((*st).ss_base, top);
        write_volatile(addr_of_mut!((*st).ss_top), (*st).ss_base);
    }
}

/// Whether `slot`, off the thread's own stack, lies on a stack that is gone. `posix_spawn`'s
/// child runs on a stack of its own with its parent's thread pointer, so its hooked calls
/// push entries onto the parent's shadow stack, and the stack is unmapped once the child has
/// exec'd; entries of a coroutine's stack stay, as long as it is there.
fn gone_stack(slot: u64) -> bool {
    !sys::is_mapped(slot)
}

/// Code range `[start, end)` of each hooked function, by id: a fixed-size table (only the
/// pages of ids in use are ever touched) so that slow paths of any thread read it without a
/// lock while `dlopen` adds functions.
static RANGES: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
const MAX_RANGES: usize = 1 << 22;

/// Notes the code range of function `id` (at hooking time, before its jump is written).
pub fn set_range(id: u32, start: u64, end: u64) {
    use core::sync::atomic::Ordering;
    let mut t = RANGES.load(Ordering::Acquire);
    if t == 0 {
        t = sys::mmap_anon(MAX_RANGES * 16) as u64;
        RANGES.store(t, Ordering::Release);
    }
    if t != 0 && (id as usize) < MAX_RANGES {
        // SAFETY: the entry lies inside the table; only the hooking thread writes, before any
        // record can carry this id.
        unsafe { *((t as *mut [u64; 2]).add(id as usize)) = [start, end] };
    }
}

/// Whether `addr` lies in the code of function `id`.
fn in_function(id: u64, addr: u64) -> bool {
    let t = RANGES.load(core::sync::atomic::Ordering::Acquire);
    if t == 0 || id as usize >= MAX_RANGES {
        return false;
    }
    // SAFETY: inside the table; entries of ids handed out were written before use.
    let [start, end] = unsafe { *((t as *const [u64; 2]).add(id as usize)) };
    addr >= start && addr < end
}

/// The entry stub found that the entry below its new one (`slot`, reserved) is not a caller:
/// its return slot lies below this call's (`rsp`) and the call does not return into its
/// code, or is this call's slot and holds something else than the exit stub (not a tail
/// call), so its frame is gone (a `longjmp` or an exception left it, and the thread now calls
/// from as high up the stack or higher). Such entries, on
/// the thread's own stack, are recorded as unwound and removed; the stub then enters the call
/// again (returns 1); so are entries on the thread's signal stack whose slot no longer holds
/// the exit stub. Entries on another stack (a coroutine's) stay, and the call is entered
/// above them (returns 0); so does a call that runs on another stack (a signal handler's).
/// Frames a backtrace disarmed get their exit stub back here once its walk is over.
#[no_mangle]
extern "C" fn fnscope_entry_dead(st: *mut ThreadState, rsp: u64, slot: u64) -> u32 {
    let now = stubs::tsc();
    // SAFETY: the entry stub passes this thread's state and the entry it reserved; entries
    // below it are initialised. A signal handler that ran since pushed and popped above it.
    unsafe {
        let own = Range((*st).stack_lo, (*st).stack_hi);
        if !own.holds(rsp) {
            return 0;
        }
        let base = (*st).ss_base;
        let ret = read_volatile(rsp as *const u64);
        let tail_call = stubs::is_exit(ret);
        // Asked only when needed: a system call.
        let mut alt_asked = None;
        let mut alt = || *alt_asked.get_or_insert_with(|| sys::alt_stack().map_or(Range(0, 0), |(lo, hi)| Range(lo, hi)));
        let mut k = slot;
        // The top of a run of signal-stack entries not known to be gone yet.
        let mut undecided: Option<u64> = None;
        while k > base {
            let e = (k - 32) as *const ShadowEntry;
            // The call this handler interrupted in its entry or exit stub: not gone.
            if (*e).in_progress() {
                break;
            }
            // A frame that calls from above its own return slot (libffi's ffi_call_unix64 builds
            // a frame in memory its caller reserved) is alive: the call returns into its code.
            // Running on the thread's own stack, a frame on its signal stack whose slot no
            // longer holds the exit stub is gone: the handler returned (after a backtrace
            // disarmed it) or jumped out. One whose slot does is gone if the frame its handler
            // interrupted is (a `siglongjmp` out of the handler, then calls from as high up):
            // the handler could only return into it. Otherwise it may be a handler's context
            // that a scheduler switched away from, to resume later: it stays.
            let dead = if own.holds((*e).slot) {
                Some(((*e).slot < rsp && !in_function((*e).id & 0xffff_ffff, ret)) || ((*e).slot == rsp && !tail_call))
            } else if gone_stack((*e).slot) {
                Some(true)
            } else if alt().holds((*e).slot) {
                (!holds_exit_stub((*e).slot)).then_some(true)
            } else {
                Some(false)
            };
            match dead {
                Some(false) => break,
                Some(true) => undecided = None,
                None => {
                    undecided.get_or_insert(k);
                }
            }
            k -= 32;
        }
        if let Some(top) = undecided {
            k = top;
        }
        if k == slot {
            return 0;
        }
        // Deepest first: records are in the order calls end.
        let mut p = slot;
        while p > k {
            p -= 32;
            let e = core::ptr::read(p as *const ShadowEntry);
            let g = (*st).graveyard_next as usize % GRAVEYARD;
            (*st).graveyard[g] = e;
            (*st).graveyard_next = (*st).graveyard_next.wrapping_add(1);
            emit_closed(st, p, now);
        }
        lower_top(st, k);
        // Their places will hold new entries, maybe alike (the same call again): the disarmed
        // ones among them must not be mistaken for those.
        keep_disarmed_below(st, k);
        // A backtrace's walk is over once a call enters from above its start on the thread's
        // own stack, or runs there after a walk on the signal stack. Not while an exception
        // is in flight: its unwinder needs the real return addresses, and its catch re-arms.
        let walk = (*st).walk_sp;
        let walk_over = walk != 0 && if own.holds(walk) { rsp > walk } else { alt().holds(walk) };
        if walk_over && (*st).unwinding == 0 {
            rearm_after_walk(st, ret);
        }
        1
    }
}

/// A stack's address range, `[lo, hi)`.
#[derive(Clone, Copy)]
struct Range(u64, u64);

impl Range {
    fn holds(self, a: u64) -> bool {
        a >= self.0 && a < self.1
    }
}

/// Whether the stack slot `slot` (mapped) holds one of the exit stubs.
///
/// # Safety
/// `slot` must be readable.
unsafe fn holds_exit_stub(slot: u64) -> bool {
    // SAFETY: per the caller's guarantee.
    stubs::is_exit(unsafe { read_volatile(slot as *const u64) })
}

/// Forgets the pending backtrace and the entries it disarmed: those stay disarmed.
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn forget_walk(st: *mut ThreadState) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        (*st).walk_sp = 0;
        (*st).rearm_n = 0;
    }
}

/// Forgets the disarmed entries at or above `top` (removed from the shadow stack).
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn keep_disarmed_below(st: *mut ThreadState, top: u64) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        let n = ((*st).rearm_n as usize).min(REARM);
        let list = &mut (*st).rearm;
        let mut kept = 0;
        for i in 0..n {
            if list[i].at < top {
                list[kept] = list[i];
                kept += 1;
            }
        }
        (*st).rearm_n = kept as u32;
    }
}

/// The backtrace's walk is over: the entries it disarmed that are still on the shadow stack,
/// unchanged, whose slot still holds their real return address, and whose function is
/// making a call now get the exit stub back; `ret` is the return address of the call being
/// entered. The last condition is the proof that the frame runs its own code: the entry
/// above it (or the call being entered) returns into it. A frame a signal interrupted in its
/// stub (an exit stub that already put the real return address back, an entry stub whose
/// entry is not written yet and still holds an older call's) has no such entry above it, and
/// writing the exit stub there would send a return astray. Frames that fail a condition stay
/// disarmed: their ends are late.
///
/// # Safety
/// `st` must be the calling thread's state, with the entries of gone frames removed.
unsafe fn rearm_after_walk(st: *mut ThreadState, ret: u64) {
    // SAFETY: per the caller's guarantee; each entry is read only below `ss_top`, and a slot
    // is written only when it holds the return address the unchanged entry saved, i.e. it is
    // that live frame's return slot (as in `set_return_addresses`).
    unsafe {
        let n = ((*st).rearm_n as usize).min(REARM);
        let (lo, hi) = ((*st).stack_lo, (*st).stack_hi);
        let top = read_volatile(addr_of_mut!((*st).ss_top));
        for d in &(&(*st).rearm)[..n] {
            if d.at < (*st).ss_base || d.at >= top {
                continue;
            }
            let e = core::ptr::read(d.at as *const ShadowEntry);
            let same = e.ret == d.entry.ret && e.slot == d.entry.slot && e.t_entry == d.entry.t_entry && e.id == d.entry.id;
            // Frames on other stacks (a signal handler's, a coroutine's) may be gone with
            // their stack memory still mapped: they stay disarmed.
            if !same || e.slot < lo || e.slot >= hi {
                continue;
            }
            let callee_ret = if d.at + 32 < top { (*((d.at + 32) as *const ShadowEntry)).ret } else { ret };
            if !in_function(e.id & 0xffff_ffff, callee_ret) {
                continue;
            }
            let slot = e.slot as *mut u64;
            if read_volatile(slot) == e.ret {
                let exit = if e.id & crate::args::ARGS_ENTRY != 0 { stubs::fnscope_exit_args } else { stubs::fnscope_exit };
                write_volatile(slot, exit as *const () as u64);
            }
        }
        forget_walk(st);
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

/// Sets the fields by which the stubs find the args frame of a shadow entry, from the
/// state's shadow stack and args stack.
///
/// # Safety
/// `st` must be a state the calling thread may write.
unsafe fn set_args_frames(st: *mut ThreadState) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        let (base, ss) = ((*st).args_base, (*st).ss_base);
        if base == 0 {
            (*st).args_limit = 0;
            (*st).args_delta = 0;
        } else {
            (*st).args_limit = ss + (crate::args::ARGS_DEPTH * core::mem::size_of::<ShadowEntry>()) as u64;
            // Wrapping: user-space addresses times 16 stay far below 2^64, and the sum wraps
            // back into the args stack.
            (*st).args_delta = base.wrapping_sub(ss << 4);
        }
    }
}

/// Moves the state `from` (and its shadow stack) to `to`, rebasing its pointers.
///
/// # Safety
/// Both must be states followed by a shadow stack, `to` unused; signals blocked.
unsafe fn move_state(from: *mut ThreadState, to: *mut ThreadState) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        let (slot, fork_slot) = ((*to).slot, (*to).fork_slot);
        // Back in its slot after a fork, the state finds the entries it left there, maybe
        // more than it brings back: those beyond are free now.
        let stale = (*to).ss_top.wrapping_sub((*to).ss_base).min(SHADOW_BYTES as u64);
        core::ptr::copy_nonoverlapping(from, to, 1);
        (*to).slot = slot;
        (*to).fork_slot = fork_slot;
        // The args stack moves with the state: `from` is freed without it.
        (*from).args_base = 0;
        let (old, new) = ((*from).ss_base, (*to).ss_base_of());
        let used = ((*from).ss_top - old) as usize;
        core::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, used);
        (*to).ss_base = new;
        (*to).ss_top = new + used as u64;
        clear_slots(new + used as u64, new + stale);
        (*to).ss_limit = new + depth_bytes();
        set_args_frames(to);
        set_args_frames(from);
        *((new - 8) as *mut u64) = u64::MAX;
    }
}

/// Before `fork`: a thread whose state is in the shared region moves it to private memory
/// for the duration, so that the child gets a copy (the region's slots are not inherited).
pub(crate) extern "C" fn before_fork() {
    let Some(st) = current() else { return };
    let _quiet = quiet();
    // SAFETY: `st` is this thread's state; signals are blocked while it moves.
    unsafe {
        if (*st).slot == 0 {
            return;
        }
        let Some(copy) = new_state(core::ptr::null_mut()) else { return };
        let mask = sys::block_signals();
        move_state(st, copy);
        (*copy).fork_slot = (*st).slot;
        stubs::fnscope_tls_set(copy);
        sys::restore_signals(mask);
    }
}

/// After `fork`, in the parent: the state goes back to its slot.
pub(crate) extern "C" fn after_fork_parent() {
    let Some(copy) = current() else { return };
    let _quiet = quiet();
    // SAFETY: `copy` is this thread's private copy from `before_fork`; signals are blocked while
    // it moves back.
    unsafe {
        let slot = (*copy).fork_slot;
        if slot == 0 {
            return;
        }
        let st = (slot as *mut u8).add(fnscope_abi::SLOT_STATE_OFFSET) as *mut ThreadState;
        let mask = sys::block_signals();
        move_state(copy, st);
        stubs::fnscope_tls_set(st);
        sys::restore_signals(mask);
        free_state(copy);
    }
}

/// After `fork`, in the child: the chunk being filled belongs to the parent's thread. Start a
/// stream of the child's own, with no open call, in a slot of its own when one is free.
pub(crate) extern "C" fn after_fork_child() {
    if crate::count_mode() {
        crate::count::after_fork_child();
        return;
    }
    let Some(st) = current() else { return };
    let here = 0u8;
    let sp = core::ptr::addr_of!(here) as u64;
    let _quiet = quiet();
    // SAFETY: `st` is this thread's state; the child has only this thread. A call belongs to
    // the process that entered it: calls open at the fork are the parent's (it records them,
    // and count mode counted them there), so in the child they return past the exit stub and
    // its own calls start at depth 0.
    unsafe {
        disarm_all(st, sp);
        (*st).chunk = core::ptr::null_mut();
        (*st).prev_chunk = core::ptr::null_mut();
        (*st).buf_end = 0;
        (*st).buf_ptr = 0;
        (*st).seq = 0;
        (*st).lost = 0;
        (*st).pid = sys::getpid();
        (*st).tid = sys::gettid();
        if (*st).fork_slot != 0 {
            (*st).fork_slot = 0;
            let slot = if region::remap_stacks() { region::claim_slot((*st).pid, (*st).tid) } else { core::ptr::null_mut() };
            if let Some(own) = new_state(slot).filter(|_| !slot.is_null()) {
                move_state(st, own);
                stubs::fnscope_tls_set(own);
                free_state(st);
            }
        }
    }
}

/// Hands the calling thread's chunk over now, so that its next records go to a chunk
/// carrying the current image session id.
pub fn restart_stream() {
    let Some(st) = current() else { return };
    let _quiet = quiet();
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

/// What a stub does with record slots that its fast check refused (see [`settle_slots`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Settle {
    /// Reserve again: the slots were given up (padded where they lie in a chunk).
    Retry = 0,
    /// Drop the record (counted as lost): the thread is finishing, or no chunk is free.
    Drop = 1,
    /// Write the record where it was reserved after all.
    Write = 2,
}

/// Settles slots `[start, start + bytes)` that a stub reserved but its check refused: they
/// run past the chunk's end, or the chunk's sequence number changed between the reservation
/// and the check, because a signal handler arrived in between and swapped chunks. Then the
/// slots may lie in the chunk just published, or past its end, or in the new chunk; only
/// where they lie tells. Slots wholly inside the chunk being filled, or inside the one before
/// it (published only at the next swap), are the stub's to write. Others are padded where
/// they lie inside one of those chunks, so that the chunk holds no empty slot, and the stub
/// reserves again: in the chunk a handler took meanwhile, if it has room, or in a new one.
///
/// # Safety
/// `st` must be the calling thread's state and the slots ones it reserved.
pub unsafe fn settle_slots(st: *mut ThreadState, start: u64, bytes: u64) -> Settle {
    // SAFETY: per the caller's guarantee.
    unsafe {
        if read_volatile(addr_of_mut!((*st).in_slow)) != 0 || (*st).exited != 0 {
            pad_reserved(st, start, start + bytes);
            (*st).lost += 1;
            return Settle::Drop;
        }
        // Signals stay blocked until `in_slow` is clear again: one that arrived meanwhile is
        // delivered as the mask is restored, and its records must find a usable chunk.
        let mask = sys::block_signals();
        write_volatile(addr_of_mut!((*st).in_slow), 1);
        let holds = |c: *mut ChunkHeader| on_grid(c, start).is_some_and(|(_, hi)| start + bytes <= hi);
        let verdict = if holds((*st).chunk) || holds((*st).prev_chunk) {
            Settle::Write
        } else {
            pad_reserved(st, start, start + bytes);
            let room = read_volatile(addr_of_mut!((*st).buf_ptr)) + bytes <= read_volatile(addr_of_mut!((*st).buf_end));
            if room || refill(st) {
                Settle::Retry
            } else {
                (*st).lost += 1;
                Settle::Drop
            }
        };
        write_volatile(addr_of_mut!((*st).in_slow), 0);
        sys::restore_signals(mask);
        verdict
    }
}

/// The stubs' call of [`settle_slots`]: returns a [`Settle`].
#[no_mangle]
extern "C" fn fnscope_settle(st: *mut ThreadState, start: u64, bytes: u64) -> u32 {
    // SAFETY: the exit stubs pass this thread's state and the slots they reserved.
    unsafe { settle_slots(st, start, bytes) as u32 }
}

/// The record area `[lo, hi)` of chunk `c` if slot address `at` is one of its slots: inside
/// it, and on its grid of records. Slots reserved in a chunk a handler swapped out may run
/// past its end into the next chunk's area, where they lie off that chunk's grid: a chunk's
/// size is a power of two, never a multiple of the 24-byte record, so neighbouring grids
/// never line up.
fn on_grid(c: *mut ChunkHeader, at: u64) -> Option<(u64, u64)> {
    let lo = c as u64 + fnscope_abi::CHUNK_HEADER_SIZE as u64;
    let hi = lo + (region::capacity() * RECORD_SIZE) as u64;
    (!c.is_null() && at >= lo && at < hi && (at - lo).is_multiple_of(RECORD_SIZE as u64)).then_some((lo, hi))
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
                // Less what was counted in: a handler of a synchronous signal (the trap flag)
                // that ran meanwhile may have dropped records since.
                (*st).lost -= lost;
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

/// Writes a call's record preceded by its data unit `words` (if any) in data slots, all in
/// one chunk, taking a new chunk if needed.
///
/// # Safety
/// `st` must be the calling thread's state.
pub unsafe fn emit_unit(st: *mut ThreadState, mut rec: Record, words: &[u64]) {
    // `--min-duration`, as the exit stub applies it: an ancestor lasts at least as long as
    // its callees, so every call kept still has its callers. A call an injection changed is
    // always kept: every change is recorded.
    let injected = words.first().is_some_and(|h| (h >> fnscope_abi::data::INJECT_SHIFT) & 0xff != 0);
    if !injected && rec.ticks() < stubs::MIN_TICKS.load(Ordering::Relaxed) {
        return;
    }
    let slots = words.len().div_ceil(2);
    let bytes = ((slots + 1) * RECORD_SIZE) as u64;
    if slots > 0 {
        rec.id_depth |= (fnscope_abi::REC_FLAG_DATA as u64) << 56;
    }
    // SAFETY: per the caller's guarantee.
    unsafe {
        if (*st).exited != 0 {
            (*st).lost += 1;
            return;
        }
        // Reserved in one read-modify-write, as the stubs do: a signal handler's records take
        // the slots after these. The bound is checked before the sequence number, as the
        // stubs do: a swap after both checks leaves these slots in the chunk before, which
        // stays unpublished until the next swap.
        let buf_ptr = AtomicU64::from_ptr(addr_of_mut!((*st).buf_ptr));
        let seq = addr_of_mut!((*st).seq);
        let mut retries = 0;
        let ptr = loop {
            let before = read_volatile(seq);
            compiler_fence(Ordering::SeqCst);
            let ptr = buf_ptr.fetch_add(bytes, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
            if ptr + bytes <= read_volatile(addr_of_mut!((*st).buf_end)) && read_volatile(seq) == before {
                break ptr;
            }
            match settle_slots(st, ptr, bytes) {
                Settle::Write => break ptr,
                // Each retry follows a swap or finds room a handler made: a third in a row
                // means chunks are not coming.
                Settle::Retry if retries < 3 => retries += 1,
                Settle::Retry => {
                    (*st).lost += 1;
                    return;
                }
                Settle::Drop => return,
            }
        };
        let tag = fnscope_abi::data::tag(words.len() as u64);
        for (k, pair) in words.chunks(2).enumerate() {
            let r = (ptr + (k * RECORD_SIZE) as u64) as *mut Record;
            write_volatile(addr_of_mut!((*r).t_entry), pair[0]);
            write_volatile(addr_of_mut!((*r).t_exit), pair.get(1).copied().unwrap_or(0));
            write_volatile(addr_of_mut!((*r).id_depth), tag);
        }
        let r = (ptr + (slots * RECORD_SIZE) as u64) as *mut Record;
        write_volatile(addr_of_mut!((*r).t_entry), rec.t_entry);
        write_volatile(addr_of_mut!((*r).t_exit), rec.t_exit);
        write_volatile(addr_of_mut!((*r).id_depth), rec.id_depth);
    }
}

/// Slots `[start, end)` were reserved but run past the chunk: those inside it become data
/// slots of no call (readers drop them), so that the chunk holds no empty slot. The chunk is
/// the thread's current one, or the one before it when a signal handler swapped chunks in
/// between (it is published only at the next swap); anything else (the thread is finishing)
/// is left alone.
///
/// # Safety
/// `st` must be the calling thread's state, and `[start, end)` slots it reserved.
pub unsafe fn pad_reserved(st: *mut ThreadState, start: u64, end: u64) {
    // SAFETY: per the caller's guarantee; the chunks it names are this thread's, unpublished.
    unsafe {
        let (chunk, prev) = ((*st).chunk, (*st).prev_chunk);
        let Some((_, limit)) = on_grid(chunk, start).or_else(|| on_grid(prev, start)) else { return };
        let mut p = start;
        while p + RECORD_SIZE as u64 <= end.min(limit) {
            let r = p as *mut Record;
            write_volatile(addr_of_mut!((*r).id_depth), fnscope_abi::data::tag(1));
            p += RECORD_SIZE as u64;
        }
    }
}

/// Records the call of shadow entry `p` as ending at `now` without returning, with its entry
/// data when it has some.
///
/// # Safety
/// `st` must be the calling thread's state and `p` one of its shadow entries.
unsafe fn emit_closed(st: *mut ThreadState, p: u64, now: u64) {
    // SAFETY: per the caller's guarantee.
    unsafe {
        let e = core::ptr::read(p as *const ShadowEntry);
        let depth = ((p - (*st).ss_base) / 32) as u32;
        let mut words = [0u64; crate::args::FRAME_WORDS];
        let n = crate::args::entry_unit(st, p, &mut words);
        emit_unit(st, Record::new(e.t_entry, now, e.id as u32, depth, REC_FLAG_UNWOUND), &words[..n]);
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
        emit_closed(st, top, now);
        lower_top(st, top);
        forget_walk(st);
    }
}

/// Pops, as calls that did not return normally, the top entries whose return-address slot
/// is below `limit`: their frames are gone. It stops at an entry in progress: its stub, which
/// a signal interrupted, still owns it.
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn pop_below(st: *mut ThreadState, limit: u64, now: u64) {
    // SAFETY: per the caller's guarantee; the top entry exists whenever top > base.
    unsafe {
        loop {
            let top = read_volatile(addr_of_mut!((*st).ss_top));
            if top <= (*st).ss_base || {
                let e = &*((top - 32) as *const ShadowEntry);
                e.in_progress() || e.slot >= limit
            } {
                break;
            }
            pop_unwound(st, now);
        }
    }
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
///
/// When no entry has this slot, the function moved its return address and returned from
/// another stack pointer (hand-written assembly such as libffi's `ffi_call_unix64` does):
/// the newest entry is the call returning, so it is taken, and the event counted.
///
/// Returns 1 when it put the real return address in place itself (the stub then returns
/// without a record), 0 when the stub should pop the top entry.
#[no_mangle]
extern "C" fn fnscope_exit_mismatch(st: *mut ThreadState, rsp: u64) -> u32 {
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
                region::add_unmatched();
                // A call removed as gone but newer than every open one was alive after all: it
                // is the one returning. It was recorded when it was removed.
                let newest_open = if top > base { (*((top - 32) as *const ShadowEntry)).t_entry } else { 0 };
                let grave = &mut (*st).graveyard;
                if let Some(g) = grave.iter_mut().filter(|g| g.ret != 0 && g.t_entry > newest_open).max_by_key(|g| g.t_entry) {
                    write_volatile(rsp as *mut u64, g.ret);
                    g.ret = 0;
                    return 1;
                }
                if top <= base {
                    // No call to return from: this thread's state was replaced under it. No
                    // program can go on without a return address.
                    sys::write_stderr(b"fnscope: a hooked function returned through fnscope but this thread has no open call; aborting (please report this program)\n");
                    libc::abort();
                }
                (*((top - 32) as *mut ShadowEntry)).slot = rsp;
                return 0;
            }
            k -= 32;
            if (*(k as *const ShadowEntry)).slot == rsp {
                break;
            }
        }
        // Entries move below: the frames a backtrace disarmed stay so (their ends are late).
        forget_walk(st);
        let matched = core::ptr::read(k as *const ShadowEntry);
        let (lo, hi) = ((*st).stack_lo, (*st).stack_hi);
        let on_stack = |a: u64| a >= lo && a < hi;
        let dead = |e: &ShadowEntry| (e.slot < rsp && on_stack(rsp) && on_stack(e.slot)) || (!on_stack(e.slot) && gone_stack(e.slot));
        // An entry in progress under the frame returning here belongs to a stub a signal
        // handler interrupted and then jumped out of: it never ends, and has no call to record.
        let dropped = |e: &ShadowEntry| e.in_progress() || dead(e);
        // Deepest first: records are in the order calls end, which places each in its
        // caller's subtree when the trace is read.
        let mut r = top;
        while r > k + 32 {
            r -= 32;
            let e = core::ptr::read(r as *const ShadowEntry);
            if !e.in_progress() && dead(&e) {
                emit_closed(st, r, now);
            }
        }
        // Args frames go with their entries (a frame is found by its entry's position).
        let move_frame = |from: u64, to: u64| {
            if let (Some(a), Some(b)) = (crate::args::frame_of(st, from), crate::args::frame_of(st, to)) {
                core::ptr::copy(a, b, crate::args::FRAME_WORDS);
            }
        };
        let mut matched_frame = [0u64; crate::args::FRAME_WORDS];
        if let Some(f) = crate::args::frame_of(st, k) {
            core::ptr::copy_nonoverlapping(f, matched_frame.as_mut_ptr(), crate::args::FRAME_WORDS);
        }
        let mut w = k;
        let mut r = k + 32;
        while r < top {
            let e = core::ptr::read(r as *const ShadowEntry);
            if !dropped(&e) {
                core::ptr::write(w as *mut ShadowEntry, e);
                move_frame(r, w);
                w += 32;
            }
            r += 32;
        }
        core::ptr::write(w as *mut ShadowEntry, matched);
        if let Some(f) = crate::args::frame_of(st, w) {
            core::ptr::copy_nonoverlapping(matched_frame.as_ptr(), f, crate::args::FRAME_WORDS);
        }
        lower_top(st, w + 32);
    }
    0
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
        // The catch re-arms every live frame.
        forget_walk(st);
    }
}

/// Puts the real return address (`armed` false) or the exit stub (`armed` true) into the
/// return-address slot of every frame on the shadow stack that holds the other one.
///
/// # Safety
/// `st` must be the calling thread's state, and its entries' slots must be live frames.
unsafe fn set_return_addresses(st: *mut ThreadState, armed: bool) {
    // SAFETY: per the caller's guarantee.
    unsafe { set_return_addresses_noting(st, armed, |_| {}) }
}

/// [`set_return_addresses`], calling `changed` with each entry whose slot it wrote.
///
/// # Safety
/// As for [`set_return_addresses`].
unsafe fn set_return_addresses_noting(st: *mut ThreadState, armed: bool, mut changed: impl FnMut(*const ShadowEntry)) {
    let plain = stubs::fnscope_exit as *const () as u64;
    let with_args = stubs::fnscope_exit_args as *const () as u64;
    // SAFETY: per the caller's guarantee; a slot is only written when it holds the value this
    // agent put there (or the real address it replaced), i.e. it is that frame's return slot.
    // Oldest first: when entries share a slot, the oldest holds the frame's real return
    // address (the others are tail calls, whose saved "return address" is the exit stub, or
    // stale entries a vfork child left), and the first write settles the slot.
    unsafe {
        let (lo, hi) = ((*st).stack_lo, (*st).stack_hi);
        let mut p = (*st).ss_base;
        while p < (*st).ss_top {
            let e = p as *const ShadowEntry;
            let slot = (*e).slot as *mut u64;
            p += 32;
            if (*e).in_progress() || ((*e).slot < lo || (*e).slot >= hi) && gone_stack((*e).slot) {
                continue;
            }
            let exit = if (*e).id & crate::args::ARGS_ENTRY != 0 { with_args } else { plain };
            let now = read_volatile(slot);
            // Disarming: a slot shared by a tail call holds the callee's exit stub, which may
            // be the other kind than the caller's.
            if armed && now == (*e).ret {
                write_volatile(slot, exit);
                changed(e);
            } else if !armed && stubs::is_exit(now) {
                write_volatile(slot, (*e).ret);
                changed(e);
            }
        }
    }
}

/// A managed runtime is about to walk this thread's stack by return address (Mono's stack
/// traces and caller lookups, which may run again later with no hook to tell): every hooked
/// frame gets its real return address back, for good. Those calls then return without
/// passing the exit stub; each is recorded as unwound when the next hooked entry or exit
/// finds it gone (counts stay exact, their ends are late).
pub fn disarm() {
    let Some(st) = current() else { return };
    // SAFETY: `st` is this thread's state and its entries' slots are its live frames.
    unsafe {
        set_return_addresses(st, false);
        forget_walk(st);
    }
}

/// The unwinder's `_Unwind_Backtrace` (behind glibc's `backtrace` and Rust's
/// `std::backtrace`), entered with its return address at `rsp`, is about to walk this
/// thread's stack by return address: every hooked frame gets its real return address back.
/// The walk only reads the stack and ends when `_Unwind_Backtrace` returns, so the frames
/// still live then get their exit stub back at the first entry that finds a gone frame from
/// above `rsp` ([`fnscope_entry_dead`]): only the calls that returned in between (the
/// walk's own callers, often) get late ends. Calls its callback makes are traced as usual.
pub fn backtrace_begins(rsp: u64) {
    let Some(st) = current() else { return };
    // SAFETY: `st` is this thread's state and its entries' slots are its live frames; `rsp`
    // points at `_Unwind_Backtrace`'s return address.
    unsafe {
        // The walk is noted before any frame is disarmed: a signal handler that runs in
        // between must not take an older walk's end for this one's.
        // One walk is remembered: the outermost on the thread's own stack (a walk on the
        // signal stack during it is over before it is), else the outermost elsewhere.
        let own = Range((*st).stack_lo, (*st).stack_hi);
        let w = (*st).walk_sp;
        let start = if w == 0 || (own.holds(rsp) && !own.holds(w)) {
            rsp
        } else if own.holds(w) && !own.holds(rsp) {
            w
        } else {
            w.max(rsp)
        };
        if start != w {
            (*st).walk_ret = read_volatile(start as *const u64);
        }
        write_volatile(addr_of_mut!((*st).walk_sp), start);
        let mut n = (*st).rearm_n as usize;
        set_return_addresses_noting(st, false, |e| {
            if n < REARM {
                (*st).rearm[n] = Disarmed { at: e as u64, entry: core::ptr::read(e) };
                n += 1;
                (*st).rearm_n = n as u32;
            }
        });
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
        if !settle(st, exception) {
            return;
        }
        let now = stubs::tsc();
        pop_below(st, caller_rsp, now);
        // Caught inside a backtrace's callback (on the walk's stack, below its start, whose
        // slot still holds `_Unwind_Backtrace`'s return address): the walk goes on above and
        // needs the real return addresses; the frames are re-armed when it is over.
        let walk = (*st).walk_sp;
        let own = Range((*st).stack_lo, (*st).stack_hi);
        let in_walk = walk != 0
            && own.holds(walk) == own.holds(caller_rsp)
            && caller_rsp < walk
            && (!own.holds(walk) || read_volatile(walk as *const u64) == (*st).walk_ret);
        if !in_walk {
            set_return_addresses(st, true);
            forget_walk(st);
        }
    }
}

/// `exception` was caught where no open call of this thread is known (a method that is not
/// hooked): it is no longer in flight, but which frames are gone is not known, so the live
/// ones stay without their exit hooks (their ends are recorded late, as unwound) until an
/// exception is caught in a hooked frame again. Re-arming here could write the exit stub
/// into stack memory a gone frame left and the handler now uses.
pub fn unwind_caught_unknown(exception: u64) {
    let Some(st) = current() else { return };
    // SAFETY: `st` is this thread's state.
    unsafe { settle(st, exception) };
}

/// Takes `exception` off this thread's in-flight list; true when none is left in flight.
///
/// # Safety
/// `st` must be the calling thread's state.
unsafe fn settle(st: *mut ThreadState, exception: u64) -> bool {
    // SAFETY: per the caller's guarantee.
    unsafe {
        let n = (*st).unwinding as usize;
        if n == 0 {
            return false;
        }
        let tracked = n.min(MAX_INFLIGHT);
        if let Some(k) = (&(*st).inflight)[..tracked].iter().position(|&e| e == exception) {
            (*st).inflight[k] = (*st).inflight[tracked - 1];
            (*st).unwinding -= 1;
        } else if n > MAX_INFLIGHT {
            (*st).unwinding -= 1;
        }
        (*st).unwinding == 0
    }
}

/// The return-address slot of this thread's newest open call of function `id`, if any: the
/// frame a managed runtime says caught an exception (see [`crate::mono`]).
pub fn newest_slot_of(id: u32) -> Option<u64> {
    let st = current()?;
    // SAFETY: `st` is this thread's state; entries between base and top are initialised.
    unsafe {
        let mut p = (*st).ss_top;
        while p > (*st).ss_base {
            p -= 32;
            let e = p as *const ShadowEntry;
            if (*e).id as u32 == id && !(*e).in_progress() {
                return Some((*e).slot);
            }
        }
    }
    None
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
            if !(*(p as *const ShadowEntry)).in_progress() {
                emit_closed(st, p, now);
            }
        }
    }
}

/// Calls still open when this thread calls `exec`: written after the thread's last record
/// without being counted in, so that they are in the trace only if the exec succeeds (the new
/// image's agent then publishes the chunk as abandoned, reading records up to the first empty
/// one). Returns where they went, for [`exec_failed`].
pub fn exec_begins() -> Option<(u64, usize)> {
    let st = current()?;
    let now = stubs::tsc();
    // SAFETY: `st` is this thread's state (checked to be this process's: a `vfork` child shares
    // its parent's); signals are blocked and `in_slow` set while the chunk may be swapped.
    unsafe {
        if (*st).pid != sys::getpid() || (*st).exited != 0 || (*st).in_slow != 0 {
            return None;
        }
        let _quiet = quiet();
        let base = (*st).ss_base;
        // `--min-duration`: outer calls started earlier, so the calls long enough are the
        // outermost ones.
        let min = stubs::MIN_TICKS.load(Ordering::Relaxed);
        let all = ((*st).ss_top - base) / 32;
        if all == 0 {
            return None;
        }
        let open = (0..all)
            .take_while(|&d| {
                let e = &*((base + d * 32) as *const ShadowEntry);
                !e.in_progress() && now.wrapping_sub(e.t_entry) >= min
            })
            .count();
        if open == 0 {
            // Every open call is shorter than the threshold: none is recorded, and none may be
            // closed later by the recorder (as cut off, when they would look long).
            mark_closed(st, true);
            return Some(((*st).buf_ptr, 0));
        }
        let mask = sys::block_signals();
        write_volatile(addr_of_mut!((*st).in_slow), 1);
        let need = (open * RECORD_SIZE) as u64;
        if (*st).buf_ptr + need > (*st).buf_end {
            refill(st);
        }
        let room = ((*st).buf_end.saturating_sub((*st).buf_ptr) / RECORD_SIZE as u64) as usize;
        let n = open.min(room);
        let at = (*st).buf_ptr;
        // The outermost `n` calls, deepest first (the order calls end in).
        for i in 0..n {
            let depth = n - 1 - i;
            let e = (base + depth as u64 * 32) as *const ShadowEntry;
            let r = (at + (i * RECORD_SIZE) as u64) as *mut Record;
            write_volatile(addr_of_mut!((*r).t_entry), (*e).t_entry);
            write_volatile(addr_of_mut!((*r).t_exit), now);
            let rec = Record::new((*e).t_entry, now, (*e).id as u32, depth as u32, REC_FLAG_UNWOUND);
            write_volatile(addr_of_mut!((*r).id_depth), rec.id_depth);
        }
        if n > 0 {
            mark_closed(st, true);
        }
        write_volatile(addr_of_mut!((*st).in_slow), 0);
        sys::restore_signals(mask);
        (n > 0).then_some((at, n))
    }
}

/// The exec failed: the calls it would have ended go on, so their records from
/// [`exec_begins`] are wiped.
pub fn exec_failed(pending: Option<(u64, usize)>) {
    let Some((at, n)) = pending else { return };
    let _quiet = quiet();
    if let Some(st) = current() {
        // SAFETY: this thread's state.
        unsafe { mark_closed(st, false) };
    }
    for i in 0..n {
        let r = (at + (i * RECORD_SIZE) as u64) as *mut Record;
        // SAFETY: the records written by `exec_begins`, past the thread's last record, in its
        // chunk; the marker word goes first so that no reader takes a half-wiped record.
        unsafe {
            write_volatile(addr_of_mut!((*r).id_depth), 0);
            write_volatile(addr_of_mut!((*r).t_entry), 0);
            write_volatile(addr_of_mut!((*r).t_exit), 0);
        }
    }
}

/// Process exit (the agent's destructor inside `exit`, or `_exit` and `abort`): calls still
/// open on this thread will never return; record them as ending now and hand the chunk over.
pub fn process_exit() {
    let Some(st) = current() else { return };
    // SAFETY: reads this thread's state. A `vfork` child runs on its parent's state, which is
    // not its to finish.
    if unsafe { (*st).pid } != sys::getpid() {
        return;
    }
    let _quiet = quiet();
    // SAFETY: `st` is this thread's state. Entries are not popped: `exit` never returns into
    // those frames, and leaving them keeps the stack consistent for hooked code that still
    // runs after us (later destructors), whose records are dropped.
    unsafe {
        emit_open_calls(st, stubs::tsc());
        mark_closed(st, true);
        finish(st);
    }
}
