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

/// The code files the agent kept in `cache` (see the agent's `code_cache`).
fn code_files(cache: &Path) -> Vec<PathBuf> {
    plan_files(cache).into_iter().filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("code-"))).collect()
}

/// Whether the code file `file` carries the agent's mark of a file whose checksum matched
/// (see the agent's `code_cache::checked_mark`): its modification time's nanoseconds are 1 +
/// its last word modulo 999,999,998.
fn marked_checked(file: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let b = std::fs::read(file).unwrap();
    let sum = u64::from_le_bytes(b[b.len() - 8..].try_into().unwrap());
    std::fs::metadata(file).unwrap().mtime_nsec() == 1 + (sum % 999_999_998) as i64
}

/// A program of 4,000 functions of about 1 KiB each (4 MiB of code, a jump on every page once
/// hooked), function `f<i>` called `i % 3 + 1` times.
fn build_big(dir: &Path) -> PathBuf {
    const N: usize = 4000;
    let mut c = String::from("volatile long sink;\n");
    for i in 0..N {
        c.push_str(&format!("__attribute__((noinline)) long f{i}(long x) {{ __asm__ volatile(\".fill 1000, 1, 0x90\"); sink += x; return x + {i}; }}\n"));
    }
    c.push_str("int main(void) { long s = 0;\n");
    for i in 0..N {
        c.push_str(&format!("for (int k = 0; k < {}; k++) s += f{i}(k);\n", i % 3 + 1));
    }
    c.push_str("return s == 0; }\n");
    let src = dir.join("big.c");
    std::fs::write(&src, c).unwrap();
    let exe = dir.join("big");
    let status = Command::new("gcc").args(["-O1", "-o"]).arg(&exe).arg(&src).status().expect("cannot run gcc");
    assert!(status.success(), "gcc big.c failed");
    exe
}

#[test]
fn kept_patched_code_is_mapped_again_and_damage_is_ignored() {
    // A program dense with jumps is patched in a copy (forced, whatever the kernel's huge
    // pages), which is kept and mapped by later runs: every count must be exact each time,
    // and a damaged or mismatched copy must never be used.
    let dir = TempDir::new("code-cache");
    let cache = dir.join("cache");
    let exe = build_big(dir.path());
    let run = |k: usize, extra: &[&str]| {
        let trace = dir.join(format!("t{k}"));
        let mut args = vec!["-v"];
        args.extend_from_slice(extra);
        let inv = Invocation::new(&exe, dir.path()).record_args(&args).env("XDG_CACHE_HOME", path_str(&cache)).env("FNSCOPE_PATCH", "copy");
        let r = inv.run_recorded(&trace);
        assert_eq!(r.code, 0, "{}", r.describe());
        let calls: BTreeMap<String, u64> = report(&trace).unwrap().into_iter().map(|f| (f.name, f.calls)).collect();
        let wrong: Vec<String> = (0..4000)
            .filter_map(|i| {
                let want = (i % 3 + 1) as u64;
                let got = calls.get(&format!("f{i}")).copied();
                let excluded = extra.contains(&"f1*");
                let ok = if excluded && format!("f{i}").starts_with("f1") { got.is_none() } else { got == Some(want) };
                (!ok).then(|| format!("f{i}: {got:?}, want {want}"))
            })
            .collect();
        assert!(wrong.is_empty(), "run {k}: {} wrong counts: {:?}\n{}", wrong.len(), &wrong[..wrong.len().min(5)], r.stderr);
        let kept = r.stderr.contains("patched in a copy that took its place (kept for later runs)");
        let mapped = r.stderr.contains("patched by mapping the copy kept by an earlier run");
        (kept, mapped, r.stderr)
    };

    let (kept, mapped, err) = run(1, &[]);
    assert!(kept && !mapped, "{err}");
    assert_eq!(code_files(&cache).len(), 1);
    let (kept, mapped, err) = run(2, &[]);
    assert!(mapped && !kept, "the kept copy was not used\n{err}");
    // A file checked once carries a mark in its modification time's nanoseconds, so that later
    // runs do not read all of it again: any write since sets the time anew (below).
    assert!(marked_checked(&code_files(&cache)[0]), "the kept copy is not marked as checked");

    // Bytes flipped in the middle of a marked file: the copy is made again, and kept in place
    // of the damaged one.
    let file = &code_files(&cache)[0];
    let mut b = std::fs::read(file).unwrap();
    let mid = b.len() / 2;
    b[mid..mid + 64].iter_mut().for_each(|x| *x ^= 0xa5);
    std::fs::write(file, b).unwrap();
    assert!(!marked_checked(file), "a write kept the mark");
    let (kept, mapped, err) = run(3, &[]);
    assert!(kept && !mapped, "a damaged copy was used\n{err}");
    let (kept, mapped, err) = run(4, &[]);
    assert!(mapped && !kept, "the copy made again was not kept\n{err}");

    // Other jumps (functions left out) make other code: a file of its own.
    let (kept, mapped, err) = run(5, &["--exclude", "f1*"]);
    assert!(kept && !mapped, "{err}");
    assert_eq!(code_files(&cache).len(), 2);

    // --no-cache neither reads nor keeps.
    let (kept, mapped, err) = run(6, &["--no-cache"]);
    assert!(!kept && !mapped, "{err}");
    assert_eq!(code_files(&cache).len(), 2);
}
