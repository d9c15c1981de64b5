//! Analysis of fnscope traces: hot-function reports, per-thread call trees, the
//! `function.txt` line format, and a summary of a recording.
//!
//! Everything streams the trace file ([`scan`]) so that memory stays bounded by the number of
//! functions, threads and nesting depth, not by the number of records. The replay views,
//! which print calls in the order they started, sort them through temporary files when a
//! call tree outgrows a fixed memory budget.

#![warn(missing_docs)]

mod by_value;
mod calls;
mod coverage;
mod coverage_html;
mod diff;
mod info;
mod names;
mod pdb;
mod profile;
mod replay;
mod report;
mod spill;
mod values;

pub use calls::{
    walk_calls, CallEvent, CallInfo, Ending, FunctionNames, Order, Selection, WalkContext,
};
pub use coverage::{
    coverage, coverage_json, percent, render_coverage_text, Coverage, CoveredFunction,
    FileCoverage, FunctionStatus, ModuleCoverage, Sources,
};
pub use coverage_html::write_coverage_html;
pub use diff::{diff, diff_json, render_diff_text, sort_diff, Diff, FuncDiff};
pub use info::{civil_from_days, info, render_info_text, ImageInfo, Info};
pub use pdb::{pdb_functions, PdbFunction};
pub use profile::{add_function, combine, function_key_texts, load_all, settle_calls_min, Profile, MODE_MERGED};
pub use replay::{replay_lines, replay_tree};
pub use values::{CallValues, Injection};
pub use by_value::{render_by_value_text, report_by_value, GroupBy, ValueGroup};
pub use spill::{get as get_varint, put as put_varint};
pub use report::{
    by_module, render_by_module_text, render_report_text, report, report_by_module_json,
    report_json, report_of, sort, FuncStats, ModuleStats, Report, SortKey, ThreadStats,
};

use fnscope_format::{
    Chunk, CountsSegment, EndInfo, FormatError, ImageTable, Meta, ModuleSummary, RunInfo,
    ThreadSegment, TraceReader,
};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// Errors of the analyses.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    /// The trace could not be opened or read.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Writing the output failed (a closed pipe, a full disk).
    #[error("cannot write the output: {0}")]
    Output(#[source] io::Error),
    /// A temporary file (the replay views' external sort) could not be written or read.
    #[error(
        "cannot use a temporary file in {}: {source}; set TMPDIR to a folder with free space",
        dir.display()
    )]
    Temp {
        /// The folder of temporary files.
        dir: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A PDB file could not be read.
    #[error("cannot read the PDB file {}: {msg}", path.display())]
    Pdb {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// Runs to be combined hold different builds of one module.
    #[error(
        "{module} is not the same build in {run_a} (build-id {id_a}) and {run_b} (build-id \
         {id_b}): functions of different builds cannot be matched by build-id. Add \
         --match-by-name to match them by name (unnamed functions will not match), or \
         combine runs of one build only"
    )]
    DifferentBuilds {
        /// File name of the module.
        module: String,
        /// One input.
        run_a: String,
        /// A build-id found in `run_a` and not in `run_b`.
        id_a: String,
        /// The other input.
        run_b: String,
        /// A build-id found in `run_b` and not in `run_a`.
        id_b: String,
    },
}

/// What a pass over a trace has learnt so far.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// What was traced (default values if the META chunk is missing).
    pub meta: Meta,
    /// How the run ended; `None` if the END chunk is missing (recorder killed).
    pub end: Option<EndInfo>,
    /// Image tables by image session id.
    pub images: BTreeMap<u32, ImageTable>,
    /// The trace ended abruptly or was damaged: results cover only what was read.
    pub truncated: bool,
    /// EVENTS chunks read.
    pub segments_read: u64,
    /// Records read.
    pub records: u64,
    /// Records each thread `(pid, tid)` dropped because the shared buffer was full (threads
    /// that dropped none are not listed).
    pub lost_by_thread: BTreeMap<(u32, u32), u64>,
    /// Bytes of the trace file read (so far, during a [`scan`]).
    pub bytes: u64,
    /// Problems the user should know about, in plain words.
    pub warnings: Vec<String>,
    /// Call counts (count mode), in file order.
    pub counts: Vec<CountsSegment>,
    /// Per-module totals of a merged trace.
    pub summaries: Vec<ModuleSummary>,
    /// Calls changed by each injection rule (`record --inject`), by image and rule index.
    pub injected: BTreeMap<(u32, u32), u64>,
    /// The runs a merged trace was made of (empty for a recorded trace).
    pub runs: Vec<RunInfo>,
}

