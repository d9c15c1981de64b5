//! Raw system calls, so that slow paths reached from inside hooked functions never call into
//! libc (which may itself be hooked, or hold a lock the program is in the middle of).

use core::arch::asm;

/// `syscall` with up to six arguments; returns the raw result (negative errno on failure).
///
/// # Safety
/// The caller must pass arguments that are valid for system call `nr`.
#[inline(always)]
pub unsafe fn syscall6(nr: usize, a1: usize, a2: usize, a3: usize, a4: usize, a5: usize, a6: usize) -> isize {
    let ret: isize;
    // SAFETY: the `syscall` instruction clobbers rcx and r11 and returns in rax, as declared;
    // validity of the arguments is the caller's obligation.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a1, in("rsi") a2, in("rdx") a3, in("r10") a4, in("r8") a5, in("r9") a6,
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

const SYS_MMAP: usize = 9;
const SYS_MUNMAP: usize = 11;
const SYS_SCHED_YIELD: usize = 24;
const SYS_GETPID: usize = 39;
const SYS_WRITE: usize = 1;
const SYS_GETTID: usize = 186;
const SYS_MREMAP: usize = 25;
const SYS_MPROTECT: usize = 10;
const SYS_READ: usize = 0;
const SYS_CLOSE: usize = 3;
const SYS_KILL: usize = 62;
const SYS_RENAME: usize = 82;
const SYS_MKDIR: usize = 83;
const SYS_UNLINK: usize = 87;
const SYS_READLINK: usize = 89;
const SYS_OPENAT: usize = 257;
const AT_FDCWD: isize = -100;
const O_RDONLY: usize = 0;
const O_WRONLY: usize = 1;
const O_CREAT: usize = 0o100;
const O_TRUNC: usize = 0o1000;
const O_CLOEXEC: usize = 0o2000000;
const ENOENT: isize = 2;
const EINTR: isize = 4;
const EEXIST: isize = 17;
const PROT_READ: usize = 1;
const PROT_WRITE: usize = 2;
const MAP_PRIVATE: usize = 2;
const MAP_ANONYMOUS: usize = 0x20;
const MAP_NORESERVE: usize = 0x4000;

/// Anonymous private read-write memory, or null.
pub fn mmap_anon(len: usize) -> *mut u8 {
    // SAFETY: an anonymous mapping with a null hint touches no existing memory.
    let r = unsafe {
        syscall6(SYS_MMAP, 0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, usize::MAX, 0)
    };
    if r < 0 {
        core::ptr::null_mut()
    } else {
        r as *mut u8
    }
}

/// Resizes a mapping from [`mmap_anon`], moving it if needed; null on failure (the old
/// mapping is then untouched).
pub fn mremap(p: *mut u8, old_len: usize, new_len: usize) -> *mut u8 {
    const MREMAP_MAYMOVE: usize = 1;
    // SAFETY: the caller passes a mapping of its own of `old_len` bytes; on failure the
    // kernel leaves it as it was.
    let r = unsafe { syscall6(SYS_MREMAP, p as usize, old_len, new_len, MREMAP_MAYMOVE, 0, 0) };
    if r < 0 {
        core::ptr::null_mut()
    } else {
        r as *mut u8
    }
}

/// Moves the pages of `[from, from + len)` (a mapping of the caller's own) to `to`, in place
/// of whatever was mapped there, in one step: no other thread ever finds `to` unmapped (a
/// fault there waits for the move to finish). On failure `from` is as it was, but `to` may
/// already be unmapped: the kernel unmaps the target before it moves the pages.
///
/// # Safety
/// `[from, from + len)` is one mapping of the caller's own that nothing else uses, holding
/// what `[to, to + len)` is to hold; if the call fails, the caller puts something valid back
/// at `to` if it was unmapped.
pub unsafe fn mremap_over(from: u64, len: usize, to: u64) -> Result<(), Errno> {
    const MREMAP_MAYMOVE: usize = 1;
    const MREMAP_FIXED: usize = 2;
    // SAFETY: per the caller's guarantee; the kernel checks both ranges.
    check(unsafe { syscall6(SYS_MREMAP, from as usize, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to as usize, 0) }).map(|_| ())
}

/// Asks for transparent huge pages in `[addr, addr + len)` (best effort: `madvise`).
pub fn advise_huge_pages(addr: u64, len: usize) {
    const SYS_MADVISE: usize = 28;
    const MADV_HUGEPAGE: usize = 14;
    // SAFETY: advice only; it changes no contents, and the kernel checks the range.
    unsafe {
        syscall6(SYS_MADVISE, addr as usize, len, MADV_HUGEPAGE, 0, 0, 0);
    }
}

/// Unmaps memory from [`mmap_anon`] (best effort).
pub fn munmap(p: *mut u8, len: usize) {
    // SAFETY: the caller passes a mapping of its own that nothing uses any more.
    unsafe {
        syscall6(SYS_MUNMAP, p as usize, len, 0, 0, 0, 0);
    }
}

/// The calling thread's name (`prctl(PR_GET_NAME)`), NUL-padded.
pub fn thread_name() -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer.
    unsafe { syscall6(libc::SYS_prctl as usize, libc::PR_GET_NAME as usize, name.as_mut_ptr() as usize, 0, 0, 0, 0) };
    name
}

