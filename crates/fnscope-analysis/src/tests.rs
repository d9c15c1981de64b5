use super::*;
use fnscope_abi::Record;
use fnscope_format::TraceWriter;
use std::path::PathBuf;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fnscope-analysis-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const START_NS: u64 = 1_467_193_517_604_532_000;

fn image(pid: u32, funcs: &[(u64, &str)]) -> String {
    let mut s = format!(
        "fnscope-image\t1\npid\t{pid}\nexe\t/bin/prog\narg\tprog\n\
         module\t0\t0x555555554000\tbeef\t/bin/prog\n"
    );
    for (i, (addr, name)) in funcs.iter().enumerate() {
        s += &format!("func\t{i}\t0\t{addr:x}\t16\t{name}\n");
    }
    s += "skip\t0\t2000\t3\ttoo-short\t3 bytes\ttiny\nskip\t0\t2100\t30\tdenylist\t\tlongjmp\n";
    s
}

const MAIN: u32 = 0;
const A: u32 = 1;
const B: u32 = 2;

/// Thread 7: main{a{b}, b}; thread 8: a{b}, its segment between thread 7's two segments.
fn write_simple(dir: &Path, with_end: bool) -> PathBuf {
    let path = dir.join("trace.fns");
    let mut w = TraceWriter::create(&path).unwrap();
    w.write_meta(&fnscope_format::Meta {
        command: vec!["prog".into()],
        start_unix_ns: START_NS,
        tsc_at_start: 1000,
        mode: "time".into(),
        ..Default::default()
    })
    .unwrap();
    w.write_image(
        0,
        &image(7, &[(0x1100, "main"), (0x1200, "_Z1av"), (0x1300, "b")]),
    )
    .unwrap();
    let t7a = [
        Record::new(1020, 1060, B, 2, 0),
        Record::new(1010, 1100, A, 1, 0),
    ];
    let t8 = [
        Record::new(1060, 1070, B, 1, 0),
        Record::new(1050, 1150, A, 0, 0),
    ];
    let t7b = [
        Record::new(1110, 1190, B, 1, 0),
        Record::new(1000, 1200, MAIN, 0, 0),
    ];
    w.write_segment(0, 7, 7, 0, 0, 0, &t7a, &Default::default()).unwrap();
    w.write_segment(0, 7, 8, 0, 0, fnscope_abi::CHUNK_FLAG_LAST, &t8, &Default::default())
        .unwrap();
    w.write_segment(0, 7, 7, 1, 0, fnscope_abi::CHUNK_FLAG_LAST, &t7b, &Default::default())
        .unwrap();
    if with_end {
        w.write_end(&fnscope_format::EndInfo {
            end_unix_ns: START_NS + 1000,
            ticks_per_ns: 2.0,
            exit_status: Some(0),
            processes: vec![7],
            ..Default::default()
        })
        .unwrap();
    }
    w.flush().unwrap();
    path
}

/// Expected statistics of a function of `/bin/prog`: calls, total, self, min, max.
fn stats(name: &str, address: u64, [c, t, s, mn, mx]: [u64; 5]) -> FuncStats {
    FuncStats {
        name: name.into(),
        raw_name: if name == "a()" {
            "_Z1av".into()
        } else {
            name.into()
        },
        module: "prog".into(),
        address,
        calls: c,
        calls_min: c,
        calls_max: c,
        timed_calls: c,
        total_ns: t,
        self_ns: s,
        min_ns: mn,
        max_ns: mx,
    }
}

