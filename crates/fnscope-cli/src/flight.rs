//! The flight recorder (`record --flight`): the recorder keeps the last calls of every thread
//! in memory, writes nothing while the program runs, and turns what it holds into a trace
//! folder (`DIR/snapshot-N`) when a trigger fires.
//!
//! The program's side is plain timing mode: threads fill chunks of the shared region and hand
//! them over as usual, so flight mode costs the program exactly what timing mode does. The
//! recorder copies each chunk into a per-thread ring instead of encoding it, and keeps at most
//! `SIZE` bytes of records per thread. A snapshot adds what the threads hold at that moment:
//! the records of their current chunks and the calls still open on their shadow stacks, which
//! are in shared memory and so survive a crash of the program.

use anyhow::{anyhow, bail, Context, Result};
use fnscope_abi::{Record, RegionHeader, RECORD_SIZE};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Options of `record` for the flight recorder.
#[derive(clap::Args)]
pub struct FlightArgs {
    /// Flight recorder: keep only the last SIZE of calls of each thread in memory (8M if no
    /// SIZE is given, about 350,000 calls) and write nothing until a trigger fires; each
    /// trigger writes a snapshot, a trace folder DIR/snapshot-N that every command reads.
    #[arg(long, value_name = "SIZE", num_args = 0..=1, default_missing_value = "8M", require_equals = true)]
    flight: Option<String>,
    /// When to write a snapshot (repeatable): `FUNC>DURATION` (a call of a function whose
    /// name matches the glob FUNC took at least DURATION, e.g. 'frame>16ms'; checked when it
    /// returns), `signal:NAME` (the program gets signal NAME, e.g. signal:USR2), `crash` (the
    /// program, or a process orphaned to fnscope, dies of SIGSEGV, SIGBUS, SIGABRT, SIGILL,
    /// SIGFPE, SIGTRAP or SIGSYS),
    /// `exit` (the program ends). Default: crash and exit. `fnscope snapshot PID` asks for one
    /// at any time.
    #[arg(long, value_name = "TRIGGER", requires = "flight")]
    trigger: Vec<String>,
    /// Ignore triggers during the first DURATION of the run (start-up).
    #[arg(long, value_name = "DURATION", requires = "flight")]
    arm_after: Option<String>,
    /// Write at most N snapshots [default: 16].
    #[arg(long, value_name = "N", requires = "flight")]
    max_snapshots: Option<u32>,
    /// At least DURATION between two snapshots: a trigger that fires often does not flood
    /// the disk [default: 1s].
    #[arg(long, value_name = "DURATION", requires = "flight")]
    snapshot_gap: Option<String>,
}

/// What fires a snapshot.
#[derive(Debug, Clone)]
pub enum Trigger {
    /// A call of a matching function at least this long.
    Slow {
        /// As the user wrote it.
        text: String,
        /// The function pattern.
        pattern: glob::Pattern,
        /// The threshold in ns.
        ns: u64,
    },
    /// The program gets this signal.
    Signal(i32),
    /// A traced process dies of a crash signal.
    Crash,
    /// The program ends.
    Exit,
}

/// The flight recorder's settings, checked.
#[derive(Clone)]
pub struct FlightOptions {
    /// Bytes of records kept per thread.
    pub size: usize,
    /// What fires a snapshot.
    pub triggers: Vec<Trigger>,
    /// Triggers before this are ignored.
    pub arm_after: Duration,
    /// Snapshots written at most.
    pub max_snapshots: u32,
    /// Least time between two snapshots.
    pub gap: Duration,
}

impl FlightOptions {
    /// The signal trigger, if any.
    pub fn signal(&self) -> Option<i32> {
        self.triggers.iter().find_map(|t| match t {
            Trigger::Signal(s) => Some(*s),
            _ => None,
        })
    }

    /// Whether `t` is among the triggers.
    pub fn has(&self, want: fn(&Trigger) -> bool) -> bool {
        self.triggers.iter().any(want)
    }
}

fn duration(s: &str, option: &str) -> Result<Duration> {
    Ok(Duration::from_nanos(fnscope_export::parse_duration(s, option)?))
}

/// A signal by name (`USR2`, `SIGUSR2`) or number.
fn signal_number(name: &str) -> Option<i32> {
    if let Ok(n) = name.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let n = name.strip_prefix("SIG").unwrap_or(name);
    Some(match n {
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "HUP" => libc::SIGHUP,
        "QUIT" => libc::SIGQUIT,
        "WINCH" => libc::SIGWINCH,
        "PWR" => libc::SIGPWR,
        "URG" => libc::SIGURG,
        _ => return None,
    })
}