/// Copies `buf.len()` bytes at `addr` of this process with `process_vm_readv`, which fails
/// on unmapped memory instead of faulting; returns the bytes copied.
pub fn read_own_memory(addr: u64, buf: &mut [u8]) -> usize {
    let local = [buf.as_mut_ptr() as usize, buf.len()];
    let remote = [addr as usize, buf.len()];
    // SAFETY: both iovecs describe memory of the right length; the kernel checks `remote`.
    let r = unsafe { syscall6(libc::SYS_process_vm_readv as usize, getpid() as usize, local.as_ptr() as usize, 1, remote.as_ptr() as usize, 1, 0) };
    if r < 0 { 0 } else { r as usize }
}

/// Kernel thread id of the caller.
pub fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { syscall6(SYS_GETTID, 0, 0, 0, 0, 0, 0) as u32 }
}

/// Process id of the caller.
pub fn getpid() -> u32 {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { syscall6(SYS_GETPID, 0, 0, 0, 0, 0, 0) as u32 }
}

/// Gives up the CPU for a moment.
pub fn sched_yield() {
    // SAFETY: sched_yield takes no arguments.
    unsafe {
        syscall6(SYS_SCHED_YIELD, 0, 0, 0, 0, 0, 0);
    }
}

/// Writes a message to stderr without libc (best effort).
pub fn write_stderr(msg: &[u8]) {
    // SAFETY: the buffer is valid for msg.len() bytes.
    unsafe {
        syscall6(SYS_WRITE, 2, msg.as_ptr() as usize, msg.len(), 0, 0, 0);
    }
}

const SYS_RT_SIGPROCMASK: usize = 14;
const SIG_SETMASK: usize = 2;

/// Signals the kernel raises for the instruction that runs (a fault, the trap flag's single
/// step, a seccomp trap). Blocked when raised, the kernel kills the process instead of running
/// the handler, so [`block_signals`] leaves them alone: a program that steps itself with the
/// trap flag runs its handler inside the agent's slow paths, which the slow paths' other
/// guards (`in_slow`, a limit of 0) keep apart.
const SYNCHRONOUS: u64 = sig_bit(libc::SIGILL)
    | sig_bit(libc::SIGTRAP)
    | sig_bit(libc::SIGBUS)
    | sig_bit(libc::SIGFPE)
    | sig_bit(libc::SIGSEGV)
    | sig_bit(libc::SIGSYS);

/// The bit of signal `sig` in a kernel signal set.
const fn sig_bit(sig: libc::c_int) -> u64 {
    1 << (sig - 1)
}

/// Blocks every signal that can be blocked, except those the running instruction raises;
/// returns the previous mask for [`restore_signals`].
pub fn block_signals() -> u64 {
    let all: u64 = !SYNCHRONOUS;
    let mut old: u64 = 0;
    // SAFETY: both pointers are valid for the 8-byte kernel sigset the last argument names.
    unsafe {
        syscall6(SYS_RT_SIGPROCMASK, SIG_SETMASK, &all as *const u64 as usize, &mut old as *mut u64 as usize, 8, 0, 0);
    }
    old
}