#[test]
fn report_by_hand() {
    let dir = tmpdir("report");
    write_simple(&dir, true);
    let r = report(&dir, true).unwrap();
    assert!(!r.truncated);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let main = stats("main", 0x1100, [1, 100, 15, 100, 100]);
    let a = stats("a()", 0x1200, [2, 95, 70, 45, 50]);
    let b = stats("b", 0x1300, [3, 65, 65, 5, 40]);
    assert_eq!(r.functions, vec![main.clone(), a.clone(), b.clone()]);
    let th = |tid, calls, first_ns, last_ns| ThreadStats {
        pid: 7,
        tid,
        calls,
        first_ns,
        last_ns,
        lost: 0,
    };
    assert_eq!(r.threads, vec![th(7, 4, 0, 100), th(8, 2, 25, 75)]);
    let pt = r.per_thread.as_ref().unwrap();
    assert_eq!(
        pt[&(7, 7)],
        vec![
            main,
            stats("b", 0x1300, [2, 60, 60, 20, 40]),
            stats("a()", 0x1200, [1, 45, 25, 45, 45])
        ]
    );
    assert_eq!(
        pt[&(7, 8)],
        vec![
            stats("a()", 0x1200, [1, 50, 45, 50, 50]),
            stats("b", 0x1300, [1, 5, 5, 5, 5])
        ]
    );

    let mut f = r.functions.clone();
    sort(&mut f, SortKey::Calls);
    assert_eq!(
        f.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["b", "a()", "main"]
    );
    sort(&mut f, SortKey::SelfTime);
    assert_eq!(
        f.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["a()", "b", "main"]
    );
    sort(&mut f, SortKey::Avg);
    assert_eq!(
        f.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["main", "a()", "b"]
    );

    let text = render_report_text(&r, Some(2), SortKey::Calls);
    assert!(text.contains("Total time"), "{text}");
    assert!(
        text.contains(
            "   65 ns       65 ns          3       21 ns        5 ns       40 ns  b (prog)"
        ),
        "{text}"
    );
    assert!(
        !text.contains("main (prog)\n  "),
        "top 2 keeps main out of the main table: {text}"
    );
    assert!(text.contains("Thread 8 (process 7)"), "{text}");

    let j = report_json(&r);
    assert_eq!(j[0]["name"], "main");
    assert_eq!(j[1]["avg_ns"], 47);
    assert_eq!(j[2]["calls"], 3);
    assert_eq!(j[2]["address"], 0x1300);
}

#[test]
fn replay_tree_text() {
    let dir = tmpdir("tree");
    write_simple(&dir, true);
    let mut out = Vec::new();
    let warnings = replay_tree(&dir, None, &mut out).unwrap();
    assert!(warnings.is_empty());
    let expected = "\
#    TID   DURATION | FUNCTION
[     8]            | a() {
[     8]       5 ns |   b();
[     8]      50 ns | } /* a() */
[     7]            | main() {
[     7]            |   a() {
[     7]      20 ns |     b();
[     7]      45 ns |   } /* a() */
[     7]      40 ns |   b();
[     7]     100 ns | } /* main */
";
    assert_eq!(String::from_utf8(out).unwrap(), expected);
    let mut out = Vec::new();
    replay_tree(&dir, Some(8), &mut out).unwrap();
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 4);
}

#[test]
fn replay_lines_function_txt() {
    let dir = tmpdir("lines");
    write_simple(&dir, true);
    let mut out = Vec::new();
    replay_lines(&dir, None, &mut out).unwrap();
    let expected = "\
1[1467193517,604532000]enter:main
2[1467193517,604532005]enter:a()
3[1467193517,604532010]enter:b
4[1467193517,604532025]enter:a()
5[1467193517,604532030]enter:b
6[1467193517,604532030]leave:b
7[1467193517,604532035]leave:b
8[1467193517,604532050]leave:a()
9[1467193517,604532055]enter:b
10[1467193517,604532075]leave:a()
11[1467193517,604532095]leave:b
12[1467193517,604532100]leave:main
";
    assert_eq!(String::from_utf8(out).unwrap(), expected);
    let mut out = Vec::new();
    replay_lines(&dir, Some(8), &mut out).unwrap();
    let expected = "\
1[1467193517,604532025]enter:a()
2[1467193517,604532030]enter:b
3[1467193517,604532035]leave:b
4[1467193517,604532075]leave:a()
";
    assert_eq!(String::from_utf8(out).unwrap(), expected);
}

#[test]
fn nsec_is_not_padded() {
    let t = Trace {
        meta: fnscope_format::Meta {
            start_unix_ns: 5_000_000_007,
            tsc_at_start: 0,
            ..Default::default()
        },
        end: Some(fnscope_format::EndInfo {
            ticks_per_ns: 1.0,
            ..Default::default()
        }),
        ..Trace::default()
    };
    let w = t.wall_ns(0);
    assert_eq!(
        format!("[{},{}]", w / 1_000_000_000, w % 1_000_000_000),
        "[5,7]"
    );
}

