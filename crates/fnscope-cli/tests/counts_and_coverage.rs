//! End-to-end tests of count mode, combined runs (`report -i A -i B`, `merge`), `diff`,
//! `coverage` and `funcs`, with exact expectations.
//!
//! The main program is tests/programs/inputs.c (next to this file): its functions are called
//! a number of times that depends on its argument N, by formulas written down in
//! [`expected`]. The program also counts its own calls and prints them (the counts.h
//! protocol of the other end-to-end tests); every run checks those against the formulas
//! first, so that a failure names the guilty party: the test program or fnscope.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// The functions of inputs.c.
const FUNCTIONS: [&str; 10] = [
    "main",
    "alpha",
    "beta",
    "grid",
    "only_even",
    "only_odd",
    "never_called",
    "rec",
    "worker",
    "delta",
];

/// Calls of each function of inputs.c when run with argument `n` (see the top of inputs.c).
fn expected(n: u64) -> BTreeMap<&'static str, u64> {
    let even = n.is_multiple_of(2);
    BTreeMap::from([
        ("main", 1),
        ("alpha", n),
        ("beta", 2 * n + 1),
        ("grid", n * n),
        ("only_even", if even { n } else { 0 }),
        ("only_odd", if even { 0 } else { n }),
        ("never_called", 0),
        ("rec", (1 << (n + 1)) - 1),
        ("worker", 1),
        ("delta", n),
    ])
}

fn this_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// tests/programs/ of the workspace: counts.h and the other test programs.
fn shared_programs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs")
}

/// Builds a C program with gcc -O2 -g (GCC, as for the other end-to-end tests: the test
/// programs' counts were checked against its code).
fn build(source: &Path, out: &Path, extra: &[&str]) -> PathBuf {
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let r = Command::new("gcc")
        .args(["-O2", "-g", "-pthread", "-I"])
        .arg(shared_programs())
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(source)
        .output()
        .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
    assert!(
        r.status.success(),
        "gcc {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&r.stderr)
    );
    out.to_path_buf()
}

fn build_inputs(dir: &TempDir, name: &str, extra: &[&str]) -> PathBuf {
    build(
        &this_dir().join("programs/inputs.c"),
        &dir.join(name),
        extra,
    )
}

/// Records `exe N` in `mode` (`time` or `count`) into `trace`, after checking that the
/// program's own counts follow the formulas.
fn record(exe: &Path, n: u64, mode: &str, trace: &Path) {
    let r = fnscope_cmd(&[
        "record",
        "--mode",
        mode,
        "-o",
        path_str(trace),
        "--",
        path_str(exe),
        &n.to_string(),
    ]);
    assert_eq!(r.code, 0, "record failed\n{}", r.describe());
    let mut own = BTreeMap::new();
    for line in r.stderr.lines() {
        if let Some(rest) = line.strip_prefix("count ") {
            let (name, c) = rest.rsplit_once(' ').unwrap();
            own.insert(name.to_string(), c.parse::<u64>().unwrap());
        }
    }
    let want: BTreeMap<String, u64> = expected(n)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(
        own, want,
        "test program inputs.c is broken: its own counts for N={n} differ from the formulas"
    );
}

/// Runs `fnscope ARGS` and parses its JSON output; panics with the output on failure.
fn json_of(args: &[&str]) -> Value {
    let r = fnscope_cmd(args);
    assert_eq!(r.code, 0, "fnscope {args:?} failed\n{}", r.describe());
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("fnscope {args:?} printed no JSON ({e})\n{}", r.describe()))
}

fn array(v: &Value) -> &Vec<Value> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a JSON array: {v}"))
}