/// Puts back a mask returned by [`block_signals`].
pub fn restore_signals(old: u64) {
    // SAFETY: the pointer is valid for the 8-byte kernel sigset.
    unsafe {
        syscall6(SYS_RT_SIGPROCMASK, SIG_SETMASK, &old as *const u64 as usize, 0, 8, 0, 0);
    }
}

/// An error number from a failed system call, printed as the C library would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// EEXIST.
    pub const EXISTS: Errno = Errno(EEXIST as i32);
    /// EINVAL.
    pub const INVALID: Errno = Errno(22);
}

impl core::fmt::Display for Errno {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // std formats it with the C library's strerror_r, which programs do not interpose.
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

fn check(r: isize) -> Result<usize, Errno> {
    if r < 0 {
        Err(Errno(-r as i32))
    } else {
        Ok(r as usize)
    }
}

/// A path as the kernel takes it: the bytes and a terminating NUL.
fn c_path(path: &std::path::Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut v = path.as_os_str().as_bytes().to_vec();
    v.push(0);
    v
}

/// Changes the protection of the pages `[addr, addr + len)` (page aligned).
pub fn mprotect(addr: u64, len: usize, prot: u32) -> Result<(), Errno> {
    // SAFETY: the caller names pages of a module or trampoline area of its own; the kernel
    // checks that they are mapped.
    check(unsafe { syscall6(SYS_MPROTECT, addr as usize, len, prot as usize, 0, 0, 0) }).map(|_| ())
}

/// Reads a whole file without the C library (which a program may interpose or hook).
pub fn read_file(path: &std::path::Path) -> Result<Vec<u8>, Errno> {
    let p = c_path(path);
    // SAFETY: `p` is NUL-terminated and outlives the call.
    let fd = check(unsafe { syscall6(SYS_OPENAT, AT_FDCWD as usize, p.as_ptr() as usize, O_RDONLY | O_CLOEXEC, 0, 0, 0) })?;
    let mut out: Vec<u8> = Vec::new();
    let result = loop {
        if out.capacity() - out.len() < 64 << 10 {
            out.reserve(out.capacity().max(64 << 10));
        }
        let spare = out.capacity() - out.len();
        // SAFETY: reading into the vector's spare capacity, `spare` bytes long.
        let r = unsafe { syscall6(SYS_READ, fd, out.as_mut_ptr().add(out.len()) as usize, spare, 0, 0, 0) };
        match r {
            0 => break Ok(()),
            r if r == -EINTR => continue,
            r if r < 0 => break Err(Errno(-r as i32)),
            // SAFETY: the kernel wrote `r` bytes after the initialised part.
            r => unsafe { out.set_len(out.len() + r as usize) },
        }
    };
    // SAFETY: closing the descriptor opened above.
    unsafe { syscall6(SYS_CLOSE, fd, 0, 0, 0, 0, 0) };
    result.map(|()| out)
}

/// A file's bytes: read into memory, or mapped.
pub struct Bytes(Held);

enum Held {
    Heap(Vec<u8>),
    /// A private read-only mapping of `len` bytes at `addr`, unmapped on drop.
    Mapped { addr: usize, len: usize },
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        Bytes(Held::Heap(v))
    }
}

impl core::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Held::Heap(v) => v,
            // SAFETY: only `map_whole` makes this variant, of a mapping of `len` readable bytes
            // that lives as long as `self`.
            Held::Mapped { addr, len } => unsafe { core::slice::from_raw_parts(*addr as *const u8, *len) },
        }
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        if let Held::Mapped { addr, len } = self.0 {
            munmap(addr as *mut u8, len);
        }
    }
}

/// Maps a whole file read-only, or reads it where it cannot be mapped. Only for files that
/// are replaced by renaming and never written after (the analysis cache's, written once with
/// [`write_new_file`]), or that the program runs (a module: the kernel refuses to write an
/// executable while it runs, and a library rewritten in place breaks the program anyway): a
/// file cut short under a mapping would fault on the lost pages, and one changed would
/// change bytes already checked. Mapping a 4 MiB plan takes the page cache's pages as they
/// are; reading it took a fresh page, a fault and a copy for each 4 KiB (3 ms of a warm
/// `cc1plus` start-up).
pub fn map_file(path: &std::path::Path) -> Result<Bytes, Errno> {
    match map_whole(path) {
        Err(Errno(e)) if e as isize != ENOENT => read_file(path).map(Bytes::from),
        r => r,
    }
}

