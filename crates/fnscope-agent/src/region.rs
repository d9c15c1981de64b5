//! The shared region and its chunks, seen from inside the traced process.
//!
//! Everything here that runs after start-up (chunk hand-over) uses atomics on the shared
//! mapping and raw system calls only: it is reached from the exit stub's slow path.

use crate::sys;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use fnscope_abi::{
    chunk_offset, records_per_chunk, ChunkHeader, Record, RegionHeader, CHUNK_FLAG_ABANDONED, CHUNK_FULL,
    CHUNK_OWNED, RECORD_SIZE, REGION_MAGIC, REGION_VERSION,
};

static BASE: AtomicU64 = AtomicU64::new(0);
static CHUNK_SIZE: AtomicU32 = AtomicU32::new(0);
static NCHUNKS: AtomicU32 = AtomicU32::new(0);
static IMAGE_SID: AtomicU32 = AtomicU32::new(0);
/// Set once the recorder is found gone: records go to [`SCRATCH`], nowhere.
static RECORDER_GONE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// A chunk of private memory that threads fill and refill once the recorder is gone, so that
/// they run on at the ordinary cost of tracing instead of asking for chunks nobody frees.
static SCRATCH: AtomicU64 = AtomicU64::new(0);
/// Path of the region file (leaked at start-up), for removing it when the recorder is gone.
static PATH: AtomicU64 = AtomicU64::new(0);
static PATH_LEN: AtomicU64 = AtomicU64::new(0);

/// Maps the region named by `path` and takes an image session id. Start-up only.
pub fn attach(path: &str) -> Result<u32, String> {
    use std::os::unix::io::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open the shared region {path}: {e}"))?;
    let len = file.metadata().map_err(|e| format!("{path}: {e}"))?.len() as usize;
    if len < fnscope_abi::REGION_HEADER_SIZE {
        return Err(format!("shared region {path} is too small ({len} bytes)"));
    }
    // SAFETY: a fresh shared mapping of a file we opened read-write; nothing else in this
    // process refers to the address range it returns.
    let p = unsafe {
        libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot map the shared region {path}: {}", std::io::Error::last_os_error()));
    }
    let hdr = p as *mut RegionHeader;
    // SAFETY: the mapping is at least one header long (checked above) and page aligned.
    let (magic, version, chunk_size, nchunks, slots) =
        unsafe { ((*hdr).magic, (*hdr).version, (*hdr).chunk_size, (*hdr).nchunks, (*hdr).stack_slots) };
    if magic != REGION_MAGIC || version != REGION_VERSION {
        return Err(format!("{path} is not an fnscope region of version {REGION_VERSION}: agent and recorder differ"));
    }
    if fnscope_abi::region_size(chunk_size, nchunks, slots) > len {
        return Err(format!("shared region {path} is shorter than its header says"));
    }
    // Slots that run past a chunk's end land off the next chunk's grid only then (see
    // `thread::settle_slots`).
    if !chunk_size.is_power_of_two() || (chunk_size as usize) <= fnscope_abi::CHUNK_HEADER_SIZE {
        return Err(format!("shared region {path} has chunks of {chunk_size} bytes, not a power of two: agent and recorder differ"));
    }
    // SAFETY: `next_image_sid` is a naturally aligned u32 inside the mapping, shared with other
    // processes only through atomic operations.
    let sid = unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*hdr).next_image_sid)) }.fetch_add(1, Ordering::AcqRel);
    // SAFETY: as above, for `agents`.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*hdr).agents)) }.fetch_add(1, Ordering::AcqRel);
    CHUNK_SIZE.store(chunk_size, Ordering::Relaxed);
    NCHUNKS.store(nchunks, Ordering::Relaxed);
    let leaked: &'static str = Box::leak(path.to_string().into_boxed_str());
    PATH.store(leaked.as_ptr() as u64, Ordering::Relaxed);
    PATH_LEN.store(leaked.len() as u64, Ordering::Relaxed);
    IMAGE_SID.store(sid, Ordering::Relaxed);
    STACK_SLOTS.store(slots, Ordering::Relaxed);
    BASE.store(p as u64, Ordering::Release);
    // A forked child must not share its parent's shadow stacks: it gets the slots mapped
    // anew (see `remap_stacks`) and takes one of its own.
    if slots > 0 {
        let (lo, hi) = stacks_range();
        // SAFETY: advice on a range of our own mapping; it changes only what fork copies.
        unsafe { sys::syscall6(28, lo as usize, (hi - lo) as usize, 10, 0, 0, 0) }; // madvise(MADV_DONTFORK)
    }
    Ok(sid)
}

