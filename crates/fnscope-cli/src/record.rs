//! `fnscope record`: runs the program with the agent preloaded and copies what it records
//! into the trace file while it runs.

use anyhow::{anyhow, bail, Context, Result};
use fnscope_abi::{
    chunk_offset, records_per_chunk, ChunkHeader, Record, RegionHeader, CHUNK_FLAG_ABANDONED, CHUNK_FREE,
    CHUNK_FULL, CHUNK_HEADER_SIZE, CHUNK_OWNED, CHUNK_RETIRED, RECORD_SIZE,
};
use crate::flight::{Flight, FlightOptions, Segment, Trigger};
use fnscope_format::{EndInfo, Meta, TraceWriter};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Options of `record`.
pub struct RecordOptions {
    /// Trace directory.
    pub output: PathBuf,
    /// Library path patterns to hook besides the main executable.
    pub libs: Vec<String>,
    /// Number of chunks in the shared region.
    pub chunks: u32,
    /// Bytes per chunk (`fnscope_abi::DEFAULT_CHUNK_SIZE` or `FLIGHT_CHUNK_SIZE`).
    pub chunk_size: u32,
    /// Print what the agent does.
    pub verbose: bool,
    /// Count calls only (no timestamps).
    pub count: bool,
    /// Trace the programs the program runs with `exec` too.
    pub follow_exec: bool,
    /// Use (and fill) the caches: module analyses (the agent's) and compressed image tables
    /// ([`crate::table_cache`]).
    pub plan_cache: bool,
    /// Turn Mono's inlining off (`MONO_ENV_OPTIONS`).
    pub mono_no_inline: bool,
    /// Full chunks left waiting beyond which the oldest are written uncompressed (RAW); by
    /// default [`DEFAULT_SPILL_AFTER`], or half the region (at most [`SATURATED_HOLD_BYTES`])
    /// while every processor is busy.
    pub spill_after: Option<usize>,
    /// Record-time filters.
    pub filters: RecordFilters,
    /// The flight recorder's settings, in flight mode.
    pub flight: Option<FlightOptions>,
    /// Program and arguments.
    pub command: Vec<String>,
    /// Arguments, return values and injections: the agent's `FNSCOPE_ARGS` text.
    pub values: String,
}

/// `MONO_ENV_OPTIONS` with Mono's inliner turned off, keeping the options the user set.
fn mono_no_inline(old: Option<&std::ffi::OsStr>) -> std::ffi::OsString {
    with_option(old, " ", "-O=-inline")
}

/// `ASAN_OPTIONS` that let AddressSanitizer run with fnscope's agent loaded first: its
/// runtime checks that it is the first library loaded and ends the program otherwise, and
/// `LD_PRELOAD` puts the agent first. Nothing the agent interposes (`dlopen`, `prctl`, the
/// `exec` family) is lost to it: each calls on to the next definition, ASan's interceptor
/// where it has one. The user's options are kept.
fn asan_options(old: Option<&std::ffi::OsStr>) -> std::ffi::OsString {
    with_option(old, ":", "verify_asan_link_order=0")
}

/// The option list `old` (of an environment variable, items separated by `sep`) with `opt`
/// added last, where it overrides an earlier setting of the same option.
fn with_option(old: Option<&std::ffi::OsStr>, sep: &str, opt: &str) -> std::ffi::OsString {
    let mut v = old.map(std::ffi::OsStr::to_os_string).unwrap_or_default();
    if !v.is_empty() {
        v.push(sep);
    }
    v.push(opt);
    v
}

/// Record-time filters: what is left out before anything is stored.
#[derive(clap::Args)]
pub struct FilterArgs {
    /// Hook only the application's code: the program and every library outside the system
    /// folders (hooked without --lib); libraries in them are not hooked, even with --lib.
    /// `fnscope info` lists the modules treated as system.
    #[arg(long)]
    app_only: bool,
    /// A system folder for --app-only (repeatable). Replaces the defaults: /usr/lib, /lib,
    /// /lib64, /usr/lib64, /usr/libexec, /usr/local/lib, /opt/mono.
    #[arg(long = "system-dir", value_name = "DIR", requires = "app_only")]
    system_dirs: Vec<PathBuf>,
    /// Hook only functions matching PATTERN (repeatable): a glob on the name, @GLOB on the
    /// module, file:GLOB on the source file (from debug information). Decided when hooking,
    /// so the others cost nothing. To keep a function with everything it calls, filter the
    /// views instead (`export --filter`).
    #[arg(long, value_name = "PATTERN")]
    filter: Vec<String>,
    /// Do not hook functions matching PATTERN (repeatable; forms as for --filter). Their
    /// callees stay, under the nearest hooked caller.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Record only calls that took at least DURATION (e.g. 50us): the rest are dropped as
    /// they return. Their callers last longer, so each call kept comes with its callers.
    #[arg(long, value_name = "DURATION")]
    min_duration: Option<String>,
    /// Record only the N outermost hooked levels of each thread; deeper calls run untraced.
    #[arg(long, value_name = "N")]
    depth: Option<u32>,
}

/// Record-time filters, checked.
#[derive(Default)]
pub struct RecordFilters {
    app_only: bool,
    system_dirs: Vec<String>,
    filter: Vec<String>,
    exclude: Vec<String>,
    min_duration_ns: u64,
    depth: u32,
}

impl FilterArgs {
    /// Checks the options (patterns, durations, and what count mode cannot do).
    pub fn check(self, count: bool) -> Result<RecordFilters> {
        for (option, list) in [("--filter", &self.filter), ("--exclude", &self.exclude)] {
            for p in list {
                let glob = p.strip_prefix('@').or_else(|| p.strip_prefix("file:")).unwrap_or(p);
                if p.contains('\n') || glob.is_empty() {
                    bail!("{option} {p:?}: write a glob such as 'Py*', '@libfoo.so*' or 'file:*/render/*'");
                }
                glob::Pattern::new(glob).map_err(|e| anyhow!("{option} {p:?}: {e}; write a glob such as 'Py*' or '@libfoo.so*'"))?;
            }
        }
        let min_duration_ns = self.min_duration.as_deref().map(|d| fnscope_export::parse_duration(d, "--min-duration")).transpose()?;
        if count && (min_duration_ns.is_some() || self.depth.is_some()) {
            bail!("--min-duration and --depth look at calls as they run: they need timing mode, not --mode count");
        }
        if self.depth == Some(0) {
            bail!("--depth 0 would record nothing: give the number of outermost levels to keep, 1 or more");
        }
        let mut system_dirs = Vec::new();
        for d in &self.system_dirs {
            let s = d.to_string_lossy();
            if !d.is_absolute() || s.contains(':') {
                bail!("--system-dir {s:?}: give an absolute path without ':'");
            }
            system_dirs.push(s.into_owned());
        }
        Ok(RecordFilters {
            app_only: self.app_only,
            system_dirs,
            filter: self.filter,
            exclude: self.exclude,
            min_duration_ns: min_duration_ns.unwrap_or(0),
            depth: self.depth.unwrap_or(0),
        })
    }
}

/// Measures the time-stamp counter's rate against the monotonic clock over `ms`
/// milliseconds: the agent compares call durations in ticks.
fn tsc_rate(ms: u64) -> f64 {
    let (t0, m0) = (tsc(), clock_ns(libc::CLOCK_MONOTONIC));
    std::thread::sleep(Duration::from_millis(ms));
    let (t1, m1) = (tsc(), clock_ns(libc::CLOCK_MONOTONIC));
    (t1 - t0) as f64 / (m1 - m0).max(1) as f64
}

/// Finds `name` the way a shell would: as a path if it contains `/`, else on `PATH`.
pub fn resolve_program(name: &str) -> Result<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        if let Err(e) = std::fs::metadata(&p) {
            if e.kind() == std::io::ErrorKind::NotFound {
                bail!("{name}: no such file; check the path of the program to record");
            }
            bail!("cannot look at {name} ({e}); check the path of the program to record and the permissions of its folders");
        }
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if p.is_file() && access(&p, libc::X_OK) {
            return Ok(p);
        }
    }
    bail!("{name}: command not found in PATH; give the program's path")
}

/// Whether the calling user may access `path` as `mode` (`libc::X_OK`, ...), as `execve` will judge it.
fn access(path: &Path, mode: libc::c_int) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    unsafe { libc::access(c.as_ptr(), mode) == 0 }
}

/// Refuses programs the agent cannot get into, with the reason and what to do.
fn check_program(path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let md = std::fs::metadata(path).with_context(|| format!("cannot look at {shown}; check the path of the program to record"))?;
    if md.is_dir() {
        bail!("{shown} is a folder, not a program: give the path of the executable to record after `--`");
    }
    if !md.is_file() {
        bail!("{shown} is not a regular file (a device, pipe or socket): give the path of the executable to record after `--`");
    }
    if md.len() == 0 {
        bail!("{shown} is empty, so it is not a program: give the path of the executable to record (rebuild it if a build left it empty)");
    }
    if !access(path, libc::X_OK) {
        bail!(
            "{shown} is not executable (mode {:o}): make it executable with `chmod +x {shown}`, or record its interpreter with it as an argument",
            md.mode() & 0o7777
        );
    }
    let mut head = [0u8; 4];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(path).with_context(|| {
            format!("cannot read {shown}: fnscope reads the program to find its functions; make it readable (chmod +r)")
        })?;
        let n = f.read(&mut head).with_context(|| format!("cannot read {shown}"))?;
        if n >= 2 && &head[..2] == b"#!" {
            // A script: its interpreter is what runs, and what gets traced (the kernel ignores
            // set-user-ID bits on scripts).
            return Ok(());
        }
    }
    if let Some(why) = secure_mode_reason(path, &md) {
        bail!(
            "{shown} {why}: the loader runs it in secure mode and ignores LD_PRELOAD, so fnscope's agent would not load \
             and the trace would be empty. Record it as root (a set-user-ID or set-group-ID one also as its owner or \
             group), or record a copy without the bit or the capabilities (`cp {shown} /tmp/` drops them)"
        );
    }
    let facts = fnscope_symbols::program_facts(path).map_err(|e| anyhow!("{shown} cannot be read as a program: {e}"))?;
    if facts.is_static {
        bail!(
            "{shown} is statically linked: fnscope puts its agent in with LD_PRELOAD, which a static program never loads. \
             Record a dynamically linked build of it (`fnscope funcs` can still list its functions)"
        );
    }
    if !facts.named && !facts.unwind {
        eprintln!(
            "fnscope: warning: {shown} has neither symbols nor unwind tables (.eh_frame), by which fnscope finds functions: \
             only its exported functions can be traced. Record a build that keeps one or the other"
        );
    } else if !facts.named {
        eprintln!("fnscope: note: {shown} is stripped: exported functions keep their names, the others are named sub_<address>");
    }
    Ok(())
}

/// Why `execve` of `path` by this process would set AT_SECURE (the loader's secure mode, in
/// which LD_PRELOAD is ignored): a set-user-ID bit with an owner other than our effective
/// uid, a set-group-ID bit (with group execute, as the kernel requires) with a group other
/// than our effective gid, or file capabilities (`setcap`) that would raise a process whose
/// real uid is not root. `None` when the bits would not take effect: a `nosuid` mount, or
/// `no_new_privs` set on this process.
fn secure_mode_reason(path: &Path, md: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mode = md.mode();
    let setuid = mode & libc::S_ISUID != 0;
    let setgid = mode & (libc::S_ISGID | libc::S_IXGRP) == (libc::S_ISGID | libc::S_IXGRP);
    let caps = raised_by_file_caps(path);
    if !setuid && !setgid && caps.is_none() {
        return None;
    }
    // SAFETY: prctl(PR_GET_NO_NEW_PRIVS) only reads a flag of this process.
    if unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1 {
        return None;
    }
    if let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())) {
        // SAFETY: `st` is a valid out-parameter and `c` a NUL-terminated path.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0 && st.f_flag & libc::ST_NOSUID != 0 {
            return None;
        }
    }
    // SAFETY: geteuid and getegid cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if setuid && md.uid() != euid {
        return Some(format!("is set-user-ID (owned by uid {}, you run as uid {euid})", md.uid()));
    }
    if setgid && md.gid() != egid {
        return Some(format!("is set-group-ID (group gid {}, you run as gid {egid})", md.gid()));
    }
    caps
}

