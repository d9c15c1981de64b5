//! Copies of the process that the C library's `fork` does not announce: `clone()` without
//! `CLONE_VM`, and `fork`, `clone` or `clone3` made through `syscall()`. The agent's fork
//! hooks (`pthread_atfork`) do not run for them, so the child would find its thread's state
//! where the parent's is, in shared memory it does not inherit, and die at its first hooked
//! call. These wrappers run the same hooks around the call. (A `syscall` instruction written
//! into the program itself cannot be seen.)

use crate::thread;
use libc::{c_int, c_long, c_void, pid_t};

static REAL_SYSCALL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
static REAL_CLONE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Start-up: finds the C library's `syscall` and `clone`.
pub fn init() {
    crate::next_definition(&REAL_SYSCALL, c"syscall");
    crate::next_definition(&REAL_CLONE, c"clone");
}

/// Runs `fork_like`, which makes a copy of the process (0 in the child), between the agent's
/// fork hooks, as the C library's `fork` does.
fn around_fork(fork_like: impl FnOnce() -> c_long) -> c_long {
    thread::before_fork();
    let r = fork_like();
    if r == 0 {
        thread::after_fork_child();
    } else {
        thread::after_fork_parent();
    }
    r
}

type SyscallFn = unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;

/// `syscall`, interposed: process copies go through [`around_fork`]; every other call goes
/// to the C library's unchanged.
///
/// # Safety
/// Same contract as the C library's `syscall` (variadic there: on x86-64 the arguments travel
/// in the same registers either way, and the unused ones are passed on as they are).
#[no_mangle]
pub unsafe extern "C" fn syscall(n: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long {
    let real = crate::next_definition(&REAL_SYSCALL, c"syscall");
    if real == 0 {
        crate::stubs::set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: `real` is the C library's syscall, called with the caller's arguments.
    let call = || unsafe { std::mem::transmute::<usize, SyscallFn>(real)(n, a1, a2, a3, a4, a5, a6) };
    let copies = match n {
        libc::SYS_fork => true,
        libc::SYS_clone => a1 & libc::CLONE_VM as c_long == 0,
        // SAFETY: clone3's first argument is a `struct clone_args`, whose first word holds
        // the flags (a null pointer is left to the kernel to refuse).
        libc::SYS_clone3 => a1 != 0 && unsafe { *(a1 as *const u64) } & libc::CLONE_VM as u64 == 0,
        _ => false,
    };
    if copies {
        around_fork(call)
    } else {
        call()
    }
}

type CloneFn = unsafe extern "C" fn(extern "C" fn(*mut c_void) -> c_int, *mut c_void, c_int, *mut c_void, *mut pid_t, *mut c_void, *mut pid_t) -> c_int;

/// The child's function and argument of a `clone` without `CLONE_VM`, for [`child_start`].
struct Start {
    func: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
}

/// First code of a child made by `clone` without `CLONE_VM`: the agent's fork hook, then the
/// program's function.
extern "C" fn child_start(start: *mut c_void) -> c_int {
    // SAFETY: `clone` below passes its `Start`, which the child's copy of memory holds.
    let Start { func, arg } = unsafe { core::ptr::read(start as *const Start) };
    thread::after_fork_child();
    func(arg)
}

/// `clone`, interposed: without `CLONE_VM` the child is a copy of the process, so it starts
/// with the agent's fork hook (see [`child_start`]) and the parent runs the others around
/// the call. With `CLONE_VM` (threads, `vfork`-like children) it is the C library's as is.
///
/// # Safety
/// Same contract as the C library's `clone` (variadic there: the last three arguments are
/// passed on as they are, read or not).
#[no_mangle]
pub unsafe extern "C" fn clone(
    func: extern "C" fn(*mut c_void) -> c_int,
    stack: *mut c_void,
    flags: c_int,
    arg: *mut c_void,
    parent_tid: *mut pid_t,
    tls: *mut c_void,
    child_tid: *mut pid_t,
) -> c_int {
    let real = crate::next_definition(&REAL_CLONE, c"clone");
    if real == 0 {
        crate::stubs::set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: `real` is the C library's clone, called with the caller's arguments.
    let real = unsafe { std::mem::transmute::<usize, CloneFn>(real) };
    if flags & libc::CLONE_VM != 0 {
        // SAFETY: as above.
        return unsafe { real(func, stack, flags, arg, parent_tid, tls, child_tid) };
    }
    // The child reads its copy of this before the parent drops it.
    let mut start = Start { func, arg };
    let p = &mut start as *mut Start as *mut c_void;
    // SAFETY: as above; `child_start` runs `func(arg)` after the agent's hook.
    around_fork(|| unsafe { real(child_start, stack, flags, p, parent_tid, tls, child_tid) } as c_long) as c_int
}