static STACK_SLOTS: AtomicU32 = AtomicU32::new(0);

/// Address range of the shadow-stack slots in this process.
fn stacks_range() -> (u64, u64) {
    let (cs, n) = (CHUNK_SIZE.load(Ordering::Relaxed), NCHUNKS.load(Ordering::Relaxed));
    let base = BASE.load(Ordering::Acquire);
    let slots = STACK_SLOTS.load(Ordering::Relaxed);
    (base + fnscope_abi::stack_slot_offset(cs, n, 0) as u64, base + fnscope_abi::stack_slot_offset(cs, n, slots) as u64)
}

fn slot_head(i: u32) -> *mut fnscope_abi::SlotHead {
    (stacks_range().0 + i as u64 * fnscope_abi::STACK_SLOT_SIZE as u64) as *mut fnscope_abi::SlotHead
}

/// Takes a free shadow-stack slot for thread `tid`; returns its address, or null when none is
/// free (the thread then uses private memory). Slow path: atomics and no allocation.
pub fn claim_slot(pid: u32, tid: u32) -> *mut u8 {
    if !attached() {
        return core::ptr::null_mut();
    }
    // SAFETY: aligned u32 inside the mapped header.
    let used = unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*header()).slots_used)) };
    for i in 0..STACK_SLOTS.load(Ordering::Relaxed) {
        let h = slot_head(i);
        // Before the slot can be ours, so that a scan never stops short of a slot in use.
        used.fetch_max(i + 1, Ordering::AcqRel);
        // SAFETY: the state word of a slot header inside the mapping.
        let state = unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*h).state)) };
        if state.compare_exchange(fnscope_abi::SLOT_FREE, fnscope_abi::SLOT_OWNED, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // SAFETY: the slot is ours now.
            unsafe {
                (*h).closed = 0;
                (*h).image_sid = image_sid();
                (*h).pid = pid;
                (*h).tid = tid;
            }
            return h as *mut u8;
        }
    }
    core::ptr::null_mut()
}

/// Marks the open calls of a slot as recorded (or not, when an exec they were recorded for
/// failed).
///
/// # Safety
/// `slot` must be a slot this thread claimed.
pub unsafe fn set_closed(slot: *mut u8, closed: bool) {
    // SAFETY: per the caller's guarantee.
    unsafe { core::ptr::write_volatile(core::ptr::addr_of_mut!((*(slot as *mut fnscope_abi::SlotHead)).closed), closed as u32) };
}

/// Gives a slot back.
///
/// # Safety
/// `slot` must be a slot this thread claimed and no longer uses.
pub unsafe fn release_slot(slot: *mut u8) {
    // SAFETY: per the caller's guarantee; the release store publishes the header's fields.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*(slot as *mut fnscope_abi::SlotHead)).state)) }
        .store(fnscope_abi::SLOT_FREE, Ordering::Release);
}

/// In a forked child: the slots were not inherited (MADV_DONTFORK); map them again, at the
/// same address, so that this process can take one. Raw system calls only.
pub fn remap_stacks() -> bool {
    if !attached() || STACK_SLOTS.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let (lo, hi) = stacks_range();
    let (p, n) = (PATH.load(Ordering::Relaxed), PATH_LEN.load(Ordering::Relaxed));
    // SAFETY: PATH/PATH_LEN describe the string leaked in `attach`.
    let path = unsafe { core::str::from_utf8_unchecked(core::slice::from_raw_parts(p as *const u8, n as usize)) };
    let Ok(fd) = sys::open_rw(std::path::Path::new(path)) else { return false };
    let offset = lo - BASE.load(Ordering::Acquire);
    // SAFETY: maps the region file's slot range over the hole fork left at the same address
    // (MAP_FIXED: nothing else can be there, the range was ours before the fork).
    let r = unsafe { sys::syscall6(9, lo as usize, (hi - lo) as usize, 3, 0x01 | 0x10, fd, offset as usize) };
    sys::close(fd);
    if r as u64 != lo {
        return false;
    }
    // SAFETY: as in `attach`.
    unsafe { sys::syscall6(28, lo as usize, (hi - lo) as usize, 10, 0, 0, 0) };
    true
}

