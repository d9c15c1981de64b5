//! Interactive SVG flame graphs (and icicle graphs), drawn by inferno from the folded stacks.

use crate::folded::fold;
use crate::stacks::Sink;
use crate::{ExportError, FlameOptions, Options, Output, Progress, Weight};
use inferno::flamegraph::{from_lines, Direction, Options as Inferno};
use std::path::Path;

/// Boxes narrower than this percentage of the width are left out, as inferno does by default:
/// they could not be seen nor hovered, and a large program has many thousands of them.
const MIN_WIDTH_PERCENT: f64 = 0.01;

pub(crate) fn write(
    input: &Path,
    opts: &Options,
    flame: &FlameOptions,
    out: &Output,
    progress: Progress<'_>,
) -> Result<Vec<String>, ExportError> {
    let folded = fold(input, opts, flame.weight, progress)?;
    // inferno reads lines of text; it holds them all anyway.
    let mut lines = Vec::new();
    folded.each(|stack, w| lines.push(format!("{stack} {w}")));
    if lines.iter().all(|l| l.ends_with(" 0")) {
        return Err(ExportError::Unsupported(format!(
            "{}: no calls were selected, so there is no flame graph to draw; check the trace with \
             `fnscope report`, or widen --time, --filter, --pid and --tid",
            input.display()
        )));
    }
    let mut sink = Sink::whole(out, "an SVG flame graph")?;
    let (widths, count_name) = match flame.weight {
        Weight::SelfTime => ("total time of each function in its stack", "ns"),
        Weight::Calls => ("calls of each function and of all it called", "calls"),
    };
    let kind = if flame.reverse {
        "Icicle graph"
    } else {
        "Flame graph"
    };
    let mut o = Inferno::default();
    o.title = format!("{kind} of {}: widths are the {widths}", folded.program);
    o.count_name = count_name.to_string();
    o.min_width = MIN_WIDTH_PERCENT;
    // Colours by name: the same function has the same colour in every graph, and a graph
    // made twice is the same file.
    o.hash = true;
    o.direction = if flame.reverse {
        Direction::Inverted
    } else {
        Direction::Straight
    };
    let r = from_lines(&mut o, lines.iter().map(String::as_str), sink.w());
    sink.check(r)?;
    sink.finish()?;
    Ok(folded.warnings)
}
