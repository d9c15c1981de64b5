//! The stack-shaped exports end to end: folded stacks, flame graphs, call graphs and
//! speedscope files of a recorded program (tests/programs/stacks.c: nesting, recursion,
//! threads), checked against what the program is known to call, against `fnscope report`
//! and `fnscope replay`, and by the tools that read them (an XML parser, graphviz's `dot`,
//! speedscope itself in headless Chromium).
//!
//! Times are compared exactly on a copy of the trace whose clock calibration is set to one
//! tick per nanosecond: report and exports then add the same integers, so any difference is
//! an accounting error, not rounding.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root folder (tests/programs, demo).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// tests/programs/stacks.c recorded (time mode, or `--mode count`) into DIR/trace.
fn record_stacks(dir: &TempDir, extra: &[&str]) -> PathBuf {
    let src = workspace().join("tests/programs/stacks.c");
    build_and_record(dir, "gcc", &["-O0", "-g", "-pthread"], &src, extra)
}

/// Builds `src` with `compiler flags` into DIR (named after the source file: the exports
/// name profiles and titles after the program) and records it into DIR/trace with
/// `record_args`.
fn build_and_record(
    dir: &TempDir,
    compiler: &str,
    flags: &[&str],
    src: &Path,
    record_args: &[&str],
) -> PathBuf {
    let exe = dir.join(src.file_stem().expect("a source file name"));
    let r = run(
        Command::new(compiler)
            .args(flags)
            .arg("-o")
            .arg(&exe)
            .arg(src),
        b"",
        TIMEOUT,
    );
    assert_eq!(
        r.code,
        0,
        "{compiler} {} failed: {}",
        src.display(),
        r.describe()
    );
    let trace = dir.join("trace");
    let r = Invocation::new(&exe, dir.path())
        .record_args(record_args)
        .run_recorded(&trace);
    assert_eq!(
        r.code,
        0,
        "recording {} failed: {}",
        src.display(),
        r.describe()
    );
    trace
}

/// A copy of the trace at `trace` with one TSC tick per nanosecond.
fn unit_clock(trace: &Path, to: &Path) -> PathBuf {
    use fnscope_format::{Chunk, TraceReader, TraceWriter};
    std::fs::create_dir_all(to).unwrap();
    let out = to.join(fnscope_format::TRACE_FILE);
    let mut r = TraceReader::open(trace).unwrap();
    let mut w = TraceWriter::create(&out).unwrap();
    let mut saw_end = false;
    while let Some(chunk) = r.next_chunk().unwrap() {
        match chunk {
            Chunk::Meta(m) => w.write_meta(&m),
            Chunk::Image { sid, table } => w.write_image(sid, &table.to_text()),
            Chunk::Events(s) => w.write_segment(
                s.image_sid,
                s.pid,
                s.tid,
                s.seq,
                s.lost,
                s.flags,
                &s.records, &Default::default()),
            Chunk::Counts(c) => w.write_counts(&c),
            Chunk::Summary(s) => w.write_summary(&s),
            Chunk::End(mut e) => {
                saw_end = true;
                e.ticks_per_ns = 1.0;
                w.write_end(&e)
            }
        }
        .unwrap();
    }
    assert!(saw_end, "the recorded trace has no END chunk");
    w.flush().unwrap();
    to.to_path_buf()
}

/// Runs fnscope and returns its stdout, failing the test with its output if it failed.
fn ok(args: &[&str]) -> String {
    let r = fnscope_cmd(args);
    assert_eq!(r.code, 0, "fnscope {args:?} failed: {}", r.describe());
    r.stdout
}

/// Parses folded stacks: `a;b;c N` per line.
fn parse_folded(text: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let (stack, n) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("folded line without a weight: {line:?}"));
        let n: u64 = n
            .parse()
            .unwrap_or_else(|_| panic!("folded weight is not a number: {line:?}"));
        assert!(
            m.insert(stack.to_string(), n).is_none(),
            "stack {stack:?} is on two lines"
        );
    }
    m
}