/// Takes a new image session id for this process (a forked child about to extend the image
/// table it shares with its parent).
pub fn renew_sid() -> u32 {
    let hdr = header();
    // SAFETY: aligned u32 inside the mapped header.
    let sid = unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*hdr).next_image_sid)) }.fetch_add(1, Ordering::AcqRel);
    IMAGE_SID.store(sid, Ordering::Relaxed);
    sid
}

/// Whether [`attach`] succeeded.
pub fn attached() -> bool {
    BASE.load(Ordering::Acquire) != 0
}

/// This process image's session id.
pub fn image_sid() -> u32 {
    IMAGE_SID.load(Ordering::Relaxed)
}

fn header() -> *mut RegionHeader {
    BASE.load(Ordering::Acquire) as *mut RegionHeader
}

fn chunk(i: u32) -> *mut ChunkHeader {
    (BASE.load(Ordering::Acquire) as usize + chunk_offset(CHUNK_SIZE.load(Ordering::Relaxed), i)) as *mut ChunkHeader
}

fn state_of(c: *mut ChunkHeader) -> &'static AtomicU32 {
    // SAFETY: `state` is the aligned first word of a chunk header inside the shared mapping,
    // which stays mapped for the life of the process.
    unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*c).state)) }
}

/// Records per chunk.
pub fn capacity() -> usize {
    records_per_chunk(CHUNK_SIZE.load(Ordering::Relaxed))
}

/// A chunk taken for a thread: where its records go.
pub struct Taken {
    /// The chunk.
    pub chunk: *mut ChunkHeader,
    /// First record slot.
    pub start: u64,
    /// End of the record area.
    pub end: u64,
}

/// Takes a free chunk for thread `tid` of process `pid`, waiting (about two seconds at most)
/// for the recorder to free one while it has full ones to copy. `None` if none became free: the caller counts the records
/// it drops.
pub fn acquire(pid: u32, tid: u32, seq: u64, lost: u64) -> Option<Taken> {
    if !attached() {
        return None;
    }
    if RECORDER_GONE.load(Ordering::Relaxed) {
        return scratch();
    }
    let n = NCHUNKS.load(Ordering::Relaxed);
    let hdr = header();
    // SAFETY: aligned u32 inside the mapped header.
    let used = unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*hdr).chunks_used)) };
    // Roughly two seconds at a few GHz; the agent has no calibration of its own.
    let deadline = crate::stubs::tsc().wrapping_add(6_000_000_000);
    loop {
        // First fit: the lowest free chunk. The recorder frees a chunk soon after it is
        // handed over, so the program cycles through the few chunks it needs, pages mapped
        // and warm; starting anywhere else walks it through every page of the region once
        // whenever the recorder is a little late (a minor fault per 4 KiB written).
        let below = used.load(Ordering::Acquire).min(n);
        for i in 0..n {
            let c = chunk(i);
            if i >= below {
                // Before the chunk can be ours, so that the recorder never skips a chunk in use.
                used.fetch_max(i + 1, Ordering::AcqRel);
            }
            if state_of(c).compare_exchange(fnscope_abi::CHUNK_FREE, CHUNK_OWNED, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                // SAFETY: we own the chunk now; its header is ours to fill.
                unsafe {
                    (*c).image_sid = image_sid();
                    (*c).pid = pid;
                    (*c).tid = tid;
                    (*c).seq = seq;
                    (*c).nrec = 0;
                    (*c).flags = 0;
                    (*c).lost = lost;
                }
                let s = c as u64 + fnscope_abi::CHUNK_HEADER_SIZE as u64;
                return Some(Taken { chunk: c, start: s, end: s + (capacity() * RECORD_SIZE) as u64 });
            }
        }
        // Waiting only helps when the recorder has full chunks to free; when every chunk is
        // held by a live thread, the record is dropped (and counted) at once.
        let any_full = (0..n).any(|i| state_of(chunk(i)).load(Ordering::Relaxed) == CHUNK_FULL);
        if any_full && check_recorder() {
            return scratch();
        }
        if !any_full || (crate::stubs::tsc().wrapping_sub(deadline) as i64) > 0 {
            return None;
        }
        sys::sched_yield();
    }
}