/// Whether the file capabilities of `path` would raise this process when it runs it: as the
/// kernel decides (`cap_bprm_creds_from_file`), a process whose real uid is not root is
/// raised by a file whose capabilities are marked effective, or permit one it does not hold.
/// Says which, for the error.
fn raised_by_file_caps(path: &Path) -> Option<String> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())).ok()?;
    let mut xattr = [0u8; 24];
    // SAFETY: `c` and the attribute name are NUL-terminated; the kernel writes at most
    // `xattr.len()` bytes.
    let n = unsafe { libc::getxattr(c.as_ptr(), c"security.capability".as_ptr(), xattr.as_mut_ptr().cast(), xattr.len()) };
    // SAFETY: getuid cannot fail.
    if n < 12 || unsafe { libc::getuid() } == 0 {
        return None;
    }
    let word = |at: usize| u32::from_le_bytes(xattr[at..at + 4].try_into().expect("4 bytes"));
    // vfs_cap_data: magic and flags, then permitted and inheritable, low words first; the
    // high words from revision 2 on.
    let (magic, effective) = (word(0), word(0) & 1 != 0);
    let permitted = u64::from(word(4)) | if magic >> 24 >= 2 && n >= 20 { u64::from(word(12)) << 32 } else { 0 };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let held = status.lines().find_map(|l| l.strip_prefix("CapPrm:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0);
    (effective || permitted & !held != 0).then(|| format!("has file capabilities (setcap, {permitted:#x}) that you do not hold"))
}

/// The name of the lock file in a trace folder.
const LOCK_FILE: &str = "record.lock";
/// Room set aside in the trace folder while recording (see [`Reserve`]).
const RESERVE_FILE: &str = ".record.reserve";
/// How much: an END chunk names every thread, about 50 bytes each.
const RESERVE_BYTES: i64 = 256 << 10;

/// Room on the trace's file system set aside for its END chunk, which a full disk would
/// otherwise leave out (and with it the clock's calibration): given back just before it is
/// written after a failed write, and when the recording ends.
struct Reserve(Option<PathBuf>);

impl Reserve {
    /// Sets the room aside in `dir`; best effort (a file system without `fallocate` has none).
    fn make(dir: &Path) -> Reserve {
        let path = dir.join(RESERVE_FILE);
        let made = std::fs::File::create(&path).ok().is_some_and(|f| {
            nix::fcntl::fallocate(&f, nix::fcntl::FallocateFlags::empty(), 0, RESERVE_BYTES).is_ok()
        });
        if !made {
            let _ = std::fs::remove_file(&path);
        }
        Reserve(made.then_some(path))
    }

    /// Gives the room back.
    fn release(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        self.release();
    }
}

/// A trace folder held by this recorder: an exclusive `flock` on `DIR/record.lock`, which
/// holds the recorder's pid. The kernel drops the lock when the file is closed, so also when
/// the recorder dies; the file is left in place, since removing it would let a third recorder
/// lock a new file while a second one still holds the old one.
struct DirLock {
    _file: std::fs::File,
}

/// Takes the trace folder `dir` for this recorder: checks it may hold a trace, creates it and
/// locks it. A folder another `record` holds is refused with that recorder's pid. A trace
/// recorded there earlier is kept as `DIR.old` (replacing an older `DIR.old` that holds
/// nothing but a trace), as uftrace keeps `uftrace.data.old` and perf `perf.data.old`:
/// recording again by mistake must not lose a recording. Leftovers of a recording that left
/// no trace file are removed.
fn prepare_dir(dir: &Path) -> Result<DirLock> {
    let shown = dir.display();
    if dir.exists() {
        if !dir.is_dir() {
            bail!("{shown} is not a folder; choose a folder for the trace with -o");
        }
        if !holds_trace_or_nothing(dir) {
            bail!("{shown} exists and is not an fnscope trace; choose another folder with -o");
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {shown}"))?;
    let mut file = lock_dir(dir)?;
    if dir.join(fnscope_format::TRACE_FILE).exists() {
        let real = keep_earlier_trace(dir)?;
        std::fs::create_dir_all(&real).with_context(|| format!("cannot create {}", real.display()))?;
        file = lock_dir(&real)?;
    }
    let _ = std::fs::remove_dir_all(dir.join("images"));
    // A killed recorder's.
    let _ = std::fs::remove_file(dir.join(RESERVE_FILE));
    // Snapshots of an earlier flight recording belong to that trace.
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("snapshot-") || name.starts_with(".snapshot-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    std::fs::create_dir_all(dir.join("images")).with_context(|| format!("cannot create {shown}/images"))?;
    Ok(DirLock { _file: file })
}

/// Moves the trace folder `dir` (locked by this recorder, holding a trace) to `DIR.old`, so
/// that recording again does not lose it, and returns the folder's real path, now free. An
/// older `DIR.old` is replaced only when it holds nothing but a trace and no recorder uses
/// it, and it is set aside rather than removed until the move succeeded: when the move fails,
/// both trace folders are as they were.
fn keep_earlier_trace(dir: &Path) -> Result<PathBuf> {
    let shown = dir.display();
    // The folder itself, not a link to it nor `run/` or `.`, is what moves.
    let real = std::fs::canonicalize(dir).with_context(|| format!("cannot find {shown}"))?;
    let cwd = std::env::current_dir().ok().and_then(|d| std::fs::canonicalize(d).ok());
    if cwd.as_ref().is_some_and(|c| c.starts_with(&real)) {
        bail!(
            "{shown} holds a trace, which fnscope would keep by renaming the folder, but it is (or holds) the \
             current folder; record into another folder with -o"
        );
    }
    let with_suffix = |suffix: &str| {
        let mut p = real.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    };
    let old = with_suffix(".old");
    let older = with_suffix(&format!(".old.{}.removing", std::process::id()));
    let mut set_aside = None;
    if std::fs::symlink_metadata(&old).is_ok() {
        if !old.is_dir() || std::fs::symlink_metadata(&old).is_ok_and(|m| m.file_type().is_symlink()) || !only_trace_entries(&old) {
            bail!(
                "{shown} holds a trace, which fnscope keeps as {}, but that exists and holds more than an fnscope \
                 trace; move it, or record into another folder with -o",
                old.display()
            );
        }
        // Held while it is set aside, so that no recorder starts into it meanwhile.
        let lock = lock_dir(&old)?;
        std::fs::rename(&old, &older).with_context(|| {
            format!("cannot replace the older trace {}; remove it, or record into another folder with -o", old.display())
        })?;
        set_aside = Some(lock);
    }
    if let Err(e) = std::fs::rename(&real, &old) {
        if set_aside.is_some() {
            let _ = std::fs::rename(&older, &old);
        }
        return Err(e).with_context(|| {
            format!(
                "cannot keep the trace recorded earlier in {shown} as {} (fnscope renames the folder to keep it); \
                 move the trace away yourself, or record into another folder with -o",
                old.display()
            )
        });
    }
    if set_aside.take().is_some() {
        if let Err(e) = std::fs::remove_dir_all(&older) {
            eprintln!("fnscope: warning: cannot remove the older trace set aside as {}: {e}", older.display());
        }
    }
    eprintln!("fnscope: note: the trace recorded earlier in {shown} is kept as {}", old.display());
    Ok(real)
}

/// What a trace folder may hold (`record`'s files, an interrupted merge's, a flight
/// recorder's snapshots): anything else is the user's.
fn is_trace_entry(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    [fnscope_format::TRACE_FILE, LOCK_FILE, RESERVE_FILE, "images", "counts"].contains(&&*name)
        || name == format!("{}.tmp", fnscope_format::TRACE_FILE)
        || name.starts_with("snapshot-")
        || name.starts_with(".snapshot-")
}

/// Whether every entry of the folder `dir` is one a trace folder holds (so that removing it
/// loses nothing but a trace).
fn only_trace_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| d.into_iter().all(|e| e.is_ok_and(|e| is_trace_entry(&e.file_name()))))
}

/// Whether the folder `dir` holds an fnscope trace (or what a recording left of one), or
/// nothing but a recorder's lock file.
fn holds_trace_or_nothing(dir: &Path) -> bool {
    let is_trace = dir.join(fnscope_format::TRACE_FILE).exists() || dir.join("images").exists();
    is_trace
        || std::fs::read_dir(dir)
            .map(|d| d.filter_map(|e| e.ok()).all(|e| e.file_name() == LOCK_FILE))
            .unwrap_or(false)
}

/// Locks the trace folder `dir` for this recorder (its pid in the lock file), or says which
/// recorder holds it.
fn lock_dir(dir: &Path) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let shown = dir.display();
    let lock_path = dir.join(LOCK_FILE);
    // Another recorder may move the folder (to DIR.old) between our open and our lock, and
    // then the lock would be on the moved folder's file: lock again until the file locked is
    // the one at the path. Each retry means another recorder took a turn, so a few suffice.
    for _ in 0..8 {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .with_context(|| format!("cannot create {}", lock_path.display()))?;
        // SAFETY: flock on a file descriptor we own; non-blocking, so it returns at once.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(e).with_context(|| format!("cannot lock {}", lock_path.display()));
            }
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let who = match text.trim().parse::<u32>() {
                Ok(pid) => format!("another `fnscope record` (pid {pid})"),
                Err(_) => "another `fnscope record`".to_string(),
            };
            bail!("{shown} is in use by {who}: wait for it to finish, or record into another folder with -o");
        }
        let held = file.metadata().with_context(|| format!("cannot read {}", lock_path.display()))?;
        let same = std::fs::metadata(&lock_path).is_ok_and(|m| (m.dev(), m.ino()) == (held.dev(), held.ino()));
        if !same {
            continue;
        }
        let pid = std::process::id();
        file.set_len(0)
            .and_then(|_| file.rewind())
            .and_then(|_| writeln!(file, "{pid}"))
            .with_context(|| format!("cannot write {}", lock_path.display()))?;
        return Ok(file);
    }
    bail!("{shown} keeps being moved by other recorders; record into another folder with -o")
}

fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-parameter.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The shared region, as the recorder sees it.
struct Region {
    map: memmap2::MmapMut,
    /// What the agents open ([`fnscope_abi::ENV_SHM`]).
    path: PathBuf,
    /// Kept open: with no file on `/dev/shm`, `path` is this descriptor's `/proc` link.
    _file: std::fs::File,
    /// Whether `path` is a file on `/dev/shm`, to be removed at the end.
    on_shm: bool,
    chunk_size: u32,
    nchunks: u32,
    slots: u32,
}

/// Where the region goes when `/dev/shm` has no room for all of it.
const MEMFD_NAME: &std::ffi::CStr = c"fnscope-region";

