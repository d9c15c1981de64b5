//! The cache of module analyses: a program recorded again is hooked from its cached analysis
//! with the same result; a damaged cache file, a rebuilt program and `--no-cache` all mean a
//! fresh analysis, never a wrong one.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn build(dir: &Path, extra: &str) -> PathBuf {
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let exe = dir.join("frames");
    let status = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(programs.join("frames.c"))
        .arg("-I")
        .arg(&programs)
        .args(["-lm", extra])
        .status()
        .expect("cannot run gcc");
    assert!(status.success(), "gcc frames.c failed");
    exe
}

/// Records `exe` with the agent's cache in `cache`; returns how many modules came from the
/// cache (the agent's verbose line), the calls per function and `info`'s hooked/skipped lines.
fn record(dir: &TempDir, cache: &Path, exe: &Path, extra: &[&str]) -> (usize, BTreeMap<String, u64>, String) {
    let trace = dir.join("t");
    let mut args = vec!["-v"];
    args.extend_from_slice(extra);
    let r = Invocation::new(exe, dir.path()).args(&["20", "0", "3:1"]).record_args(&args).env("XDG_CACHE_HOME", path_str(cache)).run_recorded(&trace);
    assert_eq!(r.code, 0, "{}", r.describe());
    let line = r.stderr.lines().find(|l| l.contains("modules analysed in an earlier run")).unwrap_or_else(|| panic!("{}", r.stderr));
    let cached: usize = line.split(": ").nth(2).and_then(|s| s.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap();
    let calls = report(&trace).unwrap().into_iter().map(|f| (f.name, f.calls)).collect();
    let info = fnscope_cmd(&["info", "-i", path_str(&trace)]).stdout;
    // Hooked and skipped counts, and skips per reason ("  too-short   6").
    let reason = |l: &str| l.starts_with("  ") && l.split_whitespace().count() == 2 && l.trim_start().starts_with(|c: char| c.is_ascii_lowercase());
    let hooks = info.lines().filter(|l| l.starts_with("functions") || reason(l)).collect::<Vec<_>>().join("\n");
    (cached, calls, hooks)
}

fn plan_files(cache: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in std::fs::read_dir(cache.join("fnscope")).unwrap().flatten() {
        if d.file_name().to_string_lossy().starts_with("plans-") {
            v.extend(std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.path()));
        }
    }
    v
}

#[test]
fn cached_analyses_give_the_same_hooks_and_damage_is_ignored() {
    let dir = TempDir::new("plan-cache");
    let cache = dir.join("cache");
    let exe = build(dir.path(), "-DUNUSED=1");
    let (first, calls, hooks) = record(&dir, &cache, &exe, &[]);
    assert_eq!(first, 0, "nothing was cached yet");
    assert_eq!(calls.get("frame"), Some(&20));
    let files = plan_files(&cache);
    assert!(!files.is_empty(), "no analysis was cached");

    let (second, calls2, hooks2) = record(&dir, &cache, &exe, &[]);
    assert_eq!(second, 1, "the program's analysis is cached");
    assert_eq!((calls2, hooks2), (calls.clone(), hooks.clone()));

    // Every kind of damage: cut short, bytes flipped in the middle, empty.
    for (k, f) in files.iter().enumerate() {
        let mut b = std::fs::read(f).unwrap();
        match k % 3 {
            0 => b.truncate(b.len() / 2),
            1 => {
                let mid = b.len() / 2;
                b[mid..mid + 16].iter_mut().for_each(|x| *x ^= 0x5a);
            }
            _ => b.clear(),
        }
        std::fs::write(f, b).unwrap();
    }
    let (damaged, calls3, hooks3) = record(&dir, &cache, &exe, &[]);
    assert_eq!((calls3, hooks3), (calls.clone(), hooks.clone()), "a damaged cache changed the result");
    assert!(damaged <= 1, "{damaged}");
    let (again, ..) = record(&dir, &cache, &exe, &[]);
    assert_eq!(again, 1, "the damaged file was replaced");

    // A rebuilt program is analysed again; --no-cache never reads the cache.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let exe = build(dir.path(), "-DUNUSED=2");
    let (rebuilt, calls4, _) = record(&dir, &cache, &exe, &[]);
    assert_eq!(rebuilt, 0, "a rebuilt program used the old analysis");
    assert_eq!(calls4, calls);
    let (fresh, calls5, _) = record(&dir, &cache, &exe, &["--no-cache"]);
    assert_eq!((fresh, calls5), (0, calls));
}
