//! Micro-benchmarks of the trace writer and reader on one segment of 43,690 fib-like records
//! (what a 1 MiB shared-memory chunk holds: 1 MiB / 24-byte records).
//!
//! `cargo bench -p fnscope-format` runs them; the figures to look at are the per-record
//! throughputs (criterion prints them as "elem/s"). Before measuring, the bench prints the
//! encoded size of the segment in bytes per record.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fnscope_abi::Record;
use fnscope_format::{Chunk, EndInfo, Meta, TraceReader, TraceWriter};
use std::hint::black_box;
use std::path::PathBuf;

/// A small xorshift generator, so that the records are the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// 20..60 ticks between events, as a traced fib shows them.
    fn ticks(&mut self) -> u64 {
        20 + self.next() % 41
    }
}

/// Records of a recursive fib(n) in post-order (the order in which calls return), stopping
/// once `out` holds `limit` records.
fn fib_records(n: u32, clock: &mut u64, rng: &mut Rng, depth: u32, limit: usize, out: &mut Vec<Record>) {
    if out.len() >= limit {
        return;
    }
    *clock += rng.ticks();
    let t_entry = *clock;
    if n >= 2 {
        fib_records(n - 1, clock, rng, depth + 1, limit, out);
        fib_records(n - 2, clock, rng, depth + 1, limit, out);
    }
    *clock += rng.ticks();
    if out.len() < limit {
        out.push(Record::new(t_entry, *clock, 0, depth, 0));
    }
}

/// Records in the benchmarked segment: fixed, so that figures stay comparable when the
/// recorder's chunk size changes.
const SEGMENT_RECORDS: usize = (1 << 20) / fnscope_abi::RECORD_SIZE;

/// One segment of fib-like records.
fn segment_records() -> Vec<Record> {
    let n = SEGMENT_RECORDS;
    let mut out = Vec::with_capacity(n);
    let mut clock = 1_000_000;
    // fib(22) makes 57,313 calls: more than a chunk holds.
    fib_records(22, &mut clock, &mut Rng(0x9e37_79b9_7f4a_7c15), 0, n, &mut out);
    assert_eq!(out.len(), n);
    out
}

/// `recs` with a data unit each, as raw shared-memory slots: fib's argument, two small
/// counters and the result.
fn with_values(recs: &[Record]) -> Vec<Record> {
    use fnscope_abi::data;
    let tag = 4 << 32 | data::TAG_IMPLIED_HEADER | 3 << 40 | 1 << 48;
    let mut raw = Vec::with_capacity(recs.len() * 3);
    for (k, r) in recs.iter().enumerate() {
        let n = u64::from(r.depth() % 23);
        raw.push(Record { t_entry: n, t_exit: k as u64 % 7, id_depth: tag });
        raw.push(Record { t_entry: k as u64 % 5, t_exit: n * 3, id_depth: tag });
        let mut r = *r;
        r.id_depth |= u64::from(fnscope_abi::REC_FLAG_DATA) << 56;
        raw.push(r);
    }
    raw
}

fn meta() -> Meta {
    Meta {
        command: vec!["fib".into(), "22".into()],
        cwd: "/tmp".into(),
        mode: "time".into(),
        ..Meta::default()
    }
}

const IMAGE: &str = "fnscope-image\t1\npid\t7\nexe\t/bin/fib\narg\tfib\n\
module\t0\t0\t-\t/bin/fib\nfunc\t0\t0\t1000\t40\tfib\n";

/// Writes a complete trace holding one segment of `recs`; returns its size in bytes.
fn write_trace(path: &std::path::Path, recs: &[Record]) -> u64 {
    let mut w = TraceWriter::create(path).expect("create trace");
    w.write_meta(&meta()).expect("meta");
    w.write_image(0, IMAGE).expect("image");
    w.write_segment(0, 7, 7, 0, 0, 0, recs, &Default::default()).expect("segment");
    w.write_end(&EndInfo { ticks_per_ns: 2.0, exit_status: Some(0), ..EndInfo::default() })
        .expect("end");
    w.flush().expect("flush");
    w.bytes_written()
}

fn tmp_path() -> PathBuf {
    std::env::temp_dir().join(format!("fnscope-codec-bench-{}.fns", std::process::id()))
}

fn codec(c: &mut Criterion) {
    let recs = segment_records();
    let path = tmp_path();
    let with_seg = write_trace(&path, &recs);
    let without = write_trace(&path, &[]);
    write_trace(&path, &recs);
    eprintln!(
        "codec bench: {} fib-like records encode to {} bytes ({:.2} bytes/record; raw {} bytes)",
        recs.len(),
        with_seg - without,
        (with_seg - without) as f64 / recs.len() as f64,
        recs.len() * fnscope_abi::RECORD_SIZE,
    );

    let mut g = c.benchmark_group("segment");
    g.throughput(Throughput::Elements(recs.len() as u64));

    // Encode (columns + zstd + CRC) and write: the recorder's work per full chunk. The file
    // is /dev/null so that the figure is the CPU cost, not the disk's, and does not grow.
    let mut w = TraceWriter::create(std::path::Path::new("/dev/null")).expect("open /dev/null");
    g.bench_function("encode_write", |b| {
        b.iter(|| {
            w.write_segment(0, 7, 7, 0, 0, 0, black_box(&recs), &Default::default()).expect("segment");
        })
    });

    // The same with values: each call with three argument words and a return word, in two
    // data slots before its record as the exit stub's fast path writes them, split and
    // written as the recorder does (the chunk holds a third as many calls).
    let raw = with_values(&recs[..recs.len() / 3]);
    let calls = (raw.len() / 3) as u64;
    let (mut split, mut data) = (Vec::new(), Default::default());
    g.throughput(Throughput::Elements(calls));
    g.bench_function("split_encode_write_values", |b| {
        b.iter(|| {
            fnscope_format::split_data_into(black_box(&raw), &mut split, &mut data);
            w.write_segment(0, 7, 7, 0, 0, 0, &split, &data).expect("segment");
        })
    });
    g.throughput(Throughput::Elements(recs.len() as u64));

    // Open the trace written above and read every chunk back, decoding the segment.
    g.bench_function("read_decode", |b| {
        b.iter(|| {
            let mut r = TraceReader::open(black_box(&path)).expect("open trace");
            let mut n = 0usize;
            while let Some(chunk) = r.next_chunk().expect("read chunk") {
                if let Chunk::Events(seg) = chunk {
                    n += seg.records.len();
                }
            }
            assert_eq!(n, recs.len());
            n
        })
    });
    g.finish();
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, codec);
criterion_main!(benches);
