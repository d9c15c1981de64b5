//! The fnscope agent: a shared library preloaded (`LD_PRELOAD`) into the traced program by
//! `fnscope record`.
//!
//! At start-up (an `.init_array` constructor, before the program's own constructors) it maps
//! the recorder's shared region, lists the functions of the main executable (and of the
//! libraries named by `FNSCOPE_LIBS`), decides which can be hooked safely
//! ([`fnscope_x86::analyze`]), builds a trampoline slot per function near its module,
//! writes the image table for the recorder and patches each function's first bytes with a
//! jump to its slot. From then on the hand-written stubs in [`stubs`] record every call.
//!
//! Nothing here runs unless `FNSCOPE_SHM` is set, so the library is inert when loaded by
//! accident.

pub mod alloc;
pub mod args;
pub mod clone;
pub mod code_cache;
pub mod count;
pub mod exec;
pub mod filter;
pub mod hook;
mod mem;
pub mod mono;
pub mod plan_cache;
pub mod region;
pub mod stubs;
pub mod sys;
pub mod thread;
pub mod unwind;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Every allocation of the agent, `std`'s included, comes from its own mappings: a program
/// may define `malloc` itself, and the agent must never run the program's code (see
/// [`alloc`]).
#[global_allocator]
static ALLOC: alloc::AgentAlloc = alloc::AgentAlloc::new();

static ACTIVE: AtomicBool = AtomicBool::new(false);
static COUNT_MODE: AtomicBool = AtomicBool::new(false);
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Whether the agent counts calls instead of timing them.
pub fn count_mode() -> bool {
    COUNT_MODE.load(Ordering::Relaxed)
}

