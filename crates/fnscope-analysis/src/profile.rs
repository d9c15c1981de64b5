//! Per-function totals of whole runs: what `merge` writes, and what reports over several
//! runs, `diff` and `coverage` read.
//!
//! A [`Profile`] lists every function the runs know about, called or not, hooked or not, per
//! module, with its calls summed over the runs (plus the fewest and most in one run) and its
//! times summed over the runs that recorded times. A recorded trace (time or count mode) is a
//! profile of one run; a merged trace stores its profile in SUMMARY chunks.
//!
//! Runs are combined by matching functions across them: by the module's build-id and the
//! function's name (its address when it has none), so that the same program recorded on
//! several machines, at several paths, adds up. Runs of different builds of a module are
//! refused unless matching by name is asked for.

use crate::report::{aggregate, Agg, Aggregates};
use crate::{ticks_to_ns, AnalysisError, Trace};
use fnscope_format::{
    EndInfo, FunctionSummary, ImageTable, Meta, ModuleSummary, RunInfo, TraceWriter,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// Per-function totals of one or more runs.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// The runs it is made of; a recorded trace is one run.
    pub runs: Vec<RunInfo>,
    /// Functions per module, sorted by address within a module.
    pub modules: Vec<ModuleSummary>,
    /// Some input ended abruptly or was damaged: totals cover only what was read.
    pub truncated: bool,
    /// Problems the user should know about.
    pub warnings: Vec<String>,
}

/// Mode of runs that recorded no times.
const MODE_COUNT: &str = "count";
/// `Meta::mode` of merged traces.
pub const MODE_MERGED: &str = "merged";
/// Module path of functions that no image table names (damaged traces).
const UNKNOWN_MODULE: &str = "?";

impl Profile {
    /// Reads any trace: a recorded one (time or count mode) or a merged one. One streaming
    /// pass over the file.
    pub fn load(path: &Path) -> Result<Profile, AnalysisError> {
        let (trace, agg) = aggregate(path, false)?;
        Ok(Profile::from_trace(path, &trace, &agg))
    }

    /// The profile of a trace whose records `agg` gathered.
    pub(crate) fn from_trace(path: &Path, trace: &Trace, agg: &Aggregates) -> Profile {
        if trace.meta.mode == MODE_MERGED || !trace.summaries.is_empty() {
            let mut runs = trace.runs.clone();
            if runs.is_empty() {
                runs.push(run_info(path, trace));
            }
            return Profile {
                runs,
                modules: trace.summaries.clone(),
                truncated: trace.truncated,
                warnings: trace.warnings.clone(),
            };
        }
        let mut b = Builder::default();
        for t in trace.images.values() {
            b.add_image(t);
        }
        for (sid, id, a) in agg.function_aggs() {
            let f = b.function(sid, id);
            b.aggs[f.0][f.1].merge(a);
        }
        for c in &trace.counts {
            for (id, &n) in c.counts.iter().enumerate() {
                if n > 0 {
                    let f = b.function(c.sid, id as u32);
                    b.counted[f.0][f.1] += n;
                }
            }
        }
        Profile {
            runs: vec![run_info(path, trace)],
            modules: b.finish(trace.ticks_per_ns()),
            truncated: trace.truncated,
            warnings: trace.warnings.clone(),
        }
    }

    /// Number of runs (at least 1): the divisor of per-run averages.
    pub fn run_count(&self) -> u64 {
        (self.runs.len() as u64).max(1)
    }

    /// Whether some run recorded times (time mode); count-mode runs give calls only.
    pub fn timed(&self) -> bool {
        self.runs.iter().any(|r| r.mode != MODE_COUNT)
    }

    /// Writes the profile as a merged trace: `DIR/trace.fns` with META (mode `merged`,
    /// listing the runs), one SUMMARY chunk per module, and END. The file is written next to
    /// its final name and renamed, so that a reader never sees half of it and merging into
    /// the folder of one of the inputs works.
    pub fn write_merged(&self, dir: &Path) -> Result<(), AnalysisError> {
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| {
                AnalysisError::Format(fnscope_format::FormatError::Io {
                    action,
                    path,
                    source,
                })
            }
        };
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        let path = dir.join(fnscope_format::TRACE_FILE);
        let tmp = dir.join(format!("{}.tmp", fnscope_format::TRACE_FILE));
        {
            let mut w = TraceWriter::create(&tmp)?;
            let meta = Meta {
                command: Vec::new(),
                cwd: String::new(),
                start_unix_ns: self.runs.iter().map(|r| r.start_unix_ns).min().unwrap_or(0),
                tsc_at_start: 0,
                host: String::new(),
                fnscope_version: env!("CARGO_PKG_VERSION").to_string(),
                mode: MODE_MERGED.to_string(),
                flight: false,
            };
            w.write_merged_meta(&meta, &self.runs)?;
            for m in &self.modules {
                w.write_summary(m)?;
            }
            // Times in SUMMARY chunks are nanoseconds already: the calibration is 1.
            w.write_end(&EndInfo {
                ticks_per_ns: 1.0,
                ..EndInfo::default()
            })?;
            w.flush()?;
        }
        std::fs::rename(&tmp, &path).map_err(io("write", &path))
    }
}

