//! A summary of a recording: what ran, what was hooked, what was recorded.

use crate::profile::MODE_MERGED;
use crate::report::{aggregate, ThreadStats};
use crate::{format_duration, AnalysisError};
use fnscope_format::{EndInfo, Meta, ModuleEntry, RunInfo};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// One process image that loaded the agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageInfo {
    /// Image session id.
    pub sid: u32,
    /// Process id.
    pub pid: u32,
    /// Executable path.
    pub exe: String,
    /// Command line.
    pub args: Vec<String>,
    /// Modules inspected.
    pub modules: Vec<ModuleEntry>,
    /// Functions hooked.
    pub functions_hooked: u64,
    /// Functions skipped.
    pub skipped: u64,
    /// Modules `--app-only` left alone as system code.
    pub system: Vec<String>,
}

/// The result of [`info`].
#[derive(Clone, Debug, Default)]
pub struct Info {
    /// What was traced (command line, working directory, host, start time, ...).
    pub meta: Meta,
    /// How the run ended, if the trace has an END chunk.
    pub end: Option<EndInfo>,
    /// Process ids seen (in images, records or the END chunk).
    pub processes: Vec<u32>,
    /// Threads that recorded calls.
    pub threads: Vec<ThreadStats>,
    /// Process images that loaded the agent.
    pub images: Vec<ImageInfo>,
    /// Functions hooked, summed over images (for a merged trace: hooked in some run).
    pub functions_hooked: u64,
    /// The runs a merged trace was made of (empty for a recorded trace).
    pub runs: Vec<RunInfo>,
    /// Functions skipped per reason code, summed over images.
    pub skipped_by_reason: BTreeMap<String, u64>,
    /// Calls recorded (time mode) or counted (count mode; summed over the runs of a merged
    /// trace).
    pub calls: u64,
    /// Records lost because the shared buffer was full.
    pub lost_records: u64,
    /// Size of the trace file read.
    pub trace_bytes: u64,
    /// Wall-clock run time of the recording, when the END chunk says when it stopped.
    pub duration_ns: Option<u64>,
    /// The trace ended abruptly or was damaged.
    pub truncated: bool,
    /// Problems the user should know about.
    pub warnings: Vec<String>,
    /// Each injection rule (`record --inject`) with the number of calls it changed.
    pub injections: Vec<(String, u64)>,
}

/// Summarises a trace in one streaming pass.
pub fn info(path: &Path) -> Result<Info, AnalysisError> {
    let (trace, agg) = aggregate(path, false)?;
    let threads = agg.thread_stats(&trace);
    let mut processes: BTreeSet<u32> = threads.iter().map(|t| t.pid).collect();
    let mut skipped_by_reason = BTreeMap::new();
    let mut images = Vec::new();
    for t in trace.images.values() {
        processes.insert(t.pid);
        for s in &t.skipped {
            *skipped_by_reason.entry(s.reason.clone()).or_insert(0) += 1;
        }
        if !t.unhooked.is_empty() {
            *skipped_by_reason.entry(fnscope_abi::skip_reason::PATCH_FAILED.to_string()).or_insert(0) += t.unhooked.len() as u64;
        }
        images.push(ImageInfo {
            sid: t.sid,
            pid: t.pid,
            exe: t.exe.clone(),
            args: t.args.clone(),
            modules: t.modules.clone(),
            functions_hooked: (t.funcs.len() - t.unhooked.len()) as u64,
            skipped: (t.skipped.len() + t.unhooked.len()) as u64,
            system: t.system.clone(),
        });
    }
    if let Some(e) = &trace.end {
        processes.extend(&e.processes);
    }
    let seg_lost: u64 = threads.iter().map(|t| t.lost).sum();
    let summarised = trace.summaries.iter().flat_map(|m| &m.functions);
    let mut functions_hooked: u64 = images.iter().map(|i| i.functions_hooked).sum();
    for f in summarised.clone() {
        if f.hooked {
            functions_hooked += 1;
        } else {
            *skipped_by_reason.entry(f.reason.clone()).or_insert(0) += 1;
        }
    }
    let counted: u64 = trace.counts.iter().flat_map(|c| &c.counts).sum();
    let summed: u64 = summarised.map(|f| f.calls).sum();
    // The same rules in every process of a recording: summed by their text.
    let mut injections: Vec<(String, u64)> = Vec::new();
    for t in trace.images.values() {
        for (k, text) in &t.injections {
            let n = trace.injected.get(&(t.sid, *k)).copied().unwrap_or(0);
            match injections.iter_mut().find(|(r, _)| r == text) {
                Some(e) => e.1 += n,
                None => injections.push((text.clone(), n)),
            }
        }
    }
    Ok(Info {
        injections,
        processes: processes.into_iter().collect(),
        functions_hooked,
        runs: trace.runs.clone(),
        skipped_by_reason,
        calls: trace.records + counted + summed,
        lost_records: seg_lost.max(trace.end.as_ref().map_or(0, |e| e.lost_records)),
        trace_bytes: trace.bytes,
        duration_ns: trace
            .end
            .as_ref()
            .map(|e| e.end_unix_ns.saturating_sub(trace.meta.start_unix_ns)),
        truncated: trace.truncated,
        warnings: trace.warnings,
        meta: trace.meta,
        end: trace.end,
        threads,
        images,
    })
}

/// The date (year, month, day) `days` days after 1970-01-01 (H. Hinnant's
/// `civil_from_days`), so that no calendar crate is needed for a few dates in output.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Wall-clock time in UTC, `2026-11-22 02:10:33.123456789 UTC`.
fn wall(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:09} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        ns % 1_000_000_000
    )
}

