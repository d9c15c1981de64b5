//! Exports of fnscope traces to the viewers people already use: Perfetto, Chrome trace
//! events, speedscope, the Firefox Profiler, folded stacks, flame graphs and call graphs.
//!
//! Every export reads the calls through [`fnscope_analysis::walk_calls`], the walk `replay`
//! prints, through one [`Selector`] that applies the common options (process, thread, time
//! window, name patterns, minimum duration), so that all views agree on which calls there
//! are, how they nest and how they ended. Nothing is held per call: memory is bounded by
//! threads × depth (plus, for the formats that need it, one entry per distinct stack).

#![warn(missing_docs)]

mod callgraph;
mod chrome;
mod firefox;
mod flamegraph;
mod folded;
mod perfetto;
mod select;
mod speedscope;
mod stacks;
mod timeline;

pub use select::{parse_duration, parse_time_window, Selector};

use fnscope_analysis::{AnalysisError, Selection};
use std::path::{Path, PathBuf};

/// Errors of the exports.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Reading the trace failed.
    #[error(transparent)]
    Analysis(#[from] AnalysisError),
    /// Writing an output file failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The trace does not hold what the format needs (a count-mode trace has no times).
    #[error("{0}")]
    Unsupported(String),
    /// A `--filter`/`--exclude` pattern or a `--time` window is malformed.
    #[error("{0}")]
    BadOption(String),
}

/// Which calls to export; see [`Selector`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Process and thread.
    pub selection: Selection,
    /// Only the part of each call inside this window, in ns from the start of the recording
    /// (`None`: unbounded on that side).
    pub window: (Option<u64>, Option<u64>),
    /// Only calls of functions matching one of these patterns and the calls they make
    /// (`uftrace -F`); every call when empty.
    pub filter: Vec<String>,
    /// Not the calls of functions matching one of these patterns; the calls they make stay,
    /// under the nearest caller kept (`uftrace -N`).
    pub exclude: Vec<String>,
    /// Only calls that took at least this long (ns).
    pub min_duration_ns: u64,
}

/// A file format of `fnscope export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Perfetto's protobuf trace (ui.perfetto.dev).
    Perfetto,
    /// Chrome's trace-event JSON (chrome://tracing, Perfetto, speedscope).
    Chrome,
    /// speedscope's evented profiles, one per thread.
    Speedscope,
    /// The Firefox Profiler's processed profile.
    Firefox,
    /// Collapsed stacks (`a;b;c 123`), for flame-graph tools.
    Folded,
}

/// What folded stacks and flame graphs weigh each stack by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Weight {
    /// Time spent in the stack's last function itself (ns): a frame's width is its total
    /// time.
    #[default]
    SelfTime,
    /// Calls of the stack's last function made from this stack.
    Calls,
}

/// Where an export goes.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// The file (`None`: standard output).
    pub path: Option<PathBuf>,
    /// Start a new file (`NAME.1.EXT`, `NAME.2.EXT`, ...) when one reaches about this many
    /// bytes; each opens on its own. Not with standard output.
    pub split_size: Option<u64>,
}

/// Options of `fnscope flamegraph`.
#[derive(Clone, Debug, Default)]
pub struct FlameOptions {
    /// Widths by calls instead of time.
    pub weight: Weight,
    /// An icicle graph: roots at the top, stacks growing down.
    pub reverse: bool,
}

/// Told how far an export has come: bytes of the trace read so far, of the total.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// Writes the calls of the trace at `input` selected by `opts` in `format`. Returns the
/// trace's warnings for the caller to show.
pub fn export(
    input: &Path,
    format: Format,
    opts: &Options,
    weight: Weight,
    out: &Output,
    progress: Progress<'_>,
) -> Result<Vec<String>, ExportError> {
    match format {
        Format::Perfetto => perfetto::write(input, opts, out, progress),
        Format::Chrome => chrome::write(input, opts, out, progress),
        Format::Speedscope => speedscope::write(input, opts, out, progress),
        Format::Firefox => firefox::write(input, opts, out, progress),
        Format::Folded => folded::write(input, opts, weight, out, progress),
    }
}

/// Writes an interactive SVG flame graph (or icicle graph) of the selected calls.
pub fn flamegraph(
    input: &Path,
    opts: &Options,
    flame: &FlameOptions,
    out: &Output,
    progress: Progress<'_>,
) -> Result<Vec<String>, ExportError> {
    flamegraph::write(input, opts, flame, out, progress)
}

/// Writes the caller → callee graph of the selected calls (graphviz DOT), each edge with its
/// calls and time, each function with its calls, total and self time.
pub fn callgraph(
    input: &Path,
    opts: &Options,
    out: &Output,
    progress: Progress<'_>,
) -> Result<Vec<String>, ExportError> {
    callgraph::write(input, opts, out, progress)
}

/// Refuses a trace without call times (count mode, merged runs) for `what` needs them.
pub(crate) fn require_times(input: &Path, what: &str) -> Result<(), ExportError> {
    let mut r = fnscope_format::TraceReader::open(input).map_err(AnalysisError::from)?;
    if let Ok(Some(fnscope_format::Chunk::Meta(m))) = r.next_chunk() {
        if m.mode == "count" || m.mode == "merged" {
            return Err(ExportError::Unsupported(format!(
                "{} is a {} trace: it holds how often functions ran, not when, which {what} needs; \
                 `fnscope export --format folded --counts` and `fnscope flamegraph --counts` work \
                 with it, or record with the default --mode time",
                input.display(),
                m.mode
            )));
        }
    }
    Ok(())
}
