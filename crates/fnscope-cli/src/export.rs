//! `export`, `flamegraph` and `callgraph`: the options they share and the progress bar.

use anyhow::Result;
use clap::Args;
use fnscope_export::{Options, Output, Progress};
use std::path::{Path, PathBuf};

/// Options of every export.
#[derive(Args)]
pub struct Common {
    /// Trace folder (or trace.fns file).
    #[arg(short = 'i', long = "input", default_value = "fnscope.data")]
    input: PathBuf,
    /// Output file (standard output if not given).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Only this process.
    #[arg(long)]
    pid: Option<u32>,
    /// Only this thread.
    #[arg(long)]
    tid: Option<u32>,
    /// Only what happened in this window from the start of the recording: START..END, each
    /// a number with a unit (ns, us, ms, s, m), either side may be left out (`2s..`).
    /// Calls crossing its edges are cut at them.
    #[arg(long, value_name = "START..END")]
    time: Option<String>,
    /// Only calls of functions matching PATTERN (a glob on the name, or @GLOB on the module
    /// file name) and the calls made inside them (repeatable).
    #[arg(long, value_name = "PATTERN")]
    filter: Vec<String>,
    /// Leave out calls of functions matching PATTERN; the calls made inside them stay, under
    /// the nearest caller kept (repeatable).
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Only calls that took at least this long (e.g. 50us, 2ms).
    #[arg(long, value_name = "DURATION")]
    min_duration: Option<String>,
    /// Split the output into files of about SIZE (e.g. 200M) that each open on their own.
    #[arg(long, value_name = "SIZE")]
    split_size: Option<String>,
}

/// A size with an optional K, M or G suffix (powers of 1024), more than 0; `None` if `s` is
/// not one.
pub fn size_value(s: &str) -> Option<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.trim().parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).filter(|&n| n > 0)
}

/// A size with an optional K, M or G suffix, for the option named `option`.
pub fn parse_size(s: &str, option: &str) -> Result<u64> {
    size_value(s).ok_or_else(|| anyhow::anyhow!("{option} {s:?}: write a size such as 200M, 1G or 500000"))
}

/// Runs one export with the common options, a progress bar on stderr (when it is a
/// terminal and the export takes more than a moment), and its warnings shown.
pub fn run(
    c: &Common,
    f: impl FnOnce(&Path, &Options, &Output, Progress<'_>) -> Result<Vec<String>, fnscope_export::ExportError>,
) -> Result<i32> {
    let window = match &c.time {
        Some(t) => fnscope_export::parse_time_window(t)?,
        None => (None, None),
    };
    let min_duration_ns = match &c.min_duration {
        Some(d) => fnscope_export::parse_duration(d, "--min-duration")?,
        None => 0,
    };
    let opts = Options {
        selection: fnscope_analysis::Selection { pid: c.pid, tid: c.tid },
        window,
        filter: c.filter.clone(),
        exclude: c.exclude.clone(),
        min_duration_ns,
    };
    let split_size = c.split_size.as_deref().map(|s| parse_size(s, "--split-size")).transpose()?;
    if split_size.is_some() && c.output.is_none() {
        anyhow::bail!("--split-size writes several files: name the first with -o");
    }
    let out = Output { path: c.output.clone(), split_size };
    let bar = crate::progress::Progress::new("exporting");
    let mut progress = |done: u64, total: u64| bar.update(done, total);
    let warnings = f(&c.input, &opts, &out, &mut progress);
    drop(bar);
    for w in warnings? {
        eprintln!("fnscope: warning: {w}");
    }
    Ok(0)
}