/// Which file, and which version of it: what [`set_mtime_nsec`] compares before it writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FileVersion {
    dev: u64,
    ino: u64,
    /// The modification time, seconds and nanoseconds.
    mtime: i64,
    /// Public: a cache file may carry a mark there ([`crate::code_cache`]).
    pub mtime_nsec: i64,
}

impl FileVersion {
    fn of(st: &libc::stat) -> FileVersion {
        FileVersion { dev: st.st_dev, ino: st.st_ino, mtime: st.st_mtime, mtime_nsec: st.st_mtime_nsec }
    }
}

/// Maps the first `len` bytes of the file at `path`, which must hold exactly `len + 8`, read
/// only and private, where the kernel likes; returns the address, the last 8 bytes (read,
/// not mapped) and the version of the file mapped. The caller unmaps it.
pub fn map_prefix(path: &std::path::Path, len: usize) -> Result<(u64, [u8; 8], FileVersion), Errno> {
    with_open_file(path, |fd, st| {
        let mut tail = [0u8; 8];
        if st.st_size as u64 != len as u64 + 8 || !pread(fd, &mut tail, len as u64) {
            return Err(Errno::INVALID);
        }
        map_fd(fd, len).map(|a| (a as u64, tail, FileVersion::of(st)))
    })
}

/// The version of the file at `path` now.
pub fn file_version(path: &std::path::Path) -> Result<FileVersion, Errno> {
    with_open_file(path, |_, st| Ok(FileVersion::of(st)))
}

/// Sets the nanoseconds of the modification time of the file at `path` to `nsec` (its
/// seconds stay), if it is still `was`: a file put in its place since, or written since, is
/// left alone. Best effort.
pub fn set_mtime_nsec(path: &std::path::Path, was: &FileVersion, nsec: i64) {
    const SYS_UTIMENSAT: usize = 280;
    const UTIME_OMIT: i64 = (1 << 30) - 2;
    let _ = with_open_file(path, |fd, st| {
        if FileVersion::of(st) != *was {
            return Err(Errno::INVALID);
        }
        let times = [libc::timespec { tv_sec: 0, tv_nsec: UTIME_OMIT }, libc::timespec { tv_sec: was.mtime, tv_nsec: nsec }];
        // SAFETY: utimensat on the open descriptor itself (no path), with two valid timespecs;
        // it changes the file's times and nothing in memory.
        check(unsafe { syscall6(SYS_UTIMENSAT, fd, 0, times.as_ptr() as usize, 0, 0, 0) })
    });
}

fn map_whole(path: &std::path::Path) -> Result<Bytes, Errno> {
    with_open_file(path, |fd, st| match usize::try_from(st.st_size) {
        Ok(0) => Ok(Bytes::from(Vec::new())),
        Ok(len) => map_fd(fd, len).map(|addr| Bytes(Held::Mapped { addr, len })),
        Err(_) => Err(Errno::INVALID),
    })
}

/// Opens `path` read only and calls `f` with the descriptor and what fstat says of it;
/// closes it.
fn with_open_file<T>(path: &std::path::Path, f: impl FnOnce(usize, &libc::stat) -> Result<T, Errno>) -> Result<T, Errno> {
    const SYS_FSTAT: usize = 5;
    let p = c_path(path);
    // SAFETY: `p` is NUL-terminated and outlives the call.
    let fd = check(unsafe { syscall6(SYS_OPENAT, AT_FDCWD as usize, p.as_ptr() as usize, O_RDONLY | O_CLOEXEC, 0, 0, 0) })?;
    // SAFETY: `struct stat` is plain integers: all zeroes is a valid value.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-parameter of the layout the kernel writes for fstat(2) on
    // x86-64 (libc's `struct stat` is that layout); `fd` is open.
    let r = check(unsafe { syscall6(SYS_FSTAT, fd, &mut st as *mut libc::stat as usize, 0, 0, 0, 0) }).and_then(|_| f(fd, &st));
    close(fd);
    r
}