impl Region {
    /// Makes the region: a file on `/dev/shm` when that file system has room for all of it,
    /// else memory of its own (`memfd_create`), which the agents open through this process's
    /// `/proc/<pid>/fd` link. A file system on `/dev/shm` smaller than the region (64 MiB in
    /// a Docker container by default) takes the file, but the first page written past its
    /// room is a SIGBUS, to the recorder or to the program, in the middle of the run;
    /// memory of its own is limited by the memory there is, as the program's is.
    fn create(nchunks: u32, chunk_size: u32, verbose: bool) -> Result<Region> {
        let slots = fnscope_abi::DEFAULT_STACK_SLOTS;
        let size = fnscope_abi::region_size(chunk_size, nchunks, slots) as u64;
        let shm = Path::new("/dev/shm");
        let room = nix::sys::statvfs::statvfs(shm).map(|s| s.blocks_available().saturating_mul(s.fragment_size())).unwrap_or(0);
        let (file, path, on_shm) = if room >= size {
            let path = shm.join(format!("fnscope-{}-{}", std::process::id(), clock_ns(libc::CLOCK_MONOTONIC)));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .with_context(|| format!("cannot create the shared buffer {}", path.display()))?;
            (file, path, true)
        } else {
            let fd = nix::sys::memfd::memfd_create(MEMFD_NAME, nix::sys::memfd::MFdFlags::MFD_CLOEXEC).with_context(|| {
                format!("/dev/shm has room for {} MiB, the shared buffer needs {} MiB, and no memory could be had for it instead (memfd_create); record with a smaller --buffer-mb", room >> 20, size >> 20)
            })?;
            let file = std::fs::File::from(fd);
            let path = PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), std::os::fd::AsRawFd::as_raw_fd(&file)));
            if verbose {
                eprintln!("fnscope: /dev/shm has room for {} MiB, the shared buffer needs {} MiB: it is memory of its own", room >> 20, size >> 20);
            }
            (file, path, false)
        };
        file.set_len(size).with_context(|| format!("cannot size the shared buffer {}", path.display()))?;
        // SAFETY: a file we just created and own; nobody else maps it until the program starts.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.with_context(|| {
            format!(
                "cannot map the shared buffer ({} MiB: {} of chunks, {} of call stacks), which every traced process maps too; if the address space is limited (ulimit -v), raise the limit by that much, or record with a smaller --buffer-mb",
                size >> 20,
                (fnscope_abi::chunk_offset(chunk_size, nchunks) as u64) >> 20,
                (size - fnscope_abi::chunk_offset(chunk_size, nchunks) as u64) >> 20
            )
        })?;
        let hdr = map.as_mut_ptr() as *mut RegionHeader;
        // SAFETY: the mapping is larger than the header and page aligned.
        unsafe {
            (*hdr).magic = fnscope_abi::REGION_MAGIC;
            (*hdr).version = fnscope_abi::REGION_VERSION;
            (*hdr).chunk_size = chunk_size;
            (*hdr).nchunks = nchunks;
            (*hdr).recorder_pid = std::process::id();
            (*hdr).stack_slots = slots;
        }
        Ok(Region { map, path, _file: file, on_shm, chunk_size, nchunks, slots })
    }

    fn header(&self) -> *mut RegionHeader {
        self.map.as_ptr() as *mut RegionHeader
    }

    fn chunk(&self, i: u32) -> *mut ChunkHeader {
        // SAFETY: i < nchunks, so the offset is inside the mapping.
        unsafe { self.map.as_ptr().add(chunk_offset(self.chunk_size, i)) as *mut ChunkHeader }
    }

    fn state(&self, i: u32) -> &AtomicU32 {
        // SAFETY: the aligned first word of a chunk header inside the mapping, which lives as
        // long as `self`.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.chunk(i)).state)) }
    }

    fn records(&self, i: u32, n: usize) -> &[Record] {
        let n = n.min(records_per_chunk(self.chunk_size));
        // SAFETY: the record area of chunk i holds records_per_chunk records, 8-byte aligned.
        unsafe { std::slice::from_raw_parts((self.chunk(i) as *const u8).add(CHUNK_HEADER_SIZE) as *const Record, n) }
    }

    /// Slots agents may have taken: they raise `slots_used` before taking one, so no slot at
    /// or past it was ever owned. Looking no further spares the pages of the others (reading a
    /// page of the region gives it memory), a few milliseconds at the end of every run.
    fn slots_used(&self) -> u32 {
        // SAFETY: aligned u32 in the header, raised by agents.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.header()).slots_used)) }.load(Ordering::Acquire).min(self.slots)
    }

    fn slot(&self, i: u32) -> *mut u8 {
        // SAFETY: i < slots, so the slot lies inside the mapping.
        unsafe { self.map.as_ptr().add(fnscope_abi::stack_slot_offset(self.chunk_size, self.nchunks, i)) as *mut u8 }
    }

    /// See `RegionHeader::untraced_images`.
    fn untraced_images(&self) -> u32 {
        // SAFETY: aligned u32 in the header, updated by agents atomically.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.header()).untraced_images)) }.load(Ordering::Relaxed)
    }

    fn unmatched_returns(&self) -> u64 {
        // SAFETY: aligned u64 in the header, updated by agents atomically.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.header()).unmatched_returns)) }
            .load(Ordering::Relaxed)
    }

    fn lost(&self) -> u64 {
        // SAFETY: aligned u64 in the header, updated by agents atomically.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.header()).lost_records)) }
            .load(Ordering::Relaxed)
    }
}

impl Region {
    /// The calls open on the shadow stack of slot `i` (deepest first: records are in the order
    /// calls end), as cut off at `now`, with the sequence number of the thread's next chunk;
    /// those shorter than `min_ticks` (`--min-duration`) are left out.
    /// The slot's owner is gone, or (for a snapshot) still running: then entries pushed or
    /// popped meanwhile may be missed, as in any snapshot of a running program.
    fn open_calls(&self, i: u32, now: u64, min_ticks: u64) -> (u64, Vec<Record>) {
        use fnscope_abi::{REC_FLAG_CUT, REC_FLAG_UNWOUND, SLOT_STATE_OFFSET, STATE_SEQ, STATE_SS_BASE, STATE_SS_TOP};
        let slot = self.slot(i);
        // SAFETY: the state lies in the slot's first page, inside the mapping.
        let (top, base, seq) = unsafe {
            let st = slot.add(SLOT_STATE_OFFSET);
            (
                std::ptr::read_volatile(st.add(STATE_SS_TOP) as *const u64),
                std::ptr::read_volatile(st.add(STATE_SS_BASE) as *const u64),
                std::ptr::read_volatile(st.add(STATE_SEQ) as *const u64),
            )
        };
        let open = (top.saturating_sub(base) / 32).min(fnscope_abi::SHADOW_ENTRIES as u64) as usize;
        let recs = (0..open)
            .rev()
            .filter_map(|d| {
                // SAFETY: entry d of the slot's shadow stack, inside the slot.
                let (t_entry, id, ret_slot) = unsafe {
                    let e = slot.add(4096 + d * 32) as *const u64;
                    (std::ptr::read_volatile(e.add(1)), std::ptr::read_volatile(e.add(2)), std::ptr::read_volatile(e.add(3)))
                };
                // A slot word of 0: an entry a stub was still writing (the call had not
                // started) or giving back (its record is written): no open call.
                (ret_slot != 0).then(|| Record::new(t_entry, now.max(t_entry), id as u32, d as u32, REC_FLAG_UNWOUND | REC_FLAG_CUT))
            })
            .filter(|r| r.ticks() >= min_ticks)
            .collect();
        (seq, recs)
    }

    /// The records a thread has written so far into chunk `i`, which it still owns: up to
    /// the first slot whose marker word is not written yet. The marker is written last, and
    /// x86 keeps stores in order, so the other words of a marked record are complete.
    fn live_records(&self, i: u32, from: usize) -> Vec<Record> {
        let cap = records_per_chunk(self.chunk_size);
        // SAFETY: the record area of chunk i, inside the mapping.
        let base = unsafe { (self.chunk(i) as *const u8).add(CHUNK_HEADER_SIZE) as *const Record };
        let mut out = Vec::new();
        for k in from..cap {
            // SAFETY: record k of the chunk; the marker is read first, volatile, and the
            // fence keeps the other reads after it.
            let r = unsafe {
                let p = base.add(k);
                let id_depth = std::ptr::read_volatile(std::ptr::addr_of!((*p).id_depth));
                if id_depth == 0 {
                    break;
                }
                std::sync::atomic::fence(Ordering::Acquire);
                Record {
                    t_entry: std::ptr::read_volatile(std::ptr::addr_of!((*p).t_entry)),
                    t_exit: std::ptr::read_volatile(std::ptr::addr_of!((*p).t_exit)),
                    id_depth,
                }
            };
            out.push(r);
        }
        out
    }

    /// The chunks in one of `states` (`CHUNK_OWNED`, `CHUNK_FULL`), in stream order: by image
    /// session, process, thread and sequence number.
    fn chunks_in(&self, states: &[u32]) -> Vec<ChunkRef> {
        let mut v = Vec::new();
        // SAFETY: aligned u32 in the header, raised by agents.
        let used = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.header()).chunks_used)) }.load(Ordering::Acquire);
        for index in 0..used.min(self.nchunks) {
            let state = self.state(index).load(Ordering::Acquire);
            if states.contains(&state) {
                // SAFETY: the header of a chunk a thread owns or has handed over; its owner
                // wrote these fields before taking it, and `nrec` before handing it over (the
                // acquire load above orders the reads after that).
                let c = unsafe { &*self.chunk(index) };
                let nrec = (state == CHUNK_FULL).then_some(c.nrec);
                v.push(ChunkRef { sid: c.image_sid, pid: c.pid, tid: c.tid, seq: c.seq, index, nrec });
            }
        }
        v.sort_unstable_by_key(|c| (c.sid, c.pid, c.tid, c.seq, c.index));
        v
    }

    fn requests(&self) -> &AtomicU32 {
        // SAFETY: aligned u32 in the header, shared with agents and `fnscope snapshot`.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.header()).snapshot_requests)) }
    }

    fn answered(&self) -> &AtomicU32 {
        // SAFETY: aligned u32 in the header, read by `fnscope snapshot`.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.header()).snapshots_answered)) }
    }
}