/// Renders a summary as `key: value` lines.
pub fn render_info_text(i: &Info) -> String {
    let mut o = String::new();
    let m = &i.meta;
    if m.mode == MODE_MERGED {
        let _ = writeln!(o, "merged by:        fnscope {}", m.fnscope_version);
        let _ = writeln!(o, "runs:             {}", i.runs.len());
        for r in &i.runs {
            let _ = writeln!(
                o,
                "  {} ({} mode, {} on {}): {}",
                r.trace,
                r.mode,
                wall(r.start_unix_ns),
                if r.host.is_empty() { "?" } else { &r.host },
                r.command.join(" ")
            );
        }
    } else {
        run_lines(&mut o, i);
    }
    let pids: Vec<String> = i.processes.iter().map(u32::to_string).collect();
    if !pids.is_empty() {
        let _ = writeln!(o, "processes:        {}", pids.join(" "));
    }
    let verb = match m.mode.as_str() {
        "count" => "counted",
        MODE_MERGED => "(all runs)",
        _ => "recorded",
    };
    let _ = writeln!(o, "{:<18}{}", format!("calls {verb}:"), i.calls);
    let _ = writeln!(o, "records lost:     {}", i.lost_records);
    let _ = writeln!(o, "trace size:       {} bytes", i.trace_bytes);
    let _ = writeln!(
        o,
        "complete:         {}",
        match (&i.end, i.truncated) {
            (Some(EndInfo { write_error: Some(why), unwritten_calls, .. }), _) => {
                format!("no, the recorder could not write it to the end ({why}): {unwritten_calls} calls made after that are missing")
            }
            (Some(EndInfo { untraced_images: n @ 1.., .. }), _) => format!("no, {n} process image(s) ran untraced (their agent could not set up)"),
            (_, true) => "no, the trace ended abruptly".to_string(),
            (_, false) => "yes".to_string(),
        }
    );
    let _ = writeln!(o, "functions hooked: {}", i.functions_hooked);
    for (rule, n) in &i.injections {
        let _ = writeln!(o, "injection:        {rule}: {n} calls changed");
    }
    let skipped: u64 = i.skipped_by_reason.values().sum();
    let _ = writeln!(o, "functions skipped: {skipped}");
    for (reason, n) in &i.skipped_by_reason {
        let _ = writeln!(o, "  {reason:<20} {n}");
    }
    if m.mode == MODE_MERGED {
        for w in &i.warnings {
            let _ = writeln!(o, "warning: {w}");
        }
        return o;
    }
    images_and_threads(&mut o, i);
    o
}

/// What ran, and its start, end and outcome, for a recorded run.
fn run_lines(o: &mut String, i: &Info) {
    let m = &i.meta;
    let _ = writeln!(o, "command:          {}", m.command.join(" "));
    let _ = writeln!(o, "directory:        {}", m.cwd);
    let _ = writeln!(o, "host:             {}", m.host);
    let _ = writeln!(
        o,
        "recorded by:      fnscope {} ({} mode)",
        m.fnscope_version, m.mode
    );
    let _ = writeln!(o, "started:          {}", wall(m.start_unix_ns));
    match &i.end {
        Some(e) => {
            let _ = writeln!(o, "ended:            {}", wall(e.end_unix_ns));
            let how = match (e.exit_status, e.killed_by_signal) {
                (_, Some(sig)) => format!(
                    "killed by signal {sig}: the trace ended abruptly; every call that returned before \
                     is in it, and the calls still running then end there, cut off"
                ),
                (Some(st), None) => format!("exited with status {st}"),
                (None, None) => "unknown".to_string(),
            };
            let _ = writeln!(o, "program:          {how}");
            let _ = writeln!(
                o,
                "clock:            {:.4} TSC ticks per ns",
                e.ticks_per_ns
            );
        }
        None => {
            let _ = writeln!(o, "ended:            unknown (no END chunk)");
        }
    }
    if let Some(d) = i.duration_ns {
        let _ = writeln!(o, "duration:         {}", format_duration(d));
    }
}

/// The images with their modules, and the threads, of a recorded run.
fn images_and_threads(o: &mut String, i: &Info) {
    let _ = writeln!(o, "images:");
    for im in &i.images {
        let _ = writeln!(
            o,
            "  #{} pid {}: {} ({} hooked, {} skipped)",
            im.sid, im.pid, im.exe, im.functions_hooked, im.skipped
        );
        for md in &im.modules {
            let _ = writeln!(
                o,
                "    [{}] {} bias {:#x} build-id {}",
                md.index,
                md.path,
                md.bias,
                md.build_id.as_deref().unwrap_or("-")
            );
        }
        if !im.system.is_empty() {
            let _ = writeln!(o, "    system code, not hooked (--app-only):");
            for p in &im.system {
                let _ = writeln!(o, "      {p}");
            }
        }
    }
    let _ = writeln!(o, "threads:");
    let _ = writeln!(
        o,
        "  {:>8} {:>8} {:>12} {:>11} {:>10}",
        "PID", "TID", "Calls", "Run time", "Lost"
    );
    for t in &i.threads {
        let _ = writeln!(
            o,
            "  {:>8} {:>8} {:>12} {:>11} {:>10}",
            t.pid,
            t.tid,
            t.calls,
            format_duration(t.run_ns()),
            t.lost
        );
    }
    for w in &i.warnings {
        let _ = writeln!(o, "warning: {w}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn wall_clock_dates() {
        assert_eq!(super::wall(0), "1970-01-01 00:00:00.000000000 UTC");
        assert_eq!(
            super::wall(1_467_193_517_604_532_239),
            "2016-06-29 09:45:17.604532239 UTC"
        );
        assert_eq!(
            super::wall(951_782_400_000_000_001),
            "2000-02-29 00:00:00.000000001 UTC"
        );
    }
}
