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

pub mod hook;
pub mod region;
pub mod stubs;
pub mod sys;
pub mod thread;
pub mod unwind;

use std::sync::atomic::{AtomicBool, Ordering};

static ACTIVE: AtomicBool = AtomicBool::new(false);

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
    if active() {
        thread::process_exit();
    }
}

fn setup(shm: &str) -> Result<(), String> {
    let sid = region::attach(shm)?;
    let pid = sys::getpid();
    region::abandon_previous_images(pid);
    let dir = std::env::var_os(fnscope_abi::ENV_DIR).ok_or("FNSCOPE_DIR is not set")?;
    let libs: Vec<String> = std::env::var(fnscope_abi::ENV_LIBS)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    thread::install_process_hooks();
    let objs = hook::loaded_objects();
    // The unwinder's entry points get pre-hooks first; tracing must leave them alone.
    let (unwinder, prehooked) = unwind::install(&objs);
    let mut table = hook::ImageTable::new(pid);
    let (mut hooked, mut skipped) = (0, 0);
    for (i, obj) in objs.iter().enumerate() {
        if hook::never_hook(&obj.path, obj) {
            continue;
        }
        let wanted = i == 0 || libs.iter().any(|p| obj.path.to_string_lossy().contains(p.as_str()));
        if !wanted {
            continue;
        }
        match hook::hook_module(obj, &mut table, &prehooked) {
            Ok(r) => {
                hooked += r.hooked;
                skipped += r.skipped;
            }
            Err(e) => warn(&format!("not tracing {}: {e}", obj.path.display())),
        }
    }
    let images = std::path::Path::new(&dir).join("images");
    std::fs::create_dir_all(&images).map_err(|e| format!("{}: {e}", images.display()))?;
    let tmp = images.join(format!("{sid}.txt.tmp"));
    std::fs::write(&tmp, table.text()).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, images.join(format!("{sid}.txt"))).map_err(|e| format!("{}: {e}", tmp.display()))?;
    if verbose() {
        warn(&format!("pid {pid}: {hooked} functions hooked, {skipped} skipped, {unwinder} unwinder hooks"));
    }
    ACTIVE.store(true, Ordering::Release);
    Ok(())
}