/// A chunk of the region as [`Region::chunks_in`] finds it.
struct ChunkRef {
    sid: u32,
    pid: u32,
    tid: u32,
    seq: u64,
    index: u32,
    /// Records in a FULL chunk; `None` for one a thread still owns.
    nrec: Option<u32>,
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.on_shm {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// See [`Recorder::image_copied`].
const IMAGE_RECOPY: Duration = Duration::from_millis(250);

/// How often the idle loop looks for new image tables. A table is written once its process
/// is hooked; copied then, while the program runs, it is not on the way out: a short-lived
/// big program (`cc1plus --version`, 2.9 MiB of table) used to end with the recorder still
/// reading, checking and writing its table, three quarters of the time from the program's
/// exit to the recorder's.
const IMAGE_LOOK: Duration = Duration::from_millis(5);

/// A folder's modification time can lag the clock by a timer tick: a table renamed into
/// place within this long of the last change is looked for again.
const MTIME_TICK: Duration = Duration::from_millis(20);

/// How long the loop naps while the program hands chunks over: the time the program would
/// lately have taken to fill one, between 5 us and 1 ms. A quarter of it woke the loop four
/// times a chunk, and each wake-up is a system call, a timer and two context switches: fib's
/// whole-tree CPU fell by about 1.3 ns a call (`bench/ab.py`, 10 rounds of 11) with
/// the program's own cost unchanged; twice the time made the program slower (+0.3 ns, 0 of
/// 11) for nothing. Counted in records, not chunks: a thread that ends hands over its last
/// chunk with what it holds, and a program that starts and ends threads by the thousand made
/// the loop nap for microseconds after each of their few records (80,000 threads of six
/// calls: 3.3-4.0 s traced against 1.4 s natively, 2.0-2.1 s with naps counted in records).
struct Naps {
    /// Moving average of the time per record, in ns (0 until measured).
    per_record_ns: f64,
    /// Records a chunk holds.
    chunk_records: usize,
}

impl Naps {
    fn new(chunk_records: usize) -> Naps {
        Naps { per_record_ns: 0.0, chunk_records }
    }

    /// `n` records were handed over in the `since` since the last ones.
    fn records(&mut self, n: usize, since: Duration) {
        let each = since.as_nanos() as f64 / n as f64;
        self.per_record_ns = if self.per_record_ns == 0.0 { each } else { 0.8 * self.per_record_ns + 0.2 * each };
    }

    fn short(&self) -> Duration {
        Duration::from_nanos((self.per_record_ns * self.chunk_records as f64) as u64).clamp(Duration::from_micros(5), Duration::from_millis(1))
    }
}

/// State of the copying loop.
struct Recorder {
    region: Region,
    writer: TraceWriter,
    dir: PathBuf,
    /// Tables copied into the trace, with their functions hooked and skipped as of the last
    /// copy.
    images_written: HashMap<u32, (usize, usize)>,
    /// Size and modification time of each image table when it was copied: a table grows when
    /// the program loads a library with `dlopen`, and is then copied again.
    image_stamps: HashMap<u32, (u64, std::time::SystemTime)>,
    /// When each table was last copied. A table that grows function by function (Mono's
    /// methods as they are compiled) is copied again at most every [`IMAGE_RECOPY`] while the
    /// program runs, and whole at the end: each copy holds the whole table.
    image_copied: HashMap<u32, Instant>,
    /// Copy every changed table now (the program is done).
    images_final: bool,
    /// Modification time of the images folder when [`Recorder::copy_new_images`] last looked.
    images_dir_seen: Option<std::time::SystemTime>,
    pids: BTreeSet<u32>,
    calls: u64,
    images_checked: bool,
    /// Thread names as last read, by (pid, tid).
    thread_names: BTreeMap<(u32, u32), String>,
    /// What the trace's first chunk says (snapshots start with it too).
    meta: Meta,
    /// Time-stamp counter and monotonic clock at the start.
    start: (u64, u64),
    /// Every image table as last copied, by session id (snapshots hold them all).
    image_texts: BTreeMap<u32, String>,
    /// Flight mode: the rings and triggers; `None` writes every call to the trace.
    flight: Option<Flight>,
    /// Flight mode: records of owned chunks already looked at by the triggers, by chunk:
    /// the chunk's sequence number and how many.
    scanned: HashMap<u32, (u64, usize)>,
    /// Snapshot requests seen in the region header.
    requests_seen: u32,
    /// The signal a traced process just died of, for the crash snapshot's end.
    crash_signal: Option<i32>,
    /// `--min-duration` in ticks, for the calls the recorder closes itself.
    min_ticks: u64,
    /// Call records and data units of the chunk being written, kept from chunk to chunk.
    split: (Vec<Record>, fnscope_format::CallData),
    /// [`RecordOptions::spill_after`].
    spill_after: Option<usize>,
    /// FULL chunks with a slot not written yet, by index and sequence number: when they were
    /// first seen so (see [`Recorder::hold_back`]).
    holes_seen: HashMap<(u32, u64), Instant>,
    /// Processors this process may run on.
    processors: usize,
    /// Whether the recorder is behind for good (see [`Recorder::drain`]).
    backlog: Backlog,
    /// Whether calls may carry data units (`-A`, `-R`, `--args`, `--inject`): without, no
    /// chunk has data slots, and none is scanned for them (the scan was a tenth of the
    /// recorder's time).
    values: bool,
    /// Why the trace could not be written further (a full disk), from the first such error
    /// on: nothing more is written then, and chunks are freed as they come, their calls
    /// counted in `unwritten`, so that the program runs on as it would have; the trace is cut
    /// after its last whole chunk and ended when the program is done
    /// (`fnscope_format::end_torn_trace`).
    failed: Option<String>,
    /// Calls recorded after the trace stopped being written (see `failed`).
    unwritten: u64,
    /// (bytes handed to the writer, calls written) after each chunk of calls since the last
    /// flush that worked, and the last before it: which calls a trace cut after a failed
    /// write still holds.
    marks: Vec<(u64, u64)>,
}

/// How long a FULL chunk with a slot not written yet waits for the stub that reserved it
/// (see [`Recorder::hold_back`]): the stub writes as soon as the signal handler that
/// interrupted it returns. The thread's later chunks wait with it, and a busy thread fills
/// about 200 chunks in that time, a twentieth of the default region.
const HOLE_WAIT: Duration = Duration::from_millis(50);

/// Bytes of chunks of the shared buffer under an address-space limit it would take more than
/// a quarter of (see [`default_chunks`]): the default buffer of earlier versions (1,024 chunks
/// of 256 KiB; with `--flight`, 4,096 of 64 KiB, as without a limit).
const LIMITED_BUFFER_BYTES: u64 = 256 << 20;

/// Chunks of the shared buffer when `--buffer-mb` is not given: [`fnscope_abi::DEFAULT_CHUNKS`],
/// or [`LIMITED_BUFFER_BYTES`] of them under an address-space limit (`ulimit -v`, common on
/// compute clusters) that the whole region, call stacks included, would take more than a
/// quarter of: every traced process maps all of it, and the program needs its address space
/// too.
pub fn default_chunks(chunk_size: u32) -> u32 {
    let full = fnscope_abi::region_size(chunk_size, fnscope_abi::DEFAULT_CHUNKS, fnscope_abi::DEFAULT_STACK_SLOTS) as u64;
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given, nothing else.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0;
    if known && limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur / 4 < full {
        (LIMITED_BUFFER_BYTES / u64::from(chunk_size)).min(u64::from(fnscope_abi::DEFAULT_CHUNKS)) as u32
    } else {
        fnscope_abi::DEFAULT_CHUNKS
    }
}

/// Full chunks left waiting beyond which the recorder writes the oldest uncompressed, unless
/// every processor is busy or the user says otherwise (`--spill-after`).
pub const DEFAULT_SPILL_AFTER: usize = 4;

/// While every processor is busy, chunks wait to be compressed up to half the buffer, but no
/// more than this many bytes of them: half the default buffer of 1,024 chunks before it had
/// room for a chunk per thread of programs with thousands (`fnscope_abi::DEFAULT_CHUNKS`),
/// so that its memory stays what it was.
const SATURATED_HOLD_BYTES: usize = 128 << 20;

/// Passes of the recorder that must find more than [`DEFAULT_SPILL_AFTER`] chunks waiting
/// before it spills every chunk ([`Backlog`]). After a nap the first pass may find that
/// many, and the next ones fewer: one pass proves nothing.
const BACKLOG_PASSES: u32 = 2;

/// How often [`Backlog`] reads `/proc/loadavg`: while every chunk is spilled a pass comes
/// every few microseconds, and a file read each time would be much of the recorder's work.
const LOAD_LOOK: Duration = Duration::from_millis(1);

/// Looks at the load [`Backlog`] decides from, of which three quarters must find a
/// processor free: one look sees an instant, and spilling (the kernel's threads that write
/// its pages out) now and then adds a task to a program that leaves one free. The decision
/// waits for [`FIRST_LOOKS`] of them.
const LOAD_LOOKS: u32 = 8;
/// See [`LOAD_LOOKS`].
const FIRST_LOOKS: u32 = 4;
const _: () = assert!(FIRST_LOOKS <= LOAD_LOOKS && LOAD_LOOKS == u8::BITS);

/// Whether the recorder is behind for good: the program fills chunks faster than they
/// compress. Then it spills every chunk while a processor is free, until it has caught up
/// (a pass finds no chunk waiting). Compressing the last few in place, it would hold each
/// for longer than the program takes to fill the next ones, and the program would write
/// into more chunks, colder in its cache.
#[derive(Default)]
struct Backlog {
    /// Passes since the last that found no chunk waiting, that found more than
    /// [`DEFAULT_SPILL_AFTER`].
    passes: u32,
    /// When the load was last looked at in that time.
    last_look: Option<Instant>,
    /// What the last [`LOAD_LOOKS`] looks found, bit 0 the last: 1 when every processor was
    /// busy.
    busy: u8,
    /// Looks made in that time.
    looks: u32,
}

impl Backlog {
    /// Notes a pass of the copying loop at `now` that found `waiting` FULL chunks. `busy`
    /// tells whether every processor is busy; it is asked during a backlog only, at most
    /// every [`LOAD_LOOK`].
    fn pass(&mut self, waiting: usize, now: Instant, busy: impl FnOnce() -> bool) {
        if waiting == 0 {
            *self = Backlog::default();
            return;
        }
        if waiting > DEFAULT_SPILL_AFTER {
            self.passes = self.passes.saturating_add(1);
        }
        if self.passes > 0 && self.last_look.is_none_or(|t| now.saturating_duration_since(t) >= LOAD_LOOK) {
            self.last_look = Some(now);
            self.busy = self.busy << 1 | busy() as u8;
            self.looks = self.looks.saturating_add(1);
        }
    }

    /// What the last look found (every processor busy), if it is less than [`LOAD_LOOK`] old
    /// at `now`.
    fn recent_look(&self, now: Instant) -> Option<bool> {
        self.last_look.filter(|&t| now.saturating_duration_since(t) < LOAD_LOOK).map(|_| self.busy & 1 != 0)
    }

    /// Whether to spill every chunk: [`BACKLOG_PASSES`] passes found a backlog, and three
    /// quarters of the last looks (at least [`FIRST_LOOKS`]) found a processor free.
    fn spill_all(&self) -> bool {
        let looks = self.looks.min(LOAD_LOOKS);
        self.passes >= BACKLOG_PASSES && looks >= FIRST_LOOKS && 4 * (looks - self.busy.count_ones()) >= 3 * looks
    }
}

/// Whether more tasks are ready to run than there are `processors` (the recorder, running,
/// among them): the kernel's count in `/proc/loadavg` (`running/total`). Unknown: no.
fn processors_saturated(processors: usize) -> bool {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|t| running_tasks(&t)).is_some_and(|r| r > processors)
}

/// The tasks ready to run, from the text of `/proc/loadavg` (`0.52 0.58 0.59 3/345 12345`).
fn running_tasks(loadavg: &str) -> Option<usize> {
    loadavg.split_whitespace().nth(3)?.split_once('/')?.0.parse().ok()
}

impl Recorder {
    /// Reads the name of thread `tid` of `pid` while it runs (a program names its threads
    /// after they start, so a later reading wins). A thread that is gone keeps what was read.
    fn name_thread(&mut self, pid: u32, tid: u32) {
        if let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) {
            let name = name.trim_end_matches('\n');
            if !name.is_empty() && self.thread_names.get(&(pid, tid)).is_none_or(|n| n != name) {
                self.thread_names.insert((pid, tid), name.to_string());
            }
        }
    }

    /// Copies the tables of images not copied yet, if any was renamed into the folder since
    /// the last look: one `stat` of the folder when none was, and no `stat` of tables already
    /// copied (thousands in a big build). Tables that grow are left to
    /// [`Recorder::copy_images`], which copies them whole again, at most every
    /// [`IMAGE_RECOPY`].
    fn copy_new_images(&mut self) -> Result<()> {
        let Ok(mtime) = std::fs::metadata(self.dir.join("images")).and_then(|m| m.modified()) else { return Ok(()) };
        let recent = std::time::SystemTime::now().duration_since(mtime).map_or(true, |age| age < MTIME_TICK);
        if self.images_dir_seen != Some(mtime) || recent {
            self.images_dir_seen = Some(mtime);
            self.copy_tables(true)?;
        }
        Ok(())
    }

    /// Copies every image table the agents have written or extended since the last look.
    fn copy_images(&mut self) -> Result<()> {
        self.copy_tables(false)
    }

