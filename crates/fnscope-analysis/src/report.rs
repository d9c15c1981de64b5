//! Per-function and per-thread statistics, computed in one streaming pass over the calls
//! in the order they returned ([`crate::walk_calls`] with [`Order::Returned`]).

use crate::calls::{walk_calls, CallInfo, Order, Selection};
use crate::names::Names;
use crate::profile::{basename, Profile};
use crate::{format_duration, ticks_to_ns, AnalysisError, Trace};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;

/// Statistics of one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FuncStats {
    /// Demangled name.
    pub name: String,
    /// Name as found in the ELF file.
    pub raw_name: String,
    /// File name of the ELF module.
    pub module: String,
    /// Link-time address in the module.
    pub address: u64,
    /// Completed calls (calls cut short by a longjmp/exception count too), summed over the
    /// runs when several were combined.
    pub calls: u64,
    /// Fewest calls in one run (0 if some run did not call it); `calls` for a single run.
    pub calls_min: u64,
    /// Most calls in one run; `calls` for a single run.
    pub calls_max: u64,
    /// Calls whose duration was recorded: 0 in count mode, `calls` in time mode, the calls
    /// of the timed runs when count and time runs were combined.
    pub timed_calls: u64,
    /// Sum of the calls' durations. Nested calls of a recursive function are each counted,
    /// so this can exceed the run time.
    pub total_ns: u64,
    /// Sum of the durations minus the time spent in hooked callees.
    pub self_ns: u64,
    /// Shortest call.
    pub min_ns: u64,
    /// Longest call.
    pub max_ns: u64,
}

impl FuncStats {
    /// Average duration of a timed call.
    pub fn avg_ns(&self) -> u64 {
        self.total_ns.checked_div(self.timed_calls).unwrap_or(0)
    }
}

/// Statistics of one thread.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadStats {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Calls recorded.
    pub calls: u64,
    /// Earliest call entry, in ns since the start of the recording.
    pub first_ns: u64,
    /// Latest call exit, in ns since the start of the recording; the run time is
    /// `last_ns - first_ns`.
    pub last_ns: u64,
    /// Records the thread lost because the shared buffer was full.
    pub lost: u64,
}

impl ThreadStats {
    /// From the earliest start to the latest end of the thread's calls.
    pub fn run_ns(&self) -> u64 {
        self.last_ns.saturating_sub(self.first_ns)
    }
}

/// The result of [`report`].
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// All functions that were called, sorted by total time (by calls without times).
    pub functions: Vec<FuncStats>,
    /// Runs the figures are summed over (1 for a recorded trace).
    pub runs: u64,
    /// Whether times were recorded (in at least one run); count mode gives calls only.
    pub timed: bool,
    /// All threads that recorded calls, by pid and tid.
    pub threads: Vec<ThreadStats>,
    /// Functions per `(pid, tid)`, when asked for.
    pub per_thread: Option<BTreeMap<(u32, u32), Vec<FuncStats>>>,
    /// The trace ended abruptly or was damaged: figures cover only what was read.
    pub truncated: bool,
    /// Problems the user should know about.
    pub warnings: Vec<String>,
}

/// What to sort functions by (largest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Number of calls.
    Calls,
    /// Total time.
    Total,
    /// Self time.
    SelfTime,
    /// Average time per call.
    Avg,
}

/// Sorts functions by `key`, largest first; ties by name so that output is stable.
pub fn sort(funcs: &mut [FuncStats], key: SortKey) {
    let k = |f: &FuncStats| match key {
        SortKey::Calls => f.calls,
        SortKey::Total => f.total_ns,
        SortKey::SelfTime => f.self_ns,
        SortKey::Avg => f.avg_ns(),
    };
    funcs.sort_by(|a, b| k(b).cmp(&k(a)).then_with(|| a.name.cmp(&b.name)));
}