impl Trace {
    /// Calibration in TSC ticks per nanosecond: from the END chunk, or 1.0 when it is missing
    /// or unusable (a warning says so).
    pub fn ticks_per_ns(&self) -> f64 {
        match &self.end {
            Some(e) if e.ticks_per_ns.is_finite() && e.ticks_per_ns > 0.0 => e.ticks_per_ns,
            _ => 1.0,
        }
    }

    /// A duration in ticks converted to nanoseconds.
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        ticks_to_ns(ticks, self.ticks_per_ns())
    }

    /// The conversion of this trace's time-stamps that every call-by-call view uses.
    pub fn clock(&self) -> Clock {
        Clock::new(self.meta.tsc_at_start, self.meta.start_unix_ns, self.ticks_per_ns())
    }

    /// Nanoseconds from the start of the recording to time-stamp `tsc` (0 if earlier).
    pub fn ns_since_start(&self, tsc: u64) -> u64 {
        self.clock().ns_since_start(tsc)
    }

    /// The duration of a call that every call-by-call view (replay, the exports) shows: see
    /// [`Clock::duration_ns`].
    pub fn duration_ns(&self, entry_tsc: u64, exit_tsc: u64) -> u64 {
        self.clock().duration_ns(entry_tsc, exit_tsc)
    }

    /// The name thread `tid` of process `pid` had when the recorder last looked, if it saw
    /// it running (from END).
    pub fn thread_name(&self, pid: u32, tid: u32) -> Option<&str> {
        let names = &self.end.as_ref()?.threads;
        names.iter().find(|t| t.pid == pid && t.tid == tid).map(|t| t.name.as_str())
    }

    /// A thread's label in the viewers: its name (else `program`), then its id.
    pub fn thread_label(&self, pid: u32, tid: u32, program: &str) -> String {
        format!("{} {tid}", self.thread_name(pid, tid).unwrap_or(program))
    }

    /// Wall-clock time of time-stamp `tsc`, in nanoseconds since the Unix epoch.
    pub fn wall_ns(&self, tsc: u64) -> u64 {
        self.clock().wall_ns(tsc)
    }
}

/// Time-stamps of one trace in nanoseconds, as every call-by-call view (replay, the exports)
/// shows them, so that they agree to the ns. Views convert two time-stamps per call, so the
/// calibration is kept in fixed point (`ns = ticks × mul / 2^shift`, rounded, `mul` holding
/// 63 significant bits): one integer multiplication, where a floating-point division and the
/// conversions around it were a tenth of an export's time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start_tsc: u64,
    start_unix_ns: u64,
    mul: u64,
    shift: u32,
}

impl Clock {
    /// The clock of a recording that started at time-stamp `start_tsc`, Unix time
    /// `start_unix_ns`, with `ticks_per_ns` (positive).
    pub fn new(start_tsc: u64, start_unix_ns: u64, ticks_per_ns: f64) -> Clock {
        let ns_per_tick = 1.0 / ticks_per_ns;
        // The largest shift that keeps `mul` below 2^64 (at most 64).
        let mut shift = 64u32;
        while shift > 0 && ns_per_tick * 2f64.powi(shift as i32) >= 18_446_744_073_709_551_615.0 {
            shift -= 1;
        }
        // `as` saturates: an absurd calibration gives absurd but finite times.
        let mul = (ns_per_tick * 2f64.powi(shift as i32)).round() as u64;
        Clock { start_tsc, start_unix_ns, mul, shift }
    }

