//! Count mode: each hooked function's entry adds one to its counter, and nothing else.
//!
//! The slot of a function (see [`crate::hook`]) does, in 33 bytes and without touching the
//! stack below the red zone or any register but `r11` (saved and restored) and the flags:
//!
//! ```text
//! tail:  lea r11, [rip + entry+5]; jmp [rip + count_init]   ; first call of a thread
//! entry: mov [rsp-8], r11
//!        mov r11, [rip + tls_offset]     ; the agent's TLS word, as an fs offset
//!        mov r11, fs:[r11]               ; this thread's counters (null before its first call)
//!        test r11, r11
//!        jz tail
//!        inc qword ptr [r11 + id*8]      ; no lock: the block is this thread's alone
//!        mov r11, [rsp-8]
//!        <relocated prologue>; jmp back
//! ```
//!
//! Counters are in a file of the trace directory (`counts/<sid>.bin`, layout in
//! [`fnscope_abi::counts`]), so that they survive a killed program.

use crate::{stubs, sys};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use fnscope_abi::counts::{block_offset, BlockHeader, CountsHeader, BLOCK_ENDED, BLOCK_FREE, BLOCK_HEADER_SIZE, BLOCK_LIVE, HEADER_SIZE, MAGIC};
use std::path::Path;

static BASE: AtomicU64 = AtomicU64::new(0);
static DUMMY: AtomicU64 = AtomicU64::new(0);
/// The thread that sets the agent up (see [`setup_done`]).
static SETUP_TID: AtomicU32 = AtomicU32::new(0);

/// Blocks per counts file: threads alive at once that get counters of their own.
const NBLOCKS: u32 = 1024;

/// Counters kept free, at the least, for libraries that `dlopen` brings later.
pub const LATE_HEADROOM: u32 = 1 << 18;

fn header() -> *mut CountsHeader {
    BASE.load(Ordering::Acquire) as *mut CountsHeader
}

fn block(i: u32) -> *mut BlockHeader {
    let h = header();
    // SAFETY: the header was written at creation and is never changed but for `nfuncs` and
    // `threads_lost`.
    let bs = unsafe { (*h).block_size };
    (h as usize + block_offset(bs, i)) as *mut BlockHeader
}

fn state(b: *mut BlockHeader) -> &'static AtomicU32 {
    // SAFETY: aligned first word of a block header in the mapping, which is never unmapped.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*b).state)) }
}

fn counters(b: *mut BlockHeader) -> *mut u64 {
    (b as usize + BLOCK_HEADER_SIZE) as *mut u64
}

/// Creates and maps `dir/counts/<sid>.bin` with room for `capacity` function ids. Start-up
/// only.
pub fn create(dir: &Path, sid: u32, capacity: u32) -> Result<(), String> {
    use std::os::unix::io::AsRawFd;
    let folder = dir.join("counts");
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    let path = folder.join(format!("{sid}.bin"));
    let block_size = (BLOCK_HEADER_SIZE + capacity as usize * 8).next_multiple_of(4096) as u32;
    let len = block_offset(block_size, NBLOCKS);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // A sparse file: only the pages of blocks in use take space.
    file.set_len(len as u64).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: a fresh shared mapping of the file just sized; nothing else refers to the range.
    let p = unsafe {
        libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot map {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    // Without it, each first touch of a page reads the file around it (ext4 then fills large
    // folios of the holes with zeros): 3-4 ms of every traced process's start-up (`gcc`'s
    // driver: 5 ms -> 1.4), more with a cold page cache.
    // SAFETY: advice on the mapping just made; it changes no contents.
    unsafe { libc::madvise(p, len, libc::MADV_RANDOM) };
    let dummy = sys::mmap_anon(capacity as usize * 8);
    if dummy.is_null() {
        return Err("out of memory for the counters".into());
    }
    let h = p as *mut CountsHeader;
    // SAFETY: the mapping starts with the header page; block 0 follows it.
    unsafe {
        (*h).capacity = capacity;
        (*h).nblocks = NBLOCKS;
        (*h).block_size = block_size;
        (*h).nfuncs = 0;
        let b0 = (p as usize + HEADER_SIZE) as *mut BlockHeader;
        (*b0).pid = sys::getpid();
        (*b0).state = BLOCK_ENDED;
        (*h).magic = MAGIC;
    }
    DUMMY.store(dummy as u64, Ordering::Relaxed);
    SETUP_TID.store(sys::gettid(), Ordering::Relaxed);
    BASE.store(p as u64, Ordering::Release);
    Ok(())
}

/// Counter capacity of the file (0 before [`create`]).
pub fn capacity() -> u32 {
    let h = header();
    if h.is_null() {
        0
    } else {
        // SAFETY: the header is mapped once created.
        unsafe { (*h).capacity }
    }
}

/// Publishes how many function ids are in use.
pub fn set_nfuncs(n: u32) {
    let h = header();
    if !h.is_null() {
        // SAFETY: aligned u32 in the header; readers only look at it after the program ends.
        unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*h).nfuncs)) }.store(n, Ordering::Release);
    }
}