/// A new private read-only mapping of the first `len` bytes of open file `fd`, placed by the
/// kernel.
fn map_fd(fd: usize, len: usize) -> Result<usize, Errno> {
    const PROT_READ: usize = 1;
    const MAP_PRIVATE: usize = 2;
    // SAFETY: a new mapping placed by the kernel changes no existing memory.
    check(unsafe { syscall6(SYS_MMAP, 0, len, PROT_READ, MAP_PRIVATE, fd, 0) })
}

/// Writes `data` to `path` (created or truncated) without the C library.
pub fn write_file(path: &std::path::Path, data: &[u8]) -> Result<(), Errno> {
    write_with(path, O_TRUNC, &[data])
}

/// Writes `data` to a new file `path`; fails if `path` exists, so that no two writers ever
/// share a temporary file (a file renamed into the cache may be mapped: see [`map_file`]).
pub fn write_new_file(path: &std::path::Path, data: &[u8]) -> Result<(), Errno> {
    write_new_file_parts(path, &[data])
}

/// [`write_new_file`] of the concatenation of `parts`, without making it.
pub fn write_new_file_parts(path: &std::path::Path, parts: &[&[u8]]) -> Result<(), Errno> {
    const O_EXCL: usize = 0o200;
    write_with(path, O_EXCL, parts)
}

/// Appends `data` to `path` (created if missing) with one `write` where the kernel allows:
/// a reader sees whole lines when each call appends whole lines.
pub fn append_file(path: &std::path::Path, data: &[u8]) -> Result<(), Errno> {
    const O_APPEND: usize = 0o2000;
    write_with(path, O_APPEND, &[data])
}

fn write_with(path: &std::path::Path, mode: usize, parts: &[&[u8]]) -> Result<(), Errno> {
    let p = c_path(path);
    // SAFETY: `p` is NUL-terminated and outlives the call.
    let fd = check(unsafe {
        syscall6(SYS_OPENAT, AT_FDCWD as usize, p.as_ptr() as usize, O_WRONLY | O_CREAT | mode | O_CLOEXEC, 0o644, 0, 0)
    })?;
    let write_all = |data: &[u8]| {
        let mut done = 0;
        loop {
            if done == data.len() {
                break Ok(());
            }
            // SAFETY: the remaining bytes of `data` are valid for reading.
            let r = unsafe { syscall6(SYS_WRITE, fd, data.as_ptr().add(done) as usize, data.len() - done, 0, 0, 0) };
            match r {
                r if r == -EINTR => continue,
                r if r <= 0 => break Err(Errno(if r == 0 { 5 } else { -r as i32 })),
                r => done += r as usize,
            }
        }
    };
    let result = parts.iter().try_for_each(|d| write_all(d));
    // SAFETY: closing the descriptor opened above.
    unsafe { syscall6(SYS_CLOSE, fd, 0, 0, 0, 0, 0) };
    result
}

/// Renames `from` to `to` (replacing it) without the C library.
pub fn rename(from: &std::path::Path, to: &std::path::Path) -> Result<(), Errno> {
    let (a, b) = (c_path(from), c_path(to));
    // SAFETY: both paths are NUL-terminated and outlive the call.
    check(unsafe { syscall6(SYS_RENAME, a.as_ptr() as usize, b.as_ptr() as usize, 0, 0, 0, 0) }).map(|_| ())
}

/// Creates a directory; one that exists already is fine.
pub fn mkdir(path: &std::path::Path) -> Result<(), Errno> {
    let p = c_path(path);
    // SAFETY: `p` is NUL-terminated and outlives the call.
    match check(unsafe { syscall6(SYS_MKDIR, p.as_ptr() as usize, 0o755, 0, 0, 0, 0) }) {
        Err(Errno(e)) if e as isize == EEXIST => Ok(()),
        r => r.map(|_| ()),
    }
}

/// What identifies a file's version: device, inode, size and modification time (s, ns);
/// `None` if it cannot be looked at.
pub fn file_stamp(path: &std::path::Path) -> Option<[u64; 5]> {
    const SYS_STAT: usize = 4;
    let p = c_path(path);
    // SAFETY: `struct stat` is plain integers: all zeroes is a valid value.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-parameter of the layout the kernel writes for stat(2) on
    // x86-64 (libc's `struct stat` is that layout), and `p` is NUL-terminated.
    let r = unsafe { syscall6(SYS_STAT, p.as_ptr() as usize, &mut st as *mut libc::stat as usize, 0, 0, 0, 0) };
    (r == 0).then_some([st.st_dev, st.st_ino, st.st_size as u64, st.st_mtime as u64, st.st_mtime_nsec as u64])
}