    /// `ticks` in ns, rounded half up.
    #[inline]
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        let wide = u128::from(ticks) * u128::from(self.mul);
        let half = if self.shift > 0 { 1u128 << (self.shift - 1) } else { 0 };
        u64::try_from((wide + half) >> self.shift).unwrap_or(u64::MAX)
    }

    /// Nanoseconds from the start of the recording to time-stamp `tsc` (0 if earlier).
    #[inline]
    pub fn ns_since_start(&self, tsc: u64) -> u64 {
        self.ticks_to_ns(tsc.saturating_sub(self.start_tsc))
    }

    /// A call's duration: the difference of its ends, each in ns since the start. (Per call
    /// it can differ by 1 ns from [`Trace::ticks_to_ns`] of its ticks, which `report` sums.)
    #[inline]
    pub fn duration_ns(&self, entry_tsc: u64, exit_tsc: u64) -> u64 {
        self.ns_since_start(exit_tsc).saturating_sub(self.ns_since_start(entry_tsc))
    }

    /// Wall-clock time of time-stamp `tsc`, in nanoseconds since the Unix epoch: the start's
    /// plus [`Clock::ns_since_start`] (minus, for a time-stamp before the start).
    pub fn wall_ns(&self, tsc: u64) -> u64 {
        if tsc >= self.start_tsc {
            self.start_unix_ns.saturating_add(self.ns_since_start(tsc))
        } else {
            self.start_unix_ns.saturating_sub(self.ticks_to_ns(self.start_tsc - tsc))
        }
    }
}

