//! speedscope's file format: one evented profile per thread, each call an open (`O`) and a
//! close (`C`) event at its exact times in ns, frames shared by all profiles.
//!
//! speedscope wants each profile's events together, so threads are walked one after the other
//! ([`Order::ByThread`]); events are written as they come, and only the frames list (one entry
//! per function) is held until the end.

use crate::stacks::{program_name, timed_meta, Advance, Sink};
use crate::{ExportError, Options, Output, Progress, Selector};
use fnscope_analysis::{walk_calls, AnalysisError, CallEvent, Order};
use std::collections::HashMap;
use std::path::Path;

const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// The profile being written: its thread and the times of its first and last events.
struct Current {
    thread: (u32, u32),
    start: u64,
    end: u64,
}

fn json(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

pub(crate) fn write(
    input: &Path,
    opts: &Options,
    out: &Output,
    progress: Progress<'_>,
) -> Result<Vec<String>, ExportError> {
    let meta = timed_meta(input, "a speedscope file")?;
    let program = program_name(&meta);
    let mut selector = Selector::new(opts)?;
    let mut sink = Sink::whole(out, "a speedscope file")?;
    let head = format!(
        "{{\"$schema\":{},\"exporter\":{},\"name\":{},\"activeProfileIndex\":0,\"profiles\":[",
        json(SCHEMA),
        json(&format!("fnscope {}", env!("CARGO_PKG_VERSION"))),
        json(&program)
    );
    let r = sink.w().write_all(head.as_bytes());
    sink.check(r)?;
    // Function index -> frame index, and the frames as JSON objects.
    let mut frame_of: HashMap<u32, usize> = HashMap::new();
    let mut frames: Vec<String> = Vec::new();
    let mut current: Option<Current> = None;
    let mut advance = Advance::new();
    let mut progress = progress;
    // Ends the profile being written: its closing and its bounds.
    let close = |w: &mut dyn std::io::Write, c: &Current| {
        write!(w, "],\"startValue\":{},\"endValue\":{}}}", c.start, c.end)
    };
    let trace = walk_calls(input, &opts.selection, Order::ByThread, |cx, ev| {
        advance.tell(cx, &mut progress);
        let Some(ev) = selector.select(cx, ev) else {
            return Ok(());
        };
        let c = *ev.call();
        let at = cx.clock.ns_since_start(ev.tsc());
        let frame = *frame_of.entry(c.func).or_insert_with(|| {
            frames.push(format!(
                "{{\"name\":{},\"file\":{}}}",
                json(cx.names.name(c.func)),
                json(cx.names.module(c.func))
            ));
            frames.len() - 1
        });
        let kind = if matches!(ev, CallEvent::Enter(_)) {
            'O'
        } else {
            'C'
        };
        let thread = cx.trace.thread_name(c.pid, c.tid).unwrap_or(&program);
        let w = sink.w();
        let mut event = || {
            match &mut current {
                Some(p) if p.thread == (c.pid, c.tid) => {
                    p.end = at;
                    w.write_all(b",")?;
                }
                _ => {
                    if let Some(p) = &current {
                        close(w, p)?;
                        w.write_all(b",")?;
                    }
                    current = Some(Current {
                        thread: (c.pid, c.tid),
                        start: at,
                        end: at,
                    });
                    let name = json(&format!("{thread} tid {} (pid {})", c.tid, c.pid));
                    write!(w, "{{\"type\":\"evented\",\"name\":{name},\"unit\":\"nanoseconds\",\"events\":[")?;
                }
            }
            write!(w, "{{\"type\":\"{kind}\",\"frame\":{frame},\"at\":{at}}}")
        };
        let r = event();
        r.map_err(AnalysisError::Output)
    })?;
    let mut warnings = trace.warnings;
    let w = sink.w();
    let mut r = Ok(());
    match &current {
        Some(p) => r = close(w, p),
        None => warnings.push(
            "no calls were selected: the speedscope file holds no profile, and speedscope will not open it".to_string(),
        ),
    }
    let r = r.and_then(|_| write!(w, "],\"shared\":{{\"frames\":[{}]}}}}", frames.join(",")));
    sink.check(r)?;
    sink.finish()?;
    Ok(warnings)
}
