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

pub mod count;
pub mod hook;
pub mod region;
pub mod stubs;
pub mod sys;
pub mod thread;
pub mod unwind;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static ACTIVE: AtomicBool = AtomicBool::new(false);
static COUNT_MODE: AtomicBool = AtomicBool::new(false);

/// Whether the agent counts calls instead of timing them.
pub fn count_mode() -> bool {
    COUNT_MODE.load(Ordering::Relaxed)
}

/// Whether the agent set itself up and threads should be traced.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

fn verbose() -> bool {
    std::env::var_os(fnscope_abi::ENV_VERBOSE).is_some_and(|v| v == "1")
}

/// Prints a warning on stderr (start-up only).
pub fn warn(msg: &str) {
    eprintln!("fnscope: {msg}");
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = agent_init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = agent_fini;

extern "C" fn agent_init() {
    let Some(shm) = std::env::var_os(fnscope_abi::ENV_SHM) else { return };
    if let Err(e) = setup(&shm.to_string_lossy()) {
        warn(&format!("tracing disabled in pid {}: {e}", std::process::id()));
    }
}

extern "C" fn agent_fini() {
    if active() && !count_mode() {
        thread::process_exit();
    }
}

/// What the agent keeps after start-up, for libraries loaded later.
struct Tracer {
    pid: u32,
    sid: u32,
    dir: PathBuf,
    libs: Vec<String>,
    prehooked: Vec<u64>,
    table: hook::ImageTable,
    /// Load addresses of the objects already looked at.
    seen: HashSet<u64>,
    /// Slots to build: tracing or counting.
    kind: hook::SlotKind,
}

static TRACER: Mutex<Option<Tracer>> = Mutex::new(None);

impl Tracer {
    /// Hooks the objects not seen yet that the user asked for (the main executable, and
    /// libraries matching `--lib`); writes the image table before patching, so that the
    /// recorder can name every id a record may carry.
    fn hook_new_objects(&mut self, objs: &[hook::Loaded]) -> Result<(usize, usize), String> {
        let mut pending = Vec::new();
        let (mut hooked, mut skipped) = (0, 0);
        for (i, obj) in objs.iter().enumerate() {
            if !self.seen.insert(obj.lo) || hook::never_hook(&obj.path, obj) {
                continue;
            }
            let path = obj.path.to_string_lossy();
            let wanted = i == 0 || self.libs.iter().any(|p| path.contains(p.as_str()));
            if !wanted {
                continue;
            }
            let max_id = if self.kind == hook::SlotKind::Count && count::capacity() > 0 { count::capacity() } else { u32::MAX };
            match hook::plan_module(obj, &mut self.table, &self.prehooked, self.kind, max_id) {
                Ok(r) => {
                    hooked += r.hooked;
                    skipped += r.skipped;
                    pending.push(r.patches);
                }
                Err(e) => warn(&format!("not tracing {}: {e}", obj.path.display())),
            }
        }
        if !pending.is_empty() {
            self.write_table()?;
            if self.kind == hook::SlotKind::Count {
                if count::capacity() == 0 {
                    // Room for libraries loaded later, when there may be some.
                    let headroom = if self.libs.is_empty() { 0 } else { 16384 };
                    count::create(&self.dir, self.sid, self.table.ids() + headroom)?;
                }
                count::set_nfuncs(self.table.ids());
            }
            for p in pending {
                hook::write_patches(&p)?;
            }
        }
        Ok((hooked, skipped))
    }

    fn write_table(&self) -> Result<(), String> {
        let images = self.dir.join("images");
        std::fs::create_dir_all(&images).map_err(|e| format!("{}: {e}", images.display()))?;
        let tmp = images.join(format!("{}.txt.tmp{}", self.sid, self.pid));
        std::fs::write(&tmp, self.table.text()).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, images.join(format!("{}.txt", self.sid))).map_err(|e| format!("{}: {e}", tmp.display()))
    }
}

fn setup(shm: &str) -> Result<(), String> {
    let started = std::time::Instant::now();
    let sid = region::attach(shm)?;
    let pid = sys::getpid();
    region::abandon_previous_images(pid);
    let dir = PathBuf::from(std::env::var_os(fnscope_abi::ENV_DIR).ok_or("FNSCOPE_DIR is not set")?);
    let libs: Vec<String> = std::env::var(fnscope_abi::ENV_LIBS)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let counting = std::env::var(fnscope_abi::ENV_MODE).is_ok_and(|m| m == "count");
    COUNT_MODE.store(counting, Ordering::Relaxed);
    thread::install_process_hooks();
    let objs = hook::loaded_objects();
    // The unwinder's entry points get pre-hooks first; tracing must leave them alone. Count
    // mode leaves return addresses alone, so the unwinder needs no help.
    let (unwinder, prehooked) = if counting { (0, Vec::new()) } else { unwind::install(&objs) };
    let kind = if counting { hook::SlotKind::Count } else { hook::SlotKind::Trace };
    let mut t = Tracer { pid, sid, dir, libs, prehooked, table: hook::ImageTable::new(pid), seen: HashSet::new(), kind };
    let (hooked, skipped) = t.hook_new_objects(&objs)?;
    t.write_table()?;
    if verbose() {
        warn(&format!(
            "pid {pid}: {hooked} functions hooked, {skipped} skipped, {unwinder} unwinder hooks, in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        ));
    }
    *TRACER.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
    ACTIVE.store(true, Ordering::Release);
    Ok(())
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
    static REAL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let real = *REAL.get_or_init(|| {
        // SAFETY: RTLD_NEXT lookup of a symbol the C library defines.
        unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlopen".as_ptr()) as usize }
    });
    if real == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `real` is the next definition of dlopen, with the same signature.
    let h = unsafe { std::mem::transmute::<usize, DlopenFn>(real)(filename, flags) };
    if !h.is_null() && active() {
        let mut g = TRACER.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = g.as_mut() {
            if !t.libs.is_empty() {
                let objs = hook::loaded_objects();
                if t.pid != sys::getpid() {
                    // A forked child: the parent's table (same session id) must not change
                    // under it, so the child continues under an id of its own.
                    t.pid = sys::getpid();
                    if !count_mode() {
                        t.sid = region::renew_sid();
                        thread::restart_stream();
                    }
                }
                if let Err(e) = t.hook_new_objects(&objs) {
                    warn(&format!("after dlopen: {e}"));
                }
            }
        }
    }
    h
}
