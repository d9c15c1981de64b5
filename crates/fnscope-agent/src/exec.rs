//! Following the program into the programs it starts, and closing the calls that a new
//! program image or an immediate exit leaves open.
//!
//! The agent reaches a new program through the environment (`LD_PRELOAD` and the
//! `FNSCOPE_*` variables). A program that passes an environment of its own to `execve` or
//! `posix_spawn` (or clears `environ` first, as `env -i` does) would leave them out; these
//! wrappers, which the preloaded agent puts in front of the C library's, add them back.
//!
//! The variadic `execl`, `execlp` and `execle` cannot be written in stable Rust: the first two
//! use `environ` (checked by nothing here, but inherited as it is), and `execle` with an
//! environment lacking fnscope's variables starts the new program untraced.

use crate::{sys, thread};
use core::sync::atomic::{AtomicUsize, Ordering};
use libc::{c_char, c_int, pid_t};

extern "C" {
    static mut environ: *const *const c_char;
}

/// `KEY=VALUE\0` strings to add, kept from start-up (leaked: they live as long as the
/// process); the first is `LD_PRELOAD`.
static ADD: AtomicUsize = AtomicUsize::new(0);
static ADD_LEN: AtomicUsize = AtomicUsize::new(0);

/// The C library's functions behind each wrapper, looked up at start-up: a `vfork` child that
/// calls `execve` must not take the dynamic linker's locks.
static REAL: [std::sync::OnceLock<usize>; 7] = [const { std::sync::OnceLock::new() }; 7];
const EXECVE: usize = 0;
const EXECVPE: usize = 1;
const FEXECVE: usize = 2;
const SPAWN: usize = 3;
const SPAWNP: usize = 4;
const EXIT: usize = 5;
const ABORT: usize = 6;
const NAMES: [&core::ffi::CStr; 7] = [c"execve", c"execvpe", c"fexecve", c"posix_spawn", c"posix_spawnp", c"_exit", c"abort"];

/// Start-up: keeps the variables a new program needs, from the environment the agent
/// started with, and finds the functions the wrappers stand for.
pub fn init(vars: Vec<Vec<u8>>) {
    for (slot, name) in REAL.iter().zip(NAMES) {
        crate::next_definition(slot, name);
    }
    let strings: Vec<*const c_char> = vars
        .into_iter()
        .map(|mut v| {
            v.push(0);
            Box::leak(v.into_boxed_slice()).as_ptr() as *const c_char
        })
        .collect();
    let n = strings.len();
    ADD.store(Box::leak(strings.into_boxed_slice()).as_ptr() as usize, Ordering::Relaxed);
    ADD_LEN.store(n, Ordering::Release);
}

/// `record --no-follow-exec`: takes fnscope out of the process's environment (the agent from
/// `LD_PRELOAD`, where the recorder put it first, and the `FNSCOPE_*` variables), so that no
/// program started from this one, by any means, loads the agent. Start-up only, before the
/// program's own code runs, editing `environ` in place as `unsetenv` would.
pub fn forget_environment() {
    // SAFETY: start-up is single-threaded; `environ` is a null-terminated array of strings
    // whose entries are only removed or replaced by leaked strings that outlive the process.
    unsafe {
        let env = environ as *mut *const c_char;
        if env.is_null() {
            return;
        }
        let (mut r, mut w) = (0, 0);
        while !(*env.add(r)).is_null() {
            let s = *env.add(r);
            r += 1;
            let b = core::ffi::CStr::from_ptr(s).to_bytes();
            if b.starts_with(b"FNSCOPE_") {
                continue;
            }
            let mut keep = s;
            if let Some(list) = b.strip_prefix(b"LD_PRELOAD=") {
                let Some(colon) = list.iter().position(|&c| c == b':') else { continue };
                let mut v = b"LD_PRELOAD=".to_vec();
                v.extend_from_slice(&list[colon + 1..]);
                v.push(0);
                keep = Box::leak(v.into_boxed_slice()).as_ptr() as *const c_char;
            }
            *env.add(w) = keep;
            w += 1;
        }
        *env.add(w) = core::ptr::null();
    }
}

fn real(i: usize) -> usize {
    REAL[i].get().copied().unwrap_or(0)
}

/// The name part of a `KEY=VALUE` string, `=` included.
///
/// # Safety
/// `s` must be a NUL-terminated string.
unsafe fn key(s: *const c_char) -> &'static [u8] {
    // SAFETY: per the caller's guarantee.
    let b = unsafe { core::ffi::CStr::from_ptr(s) }.to_bytes();
    match b.iter().position(|&c| c == b'=') {
        Some(i) => &b[..=i],
        None => b,
    }
}