pub(crate) fn ticks_to_ns(ticks: u64, ticks_per_ns: f64) -> u64 {
    // `as` saturates on overflow, which is the right answer for absurd inputs. Rounded half
    // away from zero like `f64::round`, which is a library call here: the views convert
    // every entry and exit, and it was a twentieth of an export's time. The difference is
    // exact (below 2^52 a number and its integer part are within 1, above it there is no
    // fraction).
    // Through i64 when it fits (the same value): one instruction instead of the sequence
    // that converts an unsigned number.
    let ticks = match i64::try_from(ticks) {
        Ok(t) => t as f64,
        Err(_) => ticks as f64,
    };
    let ns = ticks / ticks_per_ns;
    let whole = ns as u64;
    if ns - whole as f64 >= 0.5 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// Streams the file once; calls `f` for every segment in file order after all images seen so
/// far are loaded.
///
/// A file that is cut short or damaged part-way is not an error: the pass stops there, sets
/// [`Trace::truncated`] and adds a warning. Without an END chunk there is no clock
/// calibration: [`Trace::ticks_per_ns`] falls back to 1.0 and a warning says so.
pub fn scan(path: &Path, f: impl FnMut(&Trace, &ThreadSegment)) -> Result<Trace, AnalysisError> {
    pass(path, false, f)
}

/// A quick pass that reads META, IMAGE and END chunks and skips the records, so that names
/// and the calibration are known before the records are streamed.
pub(crate) fn headers(path: &Path) -> Result<Trace, AnalysisError> {
    pass(path, true, |_, _| {})
}

fn pass(
    path: &Path,
    skip_events: bool,
    mut f: impl FnMut(&Trace, &ThreadSegment),
) -> Result<Trace, AnalysisError> {
    let mut r = TraceReader::open(path)?;
    r.set_skip_events(skip_events);
    let mut t = Trace::default();
    let mut seen_meta = false;
    // Chunks are read and decoded (zstd, columns) on a thread of their own, a few ahead of
    // `f`: a quarter of a `report` or of a walk's first phase, done on the other processor.
    let (chunks, read) = std::sync::mpsc::sync_channel::<(Result<Option<Chunk>, FormatError>, u64, Vec<RunInfo>)>(8);
    let reader = std::thread::spawn(move || {
        loop {
            let c = r.next_chunk();
            let last = !matches!(c, Ok(Some(_)));
            let runs = if matches!(c, Ok(Some(Chunk::Meta(_)))) { r.runs().to_vec() } else { Vec::new() };
            // The pass stops taking chunks only when it has stopped reading.
            if chunks.send((c, r.offset(), runs)).is_err() || last {
                return r;
            }
        }
    });
    for (chunk, offset, runs) in read {
        match chunk {
            Ok(None) => break,
            Ok(Some(Chunk::Meta(m))) => {
                t.meta = m;
                t.runs = runs;
                seen_meta = true;
            }
            Ok(Some(Chunk::Image { sid, table })) => {
                t.images.insert(sid, table);
            }
            Ok(Some(Chunk::Events(seg))) => {
                t.segments_read += 1;
                t.records += seg.records.len() as u64;
                for (_, words) in seg.data.iter() {
                    let head = words.first().copied().unwrap_or(0);
                    if (head >> fnscope_abi::data::INJECT_SHIFT) & 0xff != 0 {
                        *t.injected.entry((seg.image_sid, (head >> fnscope_abi::data::RULE_SHIFT) as u32)).or_default() += 1;
                    }
                }
                if seg.lost > 0 {
                    *t.lost_by_thread.entry((seg.pid, seg.tid)).or_default() += seg.lost;
                }
                t.bytes = offset;
                f(&t, &seg);
            }
            Ok(Some(Chunk::End(e))) => t.end = Some(e),
            Ok(Some(Chunk::Counts(c))) => t.counts.push(c),
            Ok(Some(Chunk::Summary(s))) => t.summaries.push(s),
            Err(e @ (FormatError::Corrupt { .. } | FormatError::BadImageTable { .. })) => {
                t.truncated = true;
                t.warnings.push(format!("stopped reading: {e}"));
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let r = match reader.join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    t.bytes = r.offset();
    if r.truncated() {
        t.truncated = true;
        t.warnings.push(
            "the trace ended abruptly (the recorder was killed or the disk filled up): the \
             results cover only what was written"
                .into(),
        );
    }
    if let Some(e) = &t.end {
        if e.untraced_images > 0 {
            t.truncated = true;
            t.warnings.push(format!(
                "{} process image(s) ran untraced (their agent could not set up, for instance \
                 with the disk full): their calls are not in this trace",
                e.untraced_images
            ));
        }
        if let Some(why) = &e.write_error {
            t.truncated = true;
            t.warnings.push(format!(
                "the recorder could not write the trace to the end ({why}): {} calls made after \
                 that are missing, and the results cover only what was written",
                e.unwritten_calls
            ));
        }
    }
    let unhooked: usize = t.images.values().map(|i| i.unhooked.len()).sum();
    if unhooked > 0 {
        let why = t.images.values().flat_map(|i| &i.unhooked).map(|u| u.1.as_str()).next().unwrap_or_default();
        t.warnings.push(format!(
            "{unhooked} functions chosen for hooking could not be patched ({why}); their calls are \
             not in this trace (`fnscope info` lists them per process)"
        ));
    }
    if let Some(e) = t.end.as_ref().filter(|e| e.unmatched_returns > 0) {
        t.warnings.push(format!(
            "{} returns matched no open call of their thread (code that moves its own return \
             address); each was matched to the newest call it could be the return of",
            e.unmatched_returns
        ));
    }
    if t.meta.flight && t.records == 0 {
        t.warnings.push(
            "this is a flight recording (record --flight): its calls are in its snapshots, the \
             snapshot-N folders next to this trace (e.g. `fnscope report -i DIR/snapshot-1`)"
                .into(),
        );
    }
    if !seen_meta {
        t.warnings
            .push("the trace has no META chunk: command line and start time unknown".into());
    }
    match &t.end {
        None => t.warnings.push(
            "the trace has no END chunk, so the clock was not calibrated: times are TSC ticks \
             shown as nanoseconds"
                .into(),
        ),
        Some(e) if !(e.ticks_per_ns.is_finite() && e.ticks_per_ns > 0.0) => {
            t.warnings.push(format!(
                "the END chunk has an unusable clock calibration ({} ticks/ns): times are TSC \
                 ticks shown as nanoseconds",
                e.ticks_per_ns
            ))
        }
        Some(_) => {}
    }
    Ok(t)
}

/// Human-readable duration: `850 ns`, `12.345 us`, `1.500 ms`, `2.000 s`.
pub fn format_duration(ns: u64) -> String {
    match ns {
        0..=999 => format!("{ns} ns"),
        1_000..=999_999 => format!("{:.3} us", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.3} ms", ns as f64 / 1e6),
        _ => format!("{:.3} s", ns as f64 / 1e9),
    }
}

/// A short text (a number, a duration) built from its end in a fixed array, right-aligned
/// after spaces: replay prints one or two per call, and appending it with copies of a fixed
/// size keeps the C library's `memcpy` and `memset` out of each line (they were a quarter of
/// the printing).
pub(crate) struct ShortText {
    /// Spaces, then the text ending at [`ShortText::END`], then spaces.
    bytes: [u8; 48],
    /// Where the text starts.
    start: usize,
}

impl ShortText {
    const END: usize = 32;

    /// No text: only spaces when padded.
    pub(crate) fn new() -> ShortText {
        ShortText { bytes: [b' '; 48], start: Self::END }
    }

    fn push_front(&mut self, b: u8) {
        self.start -= 1;
        self.bytes[self.start] = b;
    }

    fn push_front_bytes(&mut self, bytes: &[u8]) {
        for &b in bytes.iter().rev() {
            self.push_front(b);
        }
    }

    fn push_front_decimal(&mut self, mut v: u64) {
        loop {
            self.push_front(b'0' + (v % 10) as u8);
            v /= 10;
            if v == 0 {
                break;
            }
        }
    }

    /// The decimal digits of `v`.
    pub(crate) fn decimal(v: u64) -> ShortText {
        let mut t = ShortText::new();
        t.push_front_decimal(v);
        t
    }

    /// [`format_duration`]'s text for `ns`, computed in integers where they give the same
    /// digits (formatting floats was a large part of a replay's time), or `None` where only
    /// the floats give them.
    pub(crate) fn duration(ns: u64) -> Option<ShortText> {
        let mut t = ShortText::new();
        let (unit, scale): (&[u8], u64) = match ns {
            0..=999 => {
                t.push_front_bytes(b" ns");
                t.push_front_decimal(ns);
                return Some(t);
            }
            1_000..=999_999 => (b" us", 1_000),
            1_000_000..=999_999_999 => (b" ms", 1_000_000),
            _ => (b" s", 1_000_000_000),
        };
        let step = scale / 1_000;
        let (whole, rest) = (ns / scale, ns % scale);
        let (mut thousandths, below) = (rest / step, rest % step);
        // A value exactly halfway rounds the way its nearest double lies, and beyond 1e15 ns
        // the double is no longer within a nanosecond: those take the floats' way. Elsewhere
        // the double is far closer to the exact value than the exact value is to a rounding
        // boundary.
        if (step > 1 && below == step / 2) || ns >= 1_000_000_000_000_000 {
            return None;
        }
        thousandths += u64::from(below > step / 2);
        let whole = whole + thousandths / 1_000;
        let thousandths = thousandths % 1_000;
        t.push_front_bytes(unit);
        for divisor in [1, 10, 100] {
            t.push_front(b'0' + (thousandths / divisor % 10) as u8);
        }
        t.push_front(b'.');
        t.push_front_decimal(whole);
        Some(t)
    }

    /// The text.
    pub(crate) fn text(&self) -> &[u8] {
        &self.bytes[self.start..Self::END]
    }

    /// Appends the text right-aligned in `width` columns (ASCII), like `{:>width}`, with one
    /// copy of 16 bytes when that holds it.
    pub(crate) fn push_padded(&self, out: &mut Vec<u8>, width: usize) {
        let from = self.start.min(Self::END.saturating_sub(width));
        match self.bytes.get(from..from + 16) {
            Some(field) if Self::END - from <= 16 => {
                let len = Self::END - from;
                out.extend_from_slice(<&[u8; 16]>::try_from(field).expect("16 bytes"));
                out.truncate(out.len() - 16 + len);
            }
            _ => {
                out.resize(out.len() + width.saturating_sub(self.text().len()), b' ');
                out.extend_from_slice(self.text());
            }
        }
    }
}

#[cfg(test)]
mod tests;