fn u(o: &Value, key: &str) -> u64 {
    o[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no unsigned {key:?} in {o}"))
}

fn f(o: &Value, key: &str) -> f64 {
    o[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key:?} in {o}"))
}

/// `report --json` entries of the inputs module, by function name.
fn report_by_name(args: &[&str], module: &str) -> BTreeMap<String, Value> {
    let mut all = vec!["report", "--json"];
    all.extend_from_slice(args);
    let v = json_of(&all);
    let mut out = BTreeMap::new();
    for o in array(&v) {
        if o["module"] == module {
            let name = o["name"].as_str().unwrap().to_string();
            assert!(
                out.insert(name.clone(), o.clone()).is_none(),
                "{name} listed twice: {v}"
            );
        }
    }
    out
}

/// The report lists exactly the functions of `want` that were called, with those calls.
fn check_calls(got: &BTreeMap<String, Value>, want: &BTreeMap<&str, u64>) {
    for (&name, &n) in want {
        match got.get(name) {
            Some(o) => assert_eq!(u(o, "calls"), n, "calls of {name}: {o}"),
            None => assert_eq!(n, 0, "{name} ({n} calls) is missing from the report"),
        }
    }
}

/// Builds inputs.c, records it with argument 3 in `mode` and checks the report's calls;
/// returns the folder (kept until the test ends), the trace and the report.
fn recorded_with_3(mode: &str) -> (TempDir, PathBuf, BTreeMap<String, Value>) {
    let dir = TempDir::new(&format!("{mode}-mode"));
    let exe = build_inputs(&dir, "inputs", &[]);
    let trace = dir.join("trace");
    record(&exe, 3, mode, &trace);
    let got = report_by_name(&["-i", path_str(&trace)], "inputs");
    check_calls(&got, &expected(3));
    (dir, trace, got)
}

#[test]
fn count_mode_gives_exact_counts() {
    let (_dir, trace, got) = recorded_with_3("count");
    for (name, o) in &got {
        assert!(
            o.get("total_ns").is_none() && o.get("self_ns").is_none(),
            "a count trace has no times, yet {name} has: {o}"
        );
        assert_eq!(
            (u(o, "runs"), u(o, "calls_min"), u(o, "calls_max")),
            (1, u(o, "calls"), u(o, "calls"))
        );
    }
    let text = fnscope_cmd(&["report", "-i", path_str(&trace)]);
    assert_eq!(text.code, 0, "{}", text.describe());
    assert!(text.stdout.contains("Calls"), "{}", text.stdout);
    assert!(!text.stdout.contains("Total time"), "{}", text.stdout);
    // Sorted by calls when there are no times: rec (15) comes first.
    let first = text.stdout.lines().nth(2).unwrap_or_default();
    assert!(
        first.contains("rec (inputs)") && first.contains("15"),
        "{}",
        text.stdout
    );
    // A time key falls back to calls, with a warning rather than a table of zeros.
    let by_total = fnscope_cmd(&["report", "-i", path_str(&trace), "--sort", "total"]);
    assert_eq!(by_total.stdout, text.stdout);
    assert!(
        by_total.stderr.contains("sorting by calls"),
        "{}",
        by_total.describe()
    );

    let info = info(&trace);
    let total: u64 = expected(3).values().sum();
    assert!(
        info.contains(&format!("calls counted:    {total}")),
        "{info}"
    );

    // Grouped per module: one module, all its calls, top 2 functions.
    let v = json_of(&[
        "report",
        "-i",
        path_str(&trace),
        "--by",
        "module",
        "--top",
        "2",
        "--json",
    ]);
    let m = array(&v)
        .iter()
        .find(|m| m["module"] == "inputs")
        .expect("module inputs");
    assert_eq!(u(m, "calls"), total);
    assert_eq!(u(m, "functions_called"), 8);
    let top: Vec<&str> = array(&m["functions"])
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(top, ["rec", "grid"]);
}

#[test]
fn time_mode_gives_exact_counts() {
    let (_dir, _trace, got) = recorded_with_3("time");
    for (name, o) in &got {
        assert_eq!(u(o, "timed_calls"), u(o, "calls"), "{name}: {o}");
        assert!(u(o, "self_ns") <= u(o, "total_ns"), "{name}: {o}");
        assert!(u(o, "min_ns") <= u(o, "max_ns"), "{name}: {o}");
        assert_eq!(f(o, "calls_avg"), u(o, "calls") as f64, "{name}: {o}");
    }
}

#[test]
fn merge_sums_and_averages() {
    let dir = TempDir::new("merge");
    let exe = build_inputs(&dir, "inputs", &[]);
    let (a, b, c) = (dir.join("a"), dir.join("b"), dir.join("c"));
    // Count and time runs together: calls from both, times from the time run only.
    record(&exe, 2, "count", &a);
    record(&exe, 5, "time", &b);
    record(&exe, 3, "count", &c);
    let merged = dir.join("ab");
    let r = fnscope_cmd(&["merge", "-o", path_str(&merged), path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 0, "{}", r.describe());

    let (e2, e5, e3) = (expected(2), expected(5), expected(3));
    let from_merged = report_by_name(&["-i", path_str(&merged)], "inputs");
    for name in FUNCTIONS {
        let (x, y) = (e2[name], e5[name]);
        let Some(o) = from_merged.get(name) else {
            assert_eq!(x + y, 0, "{name} missing from the merged report");
            continue;
        };
        assert_eq!(u(o, "calls"), x + y, "{name}: {o}");
        assert_eq!(f(o, "calls_avg"), (x + y) as f64 / 2.0, "{name}: {o}");
        assert_eq!(u(o, "calls_min"), x.min(y), "{name}: {o}");
        assert_eq!(u(o, "calls_max"), x.max(y), "{name}: {o}");
        assert_eq!(u(o, "runs"), 2, "{name}: {o}");
        assert_eq!(
            u(o, "timed_calls"),
            y,
            "{name}: only run b recorded times: {o}"
        );
        assert_eq!(u(o, "total_ns") > 0, y > 0, "{name}: {o}");
    }
    // The same figures without writing a merged trace.
    let direct = report_by_name(&["-i", path_str(&a), "-i", path_str(&b)], "inputs");
    assert_eq!(direct, from_merged);

    // A merged trace merges again, like any run; here into the folder of one of its inputs.
    let r = fnscope_cmd(&[
        "merge",
        "-o",
        path_str(&merged),
        path_str(&merged),
        path_str(&c),
    ]);
    assert_eq!(r.code, 0, "{}", r.describe());
    let abc = report_by_name(&["-i", path_str(&merged)], "inputs");
    for name in FUNCTIONS {
        let runs = [e2[name], e5[name], e3[name]];
        let sum: u64 = runs.iter().sum();
        let Some(o) = abc.get(name) else {
            assert_eq!(sum, 0, "{name} missing after the second merge");
            continue;
        };
        assert_eq!(u(o, "calls"), sum, "{name}: {o}");
        assert_eq!(f(o, "calls_avg"), sum as f64 / 3.0, "{name}: {o}");
        assert_eq!(
            u(o, "calls_min"),
            *runs.iter().min().unwrap(),
            "{name}: {o}"
        );
        assert_eq!(
            u(o, "calls_max"),
            *runs.iter().max().unwrap(),
            "{name}: {o}"
        );
        assert_eq!(u(o, "runs"), 3, "{name}: {o}");
    }
    let info = info(&merged);
    assert!(info.contains("runs:             3"), "{info}");
    assert!(info.contains("(time mode"), "{info}");
    // Threads belong to single runs.
    let r = fnscope_cmd(&[
        "report",
        "-i",
        path_str(&a),
        "-i",
        path_str(&b),
        "--threads",
    ]);
    assert_one_line_error(&r, "report --threads over two runs");
}

/// `nm` of the unstripped program: function name to address.
fn nm_addresses(exe: &Path) -> BTreeMap<String, u64> {
    let out = Command::new("nm")
        .arg("--defined-only")
        .arg(exe)
        .output()
        .expect("nm");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (addr, ty, name) = (it.next()?, it.next()?, it.next()?);
            let addr = u64::from_str_radix(addr, 16).ok()?;
            matches!(ty, "T" | "t").then(|| (name.to_string(), addr))
        })
        .collect()
}