    /// Copies the image tables written or extended since the last look; with `only_new`,
    /// only those of images never copied.
    fn copy_tables(&mut self, only_new: bool) -> Result<()> {
        if self.failed.is_some() {
            return Ok(());
        }
        let Ok(rd) = std::fs::read_dir(self.dir.join("images")) else { return Ok(()) };
        let mut found: Vec<(u32, PathBuf, (u64, std::time::SystemTime))> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let sid = name.strip_suffix(".txt")?.parse().ok()?;
                if only_new && self.images_written.contains_key(&sid) {
                    return None;
                }
                let m = e.metadata().ok()?;
                Some((sid, e.path(), (m.len(), m.modified().ok()?)))
            })
            .filter(|(sid, _, stamp)| self.image_stamps.get(sid) != Some(stamp))
            .filter(|(sid, _, _)| self.images_final || self.image_copied.get(sid).is_none_or(|t| t.elapsed() >= IMAGE_RECOPY))
            .collect();
        found.sort_by_key(|f| f.0);
        for (sid, p, stamp) in found {
            let mut bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            // The agent appends whole lines while this reads: a line cut short (perhaps in the
            // middle of a character) is read again next time, whole.
            let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            if whole < bytes.len() {
                bytes.truncate(whole);
            } else {
                self.image_stamps.insert(sid, stamp);
            }
            let text = String::from_utf8(bytes).map_err(|_| anyhow!("{} is not UTF-8: damaged, or not written by fnscope's agent", p.display()))?;
            self.write_joined()?;
            self.writer.write_image(sid, &text)?;
            self.images_written.insert(sid, count_hooks(&text));
            self.image_copied.insert(sid, Instant::now());
            if let Some(f) = &mut self.flight {
                f.image(sid, &text);
                self.image_texts.insert(sid, text);
            }
        }
        Ok(())
    }

    /// Stores one thread's records: into the trace, or in flight mode into its ring (after
    /// the triggers have seen those they have not seen yet, from `from` on).
    fn store(&mut self, seg: Segment, from: usize) -> Result<()> {
        if self.failed.is_some() {
            self.unwritten += seg.recs.len() as u64;
            return Ok(());
        }
        match &mut self.flight {
            Some(f) => {
                self.calls += seg.recs.len() as u64;
                self.pids.insert(seg.pid);
                f.scan(seg.sid, &seg.recs[from.min(seg.recs.len())..]);
                f.keep(seg);
            }
            None => {
                self.write_joined()?;
                self.writer.write_segment(seg.sid, seg.pid, seg.tid, seg.seq, seg.lost, seg.flags, &seg.recs, &seg.data)?;
                self.wrote(seg.recs.len(), seg.pid);
            }
        }
        Ok(())
    }

    /// Writes chunk `i` (holding `n` records) to the trace and frees it (retires it if it has
    /// holes): as it is (RAW) when `raw`, else encoded and compressed.
    /// `holes`: how many of the `n` slots were not written when the caller looked (see
    /// [`Recorder::hold_back`]); a slot, once written, stays so.
    fn take(&mut self, i: u32, n: usize, holes: usize, extra_flags: u32, raw: bool) -> Result<()> {
        if self.failed.is_some() {
            let recs = self.region.records(i, n);
            let written = recs.iter().filter(|r| r.is_present());
            self.unwritten += written.clone().filter(|r| !fnscope_abi::data::is_data_tag(r.id_depth)).count() as u64;
            let (nrec, holes) = (recs.len(), recs.len() - written.count());
            self.release(i, nrec, holes);
            return Ok(());
        }
        // SAFETY: the chunk is FULL (or its writer is gone): nobody writes its header now.
        let (sid, pid, tid, seq, lost, flags, name) = unsafe {
            let c = &*self.region.chunk(i);
            (c.image_sid, c.pid, c.tid, c.seq, c.lost, c.flags, c.thread_name)
        };
        if !self.images_written.contains_key(&sid) || !self.images_checked {
            self.copy_images()?;
            self.images_checked = true;
        }
        // A name is read when the thread's first chunk comes, and again now and then (one
        // file read per 64 chunks) in case the program renames it.
        if extra_flags & CHUNK_FLAG_ABANDONED == 0 && (seq % 64 == 0 || !self.thread_names.contains_key(&(pid, tid))) {
            self.name_thread(pid, tid);
        }
        // The name the thread had when it handed the chunk over: the latest, and the only
        // one of a thread that ended before the recorder looked.
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if !name.is_empty() && extra_flags & CHUNK_FLAG_ABANDONED == 0 {
            let name = String::from_utf8_lossy(name);
            if self.thread_names.get(&(pid, tid)).is_none_or(|n| *n != name) {
                self.thread_names.insert((pid, tid), name.into_owned());
            }
        }
        if raw && self.flight.is_none() {
            // Before the chunk's records are borrowed: see `write_joined`.
            self.write_joined()?;
        }
        let region_recs = self.region.records(i, n);
        let nrec = region_recs.len();
        // A slot still not written (see `hold_back`) is no call: dropped, and counted as lost.
        // Counted again here, with the copy: a stub may have written one since `holes` was.
        let kept: Vec<Record>;
        let (recs, holes) = if holes == 0 {
            (region_recs, 0)
        } else {
            kept = region_recs.iter().filter(|r| r.is_present()).copied().collect();
            let holes = nrec - kept.len();
            (&kept[..], holes)
        };
        let lost = lost + holes as u64;
        if self.flight.is_some() {
            let raw_from = self.scanned.remove(&i).filter(|&(s, _)| s == seq).map_or(0, |(_, k)| k);
            // The triggers saw raw slots; the segment holds call records only.
            let from = recs[..raw_from.min(recs.len())].iter().filter(|r| !fnscope_abi::data::is_data_tag(r.id_depth)).count();
            let seg = Segment::new(sid, pid, tid, seq, lost, flags | extra_flags, recs.to_vec());
            self.store(seg, from)?;
        } else if raw {
            // A copy, a checksum and a write: the chunk is free again in a tenth of the time
            // an encoding takes. `compact` encodes it when the program is done.
            self.writer.write_raw_segment(sid, pid, tid, seq, lost, flags | extra_flags, recs)?;
            self.wrote(recs.iter().filter(|r| !fnscope_abi::data::is_data_tag(r.id_depth)).count(), pid);
        } else if self.values && crate::flight::has_data_slots(recs) {
            // Straight from shared memory too: the data slots are split off as they are read.
            let (calls, data) = &mut self.split;
            fnscope_format::split_data_into(recs, calls, data);
            self.writer.join_segment(sid, pid, tid, seq, lost, flags | extra_flags, calls, data)?;
            let calls = calls.len();
            self.wrote(calls, pid);
        } else {
            // Straight from shared memory: no copy on the path of every call.
            self.writer.join_segment(sid, pid, tid, seq, lost, flags | extra_flags, recs, &Default::default())?;
            self.wrote(recs.len(), pid);
        }
        self.release(i, nrec, holes);
        Ok(())
    }

    /// Counts `calls` of process `pid` just handed to the writer (see [`Recorder::marks`]).
    fn wrote(&mut self, calls: usize, pid: u32) {
        self.calls += calls as u64;
        self.pids.insert(pid);
        // The calls of a segment still being joined are not in those bytes.
        self.marks.push((self.writer.bytes_written(), self.calls - self.writer.joined_records() as u64));
    }

    /// Writes the segment the writer is joining, if any, and marks where its calls end.
    /// Every other write writes it first: were that write to fail (a full disk) after it,
    /// the marks would not count calls the cut trace holds.
    fn write_joined(&mut self) -> Result<()> {
        if self.writer.joined_records() > 0 {
            self.writer.write_joined()?;
            self.marks.push((self.writer.bytes_written(), self.calls));
        }
        Ok(())
    }

    /// Hands what the writer holds to the system; the marks before are settled then.
    fn flush(&mut self) -> Result<()> {
        self.write_joined()?;
        self.writer.flush()?;
        let settled = self.marks.len().saturating_sub(1);
        self.marks.drain(..settled);
        Ok(())
    }

    /// Gives chunk `i`, whose `nrec` records are copied, back to the agents; retires it
    /// instead when `holes` of its slots were not written.
    fn release(&mut self, i: u32, nrec: usize, holes: usize) {
        if holes > 0 {
            // The stub that reserved the slot may still write it: into this chunk, which
            // therefore nobody gets again.
            self.holes_seen.retain(|&(index, _), _| index != i);
            self.region.state(i).store(CHUNK_RETIRED, Ordering::Release);
            return;
        }
        let used = CHUNK_HEADER_SIZE + (nrec + 1).min(records_per_chunk(self.region.chunk_size)) * RECORD_SIZE;
        // SAFETY: zeroing the used part of a chunk nobody owns; the state word is set FREE last
        // with release ordering so that an agent taking it sees zeroed memory.
        unsafe {
            let base = self.region.chunk(i) as *mut u8;
            std::ptr::write_bytes(base.add(4), 0, used - 4);
        }
        self.region.state(i).store(CHUNK_FREE, Ordering::Release);
    }

    /// Stops writing the trace after `e` (see [`Recorder::failed`]), and says so once.
    fn fail(&mut self, e: anyhow::Error) {
        if self.failed.is_none() {
            eprintln!("fnscope: error: {e:#}; the trace stops here, and the program runs on");
            self.failed = Some(e.root_cause().to_string());
        }
    }

    /// The value of `r`, or after an error (see [`Recorder::fail`]) the default.
    fn or_fail<T: Default>(&mut self, r: Result<T>) -> T {
        r.unwrap_or_else(|e| {
            self.fail(e);
            T::default()
        })
    }

    /// Copies every FULL chunk, each thread's in stream order (the region's order is not
    /// the threads'). Returns how many records they held.
    ///
    /// When more than `spill_after` chunks wait, the program is filling them faster than the
    /// recorder compresses them, and would soon wait for free ones: unless `!spill` (the
    /// program is done), the first ones of the pass (each thread's in stream order) go to the
    /// trace uncompressed until `spill_after` are left, which are compressed as usual.
    ///
    /// Spilling moves work to the recorder's processor (the file's pages, a second pass at
    /// the end) so that the program writes into chunks it has used before. That pays only
    /// while a processor is idle: when every one is busy (a `make -j2` on two), the program
    /// waits for the recorder's extra work instead, and the run is slower. Then, unless the
    /// user set `--spill-after`, chunks are spilled only past half the region (at most
    /// [`SATURATED_HOLD_BYTES`] of chunks), so that the program never runs out of them. And
    /// while a processor is free and a backlog lasts ([`Backlog`]), every chunk is spilled.
    fn drain(&mut self, spill: bool) -> Result<usize> {
        // Tables are looked at again once per pass, before the first chunk: a chunk may hold
        // ids of a library loaded since the last pass.
        self.images_checked = false;
        let full = self.region.chunks_in(&[CHUNK_FULL]);
        let (processors, now) = (self.processors, Instant::now());
        if spill {
            self.backlog.pass(full.len(), now, || processors_saturated(processors));
        }
        // A look the backlog just made serves here too: one read of /proc/loadavg a
        // millisecond at most.
        let saturated = || self.backlog.recent_look(now).unwrap_or_else(|| processors_saturated(processors));
        let after = match self.spill_after {
            Some(n) => n,
            None if spill && self.backlog.spill_all() => 0,
            None if spill && full.len() > DEFAULT_SPILL_AFTER && saturated() => {
                let half = self.region.nchunks as usize / 2;
                half.min(SATURATED_HOLD_BYTES / self.region.chunk_size as usize).max(DEFAULT_SPILL_AFTER)
            }
            None => DEFAULT_SPILL_AFTER,
        };
        let mut held: Option<(u32, u32, u32)> = None;
        let mut taken = 0;
        for (k, c) in full.iter().enumerate() {
            let thread = (c.sid, c.pid, c.tid);
            let n = c.nrec.unwrap_or(0) as usize;
            // A thread's chunks go in stream order: after one held back, its later ones wait.
            if held == Some(thread) {
                continue;
            }
            let holes = self.region.records(c.index, n).iter().filter(|r| !r.is_present()).count();
            if spill && self.hold_back(c, holes) {
                held = Some(thread);
                continue;
            }
            let waiting = full.len() - k - 1;
            self.take(c.index, n, holes, 0, spill && waiting >= after)?;
            taken += n;
        }
        Ok(taken)
    }

    /// Whether FULL chunk `c`, with `holes` slots not written yet, should wait for them. A
    /// signal handler that fills two chunks while an exit stub holds a slot of the first gets
    /// that chunk handed over before the stub writes its record there, a moment later: the
    /// chunk waits up to [`HOLE_WAIT`] while its process lives. After that (or when the
    /// program is done) it is taken with the slot counted as lost, and retired.
    fn hold_back(&mut self, c: &ChunkRef, holes: usize) -> bool {
        let key = (c.index, c.seq);
        if holes == 0 {
            self.holes_seen.remove(&key);
            return false;
        }
        let first = *self.holes_seen.entry(key).or_insert_with(Instant::now);
        first.elapsed() < HOLE_WAIT && process_alive(c.pid)
    }

    /// Copies chunks still owned by writers that are gone (all of them when `all`), in
    /// stream order: a thread holds up to two chunks.
    fn harvest(&mut self, all: bool) -> Result<()> {
        let gone = self.region.chunks_in(&[CHUNK_OWNED]).into_iter().filter(|c| all || !process_alive(c.pid));
        for i in gone.map(|c| c.index).collect::<Vec<_>>() {
            let cap = records_per_chunk(self.region.chunk_size);
            let n = self.region.records(i, cap).iter().take_while(|r| r.is_present()).count();
            self.take(i, n, 0, CHUNK_FLAG_ABANDONED, false)?;
        }
        self.close_dead_stacks(all)
    }

    /// Flight mode: shows the triggers the records written since the last look into chunks
    /// threads still own, so that a slow call fires without waiting for its chunk to fill.
    fn scan_live(&mut self) -> Result<()> {
        if !self.flight.as_ref().is_some_and(Flight::watches_calls) {
            return Ok(());
        }
        for ChunkRef { sid, seq, index: i, .. } in self.region.chunks_in(&[CHUNK_OWNED]) {
            if !self.images_written.contains_key(&sid) {
                // The triggers know the functions by name: the table first.
                self.copy_images()?;
            }
            let Some(f) = &mut self.flight else { return Ok(()) };
            let seen = self.scanned.get(&i).filter(|&&(s, _)| s == seq).map_or(0, |&(_, k)| k);
            let recs = self.region.live_records(i, seen);
            if !recs.is_empty() {
                f.scan(sid, &recs);
                self.scanned.insert(i, (seq, seen + recs.len()));
            }
        }
        Ok(())
    }

    /// Flight mode: writes a snapshot if a trigger fired or one was asked for, and answers
    /// the requests. `crashed` names a process that just died of a crash signal.
    fn snapshot_if_due(&mut self) -> Result<()> {
        let Some(f) = &mut self.flight else { return Ok(()) };
        let asked = self.region.requests().load(Ordering::Acquire);
        if asked != self.requests_seen {
            f.fire("asked for (signal or `fnscope snapshot`)".to_string());
        }
        if let Some(why) = f.take_pending() {
            self.snapshot(&why)?;
        }
        if asked != self.requests_seen {
            self.requests_seen = asked;
            self.region.answered().store(asked, Ordering::Release);
        }
        Ok(())
    }

    /// Writes what the flight recorder holds, and what the threads hold now, as the trace
    /// folder `DIR/snapshot-N` (written under another name, then renamed: a folder of that
    /// name is complete).
    fn snapshot(&mut self, why: &str) -> Result<()> {
        self.drain(false)?;
        // Every name the records may need, whatever the throttle on growing tables.
        let throttled = !self.images_final;
        self.images_final = true;
        let copied = self.copy_images();
        self.images_final = !throttled;
        copied?;
        let n = self.flight.as_ref().map_or(0, |f| f.written) + 1;
        let dir = crate::flight::snapshot_dir(&self.dir, n);
        let tmp = self.dir.join(format!(".snapshot-{n}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        // The threads' current chunks first, then their open calls: a call that returns in
        // between is then in neither, never in both.
        // Chunks handed over since the drain above are read here too (they reach the rings
        // after this snapshot).
        let mut live: BTreeMap<(u32, u32), Vec<Segment>> = BTreeMap::new();
        for ChunkRef { sid, pid, tid, seq, index, nrec } in self.region.chunks_in(&[CHUNK_OWNED, CHUNK_FULL]) {
            let recs = match nrec {
                Some(n) => self.region.records(index, n as usize).to_vec(),
                None => self.region.live_records(index, 0),
            };
            live.entry((pid, tid)).or_default().push(Segment::new(sid, pid, tid, seq, 0, 0, recs));
        }
        let now = tsc();
        for i in 0..self.region.slots_used() {
            use fnscope_abi::{SlotHead, SLOT_OWNED};
            let slot = self.region.slot(i);
            // SAFETY: the header of a slot inside the mapping; state is read atomically.
            let (state, closed, sid, pid, tid) = unsafe {
                let h = slot as *mut SlotHead;
                (
                    AtomicU32::from_ptr(std::ptr::addr_of_mut!((*h).state)).load(Ordering::Acquire),
                    std::ptr::read_volatile(&(*h).closed),
                    (*h).image_sid,
                    (*h).pid,
                    (*h).tid,
                )
            };
            if state == SLOT_OWNED && closed == 0 {
                let (seq, recs) = self.region.open_calls(i, now, self.min_ticks);
                let flags = CHUNK_FLAG_ABANDONED;
                live.entry((pid, tid)).or_default().push(Segment::new(sid, pid, tid, seq, 0, flags, recs));
            }
        }
        let mut w = TraceWriter::create(&tmp.join("trace.fns"))?;
        w.write_meta(&self.meta)?;
        for (sid, text) in &self.image_texts {
            w.write_image(*sid, text)?;
        }
        let mut calls = 0u64;
        let mut pids = BTreeSet::new();
        let Some(f) = &self.flight else { return Ok(()) };
        let live_segs = live.values().flatten();
        for seg in f.segments().chain(live_segs).filter(|s| !s.recs.is_empty()) {
            w.write_segment(seg.sid, seg.pid, seg.tid, seg.seq, seg.lost, seg.flags, &seg.recs, &seg.data)?;
            calls += seg.recs.len() as u64;
            pids.insert(seg.pid);
        }
        let (tsc1, mono1) = (tsc(), clock_ns(libc::CLOCK_MONOTONIC));
        w.write_end(&EndInfo {
            end_unix_ns: clock_ns(libc::CLOCK_REALTIME),
            tsc_at_end: tsc1,
            ticks_per_ns: (tsc1 - self.start.0) as f64 / (mono1 - self.start.1).max(1) as f64,
            exit_status: None,
            killed_by_signal: self.crash_signal.take(),
            lost_records: self.region.lost(),
            unmatched_returns: self.region.unmatched_returns(),
            processes: pids.iter().copied().collect(),
            threads: self
                .thread_names
                .iter()
                .filter(|((pid, _), _)| pids.contains(pid))
                .map(|(&(pid, tid), name)| fnscope_format::ThreadName { pid, tid, name: name.clone() })
                .collect(),
            ..EndInfo::default()
        })?;
        w.flush()?;
        let bytes = w.bytes_written();
        drop(w);
        std::fs::rename(&tmp, &dir).with_context(|| format!("cannot rename {} to {}", tmp.display(), dir.display()))?;
        if let Some(f) = &mut self.flight {
            f.wrote();
        }
        eprintln!("fnscope: snapshot {n} ({why}): {calls} calls, {} in {}", human_bytes(bytes), dir.display());
        Ok(())
    }

    /// Records the calls still open in the shadow stacks of threads whose process is gone
    /// (all of them when `all`) as cut off, after the thread's last records, and frees the
    /// slots. Threads that ended normally marked their open calls as recorded already.
    fn close_dead_stacks(&mut self, all: bool) -> Result<()> {
        use fnscope_abi::{SlotHead, SLOT_OWNED};
        let now = tsc();
        for i in 0..self.region.slots_used() {
            let slot = self.region.slot(i);
            // SAFETY: the state word of a slot header inside the mapping.
            let state = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*(slot as *mut SlotHead)).state)) };
            if state.load(Ordering::Acquire) != SLOT_OWNED {
                continue;
            }
            // SAFETY: reading the header of an owned slot; its owner is checked to be gone
            // before anything else is read.
            let (closed, sid, pid, tid) = unsafe {
                let h = &*(slot as *const SlotHead);
                (std::ptr::read_volatile(&h.closed), h.image_sid, h.pid, h.tid)
            };
            if !all && process_alive(pid) {
                // Threads that run long without filling a chunk get their name here.
                if !self.thread_names.contains_key(&(pid, tid)) {
                    self.name_thread(pid, tid);
                }
                continue;
            }
            if closed == 0 {
                let (seq, recs) = self.region.open_calls(i, now, self.min_ticks);
                if !recs.is_empty() {
                    if !self.images_written.contains_key(&sid) {
                        self.copy_images()?;
                    }
                    self.store(Segment::new(sid, pid, tid, seq, 0, CHUNK_FLAG_ABANDONED, recs), 0)?;
                }
            }
            state.store(fnscope_abi::SLOT_FREE, Ordering::Release);
        }
        Ok(())
    }
}

