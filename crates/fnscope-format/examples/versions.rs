//! What an older format version (3 unless `--old N` says otherwise) and the current one (6:
//! leaves' times as gap and duration since 4, image tables compressed since 5, time columns in
//! a frame of their own since 6) make of a trace's image tables and calls: bytes per call of a
//! file of both (META and END, a few hundred bytes, left out), and the writer's time per call
//! (encoding and compression, the recorder's work while a program runs). The same tables and
//! calls for both, held in memory and written in alternating rounds, so the differences are
//! the encodings' alone: a new recording of the same program differs by the noise in its times.
//!
//! `cargo run --release -p fnscope-format --example versions -- [--old N] TRACE_DIR...`

use fnscope_format::{Chunk, ImageTable, ThreadSegment, TraceReader, TraceWriter, FORMAT_VERSION};
use std::path::Path;
use std::time::Instant;

const ROUNDS: usize = 5;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut traces: Vec<String> = std::env::args().skip(1).collect();
    let mut old = 3;
    if traces.first().is_some_and(|a| a == "--old") && traces.len() >= 2 {
        old = traces[1].parse().map_err(|_| format!("--old wants a format version, not {}", traces[1]))?;
        traces.drain(..2);
    }
    if traces.is_empty() {
        return Err("usage: versions [--old N] TRACE_DIR...".into());
    }
    let out = std::env::temp_dir().join(format!("fnscope-versions-{}.fns", std::process::id()));
    let versions = [old, FORMAT_VERSION];
    let new = FORMAT_VERSION;
    println!("| trace | calls | bytes/call v{old} | v{new} | ratio | write ns/call v{old} | v{new} | ratio |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|");
    for trace in &traces {
        let mut reader = TraceReader::open(Path::new(trace))?;
        let mut segs: Vec<ThreadSegment> = Vec::new();
        let mut images: Vec<(u32, ImageTable)> = Vec::new();
        while let Some(chunk) = reader.next_chunk()? {
            match chunk {
                Chunk::Events(s) => segs.push(s),
                Chunk::Image { sid, table } => images.push((sid, table)),
                _ => {}
            }
        }
        let texts: Vec<(u32, String)> = images.iter().map(|(sid, t)| (*sid, t.to_text())).collect();
        let calls: u64 = segs.iter().map(|s| s.records.len() as u64).sum::<u64>().max(1);
        let mut bytes = [0u64; 2];
        let mut times: [Vec<f64>; 2] = Default::default();
        for _ in 0..ROUNDS {
            for (k, &version) in versions.iter().enumerate() {
                let mut writer = TraceWriter::create_as(&out, version)?;
                let start = Instant::now();
                for (sid, text) in &texts {
                    writer.write_image(*sid, text)?;
                }
                for s in &segs {
                    writer.write_segment(s.image_sid, s.pid, s.tid, s.seq, s.lost, s.flags, &s.records, &s.data)?;
                }
                writer.flush()?;
                times[k].push(start.elapsed().as_nanos() as f64 / calls as f64);
                bytes[k] = writer.bytes_written();
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (t_old, t_new) = (median(&mut times[0]), median(&mut times[1]));
        let per_call = |b: u64| b as f64 / calls as f64;
        println!(
            "| {trace} | {calls} | {:.3} | {:.3} | {:.3} | {t_old:.1} | {t_new:.1} | {:.3} |",
            per_call(bytes[0]),
            per_call(bytes[1]),
            bytes[1] as f64 / bytes[0] as f64,
            t_new / t_old
        );
    }
    let _ = std::fs::remove_file(&out);
    Ok(())
}