fn parse_trigger(t: &str) -> Result<Trigger> {
    match t {
        "crash" => return Ok(Trigger::Crash),
        "exit" => return Ok(Trigger::Exit),
        _ => {}
    }
    if let Some(name) = t.strip_prefix("signal:") {
        let sig = signal_number(name)
            .ok_or_else(|| anyhow!("--trigger {t:?}: unknown signal {name:?}; use a name such as USR2 or a number"))?;
        if [libc::SIGKILL, libc::SIGSTOP].contains(&sig) {
            bail!("--trigger {t:?}: that signal cannot be caught; use USR1 or USR2");
        }
        return Ok(Trigger::Signal(sig));
    }
    if let Some((func, d)) = t.split_once('>') {
        let pattern = glob::Pattern::new(func.trim()).map_err(|e| anyhow!("--trigger {t:?}: {e}"))?;
        let ns = fnscope_export::parse_duration(d, "--trigger")?;
        return Ok(Trigger::Slow { text: t.to_string(), pattern, ns });
    }
    bail!("--trigger {t:?}: write FUNC>DURATION (e.g. 'frame>16ms'), signal:USR2, crash or exit")
}

impl FlightArgs {
    /// Checks the options; `None` without `--flight`.
    pub fn check(self, count: bool) -> Result<Option<FlightOptions>> {
        let Some(size) = self.flight else { return Ok(None) };
        if count {
            bail!("--flight records calls with their times: it does not go with --mode count");
        }
        let size = crate::export::parse_size(&size, "--flight")? as usize;
        if size < 64 << 10 {
            bail!("--flight={size}: keep at least 64K per thread (one chunk of records)");
        }
        let mut triggers = self.trigger.iter().map(|t| parse_trigger(t)).collect::<Result<Vec<_>>>()?;
        if triggers.is_empty() {
            triggers = vec![Trigger::Crash, Trigger::Exit];
        }
        if triggers.iter().filter(|t| matches!(t, Trigger::Signal(_))).count() > 1 {
            bail!("--trigger signal:...: give one signal");
        }
        Ok(Some(FlightOptions {
            size,
            triggers,
            arm_after: self.arm_after.as_deref().map(|d| duration(d, "--arm-after")).transpose()?.unwrap_or_default(),
            max_snapshots: self.max_snapshots.unwrap_or(16),
            gap: self.snapshot_gap.as_deref().map(|d| duration(d, "--snapshot-gap")).transpose()?.unwrap_or(Duration::from_secs(1)),
        }))
    }
}

/// Records of one thread taken from one chunk, or its open calls.
pub struct Segment {
    /// Image session id, process and thread.
    pub sid: u32,
    /// See `sid`.
    pub pid: u32,
    /// See `sid`.
    pub tid: u32,
    /// Sequence number of the chunk in the thread's stream.
    pub seq: u64,
    /// Records the thread dropped before these.
    pub lost: u64,
    /// Chunk flags.
    pub flags: u32,
    /// The call records.
    pub recs: Vec<Record>,
    /// The data units of those that have one.
    pub data: fnscope_format::CallData,
}

impl Segment {
    /// A segment of the records a thread wrote, data slots included (they are separated
    /// from the call records here).
    pub fn new(sid: u32, pid: u32, tid: u32, seq: u64, lost: u64, flags: u32, raw: Vec<Record>) -> Segment {
        let (recs, data) = if has_data_slots(&raw) { fnscope_format::split_data(&raw) } else { (raw, Default::default()) };
        Segment { sid, pid, tid, seq, lost, flags, recs, data }
    }

    /// Bytes it holds in memory: records and data words.
    pub fn bytes(&self) -> usize {
        self.recs.len() * RECORD_SIZE + self.data.word_count() * 8
    }
}

/// Whether records a thread wrote hold data slots (calls with arguments or return values):
/// their third word has zero low half, which no call record has.
pub fn has_data_slots(raw: &[Record]) -> bool {
    raw.iter().any(|r| r.id_depth as u32 == 0)
}

#[derive(Default)]
struct Ring {
    segs: VecDeque<Segment>,
    bytes: usize,
}