#[test]
fn info_summary() {
    let dir = tmpdir("info");
    write_simple(&dir, true);
    let i = info(&dir).unwrap();
    assert_eq!(i.processes, vec![7]);
    assert_eq!(i.calls, 6);
    assert_eq!(i.functions_hooked, 3);
    assert_eq!(i.skipped_by_reason.get("too-short"), Some(&1));
    assert_eq!(i.skipped_by_reason.get("denylist"), Some(&1));
    assert_eq!(i.duration_ns, Some(1000));
    assert_eq!(i.threads.len(), 2);
    assert_eq!(
        i.trace_bytes,
        std::fs::metadata(dir.join("trace.fns")).unwrap().len()
    );
    assert!(!i.truncated);
    let text = render_info_text(&i);
    assert!(text.contains("exited with status 0"), "{text}");
    assert!(text.contains("too-short"), "{text}");
}

#[test]
fn truncated_trace_reports_what_it_has() {
    let dir = tmpdir("trunc");
    let path = write_simple(&dir, false);
    let full = std::fs::read(&path).unwrap();
    std::fs::write(&path, &full[..full.len() - 3]).unwrap();
    let r = report(&dir, false).unwrap();
    assert!(r.truncated);
    assert!(
        r.warnings.iter().any(|w| w.contains("ended abruptly")),
        "{:?}",
        r.warnings
    );
    assert!(
        r.warnings.iter().any(|w| w.contains("no END chunk")),
        "{:?}",
        r.warnings
    );
    // Thread 7's second segment is lost: b and a of its first segment, in ticks as ns.
    let a = r.functions.iter().find(|f| f.name == "a()").unwrap();
    assert_eq!((a.calls, a.total_ns), (2, 190));
    assert!(info(&dir).unwrap().truncated);
    let mut out = Vec::new();
    let w = replay_tree(&dir, Some(7), &mut out).unwrap();
    assert!(!w.is_empty());
    // The open main never returned: a's tree is printed on its own at its depth.
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("[     7]      90 ns |   } /* a() */"),
        "{text}"
    );
    let mut out = Vec::new();
    replay_lines(&dir, None, &mut out).unwrap();
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 8);
}

#[test]
fn newer_version_is_refused() {
    let dir = tmpdir("newer");
    let path = write_simple(&dir, true);
    let mut b = std::fs::read(&path).unwrap();
    b[8] = 9;
    std::fs::write(&path, &b).unwrap();
    let e = report(&dir, false).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("trace format version 9 is newer than this fnscope (supports {}): upgrade fnscope", fnscope_format::FORMAT_VERSION)
    );
    assert!(info(&dir).is_err());
    assert!(replay_lines(&dir, None, &mut Vec::new()).is_err());
}

/// Forked children (same image, other pid) and an exec of the same binary (other image,
/// other ids) count as the same functions.
#[test]
fn forks_and_execs_merge() {
    let dir = tmpdir("merge");
    let path = dir.join("trace.fns");
    let mut w = TraceWriter::create(&path).unwrap();
    w.write_meta(&Default::default()).unwrap();
    w.write_image(0, &image(7, &[(0x1100, "main"), (0x1300, "b")]))
        .unwrap();
    w.write_segment(0, 7, 7, 0, 0, 0, &[Record::new(0, 10, 1, 0, 0)], &Default::default())
        .unwrap();
    w.write_segment(0, 9, 9, 0, 0, 0, &[Record::new(0, 20, 1, 0, 0)], &Default::default())
        .unwrap();
    w.write_image(1, &image(11, &[(0x1300, "b"), (0x1100, "main")]))
        .unwrap();
    w.write_segment(
        1,
        11,
        11,
        0,
        0,
        0,
        &[Record::new(0, 30, 0, 0, 0), Record::new(0, 40, 1, 0, 0)], &Default::default())
    .unwrap();
    // An id that no table names still shows up.
    w.write_segment(1, 11, 11, 1, 3, 0, &[Record::new(0, 1, 77, 0, 0)], &Default::default())
        .unwrap();
    w.write_end(&fnscope_format::EndInfo {
        ticks_per_ns: 1.0,
        lost_records: 3,
        ..Default::default()
    })
    .unwrap();
    drop(w);
    let r = report(&dir, false).unwrap();
    let names: Vec<(&str, u64, u64)> = r
        .functions
        .iter()
        .map(|f| (f.name.as_str(), f.calls, f.total_ns))
        .collect();
    assert_eq!(
        names,
        [
            ("b", 3, 60),
            ("main", 1, 40),
            ("<unknown function 77 of image 1>", 1, 1)
        ]
    );
    assert_eq!(r.threads.len(), 3);
    assert!(
        r.warnings.iter().any(|w| w.contains("3 records were lost")),
        "{:?}",
        r.warnings
    );
    let i = info(&dir).unwrap();
    assert_eq!(i.processes, vec![7, 9, 11]);
    assert_eq!(i.lost_records, 3);
}