fn process_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Signals whose death is a crash (`--trigger crash`).
const CRASH_SIGNALS: [i32; 7] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS];

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Whether the program has been started: until then no signal reaches it but through fnscope.
static SPAWNED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // A signal typed at the terminal reaches the whole foreground group, the program included:
    // forward only the ones sent to fnscope alone (si_code <= 0: kill, sigqueue, tgkill), and
    // any that came before the program was there to get it.
    // SAFETY: the kernel passes a valid siginfo to SA_SIGINFO handlers.
    let code = unsafe { (*info).si_code };
    if code <= 0 || sig == libc::SIGTERM || sig == libc::SIGHUP || !SPAWNED.load(Ordering::Relaxed) {
        PENDING_SIGNAL.store(sig, Ordering::Relaxed);
    }
}

extern "C" fn on_child(_sig: libc::c_int) {}

/// A child's end interrupts the recorder's nap ([`nap`]): the recorder sees it at once, not
/// up to a nap later. The handler does nothing; `exec` resets it in the program.
fn install_child_wakeup() {
    // SAFETY: installing a handler that does nothing. `nanosleep` ends on a handled signal
    // even with SA_RESTART, which the recorder's other system calls get.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_child as *const () as usize;
        // A child stopped or continued (a debugger, ^Z) is no news for the recorder.
        sa.sa_flags = libc::SA_RESTART | libc::SA_NOCLDSTOP;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGCHLD, &sa, std::ptr::null_mut());
    }
}

/// Sleeps for `d`, or until a signal arrives (a child's end: [`install_child_wakeup`]).
fn nap(d: Duration) {
    let ts = libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long };
    // SAFETY: nanosleep with a valid timespec and no remainder pointer; an interrupted nap
    // just ends early.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