/// Whether the recorder is gone (killed). The first agent to notice removes the region file,
/// which nobody else would (a region in memory of its own has none: its `/proc` link went
/// with the recorder, and the unlink fails, harmlessly); every agent then stops recording.
pub fn check_recorder() -> bool {
    if !attached() {
        return false;
    }
    if RECORDER_GONE.load(Ordering::Relaxed) {
        return true;
    }
    // SAFETY: aligned u32 in the mapped header, written by the recorder before any agent ran.
    let pid = unsafe { (*header()).recorder_pid };
    if pid == 0 || sys::process_exists(pid) {
        return false;
    }
    RECORDER_GONE.store(true, Ordering::Relaxed);
    let (p, n) = (PATH.load(Ordering::Relaxed), PATH_LEN.load(Ordering::Relaxed));
    // SAFETY: PATH/PATH_LEN describe the string leaked in `attach`.
    let path = unsafe { core::str::from_utf8_unchecked(core::slice::from_raw_parts(p as *const u8, n as usize)) };
    sys::unlink(std::path::Path::new(path));
    sys::write_stderr(b"fnscope: the recorder is gone; tracing stops, the program runs on\n");
    true
}

/// The scratch chunk, mapped on first use (raw system call: this runs in a slow path).
fn scratch() -> Option<Taken> {
    let size = CHUNK_SIZE.load(Ordering::Relaxed) as usize;
    let mut c = SCRATCH.load(Ordering::Acquire);
    if c == 0 {
        let m = sys::mmap_anon(size) as u64;
        if m == 0 {
            return None;
        }
        c = match SCRATCH.compare_exchange(0, m, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => m,
            Err(other) => {
                sys::munmap(m as *mut u8, size);
                other
            }
        };
    }
    let s = c + fnscope_abi::CHUNK_HEADER_SIZE as u64;
    Some(Taken { chunk: c as *mut ChunkHeader, start: s, end: s + (capacity() * RECORD_SIZE) as u64 })
}

/// Counts a process image that runs untraced after its agent mapped the region (see
/// `RegionHeader::untraced_images`).
pub fn add_untraced() {
    if attached() {
        // SAFETY: aligned u32 inside the mapped header.
        unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*header()).untraced_images)) }.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts a return that matched no shadow-stack entry.
pub fn add_unmatched() {
    if attached() {
        // SAFETY: aligned u64 inside the mapped header.
        unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*header()).unmatched_returns)) }.fetch_add(1, Ordering::Relaxed);
    }
}

/// Hands a chunk holding `nrec` records to the recorder.
///
/// # Safety
/// `c` must be a chunk of the region that the calling thread owns.
pub unsafe fn publish(c: *mut ChunkHeader, nrec: u32, flags: u32) {
    // SAFETY: per the caller's guarantee; the release store below publishes these fields.
    unsafe {
        (*c).nrec = nrec;
        (*c).flags |= flags;
        // A chunk handed over for an image this process no longer runs (after exec) would
        // get the new program's name.
        if flags & fnscope_abi::CHUNK_FLAG_ABANDONED == 0 {
            (*c).thread_name = sys::thread_name();
        }
    }
    state_of(c).store(CHUNK_FULL, Ordering::Release);
}

/// Adds to the region-wide count of dropped records.
pub fn add_lost(n: u64) {
    if attached() && n > 0 {
        let hdr = header();
        // SAFETY: aligned u64 inside the mapped header.
        unsafe { AtomicU64::from_ptr(core::ptr::addr_of_mut!((*hdr).lost_records)) }.fetch_add(n, Ordering::Relaxed);
    }
}