/// Self time survives lost records and unwound calls without going negative or panicking.
#[test]
fn odd_depth_sequences() {
    let dir = tmpdir("odd");
    let path = dir.join("trace.fns");
    let mut w = TraceWriter::create(&path).unwrap();
    w.write_image(0, &image(1, &[(0x1100, "main"), (0x1200, "f")]))
        .unwrap();
    let recs = [
        Record::new(10, 20, 1, 3, 0),
        Record::new(5, 500, 1, 1, fnscope_abi::REC_FLAG_UNWOUND),
        Record::new(30, 40, 1, 5, 0),
        Record::new(0, 1000, 0, 0, 0),
        Record::new(2000, 1990, 1, 0, 0),
    ];
    w.write_segment(0, 1, 1, 0, 0, 0, &recs, &Default::default()).unwrap();
    drop(w);
    let r = report(&dir, false).unwrap();
    assert_eq!(r.functions.iter().map(|f| f.calls).sum::<u64>(), 5);
    let mut out = Vec::new();
    replay_tree(&dir, None, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("} /* f, unwound */"), "{text}");
    replay_lines(&dir, None, &mut Vec::new()).unwrap();
}

#[test]
fn damaged_traces_never_panic() {
    let dir = tmpdir("fuzz");
    let path = write_simple(&dir, true);
    let good = std::fs::read(&path).unwrap();
    let mut x = 88172645463325252u64;
    for i in 0..600 {
        let mut b = good.clone();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = x as usize % b.len();
        if i % 2 == 0 {
            b[at] ^= 1 << (x >> 60 & 7);
        } else {
            b.truncate(at);
        }
        std::fs::write(&path, &b).unwrap();
        let _ = report(&dir, true);
        let _ = info(&dir);
        let _ = replay_tree(&dir, None, &mut Vec::new());
        let _ = replay_lines(&dir, None, &mut Vec::new());
    }
}

#[test]
fn durations_read_well() {
    assert_eq!(format_duration(0), "0 ns");
    assert_eq!(format_duration(999), "999 ns");
    assert_eq!(format_duration(1_500), "1.500 us");
    assert_eq!(format_duration(2_000_000), "2.000 ms");
    assert_eq!(format_duration(3_250_000_000), "3.250 s");
}

