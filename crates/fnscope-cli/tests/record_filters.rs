//! Record-time filters (`--app-only`, `--filter`, `--exclude`, `--min-duration`, `--depth`)
//! and the flight recorder (`--flight`, its triggers, `fnscope snapshot`), on a game-like
//! frame loop (tests/programs/frames.c) whose own call counts are the oracle.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Builds tests/programs/frames.c into `dir` (with debug information, for `file:` patterns).
fn build(dir: &Path) -> PathBuf {
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let exe = dir.join("frames");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&exe)
        .arg(programs.join("frames.c"))
        .arg("-I")
        .arg(&programs)
        .arg("-lm")
        .status()
        .expect("cannot run gcc");
    assert!(status.success(), "gcc frames.c failed");
    exe
}

/// `count NAME N` lines of the program's stderr, with `main` (called once).
fn own_counts(stderr: &str) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = stderr
        .lines()
        .filter_map(|l| {
            let (name, n) = l.strip_prefix("count ")?.rsplit_once(' ')?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    m.insert("main".to_string(), 1);
    m
}

/// Calls per function of a trace, by name, with the modules seen.
fn calls(trace: &Path) -> (BTreeMap<String, u64>, Vec<String>) {
    let stats = report(trace).unwrap_or_else(|e| panic!("{e}"));
    let mut modules: Vec<String> = stats.iter().map(|f| f.module.clone()).collect();
    modules.sort();
    modules.dedup();
    (stats.into_iter().filter(|f| f.calls > 0).map(|f| (f.name, f.calls)).collect(), modules)
}

fn recorded(exe: &Path, dir: &TempDir, tag: &str, record_args: &[&str], args: &[&str]) -> (Run, PathBuf) {
    let trace = dir.join(tag);
    let inv = Invocation::new(exe, dir.path()).args(args).record_args(record_args);
    let run = inv.run_recorded(&trace);
    let native = inv.run_native();
    let problems = compare_runs(&native, &run);
    assert!(problems.is_empty(), "{tag}: {problems:?}\n{}", run.describe());
    (run, trace)
}

fn expect(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
    list.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn app_only_keeps_exactly_the_programs_own_calls() {
    let dir = TempDir::new("app-only");
    let exe = build(dir.path());
    let args = ["50", "0"];
    // The control: with libc and libm hooked, their calls are in the trace.
    let (_, all) = recorded(&exe, &dir, "all", &["--lib", "libc", "--lib", "libm"], &args);
    let (all_calls, all_modules) = calls(&all);
    assert!(all_modules.iter().any(|m| m.starts_with("libc.so")), "libc was not hooked: {all_modules:?}");
    assert!(all_calls.len() > 10, "{all_calls:?}");

    let (run, app) = recorded(&exe, &dir, "app", &["--lib", "libc", "--lib", "libm", "--app-only"], &args);
    let (app_calls, app_modules) = calls(&app);
    assert_eq!(app_modules, vec!["frames".to_string()], "modules in the --app-only trace");
    assert_eq!(app_calls, own_counts(&run.stderr), "the program's own calls, exactly");
    let info = fnscope_cmd(&["info", "-i", path_str(&app)]);
    let system = info.stdout.split("system code, not hooked (--app-only):").nth(1).unwrap_or("");
    for lib in ["libc.so.6", "libm.so.6"] {
        assert!(system.contains(lib), "info does not list {lib} as system code:\n{}", info.stdout);
    }
}

#[test]
fn filter_and_exclude_decide_when_hooking() {
    let dir = TempDir::new("filter");
    let exe = build(dir.path());
    let args = ["30", "0", "4:1"];
    let (run, t) = recorded(&exe, &dir, "only", &["--filter", "phys*", "--filter", "draw"], &args);
    let own = own_counts(&run.stderr);
    assert_eq!(calls(&t).0, expect(&[("physics", own["physics"]), ("draw", own["draw"])]));
    let info = fnscope_cmd(&["info", "-i", path_str(&t)]);
    assert!(info.stdout.lines().any(|l| l.trim_start().starts_with("filtered")), "{}", info.stdout);

    let (run, t) = recorded(&exe, &dir, "but", &["--exclude", "phys*"], &args);
    let mut want = own_counts(&run.stderr);
    want.remove("physics");
    assert_eq!(calls(&t).0, want);

    // Source files come from the debug information; the module pattern from the path.
    let (run, t) = recorded(&exe, &dir, "file", &["--filter", "file:*/frames.c", "--exclude", "stall"], &args);
    let mut want = own_counts(&run.stderr);
    want.remove("stall");
    assert_eq!(calls(&t).0, want);
    let (_, t) = recorded(&exe, &dir, "nofile", &["--filter", "file:*/other.c"], &args);
    assert!(calls(&t).0.is_empty());
    let (run, t) = recorded(&exe, &dir, "module", &["--filter", "@frame?", "--exclude", "@libc*"], &args);
    assert_eq!(calls(&t).0, own_counts(&run.stderr));

    let bad = fnscope_cmd(&["record", "-o", path_str(&dir.join("bad")), "--filter", "[oops", "--", path_str(&exe), "1", "0"]);
    assert!(bad.code != 0 && bad.stderr.contains("--filter \"[oops\""), "{}", bad.describe());
}

#[test]
fn min_duration_keeps_the_slow_calls_and_their_callers() {
    let dir = TempDir::new("min-duration");
    let exe = build(dir.path());
    // Two frames stall 25 and 20 ms; everything else takes microseconds.
    let (_, t) = recorded(&exe, &dir, "slow", &["--min-duration", "12ms"], &["40", "0", "5:25", "30:20"]);
    assert_eq!(calls(&t).0, expect(&[("main", 1), ("frame", 2), ("stall", 2)]));
    let stats = report(&t).unwrap();
    assert!(stats.iter().all(|f| f.min_ns >= 12_000_000), "a call under 12 ms was kept: {stats:?}");
    // The control: without the option every call is there.
    let (run, t) = recorded(&exe, &dir, "all", &[], &["40", "0", "5:25", "30:20"]);
    assert_eq!(calls(&t).0, own_counts(&run.stderr));
    let count = fnscope_cmd(&["record", "--mode", "count", "--min-duration", "1ms", "-o", path_str(&dir.join("c")), "--", path_str(&exe), "1", "0"]);
    assert!(count.code != 0 && count.stderr.contains("timing mode"), "{}", count.describe());
}

#[test]
fn depth_keeps_the_outermost_levels() {
    let dir = TempDir::new("depth");
    let exe = build(dir.path());
    let args = ["25", "0", "3:1"];
    let (_, t) = recorded(&exe, &dir, "d1", &["--depth", "1"], &args);
    assert_eq!(calls(&t).0, expect(&[("main", 1)]));
    let (_, t) = recorded(&exe, &dir, "d2", &["--depth", "2"], &args);
    assert_eq!(calls(&t).0, expect(&[("main", 1), ("frame", 25)]));
    let (run, t) = recorded(&exe, &dir, "d3", &["--depth", "3"], &args);
    assert_eq!(calls(&t).0, own_counts(&run.stderr));
}

/// `--depth` with frames left by longjmp at the depth limit: the next call at a shallower
/// level closes them and is recorded (tests/programs/jumps.c jumps out of 3 and more levels,
/// out of a signal handler, and back into a running function).
#[test]
fn depth_limit_recovers_from_longjmp() {
    let dir = TempDir::new("depth-jumps");
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let exe = dir.join("jumps");
    let status = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(programs.join("jumps.c"))
        .arg("-I")
        .arg(&programs)
        .status()
        .expect("cannot run gcc");
    assert!(status.success());
    let (run, t) = recorded(&exe, &dir, "d3", &["--depth", "3"], &[]);
    let own = own_counts(&run.stderr);
    let got = calls(&t).0;
    // Levels 0 to 2: main, then what main calls, then what those call.
    for f in ["main", "jmp_a", "jmp_b", "after_jump", "guarded", "sig_chain_1", "sig_chain_2"] {
        assert_eq!(got.get(f), own.get(f), "calls of {f} under --depth 3: {got:?}");
    }
    assert!(!got.contains_key("jmp_c") && !got.contains_key("on_sigusr1"), "level 3 recorded: {got:?}");
}

/// Snapshot folders of a flight recording, by number.
fn snapshots(trace: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(trace)
        .map(|rd| rd.filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("snapshot-")?.parse().ok()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn flight_recorder_keeps_the_slow_frame_whole() {
    let dir = TempDir::new("flight-slow");
    let exe = build(dir.path());
    // 300 frames 2 ms apart, frame 100 stalls for 50 ms; 64K per thread holds ~2,700 calls.
    let args = ["300", "2", "100:50"];
    let (run, t) = recorded(&exe, &dir, "t", &["--flight=64K", "--trigger", "frame>30ms"], &args);
    assert_eq!(snapshots(&t), vec![1], "{}", run.stderr);
    assert!(calls(&t).0.is_empty(), "flight mode wrote calls into the main trace");
    let snap = t.join("snapshot-1");
    let (c, _) = calls(&snap);
    assert_eq!(c.get("stall"), Some(&1), "{c:?}");
    let tree = fnscope_cmd(&["replay", "-i", path_str(&snap)]);
    assert_eq!(tree.code, 0, "{}", tree.describe());
    let lines: Vec<&str> = tree.stdout.lines().collect();
    let i = lines.iter().position(|l| l.contains("stall();")).expect("stall in the snapshot's tree");
    let shape: Vec<&str> = lines[i - 4..=i + 1].iter().map(|l| l.split('|').nth(1).unwrap_or("").trim()).collect();
    assert_eq!(shape, ["frame() {", "physics();", "physics();", "draw();", "stall();", "} /* frame */"], "{}", lines[i - 4..=i + 1].join("\n"));
}

#[test]
fn flight_recorder_survives_a_crash() {
    let dir = TempDir::new("flight-crash");
    let exe = build(dir.path());
    let args = ["100", "1", "crash:60"];
    let (run, t) = recorded(&exe, &dir, "t", &["--flight", "--trigger", "crash"], &args);
    assert_eq!(run.code, 128 + libc::SIGSEGV, "{}", run.describe());
    assert_eq!(snapshots(&t), vec![1], "{}", run.stderr);
    let snap = t.join("snapshot-1");
    let (c, _) = calls(&snap);
    // Frames 0..=60 ran (60 crashed in draw): every call is in the snapshot, open ones too.
    assert_eq!(c, expect(&[("main", 1), ("frame", 61), ("physics", 122), ("draw", 61)]));
    let tree = fnscope_cmd(&["replay", "-i", path_str(&snap)]);
    let tail: Vec<&str> = tree.stdout.lines().rev().take(3).map(|l| l.split('|').nth(1).unwrap_or("").trim()).collect();
    assert_eq!(tail, ["} /* main, cut off */", "} /* frame, cut off */", "draw(); /* cut off */"], "{}", tree.stdout);
}

/// Starts `fnscope record ARGS -- frames FRAMES_ARGS` in the background; returns it with the
/// program's pid once the program runs. The caller waits for it.
#[allow(clippy::zombie_processes)]
fn start_background(exe: &Path, trace: &Path, record_args: &[&str], args: &[&str]) -> (std::process::Child, u32) {
    let mut child = Command::new(fnscope())
        .arg("record")
        .args(record_args)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start fnscope record");
    let children = format!("/proc/{}/task/{}/children", child.id(), child.id());
    let t0 = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(&children).ok().and_then(|s| s.split_whitespace().next()?.parse().ok()) {
            // Past the agent's start-up: the program prints nothing before it ends, so wait
            // for its image table.
            if trace.join("images").read_dir().is_ok_and(|mut d| d.next().is_some()) {
                return (child, pid);
            }
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the program did not start within 20 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn snapshots_on_request_and_on_signal_while_the_program_goes_on() {
    let dir = TempDir::new("flight-request");
    let exe = build(dir.path());
    let trace = dir.join("t");
    let args = ["1500", "2"];
    let (child, pid) = start_background(&exe, &trace, &["--flight=1M", "--trigger", "signal:USR2", "--trigger", "exit"], &args);
    let r = fnscope_cmd(&["snapshot", &pid.to_string()]);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.stdout.trim(), path_str(&trace.join("snapshot-1")));
    let (c, _) = calls(&trace.join("snapshot-1"));
    assert!(c.get("frame").is_some_and(|&n| n > 0) && c.get("main") == Some(&1), "{c:?}");
    // Past the default gap of 1 s, the signal takes the second one.
    std::thread::sleep(Duration::from_millis(1100));
    // SAFETY: kill(2) of the traced program, which handles SIGUSR2 through the agent.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR2) }, 0);
    let t0 = Instant::now();
    while !trace.join("snapshot-2").exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no snapshot after SIGUSR2");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("fnscope record");
    let native = Invocation::new(&exe, dir.path()).args(&args).run_native();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), native.stdout);
    // The exit trigger took the third, with every frame of the end.
    assert_eq!(snapshots(&trace), vec![1, 2, 3]);
    let (c, _) = calls(&trace.join("snapshot-3"));
    assert_eq!(c.get("main"), Some(&1), "{c:?}");

    // A process that is not recorded in flight mode, and one that does not exist.
    let gone = fnscope_cmd(&["snapshot", &pid.to_string()]);
    assert!(gone.code != 0 && gone.stderr.contains("no process"), "{}", gone.describe());
    let me = fnscope_cmd(&["snapshot", &std::process::id().to_string()]);
    assert!(me.code != 0 && me.stderr.contains("not traced by fnscope"), "{}", me.describe());
}