/// `export --format folded` of `trace` with `extra` options, parsed.
fn folded(trace: &Path, extra: &[&str]) -> BTreeMap<String, u64> {
    let mut args = vec!["export", "-i", path_str(trace), "--format", "folded"];
    args.extend(extra);
    parse_folded(&ok(&args))
}

/// What tests/programs/stacks.c calls, from its source: calls per stack.
fn expected_stacks() -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    // rec(n) under `prefix`, made `times` times.
    fn rec(m: &mut BTreeMap<String, u64>, prefix: &str, n: u32, times: u64) {
        let mut stack = prefix.to_string();
        for _ in 0..=n {
            stack.push_str(";rec");
            *m.entry(stack.clone()).or_default() += times;
            *m.entry(format!("{stack};leaf")).or_default() += times;
        }
    }
    fn middle(m: &mut BTreeMap<String, u64>, prefix: &str, ks: &[u64]) {
        let mid = format!("{prefix};middle");
        *m.entry(mid.clone()).or_default() += ks.len() as u64;
        *m.entry(format!("{mid};inner")).or_default() += ks.len() as u64;
        *m.entry(format!("{mid};inner;leaf")).or_default() += ks.iter().sum::<u64>();
        rec(m, &mid, 3, ks.len() as u64);
    }
    m.insert("main".to_string(), 1);
    middle(&mut m, "main", &[1]);
    rec(&mut m, "main", 4, 1);
    m.insert("worker".to_string(), 3);
    let ks: Vec<u64> = (0..3)
        .flat_map(|id| std::iter::repeat_n(id + 2, 50))
        .collect();
    middle(&mut m, "worker", &ks);
    rec(&mut m, "worker", 5, 3);
    m
}

/// Calls per stack as `fnscope replay` prints them (its indented call trees).
fn replay_stacks(trace: &Path) -> BTreeMap<String, u64> {
    let text = ok(&["replay", "-i", path_str(trace)]);
    let mut open: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut m = BTreeMap::new();
    for line in text.lines().skip(1) {
        let (tid, rest) = line.split_once(']').expect("a [tid] column");
        let (_, call) = rest.split_once("| ").expect("a | column");
        let stack = open.entry(tid.to_string()).or_default();
        let call = call.trim_start();
        if call.starts_with('}') {
            stack.pop().expect("a } closes an open call");
            continue;
        }
        let name = call.split("()").next().unwrap().to_string();
        let path = stack
            .iter()
            .chain([&name])
            .cloned()
            .collect::<Vec<_>>()
            .join(";");
        *m.entry(path).or_default() += 1;
        if call.ends_with('{') {
            stack.push(name);
        }
    }
    m
}

/// Report entries summed by function name: (calls, total ns, self ns).
fn report_by_name(trace: &Path) -> BTreeMap<String, (u64, u64, u64)> {
    let mut m: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for f in report(trace).unwrap() {
        let e = m.entry(f.name).or_default();
        e.0 += f.calls;
        e.1 += f.total_ns;
        e.2 += f.self_ns;
    }
    m
}

/// Per function, from folded stacks: the weights of the stacks that end in it, and the
/// weights of all stacks it is in, once per time it is in them (each prefix ending in the
/// function is one of its calls, whose total is the weight of every stack under it).
fn sums_by_function(folded: &BTreeMap<String, u64>) -> BTreeMap<String, (u64, u64)> {
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (stack, &w) in folded {
        let frames: Vec<&str> = stack.split(';').collect();
        m.entry(frames[frames.len() - 1].to_string()).or_default().0 += w;
        for f in frames {
            m.entry(f.to_string()).or_default().1 += w;
        }
    }
    m
}