fn run_info(path: &Path, trace: &Trace) -> RunInfo {
    RunInfo {
        trace: path.display().to_string(),
        command: trace.meta.command.clone(),
        host: trace.meta.host.clone(),
        start_unix_ns: trace.meta.start_unix_ns,
        // Traces from before count mode existed have no mode: they recorded times.
        mode: if trace.meta.mode.is_empty() {
            "time".to_string()
        } else {
            trace.meta.mode.clone()
        },
    }
}

/// Collects the functions of one recorded trace: images name them, records and counts add
/// to them. Forks share their parent's image and every exec of a binary lists the same
/// functions again, so functions are keyed by module path, build-id and address (by name in a
/// module of generated code, whose addresses a runtime reuses: see `names::is_generated`).
#[derive(Default)]
struct Builder {
    modules: Vec<ModuleSummary>,
    module_index: HashMap<(String, Option<String>), usize>,
    by_address: Vec<HashMap<Result<u64, String>, usize>>,
    /// Per module and function: the records' sums (ticks) and the counted calls.
    aggs: Vec<Vec<Agg>>,
    counted: Vec<Vec<u64>>,
    /// `(sid, id)` to `(module, function)`.
    ids: HashMap<(u32, u32), (usize, usize)>,
}

impl Builder {
    fn module(&mut self, path: &str, build_id: Option<&String>) -> usize {
        let key = (path.to_string(), build_id.cloned());
        if let Some(&m) = self.module_index.get(&key) {
            return m;
        }
        let m = self.modules.len();
        self.modules.push(ModuleSummary {
            path: path.to_string(),
            build_id: build_id.cloned(),
            functions: Vec::new(),
        });
        self.module_index.insert(key, m);
        self.by_address.push(HashMap::new());
        self.aggs.push(Vec::new());
        self.counted.push(Vec::new());
        m
    }

    /// The function at `address` (or named `name`, in generated code) of module `m`, created
    /// with `make` if new.
    fn at(&mut self, m: usize, address: u64, name: &str, make: impl FnOnce() -> FunctionSummary) -> usize {
        let key = if crate::names::is_generated(&self.modules[m].path) { Err(name.to_string()) } else { Ok(address) };
        if let Some(&f) = self.by_address[m].get(&key) {
            return f;
        }
        let f = self.modules[m].functions.len();
        self.modules[m].functions.push(make());
        self.by_address[m].insert(key, f);
        self.aggs[m].push(Agg::default());
        self.counted[m].push(0);
        f
    }

    fn add_image(&mut self, t: &ImageTable) {
        let module_of = |idx: u32| match t.module(idx) {
            Some(md) => (md.path.as_str(), md.build_id.as_ref()),
            None => (UNKNOWN_MODULE, None),
        };
        for f in &t.funcs {
            let (path, bid) = module_of(f.module);
            let m = self.module(path, bid);
            let i = self.at(m, f.address, &f.raw_name, || FunctionSummary {
                address: f.address,
                size: f.size,
                name: f.raw_name.clone(),
                ..FunctionSummary::default()
            });
            // Another process may have skipped what this one hooked (no trampoline memory
            // within reach, say): the function could be measured, so it counts as hooked.
            let s = &mut self.modules[m].functions[i];
            s.hooked = true;
            s.reason.clear();
            s.detail.clear();
            self.ids.insert((t.sid, f.id), (m, i));
        }
        for k in &t.skipped {
            let (path, bid) = module_of(k.module);
            let m = self.module(path, bid);
            self.at(m, k.address, &k.raw_name, || FunctionSummary {
                address: k.address,
                size: k.size,
                name: k.raw_name.clone(),
                reason: k.reason.clone(),
                detail: k.detail.clone(),
                ..FunctionSummary::default()
            });
        }
    }

    /// The function that records of image `sid` call `id`; ids no table names get a
    /// placeholder of their own, so that their calls still show up.
    fn function(&mut self, sid: u32, id: u32) -> (usize, usize) {
        if let Some(&f) = self.ids.get(&(sid, id)) {
            return f;
        }
        let m = self.module(UNKNOWN_MODULE, None);
        // Placeholders are keyed by (sid, id), not address: give each its own slot.
        let address = self.modules[m].functions.len() as u64;
        let i = self.at(m, address, "", || FunctionSummary {
            name: format!("<unknown function {id} of image {sid}>"),
            hooked: true,
            ..FunctionSummary::default()
        });
        self.ids.insert((sid, id), (m, i));
        (m, i)
    }

