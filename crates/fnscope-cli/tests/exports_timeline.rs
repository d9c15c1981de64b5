//! The timeline exports (`export --format perfetto|chrome`) against oracles that do not come
//! from the exporters: the program's own call counts, `replay`'s tree (names, nesting, how
//! each call ended) and `replay --format lines` (the wall-clock ns of every entry and exit),
//! thread by thread. Perfetto files are decoded by Perfetto's own compiled schema (PyPI
//! `perfetto`, run by tests/scripts/decode_perfetto.py), Chrome JSON by serde_json.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One call as a viewer shows it: on its thread's track, at a depth, from begin to end (wall
/// ns since the Unix epoch), with how it ended when it did not return.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Slice {
    name: String,
    depth: usize,
    begin: u64,
    end: u64,
    ending: Option<String>,
}

/// Each thread's calls in the order they started.
type Threads = BTreeMap<u32, Vec<Slice>>;

fn programs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs")
}

/// Builds tests/programs/timeline.c and records it; returns the trace and the program's
/// stderr (its call counts).
fn record_timeline(dir: &TempDir, record_args: &[&str]) -> (PathBuf, String) {
    let exe = dir.join("timeline");
    let built = Command::new("gcc")
        .args(["-O0", "-g", "-pthread", "-I"])
        .arg(programs_dir())
        .arg("-o")
        .arg(&exe)
        .arg(programs_dir().join("timeline.c"))
        .output()
        .expect("cannot run gcc");
    assert!(built.status.success(), "gcc timeline.c failed:\n{}", String::from_utf8_lossy(&built.stderr));
    let trace = dir.join("trace");
    let r = Invocation::new(&exe, dir.path()).record_args(record_args).run_recorded(&trace);
    assert_eq!(r.code, 0, "recording timeline failed: {}", r.describe());
    (trace, r.stderr)
}

fn ok(args: &[&str]) -> Run {
    let r = fnscope_cmd(args);
    assert_eq!(r.code, 0, "fnscope {args:?} failed: {}", r.describe());
    r
}

/// Parses `replay`'s tree: per thread, each call's name, depth and ending in start order.
fn replay_tree(trace: &Path) -> BTreeMap<u32, Vec<(String, usize, Option<String>)>> {
    let r = ok(&["replay", "-i", path_str(trace)]);
    let mut calls: BTreeMap<u32, Vec<(String, usize, Option<String>)>> = BTreeMap::new();
    let mut open: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for line in r.stdout.lines().skip(1) {
        let (head, body) = line.split_once(" | ").unwrap_or_else(|| panic!("replay line {line:?}"));
        let tid: u32 = head.trim_start_matches('[').split(']').next().unwrap().trim().parse().unwrap();
        let text = body.trim_start();
        let depth = (body.len() - text.len()) / 2;
        let list = calls.entry(tid).or_default();
        if let Some(rest) = text.strip_prefix("} /* ") {
            let inner = rest.strip_suffix(" */").unwrap();
            let i = open.entry(tid).or_default().pop().unwrap_or_else(|| panic!("unmatched {line:?}"));
            if let Some((name, ending)) = inner.split_once(", ") {
                assert_eq!(list[i].0, name, "{line:?}");
                list[i].2 = Some(ending.to_string());
            }
        } else if let Some(name) = text.strip_suffix("() {") {
            open.entry(tid).or_default().push(list.len());
            list.push((name.to_string(), depth, None));
        } else {
            let (call, note) = match text.split_once(" /* ") {
                Some((c, n)) => (c, Some(n.strip_suffix(" */").unwrap().to_string())),
                None => (text, None),
            };
            let name = call.strip_suffix("();").unwrap_or_else(|| panic!("replay line {line:?}"));
            list.push((name.to_string(), depth, note));
        }
    }
    calls
}