/// Removes a file (best effort).
pub fn unlink(path: &std::path::Path) {
    let p = c_path(path);
    // SAFETY: `p` is NUL-terminated and outlives the call.
    unsafe { syscall6(SYS_UNLINK, p.as_ptr() as usize, 0, 0, 0, 0, 0) };
}

/// The target of a symbolic link (`/proc/self/exe`), or an empty path.
pub fn readlink(path: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let p = c_path(path);
    let mut buf = vec![0u8; 4096];
    // SAFETY: `p` is NUL-terminated; `buf` is valid for its length.
    let r = unsafe { syscall6(SYS_READLINK, p.as_ptr() as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0) };
    buf.truncate(r.max(0) as usize);
    std::path::PathBuf::from(std::ffi::OsString::from_vec(buf))
}

/// Whether process `pid` exists (signal 0: nothing is sent).
pub fn process_exists(pid: u32) -> bool {
    const ESRCH: isize = 3;
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { syscall6(SYS_KILL, pid as usize, 0, 0, 0, 0, 0) != -ESRCH }
}

/// Whether the page holding `addr` is mapped (`mincore` fails with ENOMEM on a hole).
pub fn is_mapped(addr: u64) -> bool {
    const SYS_MINCORE: usize = 27;
    const ENOMEM: isize = 12;
    let mut vec = 0u8;
    // SAFETY: mincore only writes one byte per page of the range, here one byte into `vec`.
    let r = unsafe { syscall6(SYS_MINCORE, (addr & !4095) as usize, 4096, &mut vec as *mut u8 as usize, 0, 0, 0) };
    r != -ENOMEM
}

/// The calling thread's alternate signal stack, `[lo, hi)`, if it has one.
pub fn alt_stack() -> Option<(u64, u64)> {
    const SYS_SIGALTSTACK: usize = 131;
    const SS_DISABLE: i32 = 2;
    #[repr(C)]
    struct StackT {
        sp: u64,
        flags: i32,
        size: usize,
    }
    let mut old = StackT { sp: 0, flags: 0, size: 0 };
    // SAFETY: with no new stack, sigaltstack only writes the current one into `old`.
    let r = unsafe { syscall6(SYS_SIGALTSTACK, 0, &mut old as *mut StackT as usize, 0, 0, 0, 0) };
    (r == 0 && old.flags & SS_DISABLE == 0 && old.size > 0).then(|| (old.sp, old.sp + old.size as u64))
}

/// Opens a file read-write; returns the descriptor.
pub fn open_rw(path: &std::path::Path) -> Result<usize, Errno> {
    const O_RDWR: usize = 2;
    let p = c_path(path);
    // SAFETY: `p` is NUL-terminated and outlives the call.
    check(unsafe { syscall6(SYS_OPENAT, AT_FDCWD as usize, p.as_ptr() as usize, O_RDWR | O_CLOEXEC, 0, 0, 0) })
}

/// Reads `buf.len()` bytes at `offset` of the file `fd`; whether it read them all.
pub fn pread(fd: usize, buf: &mut [u8], offset: u64) -> bool {
    const SYS_PREAD64: usize = 17;
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let r = unsafe { syscall6(SYS_PREAD64, fd, buf.as_mut_ptr() as usize, buf.len(), offset as usize, 0, 0) };
    r == buf.len() as isize
}

/// Processors this thread may run on (`sched_getaffinity`; 1 when it fails).
pub fn cpus() -> usize {
    let mut mask = [0u64; 16];
    // SAFETY: the kernel writes at most the mask's size into it.
    let r = unsafe { syscall6(204, 0, core::mem::size_of_val(&mask), mask.as_mut_ptr() as usize, 0, 0, 0) };
    if r <= 0 {
        return 1;
    }
    (mask.iter().map(|w| w.count_ones() as usize).sum::<usize>()).max(1)
}

/// Closes a descriptor (best effort).
pub fn close(fd: usize) {
    // SAFETY: closing a descriptor of our own.
    unsafe { syscall6(SYS_CLOSE, fd, 0, 0, 0, 0, 0) };
}