/// First hooked call of a thread in count mode: takes a free block. Called by
/// `fnscope_count_init` with every register saved.
#[no_mangle]
extern "C" fn fnscope_count_thread_init() {
    let dummy = sink();
    // Counting into the private dummy first keeps hooked functions called from here (libc's,
    // when libc is hooked) out of this path. So does the thread that sets the agent up, until
    // it is done: those calls are the agent's (see `setup_done`).
    // SAFETY: sets this thread's TLS word.
    unsafe { stubs::fnscope_tls_set(dummy) };
    if header().is_null() || (!crate::active() && sys::gettid() == SETUP_TID.load(Ordering::Relaxed)) {
        return;
    }
    let (pid, tid) = (sys::getpid(), sys::gettid());
    for i in 1..NBLOCKS {
        let b = block(i);
        if state(b).compare_exchange(BLOCK_FREE, BLOCK_LIVE, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // SAFETY: aligned u32 in the header.
            unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*header()).blocks_used)) }.fetch_max(i + 1, Ordering::Relaxed);
            crate::thread::register_exit();
            // SAFETY: the block is ours now.
            unsafe {
                (*b).pid = pid;
                (*b).tid = tid;
                stubs::fnscope_tls_set(counters(b) as *mut crate::thread::ThreadState);
            }
            return;
        }
    }
    // SAFETY: aligned u32 in the header.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*header()).threads_lost)) }.fetch_add(1, Ordering::Relaxed);
}

/// The counters that hooked functions count into while the agent's own code runs (see
/// [`crate::thread::Quiet`]); null before [`create`].
pub fn sink() -> *mut crate::thread::ThreadState {
    DUMMY.load(Ordering::Relaxed) as *mut crate::thread::ThreadState
}

/// End of start-up, on the thread that set up: the hooked calls it made until now were the
/// agent's and went to the sink; its next one takes counters of its own.
pub fn setup_done() {
    // SAFETY: reads and sets this thread's TLS word.
    unsafe {
        if stubs::fnscope_tls_get() == sink() {
            stubs::fnscope_tls_set(core::ptr::null_mut());
        }
    }
}

/// Thread exit in count mode: add this thread's counts to block 0 and free its block.
pub fn thread_exit() {
    // SAFETY: reads this thread's TLS word.
    let c = unsafe { stubs::fnscope_tls_get() } as u64;
    let dummy = sink() as u64;
    if c == 0 || c == dummy || header().is_null() {
        return;
    }
    // SAFETY: sets this thread's TLS word; later calls of this thread count into the dummy.
    unsafe { stubs::fnscope_tls_set(dummy as *mut crate::thread::ThreadState) };
    let b = (c as usize - BLOCK_HEADER_SIZE) as *mut BlockHeader;
    let total = counters(block(0));
    // Only the counters of ids handed out can be non-zero; the rest of a block is never touched
    // and stays unallocated in the sparse file.
    // SAFETY: aligned u32 in the header, published by `set_nfuncs`.
    let used = unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*header()).nfuncs)) }.load(Ordering::Acquire);
    // SAFETY: `b` is this thread's block (its counters were in our TLS word); block 0's counters
    // are shared and updated atomically; both hold `capacity` >= `used` counters.
    unsafe {
        for k in 0..used as usize {
            let v = *counters(b).add(k);
            if v != 0 {
                AtomicU64::from_ptr(total.add(k)).fetch_add(v, Ordering::Relaxed);
                *counters(b).add(k) = 0;
            }
        }
    }
    state(b).store(BLOCK_FREE, Ordering::Release);
}

/// In a forked child: the block in the TLS word is the parent thread's; take one of our own
/// at the next call.
pub fn after_fork_child() {
    // SAFETY: sets this thread's TLS word.
    unsafe { stubs::fnscope_tls_set(core::ptr::null_mut()) };
}