/// The oracle: `replay`'s tree with the exact times of `replay --format lines`, per thread.
fn oracle(trace: &Path) -> Threads {
    let mut out = Threads::new();
    for (tid, list) in replay_tree(trace) {
        let lines = ok(&["replay", "-i", path_str(trace), "--format", "lines", "--tid", &tid.to_string()]);
        let mut slices: Vec<Slice> = Vec::new();
        let mut stack = Vec::new();
        for l in lines.stdout.lines() {
            let (_, rest) = l.split_once('[').unwrap();
            let (time, what) = rest.split_once(']').unwrap();
            let (sec, nsec) = time.split_once(',').unwrap();
            let ns = sec.parse::<u64>().unwrap() * 1_000_000_000 + nsec.parse::<u64>().unwrap();
            let (kind, name) = what.split_once(':').unwrap();
            if kind == "enter" {
                let (n, depth, ending) = &list[slices.len()];
                assert_eq!((n.as_str(), *depth), (name, stack.len()), "tree and lines of thread {tid} disagree at {l:?}");
                stack.push(slices.len());
                slices.push(Slice { name: name.to_string(), depth: *depth, begin: ns, end: 0, ending: ending.clone() });
            } else {
                let i = stack.pop().unwrap_or_else(|| panic!("leave without enter: {l:?}"));
                assert_eq!(slices[i].name, name, "{l:?}");
                slices[i].end = ns;
            }
        }
        assert!(stack.is_empty() && slices.len() == list.len(), "thread {tid}: lines and tree differ in calls");
        out.insert(tid, slices);
    }
    out
}

/// Calls per function name in the program's own `count NAME N` lines.
fn program_counts(stderr: &str) -> BTreeMap<String, u64> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("count "))
        .map(|l| {
            let (name, n) = l.rsplit_once(' ').unwrap();
            (name.to_string(), n.parse().unwrap())
        })
        .collect()
}

/// Checks the oracle against the program's counts (so that it is an oracle at all).
fn check_oracle(want: &Threads, program_stderr: &str) {
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for s in want.values().flatten() {
        *got.entry(s.name.clone()).or_default() += 1;
    }
    for (name, n) in program_counts(program_stderr) {
        assert_eq!(got.get(&name).copied(), Some(n), "replay's calls of {name}");
    }
    assert_eq!(want.len(), 3, "main thread and two workers: {:?}", want.keys());
    let unwound: Vec<&Slice> = want.values().flatten().filter(|s| s.ending.is_some()).collect();
    assert_eq!(unwound.len(), 2, "the two jump_deep calls end unwound: {unwound:?}");
}