/// Whether `fnscope record -v` asked for notes on what the agent does.
pub(crate) fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// Whether the agent set itself up and threads should be traced.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Prints a warning on stderr with a raw `write` (the program may hook or interpose the C
/// library's stdio).
pub fn warn(msg: &str) {
    sys::write_stderr(format!("fnscope: {msg}\n").as_bytes());
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn(libc::c_int, *const *const libc::c_char, *const *const libc::c_char) = agent_init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = agent_fini;

/// The agent's settings, read from the environment the program starts with.
struct Settings {
    shm: String,
    dir: PathBuf,
    libs: Vec<String>,
    counting: bool,
    filters: filter::Filters,
    /// `--depth`: shadow-stack entries a thread may use (0: all).
    depth: u32,
    /// `--min-duration` in time-stamp-counter ticks.
    min_ticks: u64,
    /// Signal that asks the recorder for a snapshot (0: none).
    trigger_signal: i32,
    /// `FNSCOPE_ARGS` (see [`args::configure`]).
    args: String,
}

/// Reads the `FNSCOPE_*` variables from the `envp` the dynamic linker passes to
/// constructors. `getenv` would do, but a program may define its own (bash does), and its
/// copy may already be hooked when the agent looks again.
///
/// # Safety
/// `envp` must be null or a null-terminated array of C strings.
unsafe fn read_settings(envp: *const *const libc::c_char) -> Option<Settings> {
    use std::os::unix::ffi::OsStrExt;
    let mut vars: HashMap<&[u8], &[u8]> = HashMap::new();
    // What a program started by this one needs to be traced too (see `exec`).
    let mut inherit: Vec<Vec<u8>> = Vec::new();
    let mut p = envp;
    // SAFETY: per the caller's guarantee; each entry is a NUL-terminated string.
    unsafe {
        while !p.is_null() && !(*p).is_null() {
            let kv = std::ffi::CStr::from_ptr(*p).to_bytes();
            if kv.starts_with(b"LD_PRELOAD=") {
                inherit.insert(0, kv.to_vec());
            } else if kv.starts_with(b"FNSCOPE_") {
                inherit.push(kv.to_vec());
                if let Some(eq) = kv.iter().position(|&b| b == b'=') {
                    vars.insert(&kv[..eq], &kv[eq + 1..]);
                }
            }
            p = p.add(1);
        }
    }
    let get = |k: &str| vars.get(k.as_bytes()).copied();
    let shm = String::from_utf8_lossy(get(fnscope_abi::ENV_SHM)?).into_owned();
    if get(fnscope_abi::ENV_NO_FOLLOW) == Some(b"1") {
        exec::init(Vec::new());
        exec::forget_environment();
    } else {
        exec::init(inherit);
    }
    let dir = PathBuf::from(std::ffi::OsStr::from_bytes(get(fnscope_abi::ENV_DIR).unwrap_or_default()));
    let libs = String::from_utf8_lossy(get(fnscope_abi::ENV_LIBS).unwrap_or_default())
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    VERBOSE.store(get(fnscope_abi::ENV_VERBOSE) == Some(b"1"), Ordering::Relaxed);
    match get(fnscope_abi::ENV_PATCH) {
        None | Some(b"") => {}
        Some(b"copy") => hook::set_patching(hook::Patching::Copy),
        Some(b"in-place") => hook::set_patching(hook::Patching::InPlace),
        Some(other) => warn(&format!(
            "{}={} is not `copy` or `in-place`: the agent decides how to patch",
            fnscope_abi::ENV_PATCH,
            String::from_utf8_lossy(other)
        )),
    }
    if let Some(dir) = get(fnscope_abi::ENV_CACHE).filter(|d| !d.is_empty()) {
        plan_cache::set_dir(PathBuf::from(std::ffi::OsStr::from_bytes(dir)));
    }
    let text = |k: &str| String::from_utf8_lossy(get(k).unwrap_or_default()).into_owned();
    let number = |k: &str| text(k).parse::<u64>().unwrap_or(0);
    let filters = match filter::Filters::new(
        &text(fnscope_abi::ENV_FILTER),
        &text(fnscope_abi::ENV_EXCLUDE),
        get(fnscope_abi::ENV_APP_ONLY) == Some(b"1"),
        &text(fnscope_abi::ENV_SYSTEM_DIRS),
    ) {
        Ok(f) => f,
        Err(e) => {
            warn(&format!("tracing disabled: {e}"));
            return None;
        }
    };
    Some(Settings {
        shm,
        dir,
        libs,
        counting: get(fnscope_abi::ENV_MODE) == Some(b"count"),
        filters,
        depth: number(fnscope_abi::ENV_DEPTH).min(u32::MAX as u64) as u32,
        min_ticks: number(fnscope_abi::ENV_MIN_TICKS),
        trigger_signal: number(fnscope_abi::ENV_TRIGGER_SIGNAL) as i32,
        args: text(fnscope_abi::ENV_ARGS),
    })
}

extern "C" fn agent_init(_argc: libc::c_int, _argv: *const *const libc::c_char, envp: *const *const libc::c_char) {
    // The program finds `errno` as the loader left it (0), whatever set-up did.
    let errno = stubs::errno();
    start(envp);
    stubs::set_errno(errno);
}

fn start(envp: *const *const libc::c_char) {
    // The interposed functions' targets are looked up now: the wrappers may run where `dlsym`
    // must not (a signal handler, a `vfork` child).
    next_definition(&REAL_PRCTL, c"prctl");
    next_definition(&REAL_DLOPEN, c"dlopen");
    clone::init();
    // SAFETY: `envp` is what glibc passed `agent_init`: init_array functions get the process's
    // argc, argv and envp.
    let Some(settings) = (unsafe { read_settings(envp) }) else { return };
    if settings.dir.as_os_str().is_empty() {
        warn("tracing disabled: FNSCOPE_DIR is not set (start programs with `fnscope record`)");
        return;
    }
    if let Err(e) = stubs::specialise_tls() {
        if verbose() {
            warn(&format!("the stubs load their thread state the slower way: {e}"));
        }
    }
    if let Err(e) = setup(settings) {
        warn(&format!("tracing disabled in pid {}: {e}", sys::getpid()));
        region::add_untraced();
    }
}

extern "C" fn agent_fini() {
    let _quiet = crate::thread::quiet();
    region::check_recorder();
    thread::process_exit();
}

/// What the agent keeps after start-up, for libraries loaded later.
pub(crate) struct Tracer {
    pid: u32,
    sid: u32,
    dir: PathBuf,
    libs: Vec<String>,
    prehooked: Vec<u64>,
    pub(crate) table: hook::ImageTable,
    /// Objects already looked at, by load address, with the address of one function patched
    /// in each (if any): a library unloaded and loaded again at the same address has its
    /// original bytes back there, and is hooked again.
    seen: HashMap<u64, Option<fnscope_x86::Patch>>,
    /// Slots to build: tracing or counting.
    pub(crate) kind: hook::SlotKind,
    pub(crate) filters: filter::Filters,
}

static TRACER: Mutex<Option<Tracer>> = Mutex::new(None);

/// Runs `f` on the tracer, under its lock, in the session of this process (see
/// [`Tracer::follow_fork`]); `None` before start-up finished or when tracing is off.
pub(crate) fn with_tracer<R>(f: impl FnOnce(&mut Tracer) -> R) -> Option<R> {
    let mut g = TRACER.lock().unwrap_or_else(|e| e.into_inner());
    let t = g.as_mut()?;
    t.follow_fork();
    Some(f(t))
}

impl Tracer {
    /// Hooks the objects not seen yet that the user asked for (the main executable, and
    /// libraries matching `--lib`); writes the image table before patching, so that the
    /// recorder can name every id a record may carry. Returns the functions hooked and
    /// skipped, and whether the table was written.
    fn hook_new_objects(&mut self, objs: &[hook::Loaded]) -> Result<(usize, usize, bool), String> {
        let mut pending = Vec::new();
        let (mut hooked, mut skipped) = (0, 0);
        let (mut modules, mut cached) = (0, 0);
        for (i, obj) in objs.iter().enumerate() {
            if self.seen.get(&obj.lo).is_some_and(|probe| !hook::reloaded(obj, *probe)) || hook::never_hook(&obj.path, obj) {
                continue;
            }
            self.seen.insert(obj.lo, None);
            let path = obj.path.to_string_lossy();
            // `--app-only` hooks the application's libraries without being asked.
            let wanted = i == 0
                || self.libs.iter().any(|p| path.contains(p.as_str()))
                || self.filters.app_only();
            if !wanted {
                continue;
            }
            if i != 0 && self.filters.is_system(&obj.path) {
                self.table.system(&obj.path);
                continue;
            }
            // A library's own copy of the unwinder (the main executable's was seen to by
            // `unwind::install`). Count mode leaves return addresses alone.
            if i != 0 && self.kind == hook::SlotKind::Trace {
                let own = unwind::install_own(obj, &self.prehooked);
                self.prehooked.extend(own);
            }
            let max_id = if self.kind == hook::SlotKind::Count && count::capacity() > 0 { count::capacity() } else { u32::MAX };
            match hook::plan_module(obj, &mut self.table, &self.prehooked, self.kind, max_id, &self.filters) {
                Ok(r) => {
                    hooked += r.hooked;
                    skipped += r.skipped;
                    modules += 1;
                    cached += usize::from(r.cached);
                    self.seen.insert(obj.lo, r.patches.iter().find(|p| matches!(p.jump.stage, fnscope_x86::Stage::Entry | fnscope_x86::Stage::ShortJump)).map(|p| p.jump));
                    pending.push((obj.clone(), r.patches));
                }
                Err(e) => warn(&format!("not tracing {}: {e}", obj.path.display())),
            }
        }
        let pending_empty = pending.is_empty();
        if !pending_empty {
            self.write_table()?;
            if self.kind == hook::SlotKind::Count {
                if count::capacity() == 0 {
                    // Room for libraries loaded later and for Mono's methods, when there may be
                    // some: the counters
                    // file is sparse and only the pages of counters in use take memory, so
                    // the room can be generous (libjvm alone has 25,000 functions).
                    let later = !self.libs.is_empty() || self.filters.app_only() || mono::present();
                    let headroom = if !later { 0 } else { count::LATE_HEADROOM.max(3 * self.table.ids()) };
                    count::create(&self.dir, self.sid, self.table.ids() + headroom)?;
                }
                count::set_nfuncs(self.table.ids());
            }
            let mut failed = 0;
            for (obj, patches) in pending {
                for (patch, why) in hook::write_patches(&obj, &patches) {
                    self.table.unhooked(patch.id, &why);
                    failed += 1;
                }
            }
            if failed > 0 {
                // The table said these were hooked; say now that they are not, and why.
                hooked -= failed;
                self.write_table()?;
                warn(&format!("{failed} functions could not be patched (see `fnscope info`)"));
            }
        }
        if verbose() && modules > 0 {
            warn(&format!("pid {}: {cached} of {modules} modules analysed in an earlier run (cached)", self.pid));
        }
        Ok((hooked, skipped, !pending_empty))
    }

    /// In a forked child, the parent's table (same session id) must not change under it, so
    /// the child continues under an id of its own.
    fn follow_fork(&mut self) {
        if self.pid != sys::getpid() {
            self.pid = sys::getpid();
            if !count_mode() {
                self.sid = region::renew_sid();
                thread::restart_stream();
                if let Err(e) = self.write_table() {
                    warn(&format!("after fork: {e}"));
                }
            }
        }
    }

    /// Adds lines to the image table file as they were added to `table`: a table that grows
    /// function by function (a JIT) is not rewritten whole each time.
    pub(crate) fn append_table(&self, lines: &str) -> Result<(), String> {
        let path = self.dir.join("images").join(format!("{}.txt", self.sid));
        sys::append_file(&path, lines.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn write_table(&self) -> Result<(), String> {
        let images = self.dir.join("images");
        sys::mkdir(&images).map_err(|e| format!("{}: {e}", images.display()))?;
        let tmp = images.join(format!("{}.txt.tmp{}", self.sid, self.pid));
        sys::write_file(&tmp, self.table.text().as_bytes()).map_err(|e| {
            // What was written of it is of no use, and the room it takes may be all there was.
            sys::unlink(&tmp);
            format!("{}: {e}", tmp.display())
        })?;
        sys::rename(&tmp, &images.join(format!("{}.txt", self.sid))).map_err(|e| format!("{}: {e}", tmp.display()))
    }
}

fn setup(settings: Settings) -> Result<(), String> {
    let started = std::time::Instant::now();
    let Settings { shm, dir, libs, counting, filters, depth, min_ticks, trigger_signal, args } = settings;
    if !counting {
        if let Err(e) = args::configure(&args) {
            warn(&format!("arguments, return values and injections are off: {e}"));
        }
    }
    let sid = region::attach(&shm)?;
    let pid = sys::getpid();
    region::abandon_previous_images(pid);
    COUNT_MODE.store(counting, Ordering::Relaxed);
    thread::set_limits(depth, min_ticks);
    if min_ticks == 0 {
        if let Err(e) = stubs::skip_min_ticks() {
            if verbose() {
                warn(&format!("the exit stubs keep their --min-duration check: {e}"));
            }
        }
    }
    if trigger_signal > 0 {
        region::install_trigger_signal(trigger_signal);
    }
    thread::install_process_hooks();
    let objs = hook::loaded_objects();
    // The unwinder's entry points get pre-hooks first; tracing must leave them alone. Count
    // mode leaves return addresses alone, so the unwinder needs no help.
    let (unwinder, prehooked) = if counting { (0, Vec::new()) } else { unwind::install(&objs) };
    let kind = if counting { hook::SlotKind::Count } else { hook::SlotKind::Trace };
    let mut table = hook::ImageTable::new(pid);
    table.push_lines(&args::rule_lines());
    let mut t = Tracer { pid, sid, dir, libs, prehooked, table, seen: HashMap::new(), kind, filters };
    let (hooked, skipped, written) = t.hook_new_objects(&objs)?;
    plan_cache::forget_spare();
    if !written {
        t.write_table()?;
    }
    if verbose() {
        warn(&format!(
            "pid {pid}: {hooked} functions hooked, {skipped} skipped, {unwinder} unwinder hooks, in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        ));
    }
    *TRACER.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    ACTIVE.store(true, Ordering::Release);
    {
        let _quiet = thread::quiet();
        mono::attach();
    }
    if counting {
        count::setup_done();
    }
    Ok(())
}

static REAL_PRCTL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
static REAL_DLOPEN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// The next definition of `name` after the agent's own (the C library's, for the functions
/// the agent interposes), looked up once, quietly: with libc traced, `dlsym`'s calls are the
/// agent's, not the program's. 0 if there is none.
pub(crate) fn next_definition(cell: &'static std::sync::OnceLock<usize>, name: &core::ffi::CStr) -> usize {
    *cell.get_or_init(|| {
        let _quiet = thread::quiet();
        // SAFETY: RTLD_NEXT lookup with a valid C string.
        unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
    })
}

type PrctlFn = unsafe extern "C" fn(libc::c_int, libc::c_ulong, libc::c_ulong, libc::c_ulong, libc::c_ulong) -> libc::c_int;

/// `prctl`, interposed only to say why the program is about to die: in timing mode every
/// hooked call reads the time-stamp counter, and a program that turns it off (`PR_SET_TSC`
/// with `PR_TSC_SIGSEGV`, or seccomp's strict mode, which does too) gets SIGSEGV at its next
/// hooked call. The call itself goes through unchanged.
///
/// # Safety
/// Same contract as the C library's `prctl` (variadic there: on x86-64 the five integer
/// arguments travel in the same registers either way).
#[no_mangle]
pub unsafe extern "C" fn prctl(option: libc::c_int, a2: libc::c_ulong, a3: libc::c_ulong, a4: libc::c_ulong, a5: libc::c_ulong) -> libc::c_int {
    let real = next_definition(&REAL_PRCTL, c"prctl");
    let tsc_off = (option == libc::PR_SET_TSC && a2 == libc::PR_TSC_SIGSEGV as libc::c_ulong)
        || (option == libc::PR_SET_SECCOMP && a2 == libc::SECCOMP_MODE_STRICT as libc::c_ulong);
    if tsc_off && active() && !count_mode() {
        warn("the program turns the time-stamp counter off (prctl): timing mode reads it at every hooked call, so the next one ends the program with SIGSEGV; record it with --mode count");
    }
    if real == 0 {
        stubs::set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: `real` is the C library's prctl, called with the caller's arguments.
    unsafe { std::mem::transmute::<usize, PrctlFn>(real)(option, a2, a3, a4, a5) }
}

type DlopenFn = unsafe extern "C" fn(*const libc::c_char, libc::c_int) -> *mut libc::c_void;

/// `dlopen`, interposed (the agent is preloaded, so calls through the PLT come here): after
/// the real one returns, libraries matching `--lib` get hooked. Their constructors have run
/// by then and are not traced.
///
/// # Safety
/// Same contract as the C library's `dlopen`.
#[no_mangle]
pub unsafe extern "C" fn dlopen(filename: *const libc::c_char, flags: libc::c_int) -> *mut libc::c_void {
    let real = next_definition(&REAL_DLOPEN, c"dlopen");
    if real == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `real` is the next definition of dlopen, with the same signature.
    let h = unsafe { std::mem::transmute::<usize, DlopenFn>(real)(filename, flags) };
    if !h.is_null() && active() {
        let _quiet = thread::quiet();
        mono::mappings_changed();
        mono::attach();
        let mut g = TRACER.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = g.as_mut() {
            if !t.libs.is_empty() || t.filters.app_only() {
                let objs = hook::loaded_objects();
                t.follow_fork();
                if let Err(e) = t.hook_new_objects(&objs) {
                    warn(&format!("after dlopen: {e}"));
                }
            }
        }
    }
    h
}