/// `envp` with fnscope's variables in place of any the program set itself: the same array
/// when it has them already, else a new one in fresh memory (raw `mmap`: this may run in a
/// `vfork` child, which must not touch the allocator's state). A null `envp` is left as it is.
///
/// # Safety
/// `envp` must be null or a null-terminated array of NUL-terminated strings.
unsafe fn traced_env(envp: *const *const c_char) -> *const *const c_char {
    let n_add = ADD_LEN.load(Ordering::Acquire);
    if envp.is_null() || n_add == 0 {
        return envp;
    }
    // SAFETY: `init` stored `n_add` valid string pointers.
    let add = unsafe { core::slice::from_raw_parts(ADD.load(Ordering::Relaxed) as *const *const c_char, n_add) };
    // SAFETY: per the caller's guarantee, for every read of `envp` below.
    unsafe {
        let mut n = 0;
        while !(*envp.add(n)).is_null() {
            n += 1;
        }
        let present = add.iter().all(|&a| {
            let a = core::ffi::CStr::from_ptr(a).to_bytes();
            (0..n).any(|i| core::ffi::CStr::from_ptr(*envp.add(i)).to_bytes() == a)
        });
        if present {
            return envp;
        }
        let out = sys::mmap_anon((n + n_add + 1) * core::mem::size_of::<usize>()) as *mut *const c_char;
        if out.is_null() {
            return envp;
        }
        let mut k = 0;
        for i in 0..n {
            let s = *envp.add(i);
            let ours = add.iter().any(|&a| key(a) == key(s));
            if !ours {
                *out.add(k) = s;
                k += 1;
            }
        }
        for &a in add {
            *out.add(k) = a;
            k += 1;
        }
        *out.add(k) = core::ptr::null();
        out
    }
}

type ExecveFn = unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type FexecveFn = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
type SpawnFn = unsafe extern "C" fn(
    *mut pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *const c_char,
    *const *const c_char,
) -> c_int;

/// Runs an exec: the calls open on this thread are closed as ended by it first (they stay in
/// the trace only if the exec succeeds, see [`thread::exec_begins`]).
fn exec_with(run: impl FnOnce() -> c_int) -> c_int {
    let pending = thread::exec_begins();
    let r = run();
    thread::exec_failed(pending);
    r
}

/// Runs the C library's `execve` or `execvpe` (`which`; same signature) with fnscope's
/// environment kept.
///
/// # Safety
/// Same contract as the C library's function.
unsafe fn exec_real(which: usize, file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let f = real(which);
    if f == 0 {
        return -1;
    }
    // SAFETY: `f` is the C library's function of this signature; the environment is the
    // caller's or a copy of it.
    exec_with(|| unsafe { core::mem::transmute::<usize, ExecveFn>(f)(file, argv, traced_env(envp)) })
}

/// `execve`, with fnscope's environment kept.
///
/// # Safety
/// Same contract as the C library's `execve`.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { exec_real(EXECVE, path, argv, envp) }
}

/// `execvpe`, with fnscope's environment kept.
///
/// # Safety
/// Same contract as the C library's `execvpe`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { exec_real(EXECVPE, file, argv, envp) }
}

/// `execv`: `execve` with `environ`, which the program may have emptied.
///
/// # Safety
/// Same contract as the C library's `execv`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: `environ` is the process's environment, read once.
    unsafe { execve(path, argv, environ) }
}

/// `execvp`: `execvpe` with `environ`, which the program may have emptied.
///
/// # Safety
/// Same contract as the C library's `execvp`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: `environ` is the process's environment, read once.
    unsafe { execvpe(file, argv, environ) }
}

/// `fexecve`, with fnscope's environment kept.
///
/// # Safety
/// Same contract as the C library's `fexecve`.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let f = real(FEXECVE);
    if f == 0 {
        return -1;
    }
    // SAFETY: as for `execve`.
    exec_with(|| unsafe { core::mem::transmute::<usize, FexecveFn>(f)(fd, argv, traced_env(envp)) })
}

/// Runs the C library's `posix_spawn` or `posix_spawnp` (`which`) with fnscope's
/// environment kept.
///
/// # Safety
/// Same contract as the C library's function.
unsafe fn spawn_real(
    which: usize,
    pid: *mut pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real(which);
    if f == 0 {
        return libc::ENOSYS;
    }
    // SAFETY: `f` is the C library's function of this signature; only the environment is
    // replaced.
    unsafe { core::mem::transmute::<usize, SpawnFn>(f)(pid, file, actions, attr, argv, traced_env(envp)) }
}

/// `posix_spawn`, with fnscope's environment kept.
///
/// # Safety
/// Same contract as the C library's `posix_spawn`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { spawn_real(SPAWN, pid, path, actions, attr, argv, envp) }
}

/// `posix_spawnp`, with fnscope's environment kept.
///
/// # Safety
/// Same contract as the C library's `posix_spawnp`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { spawn_real(SPAWNP, pid, file, actions, attr, argv, envp) }
}

/// `_exit`: no destructor runs after it, so the calls still open are closed here.
///
/// # Safety
/// Same contract as the C library's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    thread::process_exit();
    let f = real(EXIT);
    if f != 0 {
        // SAFETY: `f` is the C library's _exit.
        unsafe { core::mem::transmute::<usize, unsafe extern "C" fn(c_int) -> !>(f)(status) }
    }
    // SAFETY: exit_group never returns.
    unsafe { sys::syscall6(231, status as usize, 0, 0, 0, 0, 0) };
    unreachable!("exit_group returned")
}

/// `abort`: the calls still open are closed first (the process is about to die of SIGABRT,
/// and no destructor runs).
///
/// # Safety
/// Same contract as the C library's `abort`.
#[no_mangle]
pub unsafe extern "C" fn abort() -> ! {
    thread::process_exit();
    let f = real(ABORT);
    if f != 0 {
        // SAFETY: `f` is the C library's abort.
        unsafe { core::mem::transmute::<usize, unsafe extern "C" fn() -> !>(f)() }
    }
    // SAFETY: raising SIGABRT on this thread with the default action ends the process.
    unsafe {
        libc::signal(libc::SIGABRT, libc::SIG_DFL);
        libc::raise(libc::SIGABRT);
    }
    unreachable!("SIGABRT returned")
}