#[test]
fn folded_stacks_match_program_replay_and_report() {
    let dir = TempDir::new("folded");
    let recorded = record_stacks(&dir, &[]);
    let trace = unit_clock(&recorded, &dir.join("unit"));

    let counts = folded(&trace, &["--counts"]);
    assert_eq!(
        counts,
        expected_stacks(),
        "calls per stack differ from what stacks.c calls"
    );
    assert_eq!(
        counts,
        replay_stacks(&trace),
        "calls per stack differ from replay's call trees"
    );
    assert_eq!(
        folded(&recorded, &["--counts"]),
        counts,
        "the calibration changed the calls"
    );

    let report = report_by_name(&trace);
    let by_calls = sums_by_function(&counts);
    for (name, &(calls, _, _)) in &report {
        assert_eq!(
            by_calls.get(name).map(|s| s.0),
            Some(calls),
            "calls of {name}: folded vs report"
        );
    }
    assert_eq!(
        by_calls.len(),
        report.len(),
        "functions: folded {by_calls:?} vs report {report:?}"
    );

    let time = folded(&trace, &[]);
    assert_eq!(
        time,
        folded(&trace, &["--self"]),
        "--self is the default weight"
    );
    assert_eq!(
        time.keys().collect::<Vec<_>>(),
        counts.keys().collect::<Vec<_>>(),
        "time and calls list the same stacks"
    );
    let by_time = sums_by_function(&time);
    for (name, &(_, total, self_ns)) in &report {
        let (s, t) = by_time[name];
        assert_eq!(
            (t, s),
            (total, self_ns),
            "{name}: (total, self) ns from folded stacks vs report"
        );
    }

    // --exclude drops rec's calls: the calls they made stay, under the nearest caller kept,
    // and their time goes to that caller's self time.
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, n) in expected_stacks() {
        if stack.rsplit(';').next() != Some("rec") {
            *want
                .entry(
                    stack
                        .split(';')
                        .filter(|f| *f != "rec")
                        .collect::<Vec<_>>()
                        .join(";"),
                )
                .or_default() += n;
        }
    }
    assert_eq!(
        folded(&trace, &["--counts", "--exclude", "rec"]),
        want,
        "calls per stack without rec"
    );
    let all_time: u64 = time.values().sum();
    assert_eq!(
        folded(&trace, &["--exclude", "rec"]).values().sum::<u64>(),
        all_time,
        "time without rec's calls"
    );
    let mut inner: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, n) in expected_stacks() {
        if let Some((_, under)) = stack.split_once(";inner") {
            *inner.entry(format!("inner{under}")).or_default() += n;
        }
    }
    assert_eq!(
        folded(&trace, &["--counts", "--filter", "inner"]),
        inner,
        "calls per stack of inner and what it calls"
    );

    // With the real calibration each stack's time is rounded to ns on its own: the sums may
    // then differ from the report's by half a ns per stack summed.
    let real = folded(&recorded, &[]);
    let real_report = report_by_name(&recorded);
    let real_sums = sums_by_function(&real);
    for (name, &(_, total, self_ns)) in &real_report {
        let stacks = counts
            .keys()
            .filter(|s| s.split(';').any(|f| f == name))
            .count() as u64;
        let (s, t) = real_sums[name];
        assert!(
            t.abs_diff(total) <= stacks.div_ceil(2) + 1,
            "{name}: total {t} ns from folded vs {total} in the report"
        );
        assert!(
            s.abs_diff(self_ns) <= stacks.div_ceil(2) + 1,
            "{name}: self {s} ns from folded vs {self_ns} in the report"
        );
    }
}

