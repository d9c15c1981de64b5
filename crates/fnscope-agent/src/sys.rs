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

/// Unmaps memory from [`mmap_anon`] (best effort).
pub fn munmap(p: *mut u8, len: usize) {
    // SAFETY: the caller passes a mapping of its own that nothing uses any more.
    unsafe {
        syscall6(SYS_MUNMAP, p as usize, len, 0, 0, 0, 0);
    }
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

/// Blocks every signal that can be blocked; returns the previous mask for
/// [`restore_signals`].
pub fn block_signals() -> u64 {
    let all: u64 = !0;
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