/// Throughput of `report` on a synthetic 10M-record trace (run with
/// `cargo test --release -p fnscope-analysis -- --ignored --nocapture`).
#[test]
#[ignore]
fn report_throughput_10m() {
    let dir = tmpdir("bench");
    let path = dir.join("trace.fns");
    let mut w = TraceWriter::create(&path).unwrap();
    w.write_meta(&Default::default()).unwrap();
    w.write_image(
        0,
        &image(1, &[(0x1100, "main"), (0x1200, "fib"), (0x1300, "leaf")]),
    )
    .unwrap();
    let per_chunk = fnscope_abi::records_per_chunk(fnscope_abi::DEFAULT_CHUNK_SIZE);
    let threads = 4u32;
    let mut seq = vec![0u64; threads as usize];
    let mut bufs: Vec<Vec<Record>> = vec![Vec::new(); threads as usize];
    let mut clock = 1u64 << 40;
    let mut rng = 1u64;
    let mut total = 0u64;
    // Each thread runs fib(n) repeatedly; threads' chunks interleave in the file.
    fn fib(n: u32, d: u32, clock: &mut u64, rng: &mut u64, out: &mut Vec<Record>) {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *clock += 20 + *rng % 41;
        let t0 = *clock;
        if n >= 2 {
            fib(n - 1, d + 1, clock, rng, out);
            fib(n - 2, d + 1, clock, rng, out);
        }
        *clock += 20 + *rng % 37;
        out.push(Record::new(t0, *clock, if n < 2 { 2 } else { 1 }, d, 0));
    }
    while total < 10_000_000 {
        for t in 0..threads as usize {
            fib(18, 0, &mut clock, &mut rng, &mut bufs[t]);
            while bufs[t].len() >= per_chunk {
                let rest = bufs[t].split_off(per_chunk);
                w.write_segment(0, 1, 100 + t as u32, seq[t], 0, 0, &bufs[t], &Default::default())
                    .unwrap();
                total += bufs[t].len() as u64;
                seq[t] += 1;
                bufs[t] = rest;
            }
        }
    }
    w.write_end(&fnscope_format::EndInfo {
        ticks_per_ns: 3.0,
        ..Default::default()
    })
    .unwrap();
    let bytes = w.bytes_written();
    drop(w);
    let t = std::time::Instant::now();
    let r = report(&dir, false).unwrap();
    let el = t.elapsed();
    let calls: u64 = r.functions.iter().map(|f| f.calls).sum();
    assert_eq!(calls, total);
    println!(
        "report: {total} records ({:.2} bytes/record) in {el:?}: {:.1} M records/s",
        bytes as f64 / total as f64,
        total as f64 / el.as_secs_f64() / 1e6
    );
    let t = std::time::Instant::now();
    scan(&dir, |_, _| {}).unwrap();
    println!("reading and decoding alone: {:?}", t.elapsed());
    let t = std::time::Instant::now();
    report(&dir, true).unwrap();
    println!("report --per-thread: {:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A recursion 100,000 calls deep must not overflow the stack of any analysis.
#[test]
fn deep_recursion() {
    let dir = tmpdir("deep");
    let path = dir.join("trace.fns");
    let mut w = TraceWriter::create(&path).unwrap();
    w.write_image(0, &image(1, &[(0x1100, "main"), (0x1200, "f")]))
        .unwrap();
    let n = 100_000u32;
    let recs: Vec<Record> = (0..n)
        .rev()
        .map(|d| Record::new(u64::from(d), 2 * u64::from(n) - u64::from(d), 1, d, 0))
        .collect();
    w.write_segment(0, 1, 1, 0, 0, 0, &recs, &Default::default()).unwrap();
    drop(w);
    let r = report(&dir, true).unwrap();
    assert_eq!(r.functions[0].calls, u64::from(n));
    assert_eq!(r.functions[0].self_ns, 2 * u64::from(n));
    let mut out = Vec::new();
    replay_tree(&dir, None, &mut out).unwrap();
    assert_eq!(out.split(|&b| b == b'\n').count(), 2 * n as usize + 1);
    let mut out = Vec::new();
    replay_lines(&dir, None, &mut out).unwrap();
    assert_eq!(out.split(|&b| b == b'\n').count(), 2 * n as usize + 1);
}

/// A one-run profile of one module whose functions are `(address, name, calls)`.
fn profile(path: &str, build_id: &str, funcs: &[(u64, &str, u64)]) -> Profile {
    use fnscope_format::{FunctionSummary, ModuleSummary, RunInfo};
    Profile {
        runs: vec![RunInfo {
            trace: path.into(),
            mode: "count".into(),
            ..RunInfo::default()
        }],
        modules: vec![ModuleSummary {
            path: path.into(),
            build_id: Some(build_id.into()),
            functions: funcs
                .iter()
                .map(|&(address, name, calls)| FunctionSummary {
                    address,
                    size: 16,
                    name: name.into(),
                    hooked: true,
                    calls,
                    calls_min: calls,
                    calls_max: calls,
                    ..FunctionSummary::default()
                })
                .collect(),
        }],
        ..Profile::default()
    }
}

#[test]
fn combine_matches_by_build_id_and_name() {
    // The same build at two paths; two static functions share a name; one is unnamed.
    let a = profile(
        "/a/prog",
        "x",
        &[
            (0x10, "foo", 3),
            (0x20, "sub_20", 1),
            (0x30, "dup", 1),
            (0x40, "dup", 2),
        ],
    );
    let b = profile(
        "/b/prog",
        "x",
        &[
            (0x10, "foo", 5),
            (0x20, "sub_20", 2),
            (0x30, "dup", 10),
            (0x40, "dup", 20),
            (0x50, "bar", 7),
        ],
    );
    let c = combine(
        vec![("a".into(), a.clone()), ("b".into(), b.clone())],
        false,
    )
    .unwrap();
    assert_eq!(c.run_count(), 2);
    assert_eq!(c.modules.len(), 1);
    let got: Vec<(u64, &str, u64, u64, u64)> = c.modules[0]
        .functions
        .iter()
        .map(|f| {
            (
                f.address,
                f.name.as_str(),
                f.calls,
                f.calls_min,
                f.calls_max,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0x10, "foo", 8, 3, 5),
            (0x20, "sub_20", 3, 1, 2),
            (0x30, "dup", 11, 1, 10),
            (0x40, "dup", 22, 2, 20),
            // Not in run a: 0 calls there.
            (0x50, "bar", 7, 0, 7),
        ]
    );
    let r = report_of(&c);
    let bar = r.functions.iter().find(|f| f.name == "bar").unwrap();
    assert_eq!((bar.calls, bar.calls_min, bar.calls_max), (7, 0, 7));
    assert!(!r.timed);
    assert_eq!(report_json(&r)[0]["calls_avg"], 11);

    let d = diff(("a", &a), ("b", &b), false, SortKey::Calls).unwrap();
    let deltas: Vec<(&str, f64)> = d
        .functions
        .iter()
        .map(|f| (f.name.as_str(), f.calls_delta()))
        .collect();
    assert_eq!(
        deltas,
        [
            ("dup", 18.0),
            ("dup", 9.0),
            ("bar", 7.0),
            ("foo", 2.0),
            ("sub_20", 1.0)
        ]
    );

    // Another build of a file of the same name is refused, unless matched by name.
    let other = profile("/a/prog", "y", &[(0x10, "foo", 1)]);
    let e = combine(
        vec![("a".into(), a.clone()), ("o".into(), other.clone())],
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("prog") && e.contains("--match-by-name") && e.contains("build-id x"),
        "{e}"
    );
    let c = combine(vec![("a".into(), a), ("o".into(), other)], true).unwrap();
    assert_eq!(
        c.modules[0]
            .functions
            .iter()
            .find(|f| f.name == "foo")
            .unwrap()
            .calls,
        4
    );
}

#[test]
fn merged_trace_round_trip_and_coverage_of_a_missing_module() {
    let dir = tmpdir("merged");
    let a = profile("/nowhere/prog", "x", &[(0x10, "foo", 3), (0x20, "bar", 0)]);
    a.write_merged(&dir).unwrap();
    let back = Profile::load(&dir).unwrap();
    assert_eq!(back.modules, a.modules);
    assert_eq!(back.runs, a.runs);
    let r = report(&dir, false).unwrap();
    assert_eq!(r.functions.len(), 1);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let c = coverage(&back);
    let m = &c.modules[0];
    assert_eq!(m.sources, Sources::Missing);
    assert_eq!((m.executed, m.hookable, m.unhookable), (1, 2, 0));
    let text = render_coverage_text(&c);
    assert!(text.contains("never executed (1):\n    bar\n"), "{text}");
}

/// Threads running recursions of random shapes, their segments interleaved in the file; the
/// last thread's outermost calls never return (the trace ends first).
fn write_forest(dir: &Path) {
    let path = dir.join("trace.fns");
    let mut w = TraceWriter::create(&path).unwrap();
    w.write_meta(&fnscope_format::Meta {
        start_unix_ns: START_NS,
        ..Default::default()
    })
    .unwrap();
    w.write_image(0, &image(1, &[(0x1100, "main"), (0x1200, "f"), (0x1300, "g")]))
        .unwrap();
    fn grow(d: u32, clock: &mut u64, rng: &mut u64, out: &mut Vec<Record>) {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *clock += 1 + *rng % 5;
        let t0 = *clock;
        let kids = if d < 9 { *rng % 4 } else { 0 };
        for _ in 0..kids {
            grow(d + 1, clock, rng, out);
        }
        *clock += 1 + *rng % 3;
        out.push(Record::new(t0, *clock, 1 + (*rng % 2) as u32, d, u32::from((*rng).is_multiple_of(7))));
    }
    let mut streams = Vec::new();
    let (mut clock, mut rng) = (1000u64, 99u64);
    for t in 0..4u32 {
        let mut recs = Vec::new();
        for _ in 0..3 + t {
            grow(0, &mut clock, &mut rng, &mut recs);
        }
        if t == 3 {
            // Drop the last roots: their callees become orphans.
            recs.retain(|r| r.depth() != 0 || r.t_entry < clock / 2);
        }
        streams.push(recs);
    }
    let mut seq = [0u64; 4];
    let mut at = [0usize; 4];
    let mut k = 0usize;
    while (0..4).any(|t| at[t] < streams[t].len()) {
        let t = k % 4;
        k += 1;
        let n = (streams[t].len() - at[t]).min(1 + k % 37);
        if n == 0 {
            continue;
        }
        w.write_segment(0, 1, 10 + t as u32, seq[t], 0, 0, &streams[t][at[t]..at[t] + n], &Default::default())
            .unwrap();
        seq[t] += 1;
        at[t] += n;
    }
    w.write_end(&fnscope_format::EndInfo {
        ticks_per_ns: 1.0,
        ..Default::default()
    })
    .unwrap();
}

/// The replay views print the same bytes whether the calls stay in memory or go through
/// temporary files in runs of a few calls (merged level after level).
#[test]
fn replay_spills_without_changing_output() {
    use crate::replay::{replay_lines_within, replay_tree_within};
    let simple = tmpdir("spill-simple");
    write_simple(&simple, true);
    let forest = tmpdir("spill-forest");
    write_forest(&forest);
    for dir in [&simple, &forest] {
        for tid in [None, Some(8), Some(13)] {
            let mut tree = Vec::new();
            replay_tree_within(dir, tid, &mut tree, usize::MAX).unwrap();
            let mut lines = Vec::new();
            replay_lines_within(dir, tid, &mut lines, usize::MAX).unwrap();
            for budget in [1, 3, 50] {
                let mut out = Vec::new();
                replay_tree_within(dir, tid, &mut out, budget).unwrap();
                assert!(out == tree, "tree, budget {budget}, {}", dir.display());
                let mut out = Vec::new();
                replay_lines_within(dir, tid, &mut out, budget).unwrap();
                assert!(out == lines, "lines, budget {budget}, {}", dir.display());
            }
        }
    }
    // The forest is big enough to need merges of merges at budget 1 and holds orphans.
    let mut lines = Vec::new();
    replay_lines(&forest, None, &mut lines).unwrap();
    let r = report(&forest, false).unwrap();
    let calls: u64 = r.functions.iter().map(|f| f.calls).sum();
    assert!(calls > 16 * 16, "{calls}");
    assert_eq!(lines.split(|&b| b == b'\n').count() as u64, 2 * calls + 1);
}

/// Entry order follows from depths alone: every call comes right before its callees, and
/// a call's callees are entered after it and have exited before it.
#[test]
fn forest_tree_is_nested() {
    let dir = tmpdir("nested");
    write_forest(&dir);
    let mut out = Vec::new();
    replay_lines(&dir, Some(11), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let mut open = Vec::new();
    let mut last = 0u64;
    for l in text.lines() {
        let ns: u64 = l.split(',').nth(1).unwrap().split(']').next().unwrap().parse().unwrap();
        assert!(ns >= last, "time goes back at {l}");
        last = ns;
        let name = l.split(':').nth(1).unwrap();
        if l.contains("]enter:") {
            open.push(name.to_string());
        } else {
            assert_eq!(open.pop().as_deref(), Some(name), "{l}");
        }
    }
    assert!(open.is_empty() && !text.is_empty());
}

/// The conversion rounds exactly as `f64::round` would, edge cases included.
#[test]
fn ticks_to_ns_rounds_like_round() {
    let rates = [2.5962, 1.0, 0.3, 3.0, 1e-9, 0.0, -1.0, f64::MIN_POSITIVE];
    let mut ticks: Vec<u64> = vec![0, 1, 2, 3, 5, 7, 1 << 52, (1 << 53) + 1, u64::MAX, u64::MAX - 1];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ticks.push(x >> (x % 64));
    }
    for &r in &rates {
        for &t in &ticks {
            assert_eq!(crate::ticks_to_ns(t, r), (t as f64 / r).round() as u64, "{t} / {r}");
        }
    }
}

#[test]
fn clock_agrees_with_the_division_it_replaces() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for &r in &[2.5962, 1.0, 0.3, 3.0, 4.1, 1.7] {
        let c = crate::Clock::new(1000, 5_000_000_000, r);
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Up to 2^52 ticks (weeks), where the division in f64 is still exact enough to
            // be the oracle.
            let t = x >> (12 + x % 48);
            let want = (t as f64 / r).round() as u64;
            let got = c.ticks_to_ns(t);
            // The reciprocal of a rate is itself rounded: the two may part on a value that
            // lies within a rounding step of half a nanosecond.
            assert!(got.abs_diff(want) <= 1, "{t} ticks at {r}: {got} against {want}");
            if r == 1.0 {
                assert_eq!(got, t);
            }
            assert_eq!(c.ns_since_start(1000 + t), got);
            assert_eq!(c.wall_ns(1000 + t), 5_000_000_000 + got);
        }
        assert_eq!(c.ns_since_start(999), 0);
        assert_eq!(c.wall_ns(0), 5_000_000_000 - c.ticks_to_ns(1000));
    }
    // Absurd calibrations give finite answers.
    assert_eq!(crate::Clock::new(0, 0, 1e-30).ticks_to_ns(u64::MAX), u64::MAX);
    assert_eq!(crate::Clock::new(0, 0, 1e30).ticks_to_ns(u64::MAX), 0);
}