    fn finish(mut self, ticks_per_ns: f64) -> Vec<ModuleSummary> {
        for (m, module) in self.modules.iter_mut().enumerate() {
            for (i, f) in module.functions.iter_mut().enumerate() {
                let a = &self.aggs[m][i];
                f.calls = a.calls + self.counted[m][i];
                f.calls_min = f.calls;
                f.calls_max = f.calls;
                f.timed_calls = a.calls;
                f.total_ns = ticks_to_ns(a.total, ticks_per_ns);
                f.self_ns = ticks_to_ns(a.self_t, ticks_per_ns);
                if a.calls > 0 {
                    f.min_ns = ticks_to_ns(a.min, ticks_per_ns);
                    f.max_ns = ticks_to_ns(a.max, ticks_per_ns);
                }
            }
            module.functions.sort_by_key(|f| f.address);
        }
        self.modules
    }
}

/// File name of a module path.
pub(crate) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What identifies a function across runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum NameKey {
    /// A named function, with its rank among the functions of the same name in the module
    /// (static functions of different files may share a name), in address order.
    Name(String, u32),
    /// An unnamed piece of code (`sub_<hex>`): only its address identifies it.
    Address(u64),
}

/// Module identity across runs: the build-id, else (or when matching by name) the file name.
fn module_key(m: &ModuleSummary, by_name: bool) -> String {
    match (&m.build_id, by_name) {
        (Some(id), false) => format!("build-id {id}"),
        _ => format!("file {}", basename(&m.path)),
    }
}

/// The keys of a module's functions, in the order of `m.functions`.
fn function_keys(m: &ModuleSummary) -> Vec<NameKey> {
    let mut order: Vec<usize> = (0..m.functions.len()).collect();
    order.sort_by_key(|&i| m.functions[i].address);
    let mut rank: HashMap<&str, u32> = HashMap::new();
    let mut keys = vec![NameKey::Address(0); m.functions.len()];
    for i in order {
        let f = &m.functions[i];
        keys[i] = if f.name.is_empty() || f.name == format!("sub_{:x}", f.address) {
            NameKey::Address(f.address)
        } else {
            let r = rank.entry(f.name.as_str()).or_insert(0);
            *r += 1;
            NameKey::Name(f.name.clone(), *r - 1)
        };
    }
    keys
}

/// Each function's key across runs of its module as text (`n:RANK:NAME`, or `a:HEX` for an
/// unnamed piece), for stores that match functions of several uploads the way [`combine`]
/// does: by name and rank, not by address (generated code, such as Mono's, reuses addresses).
pub fn function_key_texts(m: &ModuleSummary) -> Vec<String> {
    function_keys(m)
        .into_iter()
        .map(|k| match k {
            NameKey::Name(name, rank) => format!("n:{rank}:{name}"),
            NameKey::Address(a) => format!("a:{a:x}"),
        })
        .collect()
}

/// Every function of a profile by its key across runs: `(module key, name key)` to
/// `(module, function)` indexes.
pub(crate) fn keyed(p: &Profile, by_name: bool) -> HashMap<(String, NameKey), (usize, usize)> {
    let mut out = HashMap::new();
    for (mi, m) in p.modules.iter().enumerate() {
        let mk = module_key(m, by_name);
        for (fi, k) in function_keys(m).into_iter().enumerate() {
            out.entry((mk.clone(), k)).or_insert((mi, fi));
        }
    }
    out
}

/// Refuses to match functions of profiles that contain different builds of a module: the
/// same file name with build-ids that do not agree. With `by_name` anything goes.
pub(crate) fn check_builds(parts: &[(&str, &Profile)], by_name: bool) -> Result<(), AnalysisError> {
    if by_name {
        return Ok(());
    }
    // Per module file name, per input: the build-ids found.
    let mut seen: BTreeMap<&str, Vec<(&str, BTreeSet<&str>)>> = BTreeMap::new();
    for (label, p) in parts {
        let mut here: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for m in &p.modules {
            if let Some(id) = &m.build_id {
                here.entry(basename(&m.path)).or_default().insert(id);
            }
        }
        for (name, ids) in here {
            seen.entry(name).or_default().push((label, ids));
        }
    }
    for (module, runs) in seen {
        let (first_label, first_ids) = &runs[0];
        for (label, ids) in &runs[1..] {
            if ids != first_ids {
                let differ = |a: &BTreeSet<&str>, b: &BTreeSet<&str>| {
                    a.difference(b)
                        .next()
                        .or_else(|| a.iter().next())
                        .map_or_else(String::new, |s| s.to_string())
                };
                return Err(AnalysisError::DifferentBuilds {
                    module: module.to_string(),
                    run_a: first_label.to_string(),
                    id_a: differ(first_ids, ids),
                    run_b: label.to_string(),
                    id_b: differ(ids, first_ids),
                });
            }
        }
    }
    Ok(())
}