/// Publishes chunks that an earlier image of this process (before `exec`) still owned: their
/// threads are gone and will never publish them. Start-up only. Shadow-stack slots of the
/// earlier image whose calls were recorded (the thread that called `exec`) are freed; the
/// others stay for the recorder, which closes their calls when the process ends.
pub fn abandon_previous_images(pid: u32) {
    let me = image_sid();
    let fd = region_fd();
    // Owned by another process, or free: not ours to look at further.
    let other = |state: u32, owned: u32, owner: u32| state != owned || owner != pid;
    // Only slots and chunks ever used can hold anything of an earlier image: a program
    // started fresh looks at a few, where a look at every one was a system call each (a
    // millisecond or two at the start of every process).
    let hdr = header();
    // SAFETY: aligned u32s inside the mapped header.
    let (slots_used, chunks_used) = unsafe {
        (
            AtomicU32::from_ptr(core::ptr::addr_of_mut!((*hdr).slots_used)).load(Ordering::Acquire),
            AtomicU32::from_ptr(core::ptr::addr_of_mut!((*hdr).chunks_used)).load(Ordering::Acquire),
        )
    };
    for i in 0..STACK_SLOTS.load(Ordering::Relaxed).min(slots_used) {
        let h = slot_head(i);
        if peek(fd, h as u64, 3).is_some_and(|(state, owner)| other(state, fnscope_abi::SLOT_OWNED, owner)) {
            continue;
        }
        // SAFETY: a slot header inside the mapping; an owned slot of this pid under another
        // image belongs to threads that exec ended, which write nothing any more.
        unsafe {
            let state = AtomicU32::from_ptr(core::ptr::addr_of_mut!((*h).state));
            if state.load(Ordering::Acquire) == fnscope_abi::SLOT_OWNED
                && (*h).pid == pid
                && (*h).image_sid != me
                && core::ptr::read_volatile(core::ptr::addr_of!((*h).closed)) != 0
            {
                state.store(fnscope_abi::SLOT_FREE, Ordering::Release);
            }
        }
    }
    let cap = capacity();
    for i in 0..NCHUNKS.load(Ordering::Relaxed).min(chunks_used) {
        let c = chunk(i);
        if peek(fd, c as u64, 2).is_some_and(|(state, owner)| other(state, CHUNK_OWNED, owner)) {
            continue;
        }
        if state_of(c).load(Ordering::Acquire) != CHUNK_OWNED {
            continue;
        }
        // SAFETY: reading the header of an owned chunk whose owner no longer runs (same pid,
        // other image): nobody writes it any more.
        let (cpid, csid) = unsafe { ((*c).pid, (*c).image_sid) };
        if cpid != pid || csid == me {
            continue;
        }
        let recs = (c as usize + fnscope_abi::CHUNK_HEADER_SIZE) as *const Record;
        // SAFETY: the record area holds `cap` records inside the chunk.
        let n = (0..cap).take_while(|&k| unsafe { (*recs.add(k)).is_present() }).count();
        // SAFETY: the chunk's owner is gone (see above); publishing it is ours to do.
        unsafe { publish(c, n as u32, CHUNK_FLAG_ABANDONED) };
    }
    if let Some(fd) = fd {
        sys::close(fd);
    }
}

/// The state word and the owner's process id of the chunk or slot header at `addr` (whose
/// pid is word `pid_word`), read through the region file rather than the mapping: a page the
/// process has not touched yet costs a fault to read through the mapping, and looking at the
/// 1,024 chunks and 256 slots that way took a few milliseconds of every start-up. `None`
/// when the file cannot be read: the header is then looked at in the mapping.
fn peek(fd: Option<usize>, addr: u64, pid_word: usize) -> Option<(u32, u32)> {
    let mut b = [0u8; 16];
    if !sys::pread(fd?, &mut b, addr - BASE.load(Ordering::Acquire)) {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    Some((word(0), word(pid_word)))
}

/// A descriptor of the region file, for [`peek`].
fn region_fd() -> Option<usize> {
    let (p, n) = (PATH.load(Ordering::Relaxed), PATH_LEN.load(Ordering::Relaxed));
    if p == 0 {
        return None;
    }
    // SAFETY: PATH/PATH_LEN describe the string leaked in `attach`.
    let path = unsafe { core::str::from_utf8_unchecked(core::slice::from_raw_parts(p as *const u8, n as usize)) };
    sys::open_rw(std::path::Path::new(path)).ok()
}

/// Asks the recorder for a flight-recorder snapshot.
pub fn request_snapshot() {
    if attached() {
        // SAFETY: aligned u32 inside the mapped header.
        unsafe { AtomicU32::from_ptr(core::ptr::addr_of_mut!((*header()).snapshot_requests)) }.fetch_add(1, Ordering::Relaxed);
    }
}

extern "C" fn on_trigger_signal(_sig: libc::c_int) {
    request_snapshot();
}

/// Makes signal `sig` ask the recorder for a snapshot (`record --trigger signal:NAME`), unless
/// the process already has a disposition of its own for it (inherited `SIG_IGN`): that one
/// stays. A program that installs its own handler later replaces this one, and its signal
/// then does what the program says; `fnscope snapshot PID` still works.
pub fn install_trigger_signal(sig: i32) {
    // SAFETY: sigaction with valid pointers; the handler only does one atomic add.
    unsafe {
        let mut old: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(sig, core::ptr::null(), &mut old) != 0 || old.sa_sigaction != libc::SIG_DFL {
            return;
        }
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_trigger_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, core::ptr::null_mut());
    }
}