/// Durations put together in integers read exactly as `format_duration` writes them.
#[test]
fn short_durations_are_format_duration() {
    let mut values: Vec<u64> = vec![0, 999, 1_000, 999_999, 1_000_000, 999_999_499, 999_999_500, 999_999_501];
    for scale in [1_000u64, 1_000_000, 1_000_000_000] {
        for k in [1u64, 2, 3, 7, 999, 1_000, 1_234, 999_999, 1_000_000] {
            for off in [0u64, 1, 499, 500, 501, 999] {
                values.push(k * scale + off * (scale / 1_000));
                values.push(k * scale + off * (scale / 1_000) + scale / 2_000);
                values.push((k * scale + off * (scale / 1_000)).saturating_sub(1));
            }
        }
    }
    values.extend([999_999_999_999_999, 1_000_000_000_000_000, u64::MAX / 3, u64::MAX]);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        values.push(x >> (x % 64));
    }
    let mut integers = 0;
    for &ns in &values {
        if let Some(t) = crate::ShortText::duration(ns) {
            assert_eq!(std::str::from_utf8(t.text()).unwrap(), format_duration(ns), "{ns}");
            integers += 1;
            for width in [0, 10, 16, 20] {
                let mut out = b"x".to_vec();
                t.push_padded(&mut out, width);
                assert_eq!(String::from_utf8(out).unwrap(), format!("x{:>width$}", format_duration(ns)), "{ns}, {width}");
            }
        }
    }
    // Only halfway values and those beyond 1e15 ns (a fifth of these random ones) take the
    // floats' way.
    assert!(integers * 10 > values.len() * 7, "{integers} of {}", values.len());
    assert!((0..1_000).all(|ns| crate::ShortText::duration(ns).is_some()));
    let mut out = Vec::new();
    crate::ShortText::new().push_padded(&mut out, 10);
    crate::ShortText::decimal(1234567).push_padded(&mut out, 6);
    assert_eq!(out, b"          1234567");
}
