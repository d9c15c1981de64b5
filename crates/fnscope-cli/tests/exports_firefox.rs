//! `fnscope export --format firefox`: the processed profile, decoded here from its JSON
//! tables, gives every function of the demo (threads, recursion) exactly the total and self
//! time that `replay --format lines` (entries and exits to the ns) gives it, and the totals of
//! `report` within the 1 ns per call by which rounding each end of a call can differ from
//! rounding its duration.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds and records the demo (four threads, a recursive merge sort).
fn demo_trace(dir: &TempDir) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../demo/demo.c");
    let exe = dir.join("demo");
    let r = Command::new("gcc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("gcc runs");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let trace = dir.join("trace");
    let r = Invocation::new(&exe, dir.path()).run_recorded(&trace);
    assert_eq!(r.code, 0, "{}", r.describe());
    trace
}

/// Per function name: (sum of the sample weights of every stack it occurs in, once per
/// occurrence, as `report` counts recursive calls; the weights where it is the leaf).
fn profile_times(profile: &Value) -> (BTreeMap<String, u64>, BTreeMap<String, u64>, usize) {
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    let mut own: BTreeMap<String, u64> = BTreeMap::new();
    let threads = profile["threads"].as_array().expect("threads");
    for t in threads {
        let s = &t["samples"];
        let (st, ft, fnt, strings) = (&t["stackTable"], &t["frameTable"], &t["funcTable"], &t["stringArray"]);
        let name = |stack: usize| -> String {
            let frame = st["frame"][stack].as_u64().unwrap() as usize;
            let func = ft["func"][frame].as_u64().unwrap() as usize;
            let i = fnt["name"][func].as_u64().unwrap() as usize;
            strings[i].as_str().unwrap().to_string()
        };
        let n = s["length"].as_u64().unwrap() as usize;
        for k in 0..n {
            let Some(stack) = s["stack"][k].as_u64() else { continue };
            let w = s["weight"][k].as_u64().expect("weights");
            *own.entry(name(stack as usize)).or_default() += w;
            let mut at = Some(stack as usize);
            while let Some(i) = at {
                *total.entry(name(i)).or_default() += w;
                at = st["prefix"][i].as_u64().map(|p| p as usize);
            }
        }
    }
    (total, own, threads.len())
}

/// Per function name, from `replay --format lines` one thread at a time: (total per
/// occurrence, self) in ns.
fn replay_times(trace: &Path, tids: &[u64]) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    let mut own: BTreeMap<String, u64> = BTreeMap::new();
    for tid in tids {
        let r = fnscope_cmd(&["replay", "--format", "lines", "--tid", &tid.to_string(), "-i", path_str(trace)]);
        assert_eq!(r.code, 0, "{}", r.describe());
        // Open calls: name, entry time, time spent in callees.
        let mut open: Vec<(String, u64, u64)> = Vec::new();
        for line in r.stdout.lines() {
            let (stamp, rest) = line.split_once(']').expect("SEQ[SEC,NSEC]");
            let (sec, nsec) = stamp.split_once('[').unwrap().1.split_once(',').unwrap();
            let t = sec.parse::<u64>().unwrap() * 1_000_000_000 + nsec.parse::<u64>().unwrap();
            if let Some(name) = rest.strip_prefix("enter:") {
                open.push((name.to_string(), t, 0));
            } else {
                let name = rest.strip_prefix("leave:").expect("enter or leave");
                let (n, t0, inner) = open.pop().expect("nested");
                assert_eq!(n, name);
                *total.entry(n.clone()).or_default() += t - t0;
                *own.entry(n).or_default() += t - t0 - inner;
                if let Some(parent) = open.last_mut() {
                    parent.2 += t - t0;
                }
            }
        }
    }
    (total, own)
}

#[test]
fn firefox_profile_times_match_report() {
    let dir = TempDir::new("export-firefox");
    let trace = demo_trace(&dir);
    let out = dir.join("demo.json");
    let r = fnscope_cmd(&["export", "--format", "firefox", "-i", path_str(&trace), "-o", path_str(&out)]);
    assert_eq!(r.code, 0, "{}", r.describe());
    let profile: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).expect("the profile is JSON");
    assert_eq!(profile["meta"]["interval"].as_f64().map(|ms| (ms * 1e6).round()), Some(1.0), "1 ns samples");
    let (total, own, threads) = profile_times(&profile);
    let stats = report(&trace).unwrap();
    // The main thread and four workers.
    assert_eq!(threads, 5);
    let tids: Vec<u64> = profile["threads"].as_array().unwrap().iter().map(|t| t["tid"].as_str().and_then(|s| s.parse().ok()).or(t["tid"].as_u64()).expect("a tid")).collect();
    let (want_total, want_own) = replay_times(&trace, &tids);
    assert_eq!(total, want_total, "totals per function, to the ns");
    assert_eq!(own, want_own, "self times per function, to the ns");
    let names: Vec<&String> = total.keys().collect();
    let mut want: Vec<&String> = stats.iter().map(|s| &s.name).collect();
    want.sort();
    assert_eq!(names, want, "the same functions");
    for s in &stats {
        let slack = s.calls as i64;
        let dt = total[&s.name] as i64 - s.total_ns as i64;
        assert!(dt.abs() <= slack, "{}: total {} in the profile, {} in report", s.name, total[&s.name], s.total_ns);
    }
    assert!(stats.iter().any(|s| s.name == "merge_sort" && s.calls > 1000), "recursion is exercised");
}

#[test]
fn firefox_refuses_count_traces_and_split() {
    let dir = TempDir::new("export-firefox-count");
    let exe = compile_c_text(dir.path(), "two", "int f(int x){return x*3;}\nint main(void){return f(1)-3;}\n");
    let trace = dir.join("trace");
    let r = Invocation::new(&exe, dir.path()).record_args(&["--mode", "count"]).run_recorded(&trace);
    assert_eq!(r.code, 0, "{}", r.describe());
    let r = fnscope_cmd(&["export", "--format", "firefox", "-i", path_str(&trace), "-o", path_str(&dir.join("p.json"))]);
    assert_eq!(r.code, 2, "{}", r.describe());
    assert!(r.stderr.contains("count trace") && r.stderr.contains("--counts"), "{}", r.stderr);
    let timed = dir.join("timed");
    let r = Invocation::new(&exe, dir.path()).run_recorded(&timed);
    assert_eq!(r.code, 0, "{}", r.describe());
    let r = fnscope_cmd(&[
        "export", "--format", "firefox", "-i", path_str(&timed), "-o", path_str(&dir.join("q.json")), "--split-size", "1M",
    ]);
    assert_eq!(r.code, 2, "{}", r.describe());
    assert!(r.stderr.contains("--split-size") && r.stderr.contains("cannot be split"), "{}", r.stderr);
}