#[test]
fn count_mode_traces_fold_to_one_frame_per_function() {
    let dir = TempDir::new("folded-count");
    let trace = record_stacks(&dir, &["--mode", "count"]);
    let r = fnscope_cmd(&[
        "export",
        "-i",
        path_str(&trace),
        "--format",
        "folded",
        "--counts",
    ]);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(
        r.stderr.contains("warning") && r.stderr.contains("no stacks"),
        "no warning that a count trace has no stacks: {}",
        r.describe()
    );
    let folded = parse_folded(&r.stdout);
    // A count trace's report has calls only.
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["report", "-i", path_str(&trace), "--json"])).unwrap();
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for f in json.as_array().expect("report --json is an array") {
        *want
            .entry(f["name"].as_str().unwrap().to_string())
            .or_default() += f["calls"].as_u64().unwrap();
    }
    assert_eq!(folded, want, "count-mode folded stacks vs report's calls");
    let mut by_program: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, n) in expected_stacks() {
        *by_program
            .entry(stack.rsplit(';').next().unwrap().to_string())
            .or_default() += n;
    }
    assert_eq!(
        folded, by_program,
        "count-mode calls vs what stacks.c calls"
    );

    let svg = dir.join("flat.svg");
    ok(&[
        "flamegraph",
        "--counts",
        "-i",
        path_str(&trace),
        "-o",
        path_str(&svg),
    ]);
    let mut frames: Vec<(String, u64)> = svg_frames(&std::fs::read_to_string(&svg).unwrap())
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    frames.sort();
    assert_eq!(
        frames,
        expected_frames(&folded),
        "flame graph of a count trace: one frame per function"
    );

    for (args, what) in [
        (
            &["export", "--format", "folded"][..],
            "folded stacks by time of a count trace",
        ),
        (
            &["flamegraph"][..],
            "a flame graph by time of a count trace",
        ),
        (&["callgraph"][..], "a call graph of a count trace"),
        (
            &["export", "--format", "speedscope"][..],
            "a speedscope file of a count trace",
        ),
    ] {
        let mut a = args.to_vec();
        a.extend(["-i", path_str(&trace)]);
        let line = assert_one_line_error(&fnscope_cmd(&a), what);
        assert!(
            line.contains("count trace"),
            "{what}: the refusal does not say why: {line}"
        );
    }
}

/// Parses XML with its DTD (inferno and dot both declare SVG's).
fn parse_xml(text: &str) -> Result<roxmltree::Document<'_>, roxmltree::Error> {
    roxmltree::Document::parse_with_options(
        text,
        roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        },
    )
}

/// The frames of an inferno SVG: each frame's `<g>` title, `NAME (N UNIT, P%)`, as (NAME,
/// N), and the height of its box (its rectangle's `y`).
fn svg_frames(svg: &str) -> Vec<((String, u64), f64)> {
    let doc = parse_xml(svg).unwrap_or_else(|e| panic!("the SVG is not XML: {e}"));
    let mut frames = Vec::new();
    for g in doc.descendants().filter(|n| n.has_tag_name("g")) {
        let Some(title) = g
            .children()
            .find(|c| c.has_tag_name("title"))
            .and_then(|t| t.text())
        else {
            continue;
        };
        let (name, rest) = title
            .rsplit_once(" (")
            .unwrap_or_else(|| panic!("frame title {title:?}"));
        let n = rest.split(' ').next().unwrap().replace(',', "");
        let n = n
            .parse()
            .unwrap_or_else(|_| panic!("frame title {title:?}"));
        let y = g
            .children()
            .find(|c| c.has_tag_name("rect"))
            .and_then(|r| r.attribute("y"))
            .and_then(|y| y.parse().ok())
            .unwrap_or_else(|| panic!("frame {title:?} has no rectangle with a y"));
        frames.push(((name.to_string(), n), y));
    }
    frames
}