/// The rings of every thread and the triggers' state.
pub struct Flight {
    /// The settings.
    pub opts: FlightOptions,
    ticks_per_ns: f64,
    rings: BTreeMap<(u32, u32), Ring>,
    total: usize,
    /// Per image session: function id to the slow-call threshold (ticks) and trigger text.
    slow: HashMap<u32, HashMap<u32, (u64, usize)>>,
    started: Instant,
    last: Option<Instant>,
    /// Snapshots written so far.
    pub written: u32,
    /// Why a snapshot is due, when one is.
    pending: Option<String>,
}

impl Flight {
    /// A flight recorder with nothing kept yet; `ticks_per_ns` converts the thresholds.
    pub fn new(opts: FlightOptions, ticks_per_ns: f64) -> Flight {
        Flight {
            opts,
            ticks_per_ns,
            rings: BTreeMap::new(),
            total: 0,
            slow: HashMap::new(),
            started: Instant::now(),
            last: None,
            written: 0,
            pending: None,
        }
    }

    /// Whether any trigger looks at calls as they return.
    pub fn watches_calls(&self) -> bool {
        self.opts.has(|t| matches!(t, Trigger::Slow { .. }))
    }

    /// Learns the functions of image `sid` (its image table's text) that slow-call triggers
    /// name.
    pub fn image(&mut self, sid: u32, text: &str) {
        if !self.watches_calls() {
            return;
        }
        let mut ids = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() < 6 || f[0] != "func" {
                continue;
            }
            let Ok(id) = f[1].parse::<u32>() else { continue };
            let raw = f[5];
            let shown = fnscope_symbols::demangle(raw);
            for (k, t) in self.opts.triggers.iter().enumerate() {
                if let Trigger::Slow { pattern, ns, .. } = t {
                    if pattern.matches(raw) || pattern.matches(&shown) {
                        let ticks = (*ns as f64 * self.ticks_per_ns) as u64;
                        let e = ids.entry(id).or_insert((ticks, k));
                        if ticks < e.0 {
                            *e = (ticks, k);
                        }
                    }
                }
            }
        }
        self.slow.insert(sid, ids);
    }

    /// Looks at records of image `sid` as they come: a slow call of a watched function fires.
    pub fn scan(&mut self, sid: u32, recs: &[Record]) {
        let Some(ids) = self.slow.get(&sid) else { return };
        if ids.is_empty() {
            return;
        }
        let calls = recs.iter().filter(|r| !fnscope_abi::data::is_data_tag(r.id_depth));
        let hit = calls.into_iter().find_map(|r| ids.get(&r.id()).filter(|(ticks, _)| r.ticks() >= *ticks).map(|&(_, k)| (r, k)));
        if let Some((r, k)) = hit {
            let Trigger::Slow { text, .. } = &self.opts.triggers[k] else { return };
            let ms = r.ticks() as f64 / self.ticks_per_ns / 1e6;
            let why = format!("{text} (a call took {ms:.1} ms)");
            self.fire(why);
        }
    }

    /// Keeps a thread's records, dropping its oldest beyond the per-thread size, and the
    /// rings of threads that ended when all rings together hold more than 64 times that.
    pub fn keep(&mut self, seg: Segment) {
        let bytes = seg.bytes();
        let ended = seg.flags & fnscope_abi::CHUNK_FLAG_LAST != 0;
        let ring = self.rings.entry((seg.pid, seg.tid)).or_default();
        ring.bytes += bytes;
        self.total += bytes;
        ring.segs.push_back(seg);
        while ring.bytes > self.opts.size && ring.segs.len() > 1 {
            let old = ring.segs.pop_front().map_or(0, |s| s.bytes());
            ring.bytes -= old;
            self.total -= old;
        }
        if ended && self.total > 64 * self.opts.size {
            let done: Vec<(u32, u32)> = self
                .rings
                .iter()
                .filter(|(_, r)| r.segs.back().is_some_and(|s| s.flags & fnscope_abi::CHUNK_FLAG_LAST != 0))
                .map(|(k, _)| *k)
                .collect();
            for k in done {
                if self.total <= 32 * self.opts.size {
                    break;
                }
                if let Some(r) = self.rings.remove(&k) {
                    self.total -= r.bytes;
                }
            }
        }
    }

    /// A trigger fired: a snapshot is due unless it is too early, too soon after the last
    /// one, or the last allowed was written.
    pub fn fire(&mut self, why: String) {
        if self.pending.is_some()
            || self.written >= self.opts.max_snapshots
            || self.started.elapsed() < self.opts.arm_after
            || self.last.is_some_and(|l| l.elapsed() < self.opts.gap)
        {
            return;
        }
        self.pending = Some(why);
    }

    /// Why a snapshot is due, taking it.
    pub fn take_pending(&mut self) -> Option<String> {
        self.pending.take()
    }

    /// Notes a snapshot as written.
    pub fn wrote(&mut self) {
        self.written += 1;
        self.last = Some(Instant::now());
    }

    /// Every segment kept, thread by thread, oldest first.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.rings.values().flat_map(|r| r.segs.iter())
    }
}