/// `fnscope info`'s start of the recording, in ns since the Unix epoch.
fn start_unix_ns(trace: &Path) -> u64 {
    let text = info(trace);
    let line = text.lines().find_map(|l| l.strip_prefix("started:")).expect("info prints the start");
    // "2026-11-23 04:10:36.866440064 UTC"
    let mut parts = line.split_whitespace();
    let date: Vec<i64> = parts.next().unwrap().split('-').map(|x| x.parse().unwrap()).collect();
    let (hms, frac) = parts.next().unwrap().split_once('.').unwrap();
    let hms: Vec<i64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
    let (y, m, d) = (date[0] - i64::from(date[1] <= 2), date[1], date[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2];
    secs as u64 * 1_000_000_000 + format!("{frac:0<9}")[..9].parse::<u64>().unwrap()
}

/// Decodes Perfetto files with Perfetto's schema: one JSON object per file.
fn decode_perfetto(files: &[PathBuf]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/decode_perfetto.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).args(files);
    let r = run(&mut cmd, b"", TIMEOUT);
    assert!(
        r.code != 3,
        "python3 cannot import Perfetto's trace schema: install it with `python3 -m pip install perfetto protobuf` \
         (.ci/run does)\n{}",
        r.describe()
    );
    assert_eq!(r.code, 0, "decode_perfetto.py failed: {}", r.describe());
    r.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A decoded Perfetto file's slices per thread (`continued` marks a slice begun again after
/// a cut), times made wall-clock by adding `start_ns`, after checking its tracks are named
/// from the image table and its calls' module.
fn perfetto_threads(file: &Value, pid: u64, start_ns: u64) -> BTreeMap<u32, Vec<(Slice, bool)>> {
    let problems = file["problems"].as_array().unwrap();
    assert!(problems.is_empty(), "{}: {problems:?}", file["file"]);
    let tracks = file["tracks"].as_object().unwrap();
    let mut out: BTreeMap<u32, Vec<(Slice, bool)>> = BTreeMap::new();
    for (_, t) in tracks {
        assert_eq!(t["pid"].as_u64(), Some(pid), "{t}");
        if t["kind"] == "process" {
            assert_eq!(t["name"], "timeline");
        } else {
            assert_eq!(t["name"].as_str().unwrap(), format!("timeline {}", t["tid"]));
            out.insert(t["tid"].as_u64().unwrap() as u32, Vec::new());
        }
    }
    for s in file["slices"].as_array().unwrap() {
        let t = &tracks[&s["track"].to_string()];
        assert_eq!(s["args"]["module"], "timeline", "{s}");
        check_source(s["name"].as_str().unwrap(), &s["args"]["source"]);
        let slice = Slice {
            name: s["name"].as_str().unwrap().to_string(),
            depth: s["depth"].as_u64().unwrap() as usize,
            begin: start_ns + s["begin"].as_u64().unwrap(),
            end: start_ns + s["end"].as_u64().unwrap(),
            ending: s["args"]["ending"].as_str().map(str::to_string),
        };
        let continued = s["args"]["continued"] == true;
        out.get_mut(&(t["tid"].as_u64().unwrap() as u32)).unwrap().push((slice, continued));
    }
    out
}

/// A slice's `source` argument is where the function is defined (`-g` build): in timeline.c
/// or counts.h, the line at the start of a line that names it and does not end in `;`.
fn check_source(name: &str, got: &Value) {
    let defined = ["timeline.c", "counts.h"].into_iter().find_map(|file| {
        let text = fs::read_to_string(programs_dir().join(file)).unwrap();
        let line = text.lines().position(|l| {
            !l.starts_with([' ', '\t', '*', '/', '#'])
                && [' ', '*'].iter().any(|c| l.contains(&format!("{c}{name}(")))
                && !l.trim_end().ends_with(';')
        })?;
        Some(format!("/{file}:{}", line + 1))
    });
    let want = defined.unwrap_or_else(|| panic!("{name} is defined in neither timeline.c nor counts.h"));
    assert!(got.as_str().is_some_and(|g| g.ends_with(&want)), "source of {name}: {got}, want ...{want}");
}

/// Compares exported slices with the oracle, thread by thread, with a readable first
/// difference.
fn assert_same(what: &str, got: &Threads, want: &Threads) {
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what}: threads");
    for (tid, w) in want {
        let g = &got[tid];
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert_eq!(a, b, "{what}: thread {tid}, call {i} (exported, then oracle)");
        }
        assert_eq!(g.len(), w.len(), "{what}: thread {tid}: calls");
    }
}

/// A Chrome trace-event file's complete events per thread, in start order with their depth.
fn chrome_threads(path: &Path, start_ns: u64) -> Threads {
    let mut t = chrome_events(path, start_ns);
    t.values_mut().for_each(nest);
    t
}