/// What a flame graph of `folded` shows: one frame per distinct stack prefix, as wide as
/// the stacks under it, without those narrower than inferno's 0.01% (as fnscope sets it),
/// plus the `all` frame.
fn expected_frames(folded: &BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let mut prefixes: BTreeMap<Vec<&str>, u64> = BTreeMap::new();
    for (stack, &w) in folded {
        let frames: Vec<&str> = stack.split(';').collect();
        for i in 1..=frames.len() {
            *prefixes.entry(frames[..i].to_vec()).or_default() += w;
        }
    }
    let all: u64 = folded.values().sum();
    let min = 0.01 / (100.0 / all as f64);
    let mut out: Vec<(String, u64)> = prefixes
        .into_iter()
        .filter(|(_, w)| *w as f64 >= min)
        .map(|(p, w)| (p[p.len() - 1].to_string(), w))
        .collect();
    out.push(("all".to_string(), all));
    out.sort();
    out
}

#[test]
fn flame_graphs_show_every_stack_prefix() {
    let dir = TempDir::new("flame");
    let trace = record_stacks(&dir, &[]);
    for (flags, unit, title) in [
        (
            &[][..],
            "ns",
            "Flame graph of stacks: widths are the total time",
        ),
        (
            &["--counts"][..],
            "calls",
            "Flame graph of stacks: widths are the calls",
        ),
        (
            &["--reverse"][..],
            "ns",
            "Icicle graph of stacks: widths are the total time",
        ),
    ] {
        let svg_path = dir.join("graph.svg");
        let mut args = vec![
            "flamegraph",
            "-i",
            path_str(&trace),
            "-o",
            path_str(&svg_path),
        ];
        args.extend(flags);
        ok(&args);
        let svg = std::fs::read_to_string(&svg_path).unwrap();
        let counts: Vec<&str> = flags.iter().copied().filter(|f| *f == "--counts").collect();
        let stacks = folded(&trace, &counts);
        let frames = svg_frames(&svg);
        let mut titles: Vec<(String, u64)> = frames.iter().map(|(t, _)| t.clone()).collect();
        titles.sort();
        assert_eq!(
            titles,
            expected_frames(&stacks),
            "flame graph {flags:?}: frames vs folded stacks"
        );
        // Roots at the bottom of a flame graph, at the top of an icicle graph.
        let all_y = frames.iter().find(|((n, _), _)| n == "all").unwrap().1;
        let (lowest, highest) = frames
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), (_, y)| {
                (lo.min(*y), hi.max(*y))
            });
        let want = if flags.contains(&"--reverse") {
            lowest
        } else {
            highest
        };
        assert_eq!(
            all_y, want,
            "flame graph {flags:?}: the all frame is not where the roots go"
        );
        assert!(
            svg.contains(title),
            "flame graph {flags:?}: no title {title:?}"
        );
        assert!(
            svg.contains(&format!("{unit}, 100%")),
            "flame graph {flags:?}: the all frame is not in {unit}"
        );
    }
}

/// Writes the call graph of `trace` to DIR/calls.dot and has graphviz's `dot` lay it out as
/// `format` into DIR/calls.FORMAT; fails the test if `dot` is missing or refuses the file.
fn call_graph_through_dot(dir: &TempDir, trace: &Path, format: &str) -> (PathBuf, PathBuf) {
    let dot = find_in_path("dot").unwrap_or_else(|| {
        panic!("graphviz's `dot` is not installed: it checks the call graph (apt-get install graphviz; .ci/run installs it)")
    });
    let dot_file = dir.join("calls.dot");
    ok(&[
        "callgraph",
        "-i",
        path_str(trace),
        "-o",
        path_str(&dot_file),
    ]);
    let out = dir.join(format!("calls.{format}"));
    let r = run(
        Command::new(&dot)
            .arg(format!("-T{format}"))
            .arg(&dot_file)
            .arg("-o")
            .arg(&out),
        b"",
        TIMEOUT,
    );
    assert_eq!(r.code, 0, "dot rejected the call graph: {}", r.describe());
    (dot_file, out)
}