/// Where snapshot `n` of a recording into `dir` goes.
pub fn snapshot_dir(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("snapshot-{n}"))
}

/// `fnscope snapshot PID`: asks the recorder of process `pid` for a snapshot and waits for
/// it. Returns the snapshot's folder.
pub fn request_snapshot(pid: u32) -> Result<PathBuf> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow!("no process {pid}: give the pid of a program recorded with `fnscope record --flight`"),
        _ => anyhow!("cannot read the environment of process {pid} ({e}): run as its user or as root"),
    })?;
    let var = |k: &str| {
        environ.split(|&b| b == 0).find_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            kv.strip_prefix(k)?.strip_prefix('=').map(str::to_string)
        })
    };
    let (Some(shm), Some(dir)) = (var(fnscope_abi::ENV_SHM), var(fnscope_abi::ENV_DIR)) else {
        bail!("process {pid} is not traced by fnscope: start it with `fnscope record --flight -- PROGRAM`");
    };
    if var(ENV_FLIGHT).as_deref() != Some("1") {
        bail!("process {pid} is recorded without --flight: its whole trace goes to {dir} anyway");
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&shm)
        .with_context(|| format!("the recorder of process {pid} is gone ({shm} cannot be opened)"))?;
    // SAFETY: the recorder's region file, mapped shared; only the header's atomic counters
    // are touched.
    let map = unsafe { memmap2::MmapMut::map_mut(&file) }.context("cannot map the recorder's shared buffer")?;
    if map.len() < fnscope_abi::REGION_HEADER_SIZE {
        bail!("{shm} is not an fnscope shared buffer");
    }
    let hdr = map.as_ptr() as *mut RegionHeader;
    // SAFETY: the header page is mapped; magic and version are read before anything else.
    let (magic, version) = unsafe { ((*hdr).magic, (*hdr).version) };
    if magic != fnscope_abi::REGION_MAGIC || version != fnscope_abi::REGION_VERSION {
        bail!("process {pid} is recorded by another version of fnscope: use that version's `fnscope snapshot`");
    }
    // SAFETY: aligned u32 fields of the mapped header, shared with the recorder.
    let (requests, answered) = unsafe {
        (
            AtomicU32::from_ptr(std::ptr::addr_of_mut!((*hdr).snapshot_requests)),
            AtomicU32::from_ptr(std::ptr::addr_of_mut!((*hdr).snapshots_answered)),
        )
    };
    let before = existing_snapshots(Path::new(&dir));
    let mine = requests.fetch_add(1, Ordering::AcqRel) + 1;
    let t0 = Instant::now();
    while answered.load(Ordering::Acquire).wrapping_sub(mine) > u32::MAX / 2 {
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("the recorder of process {pid} did not answer within 30 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = existing_snapshots(Path::new(&dir));
    match after.into_iter().filter(|n| !before.contains(n)).max() {
        Some(n) => Ok(snapshot_dir(Path::new(&dir), n)),
        None => bail!(
            "the recorder of process {pid} took no snapshot: too early (--arm-after), too soon after the last one \
             (--snapshot-gap) or --max-snapshots reached"
        ),
    }
}

/// The snapshot folders of a flight recording into `dir`, in the order they were taken.
pub fn snapshot_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut n = existing_snapshots(dir);
    n.sort_unstable();
    n.into_iter().map(|n| snapshot_dir(dir, n)).collect()
}

/// Numbers of the snapshot folders in `dir`.
fn existing_snapshots(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("snapshot-")?.parse().ok())
                .filter(|&n| snapshot_dir(dir, n).join("trace.fns").exists())
                .collect()
        })
        .unwrap_or_default()
}

/// Set to `1` in the traced program's environment in flight mode, so that `fnscope snapshot`
/// can tell.
pub const ENV_FLIGHT: &str = "FNSCOPE_FLIGHT";