/// A Chrome trace-event file's complete events per thread, in file order (depth 0), after
/// checking the metadata names the process and its threads.
fn chrome_events(path: &Path, start_ns: u64) -> Threads {
    let doc: Value = serde_json::from_slice(&fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut named = BTreeMap::new();
    let mut out: BTreeMap<u32, Vec<Slice>> = BTreeMap::new();
    for e in doc["traceEvents"].as_array().unwrap() {
        let tid = e["tid"].as_u64().unwrap() as u32;
        match e["ph"].as_str().unwrap() {
            "M" => {
                named.insert((e["name"].as_str().unwrap().to_string(), tid), e["args"]["name"].as_str().unwrap().to_string());
            }
            "X" => {
                assert_eq!(e["args"]["module"], "timeline", "{e}");
                check_source(e["name"].as_str().unwrap(), &e["args"]["source"]);
                let begin = start_ns + (e["ts"].as_f64().unwrap() * 1000.0).round() as u64;
                out.entry(tid).or_default().push(Slice {
                    name: e["name"].as_str().unwrap().to_string(),
                    depth: 0,
                    begin,
                    end: begin + (e["dur"].as_f64().unwrap() * 1000.0).round() as u64,
                    ending: e["args"]["ending"].as_str().map(str::to_string),
                });
            }
            ph => panic!("unexpected event {ph}: {e}"),
        }
    }
    assert_eq!(named.get(&("process_name".to_string(), 0)).map(String::as_str), Some("timeline"), "{}", path.display());
    for tid in out.keys() {
        assert_eq!(named.get(&("thread_name".to_string(), *tid)), Some(&format!("timeline {tid}")), "{}", path.display());
    }
    out
}

/// Puts one thread's complete events, given in file order, in start order (a caller before
/// its first callee) and gives each its depth: the events still open when it starts. A call
/// is written when it ends, after its callees: between events with the same times (calls cut
/// to the same `--time` window), the later is the caller.
fn nest(slices: &mut Vec<Slice>) {
    let mut keyed: Vec<(usize, Slice)> = std::mem::take(slices).into_iter().enumerate().collect();
    keyed.sort_by_key(|(i, s)| (s.begin, std::cmp::Reverse(s.end), std::cmp::Reverse(*i)));
    *slices = keyed.into_iter().map(|(_, s)| s).collect();
    let mut ends: Vec<u64> = Vec::new();
    for s in slices.iter_mut() {
        while ends.last().is_some_and(|&e| e <= s.begin) {
            ends.pop();
        }
        s.depth = ends.len();
        ends.push(s.end);
    }
}

fn total(t: &Threads) -> usize {
    t.values().map(Vec::len).sum()
}

#[test]
fn perfetto_slices_match_replay() {
    let dir = TempDir::new("pf");
    let (trace, stderr) = record_timeline(&dir, &[]);
    let want = oracle(&trace);
    check_oracle(&want, &stderr);
    let calls: u64 = report(&trace).unwrap().iter().map(|f| f.calls).sum();
    assert_eq!(calls as usize, total(&want), "report and replay count the same calls");

    let out = dir.join("t.pftrace");
    let r = ok(&["export", "--format", "perfetto", "-i", path_str(&trace), "-o", path_str(&out)]);
    assert!(fnscope_lines(&r.stderr).is_empty(), "no warning: {}", r.describe());
    let files = decode_perfetto(std::slice::from_ref(&out));
    let pid = files[0]["tracks"]["1"]["pid"].as_u64().unwrap();
    let got: Threads = perfetto_threads(&files[0], pid, start_unix_ns(&trace))
        .into_iter()
        .map(|(tid, v)| {
            assert!(v.iter().all(|(_, c)| !c), "nothing is continued in a single file");
            (tid, v.into_iter().map(|(s, _)| s).collect())
        })
        .collect();
    assert_same("perfetto", &got, &want);
    // Each function's name, module and `file:line` once (a path of up to ~150 bytes), then a
    // few tens of bytes per call: repeated in every slice, they would be far over.
    let functions = got.values().flatten().map(|s| s.name.as_str()).collect::<std::collections::BTreeSet<_>>().len() as u64;
    let bytes = fs::metadata(&out).unwrap().len();
    assert!(bytes < 50 * calls + 200 * functions, "{bytes} bytes for {calls} calls of {functions} functions: strings are interned");
}

#[test]
fn chrome_events_match_replay() {
    let dir = TempDir::new("chrome");
    let (trace, stderr) = record_timeline(&dir, &[]);
    let want = oracle(&trace);
    check_oracle(&want, &stderr);
    let out = dir.join("t.json");
    let r = ok(&["export", "--format", "chrome", "-i", path_str(&trace), "-o", path_str(&out)]);
    assert!(fnscope_lines(&r.stderr).is_empty(), "no warning for a small trace: {}", r.describe());
    let start = start_unix_ns(&trace);
    let doc: Value = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
    assert_eq!(doc["otherData"]["start_unix_ns"].as_u64(), Some(start), "the start of the recording, as info prints it");
    assert_same("chrome", &chrome_threads(&out, start), &want);

    // Standard output gets the same document.
    let r = ok(&["export", "--format", "chrome", "-i", path_str(&trace)]);
    assert_eq!(r.stdout.as_bytes(), fs::read(&out).unwrap(), "stdout and -o write the same");
}

/// The numbered files of a split export, in order.
fn parts(dir: &Path, stem: &str, ext: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for i in 1.. {
        let p = dir.join(format!("{stem}.{i}.{ext}"));
        if !p.exists() {
            break;
        }
        v.push(p);
    }
    v
}

#[test]
fn split_files_each_open_on_their_own() {
    let dir = TempDir::new("split");
    let (trace, _) = record_timeline(&dir, &[]);
    let want = oracle(&trace);

    ok(&["export", "--format", "perfetto", "-i", path_str(&trace), "-o", path_str(&dir.join("p.pftrace")), "--split-size", "1K"]);
    let files = parts(dir.path(), "p", "pftrace");
    assert!(files.len() >= 3, "1K pieces of a {}-call trace: {files:?}", total(&want));
    assert!(!dir.join("p.pftrace").exists(), "only numbered files");
    let decoded = decode_perfetto(&files);
    let pid = decoded[0]["tracks"]["1"]["pid"].as_u64().unwrap();
    let start = start_unix_ns(&trace);
    // Glued back: a continued slice extends the one its thread had open at the end of the
    // previous file, same name and depth, beginning where that one was cut.
    let mut glued: Threads = BTreeMap::new();
    let mut new_slices = 0;
    for f in &decoded {
        for (tid, v) in perfetto_threads(f, pid, start) {
            let list = glued.entry(tid).or_default();
            for (s, continued) in v {
                if !continued {
                    new_slices += 1;
                    list.push(s);
                    continue;
                }
                let piece = list
                    .iter_mut()
                    .rev()
                    .find(|p| p.depth == s.depth && p.end == s.begin)
                    .unwrap_or_else(|| panic!("{}: continued slice {s:?} has no cut piece", f["file"]));
                assert_eq!((&piece.name, &piece.ending), (&s.name, &s.ending));
                piece.end = s.end;
            }
        }
    }
    assert_eq!(new_slices, total(&want), "slices not continued across the files = calls");
    glued.retain(|_, v| !v.is_empty());
    assert_same("perfetto split", &glued, &want);

    ok(&["export", "--format", "chrome", "-i", path_str(&trace), "-o", path_str(&dir.join("c.json")), "--split-size", "2K"]);
    let files = parts(dir.path(), "c", "json");
    assert!(files.len() >= 3, "2K pieces: {files:?}");
    let mut all: Threads = BTreeMap::new();
    for f in &files {
        for (tid, v) in chrome_events(f, start) {
            all.entry(tid).or_default().extend(v);
        }
    }
    all.values_mut().for_each(nest);
    assert_same("chrome split", &all, &want);
}

#[test]
fn count_mode_trace_is_refused() {
    let dir = TempDir::new("counts");
    let (trace, _) = record_timeline(&dir, &["--mode", "count"]);
    for format in ["perfetto", "chrome"] {
        let out = dir.join(format!("out.{format}"));
        let r = fnscope_cmd(&["export", "--format", format, "-i", path_str(&trace), "-o", path_str(&out)]);
        let msg = assert_one_line_error(&r, format);
        for hint in ["count trace", "--format folded --counts", "fnscope flamegraph --counts", "--mode time"] {
            assert!(msg.contains(hint), "{format}: {msg:?} should mention {hint:?}");
        }
        assert!(!out.exists(), "{format}: a refused export writes no file");
    }
}

/// `want` with only the calls `keep` keeps (given the call and whether a caller matched
/// `inside`), each at its depth among the kept calls.
fn select(want: &Threads, inside: impl Fn(&Slice) -> bool, keep: impl Fn(&Slice, bool) -> bool) -> Threads {
    let mut out = Threads::new();
    for (tid, slices) in want {
        // Per open depth: (kept, matched `inside`).
        let mut open: Vec<(bool, bool)> = Vec::new();
        let mut kept = Vec::new();
        for s in slices {
            open.truncate(s.depth);
            let within = open.iter().any(|o| o.1);
            let k = keep(s, within);
            if k {
                let mut s = s.clone();
                s.depth = open.iter().filter(|o| o.0).count();
                kept.push(s);
            }
            open.push((k, inside(s)));
        }
        if !kept.is_empty() {
            out.insert(*tid, kept);
        }
    }
    out
}

#[test]
fn selection_options_select_exactly() {
    let dir = TempDir::new("select");
    let (trace, _) = record_timeline(&dir, &[]);
    let want = oracle(&trace);
    let start = start_unix_ns(&trace);
    let export = |args: &[&str]| -> Threads {
        let out = dir.join("sel.json");
        let mut a = vec!["export", "--format", "chrome", "-i", path_str(&trace), "-o", path_str(&out)];
        a.extend_from_slice(args);
        ok(&a);
        chrome_threads(&out, start)
    };

    let filtered = select(&want, |s| s.name == "middle", |s, within| within || s.name == "middle");
    assert_eq!(total(&filtered), 14 + 20, "middle's calls and the leaf calls they make");
    assert_same("--filter middle", &export(&["--filter", "middle"]), &filtered);

    let excluded = select(&want, |_| false, |s, _| s.name != "hidden");
    assert_eq!(total(&excluded), total(&want) - 7);
    assert_same("--exclude hidden", &export(&["--exclude", "hidden"]), &excluded);

    let long = select(&want, |_| false, |s, _| s.end - s.begin >= 1_000_000);
    let names: Vec<&str> = long.values().flatten().map(|s| s.name.as_str()).collect();
    assert_eq!(names.iter().filter(|n| **n == "nap").count(), 2, "{names:?}");
    assert_same("--min-duration 1ms", &export(&["--min-duration", "1ms"]), &long);

    // A window from the middle of the first worker's first `nap` to the middle of its last
    // `leaf`: calls crossing an edge are cut at it (to the ns, give or take the rounding of
    // the window into clock ticks).
    let worker = want.values().nth(1).unwrap();
    let nap = worker.iter().find(|s| s.name == "nap").unwrap();
    let leaf = worker.iter().rev().find(|s| s.name == "leaf").unwrap();
    let (lo, hi) = ((nap.begin + nap.end) / 2, (leaf.begin + leaf.end) / 2);
    let window = format!("{}ns..{}ns", lo - start, hi - start);
    let mut inside = select(&want, |_| false, |s, _| s.end > lo && s.begin < hi);
    let mut got = export(&["--time", &window]);
    for (tid, slices) in &mut inside {
        for (i, s) in slices.iter_mut().enumerate() {
            let g = got.get_mut(tid).and_then(|v| v.get_mut(i));
            let Some(g) = g else { break };
            for (edge, got_t, want_t) in [(lo, &mut g.begin, s.begin.max(lo)), (hi, &mut g.end, s.end.min(hi))] {
                if want_t == edge && got_t.abs_diff(edge) <= 1 {
                    *got_t = edge;
                }
            }
            s.begin = s.begin.max(lo);
            s.end = s.end.min(hi);
        }
    }
    assert!(total(&inside) > 5 && total(&inside) < total(&want), "{window} keeps some calls: {inside:?}");
    assert_same(&format!("--time {window}"), &got, &inside);
}

#[test]
fn chrome_warns_past_what_viewers_open() {
    let dir = TempDir::new("big-chrome");
    let exe = compile_c_text(
        dir.path(),
        "many",
        "__attribute__((noinline)) int tick(int i) { return i & 7; }\n\
         int main(void) { int s = 0; for (int i = 0; i < 1100000; i++) s += tick(i); return s == 42; }\n",
    );
    let trace = dir.join("trace");
    let r = Invocation::new(&exe, dir.path()).run_recorded(&trace);
    assert_eq!(r.code, 0, "{}", r.describe());
    let out = dir.join("many.json");
    let r = ok(&["export", "--format", "chrome", "-i", path_str(&trace), "-o", path_str(&out)]);
    let warning = fnscope_lines(&r.stderr).join("\n");
    for hint in ["1100", "--format perfetto", "--time", "--split-size"] {
        assert!(warning.contains(hint), "the warning should mention {hint:?}: {warning:?}");
    }
    // Split below the limit, no file is past it: no warning.
    let r = ok(&["export", "--format", "chrome", "-i", path_str(&trace), "-o", path_str(&out), "--split-size", "50M"]);
    assert!(fnscope_lines(&r.stderr).is_empty(), "{}", r.describe());
    assert!(parts(dir.path(), "many", "json").len() >= 2);
}

/// Threads the program names itself (`pthread_setname_np`): the recorder reads the names
/// while the threads run, or from the chunk a thread hands over as it ends (a thread gone
/// before the recorder looks at it: `gamma-quick`), and every timeline viewer labels their
/// tracks with them.
#[test]
fn thread_names_label_the_tracks() {
    let dir = TempDir::new("export-thread-names");
    let src = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>
__attribute__((noinline)) int step(int x) { return x * 3 + 1; }
static void *run(void *name) {
    pthread_setname_np(pthread_self(), (const char *)name);
    int s = 0;
    for (int i = 0; i < 1000; i++) s += step(i);
    if (((const char *)name)[0] == 'g')
        return (void *)(long)s;
    usleep(300000); /* the recorder looks at running threads every 100 ms */
    for (int i = 0; i < 1000; i++) s += step(i);
    return (void *)(long)s;
}
int main(void) {
    pthread_t a, b, c;
    pthread_create(&a, 0, run, "alpha-worker");
    pthread_create(&b, 0, run, "beta-worker");
    pthread_create(&c, 0, run, "gamma-quick");
    pthread_join(c, 0);
    pthread_join(a, 0);
    pthread_join(b, 0);
    return 0;
}
"#;
    let exe = compile_c_text(dir.path(), "named", src);
    let trace = dir.join("trace");
    let r = Invocation::new(&exe, dir.path()).run_recorded(&trace);
    assert_eq!(r.code, 0, "{}", r.describe());
    let chrome = dir.join("t.json");
    ok(&["export", "--format", "chrome", "-i", path_str(&trace), "-o", path_str(&chrome)]);
    let v: Value = serde_json::from_slice(&fs::read(&chrome).unwrap()).unwrap();
    let mut labels: Vec<String> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            let label = e["args"]["name"].as_str().unwrap().to_string();
            assert!(label.ends_with(&format!(" {}", e["tid"])), "{label} names thread {}", e["tid"]);
            label.rsplit_once(' ').unwrap().0.to_string()
        })
        .collect();
    labels.sort();
    assert_eq!(labels, ["alpha-worker", "beta-worker", "gamma-quick", "named"]);
    let pf = dir.join("t.pftrace");
    ok(&["export", "--format", "perfetto", "-i", path_str(&trace), "-o", path_str(&pf)]);
    let names: Vec<String> = decode_perfetto(&[pf])[0]["tracks"]
        .as_object()
        .unwrap()
        .values()
        .filter(|t| t["kind"] != "process")
        .map(|t| t["name"].as_str().unwrap().rsplit_once(' ').unwrap().0.to_string())
        .collect();
    for want in ["alpha-worker", "beta-worker", "gamma-quick"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
}