#[test]
fn call_graph_is_valid_dot_with_report_calls() {
    let dir = TempDir::new("callgraph");
    let trace = unit_clock(&record_stacks(&dir, &[]), &dir.join("unit"));
    let (dot_file, svg) = call_graph_through_dot(&dir, &trace, "svg");
    parse_xml(&std::fs::read_to_string(&svg).unwrap()).expect("dot's SVG parses");

    let text = std::fs::read_to_string(&dot_file).unwrap();
    let mut names = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    let mut edges = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        let label = |l: &str| {
            l.split("label=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .to_string()
        };
        let number = |s: &str| s.split(' ').next().unwrap().parse::<u64>().unwrap();
        if let Some((id, rest)) = line.split_once(" [label=") {
            if let Some((a, b)) = id.split_once(" -> ") {
                let l = label(line);
                edges.insert(
                    (a.to_string(), b.to_string()),
                    number(l.split("\\n").next().unwrap()),
                );
            } else if id.starts_with('f') {
                let l = label(&format!("label={rest}"));
                let parts: Vec<&str> = l.split("\\n").collect();
                assert_eq!(parts[1], "stacks", "module of {}", parts[0]);
                assert!(
                    parts[3].starts_with("total ") && parts[3].contains(", self "),
                    "times in {l:?}"
                );
                names.insert(id.to_string(), parts[0].to_string());
                nodes.insert(parts[0].to_string(), number(parts[2]));
            }
        }
    }
    let report: BTreeMap<String, u64> = report_by_name(&trace)
        .into_iter()
        .map(|(n, (c, _, _))| (n, c))
        .collect();
    assert_eq!(nodes, report, "calls per function: call graph vs report");
    let mut want = BTreeMap::new();
    for (stack, n) in expected_stacks() {
        let f: Vec<&str> = stack.split(';').collect();
        if f.len() > 1 {
            *want
                .entry((f[f.len() - 2].to_string(), f[f.len() - 1].to_string()))
                .or_default() += n;
        }
    }
    let got: BTreeMap<(String, String), u64> = edges
        .into_iter()
        .map(|((a, b), n)| ((names[&a].clone(), names[&b].clone()), n))
        .collect();
    assert_eq!(got, want, "calls per caller -> callee pair");
}