/// Adds one input's totals of a function to the combined ones. `first` when the combined
/// function has no input yet. Public so that the team server combines stored runs exactly as
/// [`combine`] does.
pub fn add_function(o: &mut FunctionSummary, f: &FunctionSummary, first: bool) {
    if f.hooked && !o.hooked {
        o.hooked = true;
        o.reason.clear();
        o.detail.clear();
    } else if !o.hooked && o.reason.is_empty() {
        o.reason = f.reason.clone();
        o.detail = f.detail.clone();
    }
    // Saturating: figures come from files and uploads, which may be crafted.
    o.calls = o.calls.saturating_add(f.calls);
    o.calls_min = if first {
        f.calls_min
    } else {
        o.calls_min.min(f.calls_min)
    };
    o.calls_max = o.calls_max.max(f.calls_max);
    if f.timed_calls > 0 {
        o.min_ns = if o.timed_calls == 0 {
            f.min_ns
        } else {
            o.min_ns.min(f.min_ns)
        };
        o.max_ns = o.max_ns.max(f.max_ns);
        o.timed_calls = o.timed_calls.saturating_add(f.timed_calls);
        o.total_ns = o.total_ns.saturating_add(f.total_ns);
        o.self_ns = o.self_ns.saturating_add(f.self_ns);
    }
}

/// Ends a combination: a function that `runs_with` of the `total_runs` runs had was not
/// called at all in the others, so its fewest calls in one run is 0.
pub fn settle_calls_min(f: &mut FunctionSummary, runs_with: u64, total_runs: u64) {
    if runs_with < total_runs {
        f.calls_min = 0;
    }
}

/// Combines profiles (each labelled with the trace it came from, for messages): per
/// function, calls summed, fewest and most calls of one run, times summed over the timed
/// runs. A function missing from some run had 0 calls there.
pub fn combine(
    parts: Vec<(String, Profile)>,
    match_by_name: bool,
) -> Result<Profile, AnalysisError> {
    let labelled: Vec<(&str, &Profile)> = parts.iter().map(|(l, p)| (l.as_str(), p)).collect();
    check_builds(&labelled, match_by_name)?;
    let mut out = Profile::default();
    let mut module_index: HashMap<String, usize> = HashMap::new();
    let mut fn_index: Vec<HashMap<NameKey, usize>> = Vec::new();
    // Per combined function: how many runs had it.
    let mut runs_with: Vec<Vec<u64>> = Vec::new();
    for (label, p) in &parts {
        let runs = p.run_count();
        for m in &p.modules {
            let mi = *module_index
                .entry(module_key(m, match_by_name))
                .or_insert_with(|| {
                    out.modules.push(ModuleSummary {
                        path: m.path.clone(),
                        build_id: m.build_id.clone(),
                        functions: Vec::new(),
                    });
                    fn_index.push(HashMap::new());
                    runs_with.push(Vec::new());
                    out.modules.len() - 1
                });
            for (f, k) in m.functions.iter().zip(function_keys(m)) {
                let functions = &mut out.modules[mi].functions;
                let fi = *fn_index[mi].entry(k).or_insert_with(|| {
                    functions.push(FunctionSummary {
                        address: f.address,
                        size: f.size,
                        name: f.name.clone(),
                        ..FunctionSummary::default()
                    });
                    runs_with[mi].push(0);
                    functions.len() - 1
                });
                add_function(&mut functions[fi], f, runs_with[mi][fi] == 0);
                runs_with[mi][fi] += runs;
            }
        }
        out.runs.extend(p.runs.iter().cloned());
        out.truncated |= p.truncated;
        out.warnings
            .extend(p.warnings.iter().map(|w| format!("{label}: {w}")));
    }
    let total_runs = out.run_count();
    for (m, counts) in out.modules.iter_mut().zip(&runs_with) {
        for (f, &n) in m.functions.iter_mut().zip(counts) {
            settle_calls_min(f, n, total_runs);
        }
        m.functions.sort_by_key(|f| f.address);
    }
    Ok(out)
}

/// Loads every trace and combines them; a single trace is returned as it is.
pub fn load_all(paths: &[impl AsRef<Path>], match_by_name: bool) -> Result<Profile, AnalysisError> {
    let mut parts = Vec::with_capacity(paths.len());
    for p in paths {
        let p = p.as_ref();
        parts.push((p.display().to_string(), Profile::load(p)?));
    }
    if parts.len() == 1 {
        return Ok(parts.pop().map(|(_, p)| p).unwrap_or_default());
    }
    combine(parts, match_by_name)
}