/// Sums in TSC ticks; converted to ns once at the end, when the calibration is known.
#[derive(Clone, Copy)]
pub(crate) struct Agg {
    pub calls: u64,
    pub total: u64,
    pub self_t: u64,
    pub min: u64,
    pub max: u64,
}

impl Default for Agg {
    fn default() -> Agg {
        Agg {
            calls: 0,
            total: 0,
            self_t: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

impl Agg {
    fn add(&mut self, dur: u64, self_t: u64) {
        self.calls += 1;
        self.total = self.total.saturating_add(dur);
        self.self_t = self.self_t.saturating_add(self_t);
        self.min = self.min.min(dur);
        self.max = self.max.max(dur);
    }

    pub fn merge(&mut self, o: &Agg) {
        self.calls += o.calls;
        self.total = self.total.saturating_add(o.total);
        self.self_t = self.self_t.saturating_add(o.self_t);
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
}

/// Ids below this are counted in a dense vector; beyond it (only damaged or hostile input)
/// in a map, so that a huge id cannot make us allocate a huge vector.
const DENSE_IDS: u32 = 1 << 20;

/// Counters of one image's functions, by id.
#[derive(Default)]
struct IdAggs {
    dense: Vec<Agg>,
    sparse: HashMap<u32, Agg>,
}

impl IdAggs {
    fn get(&mut self, id: u32) -> &mut Agg {
        if id < DENSE_IDS {
            let i = id as usize;
            if i >= self.dense.len() {
                self.dense.resize(i + 1, Agg::default());
            }
            &mut self.dense[i]
        } else {
            self.sparse.entry(id).or_default()
        }
    }

    fn iter(&self) -> impl Iterator<Item = (u32, &Agg)> {
        let dense = self.dense.iter().enumerate().map(|(i, a)| (i as u32, a));
        dense
            .chain(self.sparse.iter().map(|(&i, a)| (i, a)))
            .filter(|(_, a)| a.calls > 0)
    }
}

/// The per-record lookup of `--per-thread` reports runs once per record; SipHash made it
/// the hottest spot. Keys are small integers, for which this multiplicative hash is enough.
#[derive(Clone, Copy, Default)]
struct FxBuild;

struct Fx(u64);

impl BuildHasher for FxBuild {
    type Hasher = Fx;
    fn build_hasher(&self) -> Fx {
        Fx(0)
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Running state of one thread.
pub(crate) struct ThreadAcc {
    /// Per open depth, the summed durations of the calls that returned at that depth since
    /// their parent opened: a parent subtracts its direct children's sum to get its self
    /// time. Depths are strictly increasing, so entries left by lost records are dropped in
    /// passing and the stack stays as small as the nesting.
    children: Vec<(u32, u64)>,
    pub calls: u64,
    pub first_tsc: u64,
    pub last_tsc: u64,
    pub lost: u64,
    funcs: HashMap<(u32, u32), Agg, FxBuild>,
}

impl Default for ThreadAcc {
    fn default() -> ThreadAcc {
        ThreadAcc {
            children: Vec::new(),
            calls: 0,
            first_tsc: u64::MAX,
            last_tsc: 0,
            lost: 0,
            funcs: HashMap::default(),
        }
    }
}

/// Everything one streaming pass gathers.
#[derive(Default)]
pub(crate) struct Aggregates {
    per_sid: HashMap<u32, IdAggs>,
    pub threads: HashMap<(u32, u32), ThreadAcc>,
    per_thread: bool,
    /// The counters of the image and the thread of the latest call, taken out of the maps
    /// while calls of the same ones follow (a segment's worth): no lookup per call.
    image: Option<(u32, IdAggs)>,
    thread: Option<((u32, u32), ThreadAcc)>,
}

impl Aggregates {
    /// Puts the counters in use back into the maps.
    fn settle(&mut self) {
        if let Some((k, v)) = self.image.take() {
            self.per_sid.insert(k, v);
        }
        if let Some((k, v)) = self.thread.take() {
            self.threads.insert(k, v);
        }
    }

    #[inline]
    fn add(&mut self, c: &CallInfo) {
        if self.image.as_ref().is_none_or(|(k, _)| *k != c.image) {
            if let Some((k, v)) = self.image.take() {
                self.per_sid.insert(k, v);
            }
            self.image = Some((c.image, self.per_sid.remove(&c.image).unwrap_or_default()));
        }
        let key = (c.pid, c.tid);
        if self.thread.as_ref().is_none_or(|(k, _)| *k != key) {
            if let Some((k, v)) = self.thread.take() {
                self.threads.insert(k, v);
            }
            self.thread = Some((key, self.threads.remove(&key).unwrap_or_default()));
        }
        let ids = &mut self.image.as_mut().expect("set above").1;
        let th = &mut self.thread.as_mut().expect("set above").1;
        th.calls += 1;
        {
            let d = c.depth;
            let dur = c.ticks();
            let mut children = 0;
            while let Some(&(cd, sum)) = th.children.last() {
                if cd <= d {
                    break;
                }
                th.children.pop();
                if cd == d + 1 {
                    children = sum;
                }
            }
            match th.children.last_mut() {
                Some((cd, sum)) if *cd == d => *sum = sum.saturating_add(dur),
                _ => th.children.push((d, dur)),
            }
            let self_t = dur.saturating_sub(children);
            ids.get(c.id).add(dur, self_t);
            if self.per_thread {
                th.funcs.entry((c.image, c.id)).or_default().add(dur, self_t);
            }
            th.first_tsc = th.first_tsc.min(c.entry_tsc);
            th.last_tsc = th.last_tsc.max(c.exit_tsc);
        }
    }

    /// Every function's counters: `(image sid, function id, counters)`.
    pub fn function_aggs(&self) -> impl Iterator<Item = (u32, u32, &Agg)> {
        self.per_sid
            .iter()
            .flat_map(|(&sid, ids)| ids.iter().map(move |(id, a)| (sid, id, a)))
    }

    pub fn thread_stats(&self, t: &Trace) -> Vec<ThreadStats> {
        let mut v: Vec<ThreadStats> = self
            .threads
            .iter()
            .map(|(&(pid, tid), a)| ThreadStats {
                pid,
                tid,
                calls: a.calls,
                first_ns: if a.calls > 0 {
                    t.ns_since_start(a.first_tsc)
                } else {
                    0
                },
                last_ns: if a.calls > 0 {
                    t.ns_since_start(a.last_tsc)
                } else {
                    0
                },
                lost: a.lost,
            })
            .collect();
        v.sort_by_key(|s| (s.pid, s.tid));
        v
    }
}

/// One streaming pass gathering per-function and per-thread counters from the calls in the
/// order they returned.
pub(crate) fn aggregate(
    path: &Path,
    per_thread: bool,
) -> Result<(Trace, Aggregates), AnalysisError> {
    let mut agg = Aggregates {
        per_thread,
        ..Aggregates::default()
    };
    let trace = walk_calls(path, &Selection::default(), Order::Returned, |_, ev| {
        agg.add(ev.call());
        Ok(())
    })?;
    agg.settle();
    for (&key, &lost) in &trace.lost_by_thread {
        agg.threads.entry(key).or_default().lost = lost;
    }
    Ok((trace, agg))
}

/// Merges counters of `(sid, id)` pairs into functions and converts them to ns.
fn to_stats<'a>(
    names: &mut Names,
    items: impl Iterator<Item = ((u32, u32), &'a Agg)>,
    tpn: f64,
) -> Vec<FuncStats> {
    let mut merged: HashMap<u32, Agg> = HashMap::new();
    for ((sid, id), a) in items {
        merged.entry(names.index(sid, id)).or_default().merge(a);
    }
    let mut out: Vec<FuncStats> = merged
        .into_iter()
        .map(|(idx, a)| {
            let name = names.name(idx).to_string();
            let f = names.info(idx);
            FuncStats {
                name,
                raw_name: f.raw_name.clone(),
                module: f.module.clone(),
                address: f.address,
                calls: a.calls,
                calls_min: a.calls,
                calls_max: a.calls,
                timed_calls: a.calls,
                total_ns: ticks_to_ns(a.total, tpn),
                self_ns: ticks_to_ns(a.self_t, tpn),
                min_ns: ticks_to_ns(a.min, tpn),
                max_ns: ticks_to_ns(a.max, tpn),
            }
        })
        .collect();
    sort(&mut out, SortKey::Total);
    out
}

/// Hot functions and thread run times of a trace, in one streaming pass: memory grows with
/// functions × threads, not with records. Count-mode traces give calls only; merged traces
/// give the totals of their runs (and no threads).
pub fn report(path: &Path, per_thread: bool) -> Result<Report, AnalysisError> {
    let (trace, agg) = aggregate(path, per_thread)?;
    let tpn = trace.ticks_per_ns();
    let mut r = report_of(&Profile::from_trace(path, &trace, &agg));
    r.per_thread = per_thread.then(|| {
        let mut names = Names::new(trace.images.values());
        agg.threads
            .iter()
            .map(|(&k, th)| {
                (
                    k,
                    to_stats(&mut names, th.funcs.iter().map(|(&k, a)| (k, a)), tpn),
                )
            })
            .collect()
    });
    let lost: u64 = agg.threads.values().map(|t| t.lost).sum();
    let lost = lost.max(trace.end.as_ref().map_or(0, |e| e.lost_records));
    if lost > 0 {
        r.warnings.push(format!(
            "{lost} records were lost because the shared buffer was full: those calls are \
             missing, and their callers' self times include them; record again with a bigger \
             --buffer-mb (each thread alive at once holds a chunk of it)"
        ));
    }
    r.threads = agg.thread_stats(&trace);
    Ok(r)
}

/// The hot-function report of a profile (one run or several combined): every function
/// that was called, without threads.
pub fn report_of(p: &Profile) -> Report {
    let mut functions = Vec::new();
    for m in &p.modules {
        let module = basename(&m.path);
        for f in m.functions.iter().filter(|f| f.calls > 0) {
            functions.push(FuncStats {
                name: fnscope_symbols::demangle(&f.name),
                raw_name: f.name.clone(),
                module: module.to_string(),
                address: f.address,
                calls: f.calls,
                calls_min: f.calls_min,
                calls_max: f.calls_max,
                timed_calls: f.timed_calls,
                total_ns: f.total_ns,
                self_ns: f.self_ns,
                min_ns: f.min_ns,
                max_ns: f.max_ns,
            });
        }
    }
    let timed = p.timed();
    sort(
        &mut functions,
        if timed {
            SortKey::Total
        } else {
            SortKey::Calls
        },
    );
    Report {
        functions,
        runs: p.run_count(),
        timed,
        threads: Vec::new(),
        per_thread: None,
        truncated: p.truncated,
        warnings: p.warnings.clone(),
    }
}

/// Calls per run, as text: whole numbers plainly, fractions with two decimals.
fn per_run(calls: u64, runs: u64) -> String {
    if calls.is_multiple_of(runs.max(1)) {
        (calls / runs.max(1)).to_string()
    } else {
        format!("{:.2}", calls as f64 / runs as f64)
    }
}

/// Columns of a function table: times only when recorded, per-run figures only for
/// several runs.
fn function_table(
    out: &mut String,
    funcs: &[FuncStats],
    top: Option<usize>,
    runs: u64,
    timed: bool,
) {
    let mut head = String::new();
    let mut rule = String::new();
    let col = |h: &mut String, r: &mut String, name: &str, w: usize| {
        let _ = write!(h, " {name:>w$}");
        let _ = write!(r, " {}", "=".repeat(w));
    };
    if timed {
        for name in ["Total time", "Self time"] {
            col(&mut head, &mut rule, name, 11);
        }
    }
    col(&mut head, &mut rule, "Calls", 10);
    if runs > 1 {
        for name in ["Avg/run", "Min/run", "Max/run"] {
            col(&mut head, &mut rule, name, 10);
        }
    }
    if timed {
        for name in ["Avg", "Min", "Max"] {
            col(&mut head, &mut rule, name, 11);
        }
    }
    let _ = writeln!(out, " {head}  Function");
    let _ = writeln!(out, " {rule}  {}", "=".repeat(20));
    for f in funcs.iter().take(top.unwrap_or(usize::MAX)) {
        let mut line = String::new();
        if timed {
            let _ = write!(
                line,
                " {:>11} {:>11}",
                format_duration(f.total_ns),
                format_duration(f.self_ns)
            );
        }
        let _ = write!(line, " {:>10}", f.calls);
        if runs > 1 {
            let _ = write!(
                line,
                " {:>10} {:>10} {:>10}",
                per_run(f.calls, runs),
                f.calls_min,
                f.calls_max
            );
        }
        if timed {
            let _ = write!(
                line,
                " {:>11} {:>11} {:>11}",
                format_duration(f.avg_ns()),
                format_duration(f.min_ns),
                format_duration(f.max_ns)
            );
        }
        let _ = writeln!(out, " {line}  {} ({})", f.name, f.module);
    }
}

/// Renders a report as text: a function table like `uftrace report` (sorted by `key`, the
/// first `top` rows), the threads with their run times, and per-thread tables if present.
/// The warnings are left to the caller, to show apart (on stderr).
pub fn render_report_text(r: &Report, top: Option<usize>, key: SortKey) -> String {
    let mut out = String::new();
    let mut funcs = r.functions.clone();
    sort(&mut funcs, key);
    if r.runs > 1 {
        let _ = writeln!(
            out,
            "  {} runs combined: Calls is their sum, Avg/run, Min/run and Max/run are per run; \
             times cover the runs recorded in time mode\n",
            r.runs
        );
    }
    function_table(&mut out, &funcs, top, r.runs, r.timed);
    if r.threads.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\n  {:>8} {:>8} {:>12} {:>11} {:>10}",
        "PID", "TID", "Calls", "Run time", "Lost"
    );
    let _ = writeln!(
        out,
        "  {:>8} {:>8} {:>12} {:>11} {:>10}",
        "===", "===", "=====", "========", "===="
    );
    for t in &r.threads {
        let _ = writeln!(
            out,
            "  {:>8} {:>8} {:>12} {:>11} {:>10}",
            t.pid,
            t.tid,
            t.calls,
            format_duration(t.run_ns()),
            t.lost
        );
    }
    if let Some(pt) = &r.per_thread {
        for (&(pid, tid), funcs) in pt {
            let mut funcs = funcs.clone();
            sort(&mut funcs, key);
            let _ = writeln!(out, "\n  Thread {tid} (process {pid})");
            function_table(&mut out, &funcs, top, 1, true);
        }
    }
    out
}

/// A JSON number: an integer when `v` is whole, so that single runs print `3`, not `3.0`.
pub(crate) fn json_num(v: f64) -> serde_json::Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        json!(v as i64)
    } else {
        json!(v)
    }
}

fn function_json(f: &FuncStats, runs: u64, timed: bool) -> serde_json::Value {
    let mut o = json!({
        "name": f.name,
        "module": f.module,
        "address": f.address,
        "calls": f.calls,
        "calls_avg": json_num(f.calls as f64 / runs.max(1) as f64),
        "runs": runs,
        "calls_min": f.calls_min,
        "calls_max": f.calls_max,
    });
    if timed {
        o["timed_calls"] = json!(f.timed_calls);
        o["total_ns"] = json!(f.total_ns);
        o["self_ns"] = json!(f.self_ns);
        o["avg_ns"] = json!(f.avg_ns());
        o["min_ns"] = json!(f.min_ns);
        o["max_ns"] = json!(f.max_ns);
    }
    o
}

/// The functions of a report as a JSON array of objects with `name`, `module`, `address`,
/// `calls` (summed over the runs), `calls_avg` (per run), `runs`, `calls_min` and
/// `calls_max` (fewest and most in one run); when times were recorded also `timed_calls`,
/// `total_ns`, `self_ns`, `avg_ns`, `min_ns` and `max_ns`. Count-mode reports have no time
/// fields.
pub fn report_json(r: &Report) -> serde_json::Value {
    r.functions
        .iter()
        .map(|f| function_json(f, r.runs, r.timed))
        .collect()
}

/// The called functions of one module.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleStats {
    /// File name of the module.
    pub module: String,
    /// Calls of its functions, summed.
    pub calls: u64,
    /// Self time of its functions, summed (self times do not overlap, totals would).
    pub self_ns: u64,
    /// Its functions that were called, sorted by the report's key.
    pub functions: Vec<FuncStats>,
}

/// Groups a report's functions per module (shared object), modules sorted by calls or by
/// self time (for the time keys), largest first.
pub fn by_module(r: &Report, key: SortKey) -> Vec<ModuleStats> {
    let mut groups: BTreeMap<&str, ModuleStats> = BTreeMap::new();
    for f in &r.functions {
        let g = groups
            .entry(f.module.as_str())
            .or_insert_with(|| ModuleStats {
                module: f.module.clone(),
                ..ModuleStats::default()
            });
        g.calls += f.calls;
        g.self_ns = g.self_ns.saturating_add(f.self_ns);
        g.functions.push(f.clone());
    }
    let mut out: Vec<ModuleStats> = groups.into_values().collect();
    for g in &mut out {
        sort(&mut g.functions, key);
    }
    let k = |g: &ModuleStats| match key {
        SortKey::Calls => g.calls,
        _ => g.self_ns,
    };
    out.sort_by(|a, b| k(b).cmp(&k(a)).then_with(|| a.module.cmp(&b.module)));
    out
}

/// Renders a report grouped per module: a line per module with its totals, then the first
/// `top` of its functions.
pub fn render_by_module_text(r: &Report, top: Option<usize>, key: SortKey) -> String {
    let mut out = String::new();
    for (i, g) in by_module(r, key).iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = write!(
            out,
            "{}: {} calls in {} functions",
            g.module,
            g.calls,
            g.functions.len()
        );
        if r.runs > 1 {
            let _ = write!(out, " ({} per run)", per_run(g.calls, r.runs));
        }
        if r.timed {
            let _ = write!(out, ", self time {}", format_duration(g.self_ns));
        }
        out.push('\n');
        function_table(&mut out, &g.functions, top, r.runs, r.timed);
    }
    out
}

/// A report grouped per module as a JSON array: per module `module`, `calls`, `calls_avg`,
/// `functions_called`, `self_ns` (when timed), and `functions`, the first `top` of its
/// functions as in [`report_json`].
pub fn report_by_module_json(r: &Report, top: Option<usize>, key: SortKey) -> serde_json::Value {
    by_module(r, key)
        .iter()
        .map(|g| {
            let mut o = json!({
                "module": g.module,
                "calls": g.calls,
                "calls_avg": json_num(g.calls as f64 / r.runs.max(1) as f64),
                "functions_called": g.functions.len(),
                "functions": g.functions.iter().take(top.unwrap_or(usize::MAX))
                    .map(|f| function_json(f, r.runs, r.timed)).collect::<Vec<_>>(),
            });
            if r.timed {
                o["self_ns"] = json!(g.self_ns);
            }
            o
        })
        .collect()
}