/// Checks a speedscope file: the schema, evented profiles whose events open and close
/// properly in time order within their bounds. Returns per function name (calls, total ns)
/// and the profile names.
fn check_speedscope(json: &str) -> (BTreeMap<String, (u64, u64)>, Vec<String>) {
    let v: serde_json::Value = serde_json::from_str(json).expect("the speedscope file is JSON");
    assert_eq!(
        v["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let frames: Vec<String> = v["shared"]["frames"]
        .as_array()
        .expect("shared.frames")
        .iter()
        .map(|f| f["name"].as_str().expect("a frame name").to_string())
        .collect();
    let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut names = Vec::new();
    for p in v["profiles"].as_array().expect("profiles") {
        assert_eq!(p["type"], "evented");
        assert_eq!(p["unit"], "nanoseconds");
        names.push(p["name"].as_str().expect("a profile name").to_string());
        let (start, end) = (
            p["startValue"].as_u64().unwrap(),
            p["endValue"].as_u64().unwrap(),
        );
        let mut open: Vec<(u64, u64)> = Vec::new();
        let mut last = start;
        for e in p["events"].as_array().expect("events") {
            let (frame, at) = (e["frame"].as_u64().unwrap(), e["at"].as_u64().unwrap());
            assert!(
                at >= last && at <= end,
                "event {e} out of order or bounds [{start}, {end}]"
            );
            last = at;
            match e["type"].as_str().unwrap() {
                "O" => open.push((frame, at)),
                "C" => {
                    let (f, since) = open.pop().unwrap_or_else(|| panic!("{e} closes nothing"));
                    assert_eq!(f, frame, "{e} closes another frame than the last opened");
                    let t = totals.entry(frames[frame as usize].clone()).or_default();
                    t.0 += 1;
                    t.1 += at - since;
                }
                other => panic!("event type {other}"),
            }
        }
        assert!(open.is_empty(), "profile {} leaves frames open", p["name"]);
    }
    (totals, names)
}

#[test]
fn speedscope_profiles_match_report() {
    let dir = TempDir::new("speedscope");
    let trace = unit_clock(&record_stacks(&dir, &[]), &dir.join("unit"));
    let json = ok(&["export", "-i", path_str(&trace), "--format", "speedscope"]);
    let (totals, names) = check_speedscope(&json);
    let report: BTreeMap<String, (u64, u64)> = report_by_name(&trace)
        .into_iter()
        .map(|(n, (c, t, _))| (n, (c, t)))
        .collect();
    assert_eq!(
        totals, report,
        "(calls, total ns) per function: speedscope vs report"
    );
    assert_eq!(
        names.len(),
        4,
        "one profile per thread (main and 3 workers): {names:?}"
    );
    let tids: BTreeSet<&str> = names
        .iter()
        .map(|n| n.split(" tid ").nth(1).expect("a tid in the name"))
        .collect();
    assert_eq!(tids.len(), 4, "profile names {names:?}");
    assert!(
        names.iter().all(|n| n.starts_with("stacks tid ")),
        "profile names {names:?}"
    );
}

/// speedscope's offline app (npm package 1.25), unpacked under target/tmp once.
fn speedscope_app() -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("speedscope");
    let index = root.join("package/dist/release/index.html");
    if !index.exists() {
        std::fs::create_dir_all(&root).unwrap();
        let npm = find_in_path("npm")
            .expect("npm is not installed: it fetches speedscope (apt-get install npm)");
        let r = run(
            Command::new(npm)
                .args(["pack", "--silent", "speedscope@1.25"])
                .current_dir(&root),
            b"",
            TIMEOUT,
        );
        assert_eq!(
            r.code,
            0,
            "npm pack speedscope@1.25 failed: {}",
            r.describe()
        );
        let tgz = r
            .stdout
            .trim()
            .lines()
            .last()
            .expect("npm pack names its file")
            .to_string();
        let r = run(
            Command::new("tar").arg("xzf").arg(&tgz).current_dir(&root),
            b"",
            TIMEOUT,
        );
        assert_eq!(r.code, 0, "cannot unpack {tgz}: {}", r.describe());
    }
    index
}

/// The demo's trace exported to speedscope and opened by speedscope in headless Chromium: the
/// page shows the profile of every thread and the functions of the first one.
#[test]
fn speedscope_opens_the_demo_in_a_browser() {
    let chromium = find_in_path("chromium")
        .unwrap_or_else(|| panic!("chromium is not installed: it runs speedscope (apt-get install chromium; .ci/run installs it)"));
    let index = speedscope_app();
    let dir = TempDir::new("speedscope-browser");
    let demo = workspace().join("demo/demo.c");
    let trace = build_and_record(&dir, "gcc", &["-O2", "-g", "-pthread"], &demo, &[]);
    let json_path = dir.join("demo.speedscope.json");
    ok(&[
        "export",
        "-i",
        path_str(&trace),
        "--format",
        "speedscope",
        "-o",
        path_str(&json_path),
    ]);
    let json = std::fs::read_to_string(&json_path).unwrap();
    let (_, profiles) = check_speedscope(&json);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let frames = v["shared"]["frames"].as_array().unwrap();
    let first: BTreeSet<&str> = v["profiles"][0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            frames[e["frame"].as_u64().unwrap() as usize]["name"]
                .as_str()
                .unwrap()
        })
        .collect();
    let loader = dir.join("profile.js");
    std::fs::write(
        &loader,
        format!(
            "speedscope.loadFileFromBase64(\"demo.speedscope.json\", \"{}\");\n",
            base64_encode(json.as_bytes())
        ),
    )
    .unwrap();
    // The sandwich view lists the functions of the profile shown as text (the flame charts
    // are drawn on canvases, which --dump-dom cannot read).
    let url = format!(
        "file://{}#localProfilePath={}&view=sandwich",
        index.display(),
        loader.display()
    );
    let r = run(
        Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=20000",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.join("chromium").display()
            ))
            .arg("--dump-dom")
            .arg(&url),
        b"",
        TIMEOUT,
    );
    assert_eq!(r.code, 0, "chromium failed: {}", r.describe());
    let page = &r.stdout;
    assert!(
        page.contains("<title>demo - speedscope</title>"),
        "speedscope did not load the file: {}",
        clip(page)
    );
    for p in &profiles {
        assert!(
            page.contains(p.as_str()),
            "the page does not list profile {p:?}: {}",
            clip(page)
        );
    }
    for f in &first {
        assert!(
            page.contains(&format!(">{f}<")),
            "the page does not show function {f:?} of the first profile: {}",
            clip(page)
        );
    }
    assert!(!first.is_empty(), "the first profile has no calls");
}