/// `strip OPTIONS -o TO FROM`.
fn strip(options: &[&str], from: &Path, to: &Path) {
    let r = Command::new("strip").args(options).arg("-o").arg(to).arg(from).output().expect("strip");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn stripped_copy_counts_from_eh_frame() {
    let dir = TempDir::new("stripped");
    let full = build_inputs(&dir, "inputs-full", &[]);
    let stripped = dir.join("inputs");
    strip(&[], &full, &stripped);
    let addresses = nm_addresses(&full);
    let trace = dir.join("trace");
    record(&stripped, 3, "count", &trace);

    let v = json_of(&["report", "-i", path_str(&trace), "--json"]);
    let mut by_address = BTreeMap::new();
    for o in array(&v).iter().filter(|o| o["module"] == "inputs") {
        let name = o["name"].as_str().unwrap();
        assert!(
            name.starts_with("sub_"),
            "a stripped binary names nothing: {o}"
        );
        by_address.insert(u(o, "address"), u(o, "calls"));
    }
    let funcs = json_of(&["funcs", "--json", path_str(&stripped)]);
    for (name, n) in expected(3) {
        let at = addresses[name];
        assert_eq!(
            by_address.get(&at).copied().unwrap_or(0),
            n,
            "{name} at {at:#x}"
        );
        let listed = array(&funcs)
            .iter()
            .find(|o| u(o, "address") == at)
            .unwrap_or_else(|| panic!("funcs does not list {name} at {at:#x}"));
        assert_eq!(listed["source"], "eh_frame", "{listed}");
        assert_eq!(listed["hookable"], true, "{listed}");
        assert_eq!(listed["name"], format!("sub_{at:x}"), "{listed}");
    }
}

/// A program with neither symbols nor unwind tables offers nothing to hook (bar exported
/// functions): `record` says so and why, instead of an unexplained "0 functions hooked".
#[test]
fn nothing_to_hook_is_explained() {
    let dir = TempDir::new("no-unwind");
    let full = build_inputs(&dir, "inputs-full", &[]);
    let bare = dir.join("inputs");
    strip(&["--strip-all", "-R", ".eh_frame", "-R", ".eh_frame_hdr"], &full, &bare);
    let trace = dir.join("trace");
    let r = fnscope_cmd(&["record", "-o", path_str(&trace), "--", path_str(&bare), "3"]);
    assert_eq!(r.code, 0, "{}", r.describe());
    for said in ["has neither symbols nor unwind tables (.eh_frame)", "no function could be hooked", "0 calls recorded"] {
        assert!(r.stderr.contains(said), "record does not say {said:?}\n{}", r.describe());
    }
    // The plain stripped copy keeps its unwind tables: its functions are found and hooked.
    let stripped = dir.join("stripped");
    strip(&[], &full, &stripped);
    let r = fnscope_cmd(&["record", "-o", path_str(&dir.join("trace2")), "--", path_str(&stripped), "3"]);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(!r.stderr.contains("no function could be hooked"), "{}", r.describe());
    assert!(r.stderr.contains("is stripped"), "{}", r.describe());
    // A filter that keeps nothing is named as a cause.
    let trace3 = dir.join("trace3");
    let r = fnscope_cmd(&["record", "--filter", "no_such_function", "-o", path_str(&trace3), "--", path_str(&full), "3"]);
    assert_eq!(r.code, 0, "{}", r.describe());
    for said in ["no function could be hooked", "--filter and --exclude"] {
        assert!(r.stderr.contains(said), "record does not say {said:?}\n{}", r.describe());
    }
}

/// Line of inputs.c where function `name` is defined.
fn definition_line(name: &str) -> u64 {
    let src = std::fs::read_to_string(this_dir().join("programs/inputs.c")).unwrap();
    let (plain, pointer) = (format!(" {name}("), format!("*{name}("));
    let i = src
        .lines()
        .position(|l| {
            (l.starts_with("NOINLINE ") || l.starts_with("int "))
                && (l.contains(&plain) || l.contains(&pointer))
        })
        .unwrap_or_else(|| panic!("no definition of {name} in inputs.c"));
    i as u64 + 1
}

/// Coverage of module `inputs`: name to (status, line) of the functions of inputs.c, and
/// the module object.
fn coverage_of(inputs: &[&Path]) -> (BTreeMap<String, (String, u64)>, Value) {
    let mut args = vec!["coverage", "--json"];
    for i in inputs {
        args.extend(["-i", path_str(i)]);
    }
    let v = json_of(&args);
    let m = array(&v["modules"])
        .iter()
        .find(|m| m["module"] == "inputs")
        .unwrap_or_else(|| panic!("no module inputs: {v}"))
        .clone();
    assert_eq!(m["sources"], "dwarf", "{m}");
    let mut out = BTreeMap::new();
    for o in array(&m["functions"]) {
        if o["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("/programs/inputs.c"))
        {
            let name = o["name"].as_str().unwrap().to_string();
            out.insert(
                name,
                (o["status"].as_str().unwrap().to_string(), u(o, "line")),
            );
        }
    }
    (out, m)
}

#[test]
fn coverage_lists_what_each_input_reaches() {
    let dir = TempDir::new("coverage");
    let exe = build_inputs(&dir, "inputs", &[]);
    let (two, three) = (dir.join("n2"), dir.join("n3"));
    record(&exe, 2, "count", &two);
    record(&exe, 3, "time", &three);
    for (inputs, reached) in [
        (vec![two.as_path()], expected(2)),
        (vec![three.as_path()], expected(3)),
        (vec![two.as_path(), three.as_path()], {
            let mut both = expected(2);
            for (k, v) in expected(3) {
                *both.get_mut(k).unwrap() += v;
            }
            both
        }),
    ] {
        let (got, m) = coverage_of(&inputs);
        let want: BTreeMap<String, (String, u64)> = FUNCTIONS
            .iter()
            .map(|&name| {
                let status = if reached[name] > 0 {
                    "executed"
                } else {
                    "not-executed"
                };
                (
                    name.to_string(),
                    (status.to_string(), definition_line(name)),
                )
            })
            .collect();
        assert_eq!(got, want, "coverage of {inputs:?}");
        // Unhookable functions are apart: never in the hookable count.
        let fs = array(&m["functions"]);
        let count = |s: &str| fs.iter().filter(|o| o["status"] == s).count() as u64;
        assert_eq!(u(&m, "executed"), count("executed"));
        assert_eq!(u(&m, "hookable"), count("executed") + count("not-executed"));
        assert_eq!(u(&m, "unhookable"), count("unhookable"));
        for o in fs.iter().filter(|o| o["status"] == "unhookable") {
            assert!(!o["reason"].as_str().unwrap_or_default().is_empty(), "{o}");
        }
    }

    let html = dir.join("html");
    let r = fnscope_cmd(&[
        "coverage",
        "-i",
        path_str(&two),
        "-i",
        path_str(&three),
        "--html",
        path_str(&html),
    ]);
    assert_eq!(r.code, 0, "{}", r.describe());
    let index = std::fs::read_to_string(html.join("index.html")).expect("index.html");
    assert!(index.contains("inputs.c"), "{index}");
    // The page of inputs.c is linked from the index, and marks each function.
    let page = index
        .split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .find(|p| {
            std::fs::read_to_string(html.join(p))
                .is_ok_and(|t| t.contains("<h1>") && t.contains("programs/inputs.c</h1>"))
        })
        .expect("a page for inputs.c");
    let text = std::fs::read_to_string(html.join(page)).unwrap();
    for (name, class) in [
        ("never_called", "not-executed"),
        ("only_even", "executed"),
        ("rec", "executed"),
    ] {
        let row = text
            .lines()
            .find(|l| l.starts_with("<tr") && l.contains(&format!(">{name}<")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}"));
        assert!(row.contains(&format!("class=\"{class}\"")), "{name}: {row}");
    }
    // Self-contained: nothing is loaded from elsewhere.
    for t in [&index, &text] {
        assert!(
            !t.contains("http://") && !t.contains("https://") && !t.contains("src="),
            "external asset"
        );
    }
}

#[test]
fn diff_gives_exact_call_deltas() {
    let dir = TempDir::new("diff");
    let exe = build_inputs(&dir, "inputs", &[]);
    let (a, b) = (dir.join("a"), dir.join("b"));
    record(&exe, 2, "count", &a);
    record(&exe, 5, "time", &b);
    let v = json_of(&["diff", path_str(&a), path_str(&b), "--json"]);
    let rows: Vec<&Value> = array(&v)
        .iter()
        .filter(|o| o["module"] == "inputs")
        .collect();
    let (e2, e5) = (expected(2), expected(5));
    let mut seen = BTreeSet::new();
    for o in &rows {
        let name = o["name"].as_str().unwrap();
        assert!(seen.insert(name), "{name} listed twice");
        assert_eq!(f(o, "calls_a"), e2[name] as f64, "{o}");
        assert_eq!(f(o, "calls_b"), e5[name] as f64, "{o}");
        assert_eq!(
            f(o, "calls_delta"),
            e5[name] as f64 - e2[name] as f64,
            "{o}"
        );
        assert!(o.get("total_ns_a").is_none(), "run a has no times: {o}");
    }
    let called: BTreeSet<&str> = FUNCTIONS
        .iter()
        .copied()
        .filter(|n| e2[n] + e5[n] > 0)
        .collect();
    assert_eq!(seen, called);
    // Largest change first.
    let deltas: Vec<f64> = rows.iter().map(|o| f(o, "calls_delta").abs()).collect();
    assert!(deltas.windows(2).all(|w| w[0] >= w[1]), "{deltas:?}");
    assert_eq!(rows[0]["name"], "rec");

    let text = fnscope_cmd(&["diff", path_str(&a), path_str(&b)]);
    assert_eq!(text.code, 0, "{}", text.describe());
    let rec = text
        .stdout
        .lines()
        .find(|l| l.ends_with(" rec (inputs)"))
        .expect("rec line");
    assert_eq!(
        rec.split_whitespace().take(3).collect::<Vec<_>>(),
        ["7", "63", "+56"],
        "{rec}"
    );
}

#[test]
fn different_builds_are_refused_unless_matched_by_name() {
    let dir = TempDir::new("builds");
    let one = build_inputs(&dir, "one/inputs", &[]);
    let two = build_inputs(&dir, "two/inputs", &["-DVARIANT=1"]);
    let (a, b) = (dir.join("a"), dir.join("b"));
    record(&one, 2, "count", &a);
    record(&two, 3, "count", &b);
    let out = dir.join("merged");
    for args in [
        vec!["merge", "-o", path_str(&out), path_str(&a), path_str(&b)],
        vec!["report", "-i", path_str(&a), "-i", path_str(&b)],
        vec!["diff", path_str(&a), path_str(&b)],
        vec!["coverage", "-i", path_str(&a), "-i", path_str(&b)],
    ] {
        let r = fnscope_cmd(&args);
        let line = assert_one_line_error(&r, &format!("{args:?}"));
        assert!(
            line.contains("inputs") && line.contains("--match-by-name"),
            "{line}"
        );
    }
    let got = report_by_name(
        &["-i", path_str(&a), "-i", path_str(&b), "--match-by-name"],
        "inputs",
    );
    let (e2, e3) = (expected(2), expected(3));
    for name in ["alpha", "grid", "rec", "only_even", "only_odd"] {
        assert_eq!(u(&got[name], "calls"), e2[name] + e3[name], "{name}");
    }
}

#[test]
fn funcs_verdicts_of_asm_heads() {
    let dir = TempDir::new("funcs");
    let exe = build(
        &shared_programs().join("asm_heads.c"),
        &dir.join("asm_heads"),
        &[],
    );
    let v = json_of(&["funcs", "--json", path_str(&exe)]);
    let by_name: BTreeMap<&str, &Value> = array(&v)
        .iter()
        .map(|o| (o["name"].as_str().unwrap(), o))
        .collect();
    for (i, o) in array(&v).iter().enumerate() {
        assert_eq!(u(o, "index"), i as u64, "{o}");
        assert_eq!(o["module"], "asm_heads", "{o}");
        assert_eq!(
            o["hookable"] == true,
            o["reason"] == "",
            "reason empty exactly when hookable: {o}"
        );
    }
    let verdict = |name: &str| {
        let o = by_name
            .get(name)
            .unwrap_or_else(|| panic!("{name} not listed"));
        (
            o["hookable"].as_bool().unwrap(),
            o["reason"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(verdict("short_ret"), (false, "too-short".to_string()));
    // No padding in reach (the functions are packed): the short ones, the loop back to +2 and
    // the target of a jump to +3 get their island in a hooked neighbour's first bytes.
    for name in ["short_zero", "short_inc", "head_loop", "victim"] {
        assert_eq!(verdict(name), (true, String::new()), "{name}");
        assert_eq!(by_name[name]["form"], "borrowed", "{name}");
    }
    for name in [
        "after_shorts",
        "jumper_in",
        "body_loop",
        "rip_prologue",
        "rip_lea",
        "rip_cmp",
        "early_branch",
        "main",
    ] {
        assert_eq!(verdict(name), (true, String::new()), "{name}");
    }
    assert_eq!(by_name["_start"]["entry"], false);
    assert_eq!(
        by_name["victim"]["detail"]
            .as_str()
            .map(|d| d.contains("neighbour's moved bytes")),
        Some(true)
    );
    // main has a source position from DWARF; the assembly functions have none.
    let src = std::fs::read_to_string(shared_programs().join("asm_heads.c")).unwrap();
    let main_line = src
        .lines()
        .position(|l| l.starts_with("int main("))
        .unwrap() as u64
        + 1;
    assert!(by_name["main"]["file"]
        .as_str()
        .unwrap()
        .ends_with("programs/asm_heads.c"));
    assert_eq!(u(by_name["main"], "line"), main_line);

    let skipped = json_of(&["funcs", "--json", "--skipped", path_str(&exe)]);
    let names: BTreeSet<&str> = array(&skipped)
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    let want: BTreeSet<&str> = array(&v)
        .iter()
        .filter(|o| o["hookable"] == false)
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, want);
    assert!(names.contains("short_ret") && !names.contains("victim"));

    let text = fnscope_cmd(&["funcs", path_str(&exe)]);
    assert_eq!(text.code, 0, "{}", text.describe());
    let entries = array(&v).iter().filter(|o| o["entry"] == true).count();
    let hookable = array(&v).iter().filter(|o| o["hookable"] == true).count();
    let last = text.stdout.lines().last().unwrap();
    assert!(
        last.starts_with(&format!(
            "{} pieces of code, {entries} function entries: {hookable} hookable",
            array(&v).len()
        )),
        "{last}"
    );
    assert!(
        last.contains("4 through an island in a neighbour's moved bytes") && !last.contains("branch-into-patch"),
        "{last}"
    );
}

#[test]
fn funcs_lists_a_pdb() {
    let dir = TempDir::new("pdb");
    let pdb = dir.join("run_code_on_dllmain_amd64.pdb");
    let out = Command::new("gzip")
        .arg("-dc")
        .arg(this_dir().join("data/run_code_on_dllmain_amd64.pdb.gz"))
        .output()
        .expect("gzip");
    assert!(out.status.success());
    std::fs::write(&pdb, &out.stdout).unwrap();

    // Expectations checked with llvm-pdbutil: see tests/data/README.md.
    let v = json_of(&["funcs", "--json", "--pdb", path_str(&pdb)]);
    let fs = array(&v);
    assert_eq!(fs.len(), 112);
    for (i, o) in fs.iter().enumerate() {
        assert_eq!(u(o, "index"), i as u64);
        assert!(
            o["hookable"].is_null(),
            "not analysed for Windows code: {o}"
        );
    }
    assert!(fs
        .windows(2)
        .all(|w| u(&w[0], "address") < u(&w[1], "address")));
    let find = |name: &str| {
        fs.iter()
            .find(|o| o["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed"))
    };
    for (name, rva, size, line) in [
        (
            "DllMain(HINSTANCE__*, unsigned long, void*)",
            0x14b8,
            64,
            68,
        ),
        ("RunCodeInThread(void*)", 0x1420, 151, 37),
    ] {
        let o = find(name);
        assert_eq!(
            (u(o, "address"), u(o, "size"), u(o, "line")),
            (rva, size, line),
            "{o}"
        );
        assert!(
            o["file"]
                .as_str()
                .unwrap()
                .ends_with("\\windows\\run_code_on_dllmain.cpp"),
            "{o}"
        );
    }
    let raw = json_of(&["funcs", "--json", "--raw", "--pdb", path_str(&pdb)]);
    let o = array(&raw)
        .iter()
        .find(|o| u(o, "address") == 0x1420)
        .unwrap();
    assert_eq!(o["name"], "?RunCodeInThread@@YAKPEAX@Z");
}

#[test]
fn bad_inputs_give_one_line_errors() {
    let dir = TempDir::new("bad-inputs");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not a program\n").unwrap();
    let exe = build_inputs(&dir, "inputs", &[]);
    let trace = dir.join("trace");
    record(&exe, 1, "count", &trace);
    let busy = dir.join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("keep.txt"), "mine").unwrap();
    let missing = dir.join("missing");
    for (args, want) in [
        (vec!["funcs", path_str(&text)], "not an ELF file"),
        (vec!["funcs", path_str(&missing)], "cannot read"),
        (vec!["funcs", "--pdb", path_str(&exe)], "not a PDB file"),
        (vec!["funcs", "--pdb", path_str(&missing)], "cannot open"),
        (
            vec!["report", "-i", path_str(&text)],
            "not an fnscope trace",
        ),
        (
            vec!["report", "-i", path_str(&trace), "-i", path_str(&missing)],
            "no trace at",
        ),
        (
            vec!["merge", "-o", path_str(&busy), path_str(&trace)],
            "is not an fnscope trace",
        ),
        (
            vec!["merge", "-o", path_str(&dir.join("m")), path_str(&text)],
            "not an fnscope trace",
        ),
        (
            vec!["diff", path_str(&trace), path_str(&text)],
            "not an fnscope trace",
        ),
        (vec!["coverage", "-i", path_str(&missing)], "no trace at"),
    ] {
        let r = fnscope_cmd(&args);
        let line = assert_one_line_error(&r, &format!("{args:?}"));
        assert!(line.contains(want), "{args:?}: want {want:?} in {line:?}");
    }
    assert_eq!(
        std::fs::read_to_string(busy.join("keep.txt")).unwrap(),
        "mine"
    );
    // A module that is no longer where it ran: coverage still works, without source files.
    std::fs::remove_file(&exe).unwrap();
    let v = json_of(&["coverage", "--json", "-i", path_str(&trace)]);
    let m = &array(&v["modules"])[0];
    assert_eq!(m["sources"], "module-missing", "{m}");
    assert!(u(m, "executed") > 0, "{m}");
}

#[test]
fn count_mode_fork_with_every_counter_in_use() {
    // The parent's fork hook took the thread's counters for a thread state: with counters
    // that were not 0 where the state's fork slot lies, the parent crashed after fork()
    // (python3 did). Here every one of the first 200 ids has counted a call.
    let dir = TempDir::new("count-fork");
    let mut src = String::from("#include <stdio.h>\n#include <unistd.h>\n#include <sys/wait.h>\n");
    for i in 0..200 {
        src += &format!("int f{i}(int x) {{ return x * 3 + {i}; }}\n");
    }
    src += "int main(void)\n{\n    int s = 0;\n";
    for i in 0..200 {
        src += &format!("    s = f{i}(s) % 100003;\n");
    }
    src += "    pid_t child = fork();\n    if (child == 0)\n        _exit(7);\n    int status;\n    waitpid(child, &status, 0);\n    printf(\"%d %d\\n\", s, WEXITSTATUS(status));\n    return 0;\n}\n";
    let exe = compile_c_text(dir.path(), "forker", &src);
    let inv = Invocation::new(&exe, dir.path()).record_args(&["--mode", "count"]);
    let native = inv.run_native();
    let trace = dir.join("trace");
    let traced = inv.run_recorded(&trace);
    let problems = compare_runs(&native, &traced);
    assert!(problems.is_empty(), "{problems:?}\n{}", traced.describe());
    let got = report_by_name(&["-i", path_str(&trace)], "forker");
    let want: BTreeMap<String, u64> = (0..200).map(|i| (format!("f{i}"), 1)).collect();
    check_calls(&got, &want.iter().map(|(k, v)| (k.as_str(), *v)).collect());
}
