//! Functions shorter than the 5-byte jump (tests/programs/short_funcs.c, gcc -O2): `funcs`
//! says they are hooked over their padding, through an island in padding or through one in
//! a neighbour's moved first bytes, and `record` counts their calls (and the neighbours')
//! exactly, in count mode and in timing mode, with the program's output unchanged.
//!
//! The oracle is the program: each call site counts its call (counts.h protocol).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// Builds short_funcs.c with gcc -O2 into `dir`.
fn build(dir: &TempDir) -> PathBuf {
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let out = dir.join("short_funcs");
    let r = Command::new("gcc")
        .args(["-O2", "-g", "-I"])
        .arg(&programs)
        .arg("-o")
        .arg(&out)
        .arg(programs.join("short_funcs.c"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
    assert!(
        r.status.success(),
        "gcc short_funcs.c failed:\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    out
}

/// `count NAME N` lines of the program's stderr.
fn own_counts(stderr: &str) -> BTreeMap<String, u64> {
    stderr
        .lines()
        .filter_map(|l| {
            let (name, n) = l.strip_prefix("count ")?.rsplit_once(' ')?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .collect()
}

/// `fnscope funcs --json` rows of the program, by name.
fn funcs(exe: &Path) -> BTreeMap<String, Value> {
    let r = fnscope_cmd(&["funcs", "--json", path_str(exe)]);
    assert_eq!(r.code, 0, "funcs failed\n{}", r.describe());
    let rows: Value = serde_json::from_str(&r.stdout).expect("funcs --json prints JSON");
    rows.as_array()
        .expect("an array")
        .iter()
        .map(|o| (o["name"].as_str().unwrap().to_string(), o.clone()))
        .collect()
}

#[test]
fn short_functions_are_hooked() {
    let dir = TempDir::new("short-funcs");
    let exe = build(&dir);
    let native = Invocation::new(&exe, dir.path()).args(&["10"]).run_native();
    let names: Vec<String> = own_counts(&native.stderr).into_keys().collect();
    assert_eq!(names.len(), 13, "{}", native.describe());
    let rows = funcs(&exe);
    let mut forms: BTreeMap<&str, usize> = BTreeMap::new();
    let mut short = 0;
    for name in &names {
        let row = &rows[name.as_str()];
        assert_eq!(row["hookable"], Value::Bool(true), "{name}: {row}");
        let form = row["form"].as_str().unwrap_or_else(|| panic!("{name}: {row}"));
        *forms.entry(form).or_default() += 1;
        if row["size"].as_u64().unwrap() < 5 {
            short += 1;
            assert!(
                ["padding", "island", "borrowed"].contains(&form),
                "{name}: {row}"
            );
        }
    }
    assert!(short >= 5, "gcc made fewer short functions than expected: {rows:?}");
    // Both forms are exercised: aligned functions have padding, packed ones do not.
    assert!(forms.get("padding").is_some_and(|&n| n >= 2), "{forms:?}");
    assert!(forms.get("island").is_some_and(|&n| n >= 2), "{forms:?}");
    // The loop back into its first bytes needs an island too.
    assert_eq!(rows["loop_add"]["form"], "island", "{}", rows["loop_add"]);
    // No padding within reach: the islands go into the neighbours' first bytes.
    for name in ["dense_ident", "dense_zero"] {
        assert_eq!(rows[name]["form"], "borrowed", "{}", rows[name]);
    }
}

#[test]
fn short_functions_counted_exactly() {
    let dir = TempDir::new("short-funcs-counts");
    let exe = build(&dir);
    let inv = Invocation::new(&exe, dir.path()).args(&["1000"]);
    let native = inv.run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let want = own_counts(&native.stderr);
    assert_eq!(want.len(), 13, "{}", native.describe());
    for mode in ["count", "time"] {
        let trace = dir.join(format!("trace-{mode}"));
        let r = fnscope_cmd(&[
            "record",
            "--mode",
            mode,
            "-o",
            path_str(&trace),
            "--",
            path_str(&exe),
            "1000",
        ]);
        assert_eq!(r.code, 0, "{mode}: {}", r.describe());
        assert_eq!(r.stdout, native.stdout, "{mode}: stdout changed");
        assert_eq!(
            program_stderr(&r.stderr),
            native.stderr,
            "{mode}: stderr changed"
        );
        let got = reported_calls(&trace);
        for (name, n) in &want {
            assert_eq!(got.get(name), Some(n), "{mode}: calls of {name}");
        }
        assert_eq!(got.get("main"), Some(&1), "{mode}");
    }
}

/// Calls per function of short_funcs in `report --json` (count-mode reports have no times).
fn reported_calls(trace: &Path) -> BTreeMap<String, u64> {
    let r = fnscope_cmd(&["report", "-i", path_str(trace), "--json"]);
    assert_eq!(r.code, 0, "report failed\n{}", r.describe());
    let rows: Value = serde_json::from_str(&r.stdout).expect("report --json prints JSON");
    let mut out = BTreeMap::new();
    for o in rows.as_array().expect("an array") {
        if o["module"] == "short_funcs" {
            let name = o["name"].as_str().unwrap().to_string();
            let before = out.insert(name, o["calls"].as_u64().unwrap());
            assert!(before.is_none(), "one entry per function: {o}");
        }
    }
    out
}