/// Standard base64 of `data` (the loader script speedscope reads).
fn base64_encode(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// C++ names hold quotes, angle brackets, ampersands and spaces: every format carries them
/// through its own escaping, and the readers get the report's names back.
#[test]
fn cpp_names_survive_every_format() {
    let dir = TempDir::new("cpp-names");
    let src = dir.join("names.cpp");
    std::fs::write(
        &src,
        r#"#include <cstdio>
struct Weight { unsigned long long v; };
__attribute__((noinline)) Weight operator""_w(unsigned long long v) { return Weight{v}; }
template <typename T> __attribute__((noinline)) T twice(const T &x) { return x + x; }
int main() { Weight w = 21_w; std::printf("%llu %d\n", twice(w.v), twice<int>(2)); }
"#,
    )
    .unwrap();
    let trace = build_and_record(&dir, "g++", &["-O0", "-g"], &src, &[]);
    let names: BTreeSet<String> = report_by_name(&trace).into_keys().collect();
    assert!(
        names.iter().any(|n| n.contains('"'))
            && names.iter().any(|n| n.contains("<int>") && n.contains('&')),
        "the test needs names with quotes, angle brackets and ampersands: {names:?}"
    );

    let stacks = folded(&trace, &[]);
    let ends: BTreeSet<String> = stacks
        .keys()
        .map(|s| s.rsplit(';').next().unwrap().to_string())
        .collect();
    assert_eq!(ends, names, "folded frames vs report names");

    let svg_path = dir.join("flame.svg");
    ok(&[
        "flamegraph",
        "-i",
        path_str(&trace),
        "-o",
        path_str(&svg_path),
    ]);
    let titles: BTreeSet<String> = svg_frames(&std::fs::read_to_string(&svg_path).unwrap())
        .into_iter()
        .map(|((n, _), _)| n)
        .filter(|n| n != "all")
        .collect();
    assert!(
        titles.is_subset(&names) && titles.contains("main"),
        "flame graph frames {titles:?} vs report names {names:?}"
    );

    let (_, json) = call_graph_through_dot(&dir, &trace, "json");
    // dot's JSON gives each node's label as dot read it: quotes unescaped, line breaks
    // still `\n`.
    let laid_out: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let labels: BTreeSet<String> = laid_out["objects"]
        .as_array()
        .expect("dot's nodes")
        .iter()
        .map(|o| {
            o["label"]
                .as_str()
                .unwrap()
                .split("\\n")
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        labels, names,
        "call graph node names as dot read them vs report names"
    );

    let (totals, _) = check_speedscope(&ok(&[
        "export",
        "-i",
        path_str(&trace),
        "--format",
        "speedscope",
    ]));
    assert_eq!(
        totals.into_keys().collect::<BTreeSet<_>>(),
        names,
        "speedscope frames vs report names"
    );
}