fn install_signal_forwarding() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2] {
        // SAFETY: installing an async-signal-safe handler (one atomic store).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Outcome of a recording.
pub struct RecordOutcome {
    /// Exit code for `fnscope` itself: the program's, or 128+N when killed by signal N.
    pub exit_code: i32,
    /// The signal that killed the program, which `fnscope` then dies of too
    /// ([`end_like_the_program`]).
    pub signal: Option<i32>,
}

/// The system's description of signal `sig` ("Segmentation fault").
fn signal_name(sig: i32) -> String {
    // SAFETY: strsignal returns null or a string that stays valid until the next call on
    // this thread; it is copied at once.
    let p = unsafe { libc::strsignal(sig) };
    if p.is_null() {
        return format!("signal {sig}");
    }
    // SAFETY: a non-null result of strsignal is a NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Ends `fnscope` the way the program ended: killed by `signal` when it was, so that a parent
/// that looks at how its child ended (a shell printing "Segmentation fault", Python's
/// negative `returncode`, a test runner) sees what it sees without tracing; else, or if the
/// signal does not end this process, exit with `code`. No core file is written for
/// `fnscope` itself: the program wrote its own, where the system writes them.
pub fn end_like_the_program(code: i32, signal: Option<i32>) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    if let Some(sig) = signal {
        // SAFETY: plain system calls on this process: no core limit and not dumpable (a
        // core_pattern that pipes to a helper such as systemd-coredump may not look at the
        // limit), the default action for `sig` (the recorder forwards some signals with a
        // handler of its own), `sig` unblocked, then raised.
        unsafe {
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
    }
    std::process::exit(code)
}

/// Runs `record`.
pub fn record(opts: &RecordOptions) -> Result<RecordOutcome> {
    let name = opts.command.first().ok_or_else(|| anyhow!("no program given: fnscope record -- PROGRAM [ARGS...]"))?;
    let program = resolve_program(name)?;
    check_program(&program)?;
    let _lock = prepare_dir(&opts.output)?;
    let dir = std::fs::canonicalize(&opts.output)?;
    let region = Region::create(opts.chunks, opts.chunk_size, opts.verbose)?;
    let agent = crate::agent_lib::path()?;
    let mut writer = TraceWriter::create(&dir.join("trace.fns"))?;
    let mut reserve = Reserve::make(&dir);
    if let Some(cache) = opts.plan_cache.then(|| crate::table_cache::TableCache::next_to(&agent)).flatten() {
        writer.set_frame_store(Box::new(cache));
    }
    let (tsc0, mono0, real0) = (tsc(), clock_ns(libc::CLOCK_MONOTONIC), clock_ns(libc::CLOCK_REALTIME));
    let meta = Meta {
        command: opts.command.clone(),
        cwd: std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_default(),
        start_unix_ns: real0,
        tsc_at_start: tsc0,
        host: std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string(),
        fnscope_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: if opts.count { "count" } else { "time" }.to_string(),
        flight: opts.flight.is_some(),
    };
    writer.write_meta(&meta)?;
    writer.flush()?;
    let f = &opts.filters;
    // Durations are compared in time-stamp-counter ticks, in the stubs and by the triggers.
    let watches = opts.flight.as_ref().is_some_and(|o| o.has(|t| matches!(t, Trigger::Slow { .. })));
    let ticks_per_ns = if f.min_duration_ns > 0 || watches { tsc_rate(5) } else { 1.0 };
    let mut preload = agent.display().to_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        preload = format!("{preload}:{}", old.to_string_lossy());
    }
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) only changes who adopts orphaned descendants, so
    // that the children a program leaves behind are waited for and their traces collected.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut cmd = std::process::Command::new(&program);
    cmd.arg0(name)
        .args(&opts.command[1..])
        .env("LD_PRELOAD", preload)
        .env("ASAN_OPTIONS", asan_options(std::env::var_os("ASAN_OPTIONS").as_deref()))
        .env(fnscope_abi::ENV_SHM, &region.path)
        .env(fnscope_abi::ENV_DIR, &dir)
        .env(fnscope_abi::ENV_LIBS, opts.libs.join(","));
    if opts.verbose {
        cmd.env(fnscope_abi::ENV_VERBOSE, "1");
    }
    if opts.count {
        cmd.env(fnscope_abi::ENV_MODE, "count");
    }
    if !opts.follow_exec {
        cmd.env(fnscope_abi::ENV_NO_FOLLOW, "1");
    }
    if let Some(cache) = opts.plan_cache.then(|| crate::agent_lib::plan_cache_dir(&agent)).flatten() {
        cmd.env(fnscope_abi::ENV_CACHE, cache);
    }
    if opts.mono_no_inline {
        cmd.env("MONO_ENV_OPTIONS", mono_no_inline(std::env::var_os("MONO_ENV_OPTIONS").as_deref()));
    }
    if !opts.values.is_empty() {
        cmd.env(fnscope_abi::ENV_ARGS, &opts.values);
    } else {
        // The recorder then looks for no data slots: none may come from an inherited setting.
        cmd.env_remove(fnscope_abi::ENV_ARGS);
    }
    if !f.filter.is_empty() {
        cmd.env(fnscope_abi::ENV_FILTER, f.filter.join("\n"));
    }
    if !f.exclude.is_empty() {
        cmd.env(fnscope_abi::ENV_EXCLUDE, f.exclude.join("\n"));
    }
    if f.app_only {
        cmd.env(fnscope_abi::ENV_APP_ONLY, "1").env(fnscope_abi::ENV_SYSTEM_DIRS, f.system_dirs.join(":"));
    }
    if f.depth > 0 {
        cmd.env(fnscope_abi::ENV_DEPTH, f.depth.to_string());
    }
    // Rounded down: a call at the threshold is kept.
    let min_ticks = if f.min_duration_ns > 0 { ((f.min_duration_ns as f64 * ticks_per_ns) as u64).max(1) } else { 0 };
    if min_ticks > 0 {
        cmd.env(fnscope_abi::ENV_MIN_TICKS, min_ticks.to_string());
    }
    if let Some(o) = &opts.flight {
        cmd.env(crate::flight::ENV_FLIGHT, "1");
        if let Some(sig) = o.signal() {
            cmd.env(fnscope_abi::ENV_TRIGGER_SIGNAL, sig.to_string());
        }
    }
    // Before the spawn: a signal sent to fnscope as soon as the program is up (it may print
    // "ready" before this thread runs again on a busy machine) must be forwarded, not kill
    // fnscope. exec resets the handlers in the program; one that lands in the child before
    // exec only sets that copy's flag.
    install_signal_forwarding();
    install_child_wakeup();
    let child = cmd.spawn().with_context(|| format!("cannot start {}", program.display()))?;
    SPAWNED.store(true, Ordering::Relaxed);
    let child_pid = child.id() as libc::pid_t;
    let flight = opts.flight.clone().map(|o| Flight::new(o, ticks_per_ns));
    let mut rec = Recorder {
        region,
        writer,
        dir: dir.clone(),
        images_written: HashMap::new(),
        image_stamps: HashMap::new(),
        image_copied: HashMap::new(),
        images_final: false,
        images_dir_seen: None,
        images_checked: false,
        pids: BTreeSet::new(),
        calls: 0,
        thread_names: BTreeMap::new(),
        meta,
        start: (tsc0, mono0),
        image_texts: BTreeMap::new(),
        flight,
        scanned: HashMap::new(),
        holes_seen: HashMap::new(),
        requests_seen: 0,
        crash_signal: None,
        min_ticks,
        split: Default::default(),
        spill_after: opts.spill_after,
        processors: std::thread::available_parallelism().map_or(1, |n| n.get()),
        backlog: Backlog::default(),
        values: !opts.values.is_empty(),
        failed: None,
        unwritten: 0,
        marks: Vec::new(),
    };
    let mut status: Option<(Option<i32>, Option<i32>)> = None;
    let mut last_harvest = Instant::now();
    // None until the program hands a chunk over: it is starting (a big program hooks for tens
    // of milliseconds), and nothing is to be copied soon.
    let mut last_busy: Option<Instant> = None;
    let mut last_image_look = Instant::now();
    let mut naps = Naps::new(records_per_chunk(opts.chunk_size));
    // Short naps must be short: the kernel's default slack would add 50 us to each.
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes how late this thread's timers may fire.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000, 0, 0, 0) };
    // From here on an error (a full disk) stops the trace, not the recording: the program
    // runs on (see `Recorder::failed`).
    loop {
        let drained = rec.drain(true);
        let busy = rec.or_fail(drained);
        let sig = PENDING_SIGNAL.swap(0, Ordering::Relaxed);
        if sig != 0 {
            // SAFETY: forwarding a signal to our own child.
            unsafe { libc::kill(child_pid, sig) };
        }
        let mut all_gone = false;
        loop {
            let mut st: libc::c_int = 0;
            // SAFETY: waitpid with a valid status pointer.
            let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if r == 0 {
                break;
            }
            if r < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                all_gone = true;
                break;
            }
            if r == child_pid {
                status = Some(if libc::WIFEXITED(st) {
                    (Some(libc::WEXITSTATUS(st)), None)
                } else {
                    (None, Some(libc::WTERMSIG(st)))
                });
            }
            if libc::WIFSIGNALED(st) && CRASH_SIGNALS.contains(&libc::WTERMSIG(st)) {
                if let Some(f) = &mut rec.flight {
                    if f.opts.has(|t| matches!(t, Trigger::Crash)) {
                        f.fire(format!("crash: process {r} died of signal {}", libc::WTERMSIG(st)));
                        rec.crash_signal = Some(libc::WTERMSIG(st));
                        // Its chunks and open calls first: they are what the snapshot is for.
                        let harvested = rec.harvest(false);
                        rec.or_fail(harvested);
                    }
                }
            }
        }
        if all_gone {
            break;
        }
        if last_harvest.elapsed() > Duration::from_millis(100) {
            let harvested = rec.harvest(false).and_then(|()| rec.flush());
            rec.or_fail(harvested);
            last_harvest = Instant::now();
        }
        let looked = rec.scan_live().and_then(|()| rec.snapshot_if_due());
        rec.or_fail(looked);
        if busy > 0 {
            if let Some(t) = last_busy {
                naps.records(busy, t.elapsed());
            }
            last_busy = Some(Instant::now());
        } else {
            if last_image_look.elapsed() >= IMAGE_LOOK {
                let copied = rec.copy_new_images();
                rec.or_fail(copied);
                last_image_look = Instant::now();
            }
            // While the program hands chunks over, come back when the next one can be full:
            // a chunk freed then is the one it takes after that, still warm in its cache
            // (with the quick copies of flight mode, a 1 ms nap cost the program a fifth of
            // its speed), and each nap is a system call and a timer (naps of 5 us were a
            // fifth of the recorder's time). An idle program gets the long nap.
            nap(if last_busy.is_some_and(|t| t.elapsed() < Duration::from_millis(20)) { naps.short() } else { Duration::from_millis(1) });
        }
    }
    let drained = rec.drain(false).and_then(|_| rec.harvest(true));
    rec.or_fail(drained);
    rec.images_final = true;
    let copied = rec.copy_images().and_then(|()| rec.snapshot_if_due());
    rec.or_fail(copied);
    if let Some(f) = &mut rec.flight {
        if f.opts.has(|t| matches!(t, Trigger::Exit)) && f.written < f.opts.max_snapshots && rec.failed.is_none() {
            let why = match status {
                Some((Some(c), _)) => format!("exit: the program ended with status {c}"),
                Some((None, Some(s))) => format!("exit: the program was killed by signal {s}"),
                _ => "exit".to_string(),
            };
            let taken = rec.snapshot(&why);
            rec.or_fail(taken);
        }
    }
    let counted = if rec.failed.is_none() {
        let counted = rec.write_joined().and_then(|()| copy_counts(&dir, &mut rec.writer, &mut rec.pids));
        rec.or_fail(counted)
    } else {
        0
    };
    let (tsc1, mono1, real1) = (tsc(), clock_ns(libc::CLOCK_MONOTONIC), clock_ns(libc::CLOCK_REALTIME));
    let ticks_per_ns = if mono1 > mono0 { (tsc1 - tsc0) as f64 / (mono1 - mono0) as f64 } else { 1.0 };
    let (exit_status, killed_by_signal) = status.unwrap_or((None, None));
    let lost = rec.region.lost();
    let end = EndInfo {
        end_unix_ns: real1,
        tsc_at_end: tsc1,
        ticks_per_ns,
        exit_status,
        killed_by_signal,
        lost_records: lost,
        unmatched_returns: rec.region.unmatched_returns(),
        untraced_images: rec.region.untraced_images(),
        processes: rec.pids.iter().copied().collect(),
        threads: rec
            .thread_names
            .iter()
            .filter(|((pid, _), _)| rec.pids.contains(pid))
            .map(|(&(pid, tid), name)| fnscope_format::ThreadName { pid, tid, name: name.clone() })
            .collect(),
        ..EndInfo::default()
    };
    if rec.failed.is_none() {
        let ended = rec.write_joined().and_then(|()| rec.writer.write_end(&end).and_then(|()| rec.writer.flush()).map_err(anyhow::Error::from));
        rec.or_fail(ended);
    }
    let mut bytes = rec.writer.bytes_written();
    if let Some(why) = rec.failed.clone() {
        // What the writer still holds would land past the end the trace is given now.
        rec.writer.abandon();
        reserve.release();
        let trace = dir.join(fnscope_format::TRACE_FILE);
        let made = rec.calls + rec.unwritten;
        let (marks, mut kept) = (&rec.marks, None);
        let mut end_at = |cut: u64, threads| {
            let calls = marks.iter().rev().find(|m| m.0 <= cut).map_or(0, |m| m.1);
            kept = Some(calls);
            EndInfo { write_error: Some(why.clone()), unwritten_calls: made - calls, threads, ..end.clone() }
        };
        // Without the threads' names if they take more than the room set aside.
        let ended = fnscope_format::end_torn_trace(&trace, |cut| end_at(cut, end.threads.clone()))
            .or_else(|_| fnscope_format::end_torn_trace(&trace, |cut| end_at(cut, Vec::new())));
        match ended {
            Ok(len) => bytes = len,
            Err(e) => eprintln!("fnscope: warning: the trace has no END chunk either ({e}): its times are not calibrated"),
        }
        if let Some(calls) = kept {
            (rec.calls, rec.unwritten) = (calls, made - calls);
        }
        eprintln!(
            "fnscope: error: the trace holds the {} calls written before writing failed ({why}); the {} calls made after are not in it; `fnscope report -i {}` reads what it holds",
            rec.calls,
            rec.unwritten,
            opts.output.display()
        );
    } else if rec.writer.raw_chunks() > 0 {
        let raw = rec.writer.raw_chunks();
        let started = Instant::now();
        let bar = crate::progress::Progress::new("compressing the chunks written uncompressed");
        match fnscope_format::compact(&dir.join(fnscope_format::TRACE_FILE), |done, total| bar.update(done, total)) {
            Ok(c) => {
                bytes = c.bytes_after;
                if opts.verbose {
                    eprintln!(
                        "fnscope: {raw} chunks written uncompressed to keep up with the program, compressed after it ended in {:.2} s (trace {} before, {} after)",
                        started.elapsed().as_secs_f64(),
                        human_bytes(c.bytes_before),
                        human_bytes(c.bytes_after)
                    );
                }
            }
            // The trace reads the same as it is, only bigger.
            Err(e) => eprintln!("fnscope: warning: the trace stays partly uncompressed: {e}"),
        }
    }
    let (hooked, skipped) = rec.images_written.values().fold((0, 0), |(h, s), c| (h + c.0, s + c.1));
    // Tables and counters are in the trace file now; these folders were the agents' mailbox.
    let _ = std::fs::remove_dir_all(dir.join("images"));
    let _ = std::fs::remove_dir_all(dir.join("counts"));
    let per_call = if rec.calls > 0 { format!(" ({:.1} bytes/call)", bytes as f64 / rec.calls as f64) } else { String::new() };
    let lost_note = if lost > 0 { format!(", {lost} calls lost (buffers full)") } else { String::new() };
    let untraced = rec.region.untraced_images();
    // An image that ran untraced has no table: the warning below says why.
    if hooked == 0 && untraced == 0 {
        let filters = &opts.filters;
        let filtered = if filters.filter.is_empty() && filters.exclude.is_empty() {
            ""
        } else {
            " (--filter and --exclude leave some out: check them)"
        };
        eprintln!(
            "fnscope: warning: no function could be hooked, so no call was recorded; `fnscope funcs {}` lists the functions \
             found in the program and why each was left out{filtered}",
            program.display()
        );
    }
    if untraced > 0 {
        eprintln!(
            "fnscope: warning: {untraced} process image(s) ran untraced: their agent could not set up (the messages above say why); \
             their calls are not in the trace"
        );
    }
    let unmatched = rec.region.unmatched_returns();
    if unmatched > 0 {
        eprintln!(
            "fnscope: warning: {unmatched} returns matched no open call (code that moves its own return address); \
             each was matched to the newest call it could be the return of"
        );
    }
    if let Some(f) = &rec.flight {
        eprintln!(
            "fnscope: {} functions hooked, {} skipped; flight recorder: {} calls seen in {} process(es){}, {} snapshot(s) in {}",
            hooked,
            skipped,
            rec.calls,
            rec.pids.len().max(1),
            lost_note,
            f.written,
            opts.output.display(),
        );
    } else if opts.count {
        eprintln!(
            "fnscope: {} functions hooked, {} skipped; {} calls counted in {} process(es); trace {} in {}",
            hooked,
            skipped,
            counted,
            rec.pids.len().max(1),
            human_bytes(bytes),
            opts.output.display(),
        );
    } else {
        eprintln!(
            "fnscope: {} functions hooked, {} skipped; {} calls recorded in {} process(es){}; trace {} in {}{}",
            hooked,
            skipped,
            rec.calls,
            rec.pids.len().max(1),
            lost_note,
            human_bytes(bytes),
            opts.output.display(),
            per_call
        );
    }
    let exit_code = match (exit_status, killed_by_signal) {
        // A trace cut short by an error makes a clean run's exit code 2, as a failed upload
        // does, so that a script notices; a failed program's own code comes first.
        (Some(0), _) if rec.failed.is_some() => 2,
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    };
    let signal = if exit_status.is_none() { killed_by_signal } else { None };
    if let Some(sig) = signal {
        eprintln!("fnscope: the program was killed by signal {sig} ({}); its calls until then are in the trace", signal_name(sig));
    }
    Ok(RecordOutcome { exit_code, signal })
}

/// Count mode: turns every block of every `counts/<sid>.bin` into a COUNTS chunk. Returns
/// the number of calls counted.
fn copy_counts(dir: &Path, writer: &mut TraceWriter, pids: &mut BTreeSet<u32>) -> Result<u64> {
    use fnscope_abi::counts::{block_offset, BlockHeader, CountsHeader, BLOCK_FREE, BLOCK_HEADER_SIZE, HEADER_SIZE, MAGIC};
    let Ok(rd) = std::fs::read_dir(dir.join("counts")) else { return Ok(0) };
    let mut files: Vec<(u32, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().to_string_lossy().strip_suffix(".bin")?.parse().ok()?, e.path())))
        .collect();
    files.sort();
    let mut total = 0u64;
    for (sid, path) in files {
        let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: a read-only map of a file no process writes any more (all have exited).
        let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        // The file is mostly holes (room for threads and late libraries): reading around each
        // page touched would fill the page cache with zeros, 5-10 ms a process of `make`.
        // Only advice: without it the counts read the same.
        let _ = map.advise(memmap2::Advice::Random);
        if map.len() < HEADER_SIZE {
            continue;
        }
        // SAFETY: the map holds at least the header page; fields are read by value.
        let (magic, capacity, nblocks, block_size, nfuncs, lost) = unsafe {
            let h = &*(map.as_ptr() as *const CountsHeader);
            (h.magic, h.capacity, h.nblocks.min(h.blocks_used.max(1)), h.block_size, h.nfuncs, h.threads_lost)
        };
        if magic != MAGIC || nfuncs > capacity || block_offset(block_size, nblocks) > map.len() {
            eprintln!("fnscope: warning: {} is not a complete counts file; its counts are left out", path.display());
            continue;
        }
        if lost > 0 {
            eprintln!("fnscope: warning: {lost} threads of image {sid} found no free counter block; their calls are not counted");
        }
        for i in 0..nblocks {
            let off = block_offset(block_size, i);
            // SAFETY: the block lies inside the map (checked against nblocks above).
            let (state, pid, tid) = unsafe {
                let b = &*(map.as_ptr().add(off) as *const BlockHeader);
                (b.state, b.pid, b.tid)
            };
            if state == BLOCK_FREE && i != 0 {
                continue;
            }
            let start = off + BLOCK_HEADER_SIZE;
            let counts: Vec<u64> = map[start..start + nfuncs as usize * 8]
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect();
            let sum: u64 = counts.iter().sum();
            if sum == 0 {
                continue;
            }
            total += sum;
            pids.insert(pid);
            writer.write_counts(&fnscope_format::CountsSegment { sid, pid, tid, counts })?;
        }
    }
    Ok(total)
}

/// Functions hooked and skipped in an image table's text, counted as it is copied: reading
/// the tables again at the end, three passes each, was a tenth of the wall time of a traced
/// `cc1plus --version`.
fn count_hooks(text: &str) -> (usize, usize) {
    let (mut func, mut unhooked, mut skip) = (0, 0, 0);
    for line in text.lines() {
        if line.starts_with("func\t") {
            func += 1;
        } else if line.starts_with("unhooked\t") {
            unhooked += 1;
        } else if line.starts_with("skip\t") {
            skip += 1;
        }
    }
    (func - unhooked.min(func), skip + unhooked)
}

/// Bytes in a short human form.
pub fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::{mono_no_inline, running_tasks, Backlog, DEFAULT_SPILL_AFTER, LOAD_LOOK};
    use std::ffi::OsStr;
    use std::time::Instant;

    #[test]
    fn mono_no_inline_keeps_the_users_options() {
        assert_eq!(mono_no_inline(None), "-O=-inline");
        assert_eq!(mono_no_inline(Some(OsStr::new(""))), "-O=-inline");
        assert_eq!(mono_no_inline(Some(OsStr::new("--debug"))), "--debug -O=-inline");
    }

    #[test]
    fn running_tasks_are_read_from_loadavg() {
        assert_eq!(running_tasks("0.52 0.58 0.59 3/345 12345\n"), Some(3));
        assert_eq!(running_tasks("12.00 8.10 4.00 17/2048 99"), Some(17));
        assert_eq!(running_tasks("0.52 0.58 0.59"), None);
        assert_eq!(running_tasks("0.52 0.58 0.59 x/345 1"), None);
        // This very process is running while it reads its own count.
        let own = std::fs::read_to_string("/proc/loadavg").unwrap();
        assert!(running_tasks(&own).is_some_and(|n| n >= 1), "{own}");
    }

    /// Passes `waiting` chunks each, one [`LOAD_LOOK`] apart from `at` on, the load looks
    /// answering `busy`; returns whether the backlog says to spill every chunk after each.
    fn passes(b: &mut Backlog, at: &mut Instant, waiting: &[usize], busy: bool) -> Vec<bool> {
        let mut asked = 0;
        let out = waiting
            .iter()
            .map(|&w| {
                *at += LOAD_LOOK;
                b.pass(w, *at, || {
                    asked += 1;
                    busy
                });
                b.spill_all()
            })
            .collect();
        assert!(asked <= waiting.len());
        out
    }

    #[test]
    fn a_lasting_backlog_spills_every_chunk_while_a_processor_is_free() {
        let behind = DEFAULT_SPILL_AFTER + 1;
        let (mut b, mut at) = (Backlog::default(), Instant::now());
        // A pass after a nap finds a few, the next ones none: never.
        assert_eq!(passes(&mut b, &mut at, &[behind, 0, 1, 0, behind, 2, 0], false), [false; 7]);
        // A backlog that lasts, with a processor free: once four looks were made.
        assert_eq!(passes(&mut b, &mut at, &[behind, behind, 3, behind, 2, 1], false), [false, false, false, true, true, true]);
        // Caught up: over, and a new backlog must prove itself again.
        assert_eq!(passes(&mut b, &mut at, &[0, behind, behind], false), [false; 3]);
        // The same backlog with every processor busy: never (the program would wait for the
        // recorder's extra work).
        let mut b = Backlog::default();
        assert_eq!(passes(&mut b, &mut at, &[behind; 12], true), [false; 12]);
        // Busy now and then: three quarters of the last eight looks decide.
        let mut b = Backlog::default();
        let mut got = passes(&mut b, &mut at, &[behind; 8], false);
        got.extend(passes(&mut b, &mut at, &[behind; 2], true));
        got.extend(passes(&mut b, &mut at, &[behind], true));
        assert_eq!(got, [false, false, false, true, true, true, true, true, true, true, false]);
    }

    #[test]
    fn the_load_is_looked_at_once_per_interval_and_only_during_a_backlog() {
        let (mut b, at) = (Backlog::default(), Instant::now());
        let mut asked = 0;
        b.pass(3, at, || {
            asked += 1;
            false
        });
        assert_eq!(asked, 0, "no backlog yet");
        for _ in 0..5 {
            b.pass(DEFAULT_SPILL_AFTER + 1, at, || {
                asked += 1;
                false
            });
        }
        assert_eq!(asked, 1, "five passes within one interval");
    }
}
