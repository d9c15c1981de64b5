//! End-to-end tests of `fnscope record` on small C and C++ programs (tests/programs/), built
//! here with gcc/g++.
//!
//! The oracle is the program itself: every function of interest counts its own calls and the
//! program prints the counts on stderr at the end (protocol in tests/programs/counts.h). For
//! each program the test
//!   1. builds it and runs it natively (it must behave as designed: exit code, counts),
//!   2. checks with `nm -C` that each counted name is a real function of the binary and that
//!      GCC did not clone it (calls to a `.constprop` copy would never reach the original);
//!      tests/programs/check_oracles.sh goes further and compares every count with the
//!      entries gdb sees, which also catches inlining and recursion turned into a loop,
//!   3. runs it under `fnscope record` and requires the same exit code, the same stdout and
//!      the same stderr (minus fnscope's own `fnscope:` lines),
//!   4. reads `fnscope report --json` and requires, for each counted function, the exact
//!      number of calls the program counted (or what the line's kind allows).
//!
//! Then the bad-input cases: missing, non-ELF, foreign-architecture, static and stripped
//! programs, and missing, truncated, newer and corrupt traces.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;

fn programs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs")
}

/// Compiles tests/programs/SOURCE into DIR/NAME with FLAGS (plus -pthread and the include
/// path). C++ sources (.cpp) go to g++, the rest to gcc - always GCC, not $CC: the programs
/// use GNU C (nested functions, `noclone`) and their counts were checked against GCC's code.
fn compile(source: &str, dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let compiler = if source.ends_with(".cpp") {
        "g++"
    } else {
        "gcc"
    };
    let out = dir.join(name);
    let result = Command::new(compiler)
        .args(flags)
        .arg("-pthread")
        .arg("-I")
        .arg(programs_dir())
        .arg("-o")
        .arg(&out)
        .arg(programs_dir().join(source))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        result.status.success(),
        "{compiler} {source} failed:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// Flags for most programs: optimised like a release build, with debug info (which fnscope
/// does not need, but real builds often have).
const O2: &[&str] = &["-O2", "-g"];

/// What a `counts.h` line asks of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// Hooked, exactly N calls.
    Count,
    /// Hooked, 1..=N calls.
    AtMost,
    /// Not hooked (called N times).
    Skipped,
    /// Not hooked, or hooked with exactly N calls.
    Either,
}

/// The program's own counts, summed over every line with the same kind and name (several
/// processes of one run each print theirs).
fn parse_counts(stderr: &str) -> BTreeMap<String, (Kind, u64)> {
    let mut m: BTreeMap<String, (Kind, u64)> = BTreeMap::new();
    for line in stderr.lines() {
        let Some((word, rest)) = line.split_once(' ') else {
            continue;
        };
        let kind = match word {
            "count" => Kind::Count,
            "atmost" => Kind::AtMost,
            "skipped" => Kind::Skipped,
            "either" => Kind::Either,
            _ => continue,
        };
        let (name, n) = rest
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("malformed count line {line:?}"));
        let n: u64 = n
            .parse()
            .unwrap_or_else(|_| panic!("malformed count line {line:?}"));
        let e = m.entry(name.to_string()).or_insert((kind, 0));
        assert_eq!(e.0, kind, "{name} is printed with two kinds of count line");
        e.1 += n;
    }
    m
}

/// The functions `nm -C` lists in the binary's symbol table.
fn nm_functions(exe: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-C", "--defined-only"])
        .arg(exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run nm: {e}"));
    assert!(out.status.success(), "nm {} failed", exe.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let (_addr, ty, name) = (it.next()?, it.next()?, it.next()?);
            matches!(ty, "T" | "t" | "W" | "w" | "i").then(|| name.to_string())
        })
        .collect()
}

/// The counts are only an oracle if every counted name is one real function and all its
/// calls enter it: fail loudly (as a broken test program, not a tool bug) otherwise.
fn check_oracle(exe: &Path, counts: &BTreeMap<String, (Kind, u64)>) {
    let funcs = nm_functions(exe);
    for name in counts.keys() {
        assert!(
            funcs.iter().any(|f| f == name),
            "test program {} is broken: it counts {name:?}, but `nm -C` lists no function \
             of that name",
            exe.display()
        );
        // GCC names clones NAME.constprop.0, NAME.isra.0, NAME.part.0 (C) or
        // "NAME [clone .constprop.0]" (C++). A .cold part is fine: it is not an entry.
        for f in &funcs {
            if let Some(rest) = f.strip_prefix(name.as_str()) {
                let clone = rest.starts_with('.') || rest.starts_with(" [clone .");
                assert!(
                    !clone || rest.contains("cold"),
                    "test program {} is broken: GCC made a copy {f:?} of {name:?}, so the \
                     program's own count of {name:?} is not the number of calls entering it",
                    exe.display()
                );
            }
        }
    }
}

/// Compares the report with the program's counts; returns what is wrong.
fn check_counts(
    stats: &[FnStat],
    module: &str,
    counts: &BTreeMap<String, (Kind, u64)>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, &(kind, n)) in counts {
        let (calls, entries) = calls_of(stats, module, name);
        let ok = match kind {
            Kind::Count => calls == n && (entries > 0 || n == 0),
            Kind::AtMost => entries > 0 && calls >= 1 && calls <= n,
            Kind::Skipped => calls == 0,
            Kind::Either => calls == 0 || calls == n,
        };
        if !ok {
            let what = match kind {
                Kind::Count => format!("the program counted {n} calls"),
                Kind::AtMost => format!("want 1..={n} calls (the program made {n})"),
                Kind::Skipped => format!("it must not be hooked (called {n} times)"),
                Kind::Either => format!("want 0 (not hooked) or {n} calls"),
            };
            let found = if entries == 0 {
                "not in the report (skipped, or not found?)".to_string()
            } else {
                format!(
                    "{calls} calls in {entries} report entr{}",
                    if entries == 1 { "y" } else { "ies" }
                )
            };
            problems.push(format!("{name}: {found}; {what}"));
        }
    }
    problems
}

/// One test program and how to run it.
struct Case<'a> {
    source: &'a str,
    /// File name of the built program, which is also the module name in the report.
    name: &'a str,
    flags: &'a [&'a str],
    args: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
    stdin: &'a [u8],
    /// The exit code the program has natively (128+N when it dies by signal N).
    code: i32,
    /// Options of `fnscope record`.
    record_args: &'a [&'a str],
}

impl<'a> Case<'a> {
    fn new(source: &'a str, name: &'a str) -> Case<'a> {
        Case {
            source,
            name,
            flags: O2,
            args: &[],
            env: &[],
            stdin: b"",
            code: 0,
            record_args: &[],
        }
    }
}

/// What a finished case leaves for further checks.
struct Outcome {
    /// The test's directory (program, trace), kept until the test ends.
    dir: TempDir,
    trace: PathBuf,
    native: Run,
    counts: BTreeMap<String, (Kind, u64)>,
}

/// Builds, runs natively, runs under record, and checks outputs and counts (see the top of
/// this file). Panics with every problem found at once.
fn check_case(case: &Case) -> Outcome {
    let dir = TempDir::new(case.name);
    let exe = compile(case.source, dir.path(), case.name, case.flags);
    let mut inv = Invocation::new(&exe, dir.path())
        .args(case.args)
        .stdin(case.stdin)
        .record_args(case.record_args);
    for (k, v) in case.env {
        inv = inv.env(k, v);
    }

    let native = inv.run_native();
    assert_eq!(
        native.code,
        case.code,
        "test program {} misbehaves natively (before fnscope is involved)\n{}",
        case.name,
        native.describe()
    );
    let counts = parse_counts(&native.stderr);
    assert!(
        !counts.is_empty(),
        "{} printed no counts\n{}",
        case.name,
        native.describe()
    );
    check_oracle(&exe, &counts);

    let trace = dir.join("trace");
    let traced = inv.run_recorded(&trace);
    let mut problems = compare_runs(&native, &traced);
    match report(&trace) {
        Ok(stats) => {
            problems.extend(check_counts(&stats, case.name, &counts));
            problems.extend(report_invariants(&stats));
        }
        Err(e) => problems.push(e),
    }
    if !problems.is_empty() {
        panic!(
            "{} under fnscope record:\n  - {}\n\n=== record run ===\n{}\n\n\
             === fnscope info ===\n{}",
            case.name,
            problems.join("\n  - "),
            traced.describe(),
            info(&trace)
        );
    }
    Outcome {
        dir,
        trace,
        native,
        counts,
    }
}

// ---------------------------------------------------------------------------------------
// The programs

/// Arguments (one with a space), environment, working directory (printed by the program)
/// and stdin must reach the program unchanged.
const BASIC_ARGS: &[&str] = &["alpha", "beta gamma", ""];
const BASIC_ENV: &[(&str, &str)] = &[("FNSCOPE_TEST_ENV", "value with spaces = ok")];
const BASIC_STDIN: &[u8] = b"1 2 3\n40\n";

fn basic_case<'a>(name: &'a str, flags: &'a [&'a str]) -> Case<'a> {
    Case {
        args: BASIC_ARGS,
        env: BASIC_ENV,
        stdin: BASIC_STDIN,
        flags,
        ..Case::new("basic.c", name)
    }
}

#[test]
fn basic_o2() {
    let out = check_case(&basic_case("basic", O2));
    assert!(
        out.native.stdout.contains("stdin sum 46"),
        "{}",
        out.native.stdout
    );
    let text = info(&out.trace);
    // A run that ended normally must not be reported as cut short: otherwise the check in
    // `sigkill_abrupt_end` would pass for a tool that always says so.
    assert!(
        !text.to_lowercase().contains("abrupt"),
        "normal end reported as abrupt:\n{text}"
    );
}

#[test]
fn program_defining_getenv_is_traced() {
    // -rdynamic exports the program's getenv, which then serves every getenv of the process,
    // the agent's included (bash does the same): before, the main thread recorded nothing.
    check_case(&Case { flags: &["-O2", "-g", "-rdynamic"], ..Case::new("own_libc.c", "own_getenv") });
}

#[test]
fn program_with_its_own_8_byte_aligned_malloc_is_traced() {
    // Before, the agent's start-up allocated from this malloc and crashed on a block that was
    // not 16-byte aligned.
    check_case(&Case { flags: &["-O2", "-g", "-rdynamic", "-DOWN_MALLOC"], ..Case::new("own_libc.c", "own_malloc") });
}

#[test]
fn threads_with_libc_hooked() {
    // With libc hooked, the agent's start-up ran through hooked libc functions (the main
    // thread then recorded nothing), and threads crashed at exit: libc frames of
    // start_thread were still armed when the thread's state went away.
    let out = check_case(&Case { record_args: &["--lib", "libc.so"], ..Case::new("threads.c", "threads_libc") });
    let stats = report(&out.trace).expect("report");
    let libc_calls = calls_per_module(&stats).get("libc.so.6").copied().unwrap_or(0);
    assert!(libc_calls > 0, "no libc calls recorded with --lib libc.so\n{}", info(&out.trace));
}

#[test]
fn return_address_moved_by_hand_written_code() {
    // move_ret returns from another stack pointer (as libffi's ffi_call_unix64 does): the
    // exit stub must go on, and say so.
    let out = check_case(&Case::new("moved_return.c", "moved_return"));
    let summary = fnscope_cmd(&["report", "-i", path_str(&out.trace)]);
    assert!(
        summary.stderr.contains("1000 returns matched no open call"),
        "the unmatched returns are not reported\n{}",
        summary.describe()
    );
}

/// Region files of the recorder with process id `pid` (`/dev/shm/fnscope-<pid>-<time>`).
fn region_files(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("fnscope-{pid}-");
    fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn recorder_killed_program_runs_on() {
    // Before, a program whose recorder was killed asked for buffers nobody would free again,
    // two seconds per call, and the region file stayed in /dev/shm.
    let dir = TempDir::new("recorder-killed");
    let exe = compile("busy_calls.c", dir.path(), "busy_calls", O2);
    let native = Invocation::new(&exe, dir.path()).run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let mut child = Command::new(fnscope())
        .arg("record")
        .arg("-o")
        .arg(dir.join("trace"))
        .arg("--")
        .arg(&exe)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fnscope record");
    let pid = child.id();
    let start = Instant::now();
    while region_files(pid).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "fnscope record made no region file");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().expect("kill the recorder");
    child.wait().expect("reap the recorder");
    // The program, orphaned, holds the output pipes until it ends.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let (mut o, mut e) = (String::new(), String::new());
        let _ = out.read_to_string(&mut o);
        let _ = err.read_to_string(&mut e);
        let _ = tx.send((o, e));
    });
    let (stdout, stderr) = rx
        .recv_timeout(Duration::from_secs(90))
        .expect("the program did not finish within 90 s of its recorder's death");
    assert_eq!(stdout, native.stdout, "program output changed; stderr:\n{stderr}");
    assert_eq!(program_stderr(&stderr), native.stderr);
    assert!(stderr.contains("the recorder is gone"), "the program did not say it stopped tracing:\n{stderr}");
    assert_eq!(region_files(pid), Vec::<PathBuf>::new(), "the region file was left behind");
}

#[test]
fn basic_o0() {
    // Unoptimised code: every function starts with push rbp; mov rbp, rsp.
    check_case(&basic_case("basic-O0", &["-O0", "-g"]));
}

#[test]
fn basic_cet() {
    // Every function starts with endbr64, the landing pad of indirect branch tracking.
    check_case(&basic_case(
        "basic-cet",
        &["-O2", "-g", "-fcf-protection=full"],
    ));
}

#[test]
fn basic_no_pie() {
    // A non-PIE executable: fixed addresses in the low 2 GiB, where the trampolines must be
    // placed within reach.
    check_case(&basic_case(
        "basic-nopie",
        &["-O2", "-g", "-fno-pie", "-no-pie"],
    ));
}

/// `replay --format lines` prints technique A's function.txt: one `SEQ[SEC,NSEC]enter:NAME`
/// and one `SEQ[SEC,NSEC]leave:NAME` line per call.
#[test]
fn replay_lines_match_counts() {
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let out = check_case(&basic_case("basic-replay", O2));
    let finished = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let r = fnscope_cmd(&["replay", "-i", path_str(&out.trace), "--format", "lines"]);
    assert_eq!(r.code, 0, "replay failed\n{}", r.describe());

    let mut enters: BTreeMap<String, u64> = BTreeMap::new();
    let mut stack: Vec<String> = Vec::new();
    let mut prev: Option<(u64, u64, u64)> = None;
    for (i, line) in r.stdout.lines().enumerate() {
        macro_rules! bad {
            ($why:expr) => {
                panic!("replay line {}: {}: {line:?}", i + 1, $why)
            };
        }
        let (seq, rest) = line.split_once('[').unwrap_or_else(|| bad!("no '['"));
        let (time, event) = rest.split_once(']').unwrap_or_else(|| bad!("no ']'"));
        let (sec, nsec) = time
            .split_once(',')
            .unwrap_or_else(|| bad!("no ',' in the time"));
        let seq: u64 = seq.parse().unwrap_or_else(|_| bad!("sequence number"));
        let sec: u64 = sec.parse().unwrap_or_else(|_| bad!("seconds"));
        let nsec: u64 = nsec.parse().unwrap_or_else(|_| bad!("nanoseconds"));
        if nsec >= 1_000_000_000 {
            bad!("nanoseconds out of range");
        }
        // Technique A stamps events with wall-clock time (seconds since the epoch).
        if sec + 300 < started || sec > finished + 300 {
            bad!("time is not wall-clock time of this run");
        }
        if let Some((pseq, psec, pnsec)) = prev {
            if seq != pseq + 1 {
                bad!("sequence numbers must count up by one");
            }
            if (sec, nsec) < (psec, pnsec) {
                bad!("time goes backwards in a single-threaded trace");
            }
        }
        prev = Some((seq, sec, nsec));
        if let Some(name) = event.strip_prefix("enter:") {
            *enters.entry(name.to_string()).or_insert(0) += 1;
            stack.push(name.to_string());
        } else if let Some(name) = event.strip_prefix("leave:") {
            // With return values recorded the line goes on with `ret:VALUE`, glued to the
            // name as in technique A.
            let name = name.rfind("ret:").map_or(name, |p| &name[..p]);
            match stack.pop() {
                Some(open) if open == name => {}
                other => bad!(format!("leave does not match the open call {other:?}")),
            }
        } else {
            bad!("neither enter: nor leave:");
        }
    }
    assert!(stack.is_empty(), "calls entered but never left: {stack:?}");
    for (name, (kind, n)) in &out.counts {
        if *kind == Kind::Count {
            assert_eq!(
                enters.get(name).copied().unwrap_or(0),
                *n,
                "enter:{name} lines"
            );
        }
    }
}

#[test]
fn threads() {
    check_case(&Case::new("threads.c", "threads"));
}

#[test]
fn five_thousand_short_lived_threads() {
    check_case(&Case::new("thread_churn.c", "thread_churn"));
}

#[test]
fn coroutines_switching_stacks() {
    check_case(&Case::new("coroutines.c", "coroutines"));
}

#[test]
fn three_hundred_threads_at_once() {
    check_case(&Case::new("many_threads.c", "many_threads"));
}

#[test]
fn recursion() {
    // Every level a real call; deep() nests 100000 hooked calls.
    check_case(&Case {
        flags: &["-O2", "-g", "-fno-optimize-sibling-calls"],
        ..Case::new("recursion.c", "recursion")
    });
}

#[test]
fn tail_calls() {
    // Default -O2: sibling calls become jumps.
    check_case(&Case {
        flags: &["-O2", "-g", "-foptimize-sibling-calls"],
        ..Case::new("tailcalls.c", "tailcalls")
    });
}

#[test]
fn cpp_exceptions() {
    check_case(&Case::new("exceptions.cpp", "exceptions"));
}

/// Linked with `-static-libgcc -static-libstdc++`, as programs shipped to machines without
/// the right libstdc++ often are: the program throws through its own copy of the unwinder,
/// whose symbols are local, out of `dlsym`'s sight. The unwinder met the tool's return
/// addresses and the program died in `std::terminate`.
const STATIC_UNWINDER: &[&str] = &["-O2", "-g", "-static-libgcc", "-static-libstdc++"];

#[test]
fn cpp_exceptions_through_the_programs_own_unwinder() {
    check_case(&Case {
        flags: STATIC_UNWINDER,
        ..Case::new("exceptions.cpp", "exceptions_static")
    });
}

#[test]
fn destructors_run_by_the_programs_own_unwinder() {
    check_case(&Case {
        flags: STATIC_UNWINDER,
        ..Case::new("unwind_cleanup.cpp", "unwind_cleanup_static")
    });
}

#[test]
fn cpp_exceptions_through_a_librarys_own_unwinder() {
    // A library linked with -static-libgcc -static-libstdc++ and traced with --lib throws
    // through its own copy of the unwinder, out of dlsym's sight: it met the tool's return
    // addresses and the program died in std::terminate.
    let dir = TempDir::new("own-unwinder-lib");
    let lib = dir.join("libownunw.so");
    let built = Command::new("g++")
        .args(["-O2", "-g", "-shared", "-fPIC", "-static-libgcc", "-static-libstdc++", "-I"])
        .arg(programs_dir())
        .arg("-o")
        .arg(&lib)
        .arg(programs_dir().join("own_unwinder_lib.cpp"))
        .output()
        .expect("cannot run g++");
    assert!(built.status.success(), "g++ failed: {}", String::from_utf8_lossy(&built.stderr));
    let exe = dir.join("own_unwinder_main");
    let built = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(programs_dir().join("own_unwinder_main.c"))
        .arg(format!("-L{}", dir.path().display()))
        .arg("-lownunw")
        .arg(format!("-Wl,-rpath,{}", dir.path().display()))
        .output()
        .expect("cannot run gcc");
    assert!(built.status.success(), "gcc failed: {}", String::from_utf8_lossy(&built.stderr));
    let inv = Invocation::new(&exe, dir.path()).record_args(&["--lib", "libownunw"]);
    let native = inv.run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let counts = parse_counts(&native.stderr);
    assert_eq!(counts.len(), 4, "{}", native.describe());
    let trace = dir.join("trace");
    let traced = inv.run_recorded(&trace);
    let mut problems = compare_runs(&native, &traced);
    match report(&trace) {
        Ok(stats) => {
            problems.extend(check_counts(&stats, "libownunw.so", &counts));
            problems.extend(report_invariants(&stats));
        }
        Err(e) => problems.push(e),
    }
    assert!(problems.is_empty(), "  - {}\n{}", problems.join("\n  - "), traced.describe());
}

#[test]
fn backtraces_see_every_frame() {
    // glibc's backtrace() through hooked frames: it used to stop at the first one (2 frames
    // instead of 7), and the program's output changed with it. -rdynamic names the frames.
    let out = check_case(&Case {
        flags: &["-O2", "-g", "-rdynamic"],
        ..Case::new("backtrace.cpp", "backtrace")
    });
    // The frames are re-armed once each walk is over: only walk() and its two callers, which
    // return before the next hooked entry, end late; main's end is exact.
    let late = unwound_calls(&out.trace);
    assert_eq!(late.iter().filter(|n| n.as_str() != "main").count(), 9, "{late:?}");
    assert!(!late.iter().any(|n| n == "main"), "main's end is late: {late:?}");
}

#[test]
fn backtraces_from_signals_that_land_anywhere() {
    // The handler's walk and the re-arming after it, with the signal cutting the tool's
    // entry and exit code short: the returns must all go where they should.
    check_case(&Case::new("backtrace_async.c", "backtrace_async"));
}

#[test]
fn a_function_that_loops_back_to_its_entry_is_left_alone() {
    // loop_to_entry.c: spin jumps back to its own first byte 200,000 times. Hooked, every turn
    // entered spin again: in timing mode nested calls until the shadow stack was full (65,535
    // spin calls, the work calls past them dropped without a word), in count mode 200,001 spin
    // calls. It is skipped; work's calls are all there, in both modes.
    let dir = TempDir::new("loop-to-entry");
    let prog = compile("loop_to_entry.c", dir.path(), "loop_to_entry", &["-O2"]);
    for mode in ["time", "count"] {
        let trace = dir.join(mode);
        let r = fnscope_cmd(&["record", "--mode", mode, "-o", path_str(&trace), "--", path_str(&prog), "200000"]);
        assert_eq!((r.code, r.signal), (0, None), "{mode}: {}", r.describe());
        // main and work's 200,000: nothing more, nothing lost.
        assert_eq!(summary_counts(&r.stderr), (200_001, 0), "{mode}: {}", r.describe());
        if mode == "time" {
            let stats = report(&trace).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(calls_of(&stats, "loop_to_entry", "work").0, 200_000);
        }
    }
    let funcs = fnscope_cmd(&["funcs", path_str(&prog)]);
    let line = funcs.stdout.lines().find(|l| l.contains(" spin ")).unwrap_or_else(|| panic!("{}", funcs.describe()));
    assert!(line.contains("branch-into-patch") && line.contains("back to the entry"), "{line}");
}

#[test]
fn rearming_after_a_walk_spares_frames_in_a_stub() {
    // rearm_race.c single-steps through fnscope's exit and entry stubs and, with untraced
    // handlers, walks the stack where re-arming a frame would send its return astray (into
    // the exit stub again, or with the exit stub saved as its return address): both crashed
    // before re-arming asked for proof that the frame runs its own code.
    let dir = TempDir::new("rearm-race");
    let source = fs::read_to_string(programs_dir().join("rearm_race.c")).unwrap();
    let prog = compile_c_text(dir.path(), "rearm_race", &source);
    for mode in ["exit", "entry"] {
        let trace = dir.join(mode);
        let r = fnscope_cmd(&["record", "--exclude", "on_trap", "--exclude", "on_usr2", "-o", path_str(&trace), "--", path_str(&prog), mode]);
        assert_eq!((r.code, r.signal), (0, None), "{mode}: {}", r.describe());
        assert!(
            r.stdout.contains("phase 2 "),
            "{mode}: the handlers did not meet the stub instructions they look for (did the stubs change?)\n{}",
            r.describe()
        );
    }
}

#[test]
fn traced_handlers_after_every_instruction_leave_calls_intact() {
    // stepping_handlers.c single-steps through its calls of f, fnscope's stubs included, with
    // a traced SIGTRAP handler that calls hooked functions at each step. Right after an entry
    // stub reserved its shadow entry, the handler's first call took it for a gone frame (its
    // slot word was the one that call had left there a step earlier) and removed it under the
    // stub: f's return address was lost. Both kinds of stubs: plain, and with values recorded.
    let dir = TempDir::new("stepping-handlers");
    let prog = compile("stepping_handlers.c", dir.path(), "stepping_handlers", &["-O2", "-g"]);
    let values: &[&str] = &["-A", "f@arg1", "-A", "g@arg1", "-R", "g", "-A", "on_trap@arg1"];
    for (mode, extra) in [("plain", &[][..]), ("values", values)] {
        let trace = dir.join(mode);
        let mut args = vec!["record", "-o", path_str(&trace)];
        args.extend_from_slice(extra);
        args.extend(["--", path_str(&prog)]);
        let r = fnscope_cmd(&args);
        assert_eq!((r.code, r.signal), (0, None), "{mode}: {}", r.describe());
        assert!(
            r.stdout.contains("covered 1 1 "),
            "{mode}: the handler did not land where the stubs reserve and release entries (did the stubs change?)\n{}",
            r.describe()
        );
        let counts = parse_counts(&r.stderr);
        assert!(counts.get("on_trap").is_some_and(|&(_, n)| n > 100), "{mode}: too few steps: {counts:?}");
        let stats = report(&trace).unwrap_or_else(|e| panic!("{mode}: {e}"));
        let mut problems = check_counts(&stats, "stepping_handlers", &counts);
        problems.extend(report_invariants(&stats));
        let late = unwound_calls(&trace);
        if !late.is_empty() {
            problems.push(format!("calls that did not return: {late:?}"));
        }
        assert!(problems.is_empty(), "{mode}:\n  - {}\n{}", problems.join("\n  - "), r.describe());
    }
}

#[test]
fn backtraces_from_signal_handlers() {
    // backtrace() in a handler on the same stack, on a signal stack, and in a SIGSEGV handler
    // that ends the process: the walks see every frame, and the interrupted calls get their
    // exit stub back once each walk is over (their ends are exact).
    let out = check_case(&Case {
        flags: &["-O2", "-g", "-rdynamic"],
        code: 7,
        ..Case::new("backtrace_signal.c", "backtrace_signal")
    });
    let late = unwound_calls(&out.trace);
    let count = |name: &str| late.iter().filter(|n| n.as_str() == name).count();
    // note_walk returns before the next hooked entry, in all 10 walks. After a walk on the
    // signal stack, the frames are re-armed only once the thread runs on its own stack
    // again, when the interrupted calls have returned: in those 6 rounds they end late.
    // inner, interrupted by the signal (inside raise), is never re-armed: no call out of its
    // own code proves it is not in the middle of fnscope's entry or exit code. The crash
    // handler's walk is the last thing the process does, so the calls open then end with it.
    assert_eq!(count("note_walk"), 10, "{late:?}");
    for (name, n) in [("only_walk", 3), ("on_usr1", 3), ("outer", 6), ("middle", 6), ("inner", 9), ("handler_work", 0), ("between", 0)] {
        assert_eq!(count(name), n, "{name}: {late:?}");
    }
    // The handlers' calls on the signal stack are gone once main runs again: the calls
    // after them are main's, not theirs.
    let depths = replay_depths(&out.trace, "between");
    assert!(depths.len() == 450 && depths.iter().all(|&d| d == 1), "{depths:?}");
}

#[test]
fn backtraces_by_the_programs_own_unwinder_see_every_frame() {
    let out = check_case(&Case {
        flags: &["-O2", "-g", "-rdynamic", "-static-libgcc", "-static-libstdc++"],
        ..Case::new("backtrace.cpp", "backtrace_static")
    });
    // Its own _Unwind_Backtrace walks first each time: the frames are re-armed after it too.
    let late = unwound_calls(&out.trace);
    assert!(!late.iter().any(|n| n == "main"), "main's end is late: {late:?}");
}

/// The nesting depth of every call of `name` in `fnscope replay`'s tree (0 = outermost).
fn replay_depths(trace: &Path, name: &str) -> Vec<usize> {
    let r = fnscope_cmd(&["replay", "-i", path_str(trace)]);
    assert_eq!(r.code, 0, "replay failed\n{}", r.describe());
    r.stdout
        .lines()
        .filter_map(|l| {
            let tree = l.split_once("| ")?.1;
            let text = tree.trim_start();
            let opens = text.starts_with(&format!("{name}() {{")) || text.starts_with(&format!("{name}();"));
            opens.then(|| (tree.len() - text.len()) / 2)
        })
        .collect()
}

#[test]
fn longjmp_and_siglongjmp() {
    let out = check_case(&Case::new("jumps.c", "jumps"));
    // main's loop calls jmp_a and after_jump at the same level each time; before, a call made
    // after a longjmp nested inside the frames the jump had left.
    assert_eq!(replay_depths(&out.trace, "jmp_a").len(), 200);
    for name in ["jmp_a", "after_jump"] {
        let depths = replay_depths(&out.trace, name);
        assert!(depths.iter().all(|&d| d == 1), "{name} is not always a child of main: depths {depths:?}");
    }
}

#[test]
fn destructors_during_unwinding_sit_in_their_frame() {
    let out = check_case(&Case::new("unwind_cleanup.cpp", "unwind_cleanup"));
    // main > catcher > thrower(3) > ... > thrower(0): throwers at depths 2..=5, and each
    // cleanup one level below the thrower whose destructor ran it.
    let mut throwers = replay_depths(&out.trace, "thrower");
    let mut cleanups = replay_depths(&out.trace, "cleanup");
    throwers.sort();
    cleanups.sort();
    assert_eq!(throwers.iter().map(|d| d + 1).collect::<Vec<_>>(), cleanups, "thrower and cleanup depths");
    assert_eq!(cleanups.iter().filter(|&&d| d == 6).count(), 10, "{cleanups:?}");
}

#[test]
fn exec_with_an_environment_of_its_own_is_followed() {
    // posix_spawn and execve with environments lacking LD_PRELOAD: before, the new programs
    // ran untraced. main and before_exec are open when the first image execs: they end with
    // the exec (before, they were lost), and before the new image's calls.
    let out = check_case(&Case::new("exec_env.c", "exec_env"));
    let r = fnscope_cmd(&["replay", "-i", path_str(&out.trace), "--format", "lines"]);
    assert_eq!(r.code, 0, "{}", r.describe());
    let pos = |what: &str| r.stdout.lines().position(|l| l.ends_with(what)).unwrap_or_else(|| panic!("no {what:?} in\n{}", r.stdout));
    assert!(pos("leave:before_exec") < pos("enter:final_work"), "the pre-exec call comes after the new image's calls:\n{}", r.stdout);
}

#[test]
fn no_follow_exec_traces_only_the_first_program() {
    let dir = TempDir::new("no-follow");
    let exe = compile("exec_env.c", dir.path(), "exec_env", O2);
    let inv = Invocation::new(&exe, dir.path()).record_args(&["--no-follow-exec"]);
    let native = inv.run_native();
    let trace = dir.join("trace");
    let traced = inv.run_recorded(&trace);
    let problems = compare_runs(&native, &traced);
    assert!(problems.is_empty(), "{problems:?}\n{}", traced.describe());
    let stats = report(&trace).expect("report");
    // The first image's calls (before_exec, ended by the exec) are in; the spawned and the
    // exec'd images are not traced at all.
    assert_eq!(calls_of(&stats, "exec_env", "before_exec").0, 1);
    assert_eq!(calls_of(&stats, "exec_env", "main").0, 1, "only the first image's main");
    assert_eq!(calls_of(&stats, "exec_env", "child_work").0, 0);
    assert_eq!(calls_of(&stats, "exec_env", "final_work").0, 0);
}

#[test]
fn fork_after_posix_spawn_with_libc_hooked() {
    // posix_spawn's child runs on a stack of its own with its parent's thread pointer: its
    // hooked libc calls left entries whose slots were unmapped once it exec'd, and every child
    // forked later crashed on them.
    check_case(&Case { record_args: &["--lib", "libc.so"], ..Case::new("spawn_fork.c", "spawn_fork") });
}

#[test]
fn fork_after_siglongjmp_out_of_a_handler_on_the_signal_stack() {
    // With libc traced, raise's entry (left by the jump) stayed under the handler's entries
    // on the signal stack, whose slots still held the exit stub; the child put raise's return
    // address into the slot it shares with fork's, returned from fork() after the raise and
    // ran the parent's code again.
    check_case(&Case { record_args: &["--lib", "libc.so"], ..Case::new("siglongjmp_fork.c", "siglongjmp_fork") });
}

#[test]
fn the_agents_own_libc_calls_are_not_the_programs() {
    // With libc traced, the agent's own memset, memcpy and dlsym were recorded as the
    // program's calls (14 memsets too many in timing mode, 6 memcpys in count mode), and with
    // values recorded (-R) the exit stub's slow path called a hooked memset, whose exit took
    // the same path again: the program spun at exit.
    let dir = TempDir::new("libc_calls");
    let exe = compile("libc_calls.c", dir.path(), "libc_calls", &["-O2", "-g", "-Wl,-z,now"]);
    let (sets, copies) = (1000, 700);
    let inv = Invocation::new(&exe, dir.path()).args(&[sets.to_string(), copies.to_string()]);
    let native = inv.run_native();
    assert_eq!(native.code, 0, "libc_calls misbehaves natively\n{}", native.describe());
    let modes: [(&str, &[&str]); 3] = [
        ("time", &["--lib", "libc.so"]),
        ("count", &["--mode", "count", "--lib", "libc.so"]),
        ("values", &["-A", "*", "-R", "*", "--lib", "libc.so"]),
    ];
    let mut problems = Vec::new();
    for (label, record_args) in modes {
        let trace = dir.join(label);
        let traced = inv.clone().record_args(record_args).run_recorded(&trace);
        problems.extend(compare_runs(&native, &traced).into_iter().map(|p| format!("{label}: {p}")));
        let stats = counted(&trace);
        // glibc names its implementations by CPU (`__memset_avx2_unaligned_erms`); memcpy's
        // may carry memmove's name (one address, both symbols).
        let calls = |names: &[&str]| -> u64 {
            stats.iter().filter(|f| f.module == "libc.so.6" && names.iter().any(|n| f.name.contains(n))).map(|f| f.calls).sum()
        };
        for (what, names, want) in [("memset", &["memset"][..], sets), ("memcpy", &["memcpy", "memmove"][..], copies)] {
            let got = calls(names);
            if got != want {
                problems.push(format!("{label}: {got} calls of {what}, the program made {want}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn copies_made_by_clone_and_raw_fork_syscalls() {
    // The agent's fork hooks did not run for them: the children found their thread's state
    // in shared memory they do not inherit and died at their first hooked call.
    let out = check_case(&Case::new("raw_fork.c", "raw_fork"));
    check_count_mode(&out, "raw_fork");
}

#[test]
fn fork_from_a_thread_that_then_ends_in_the_child() {
    check_case(&Case::new("fork_thread.c", "fork_thread"));
}

#[test]
fn call_open_at_fork_is_the_parents() {
    // spawner is running when the process forks: one call in both modes (before, timing mode
    // recorded it in the parent and again in the child).
    let out = check_case(&Case::new("fork_open.c", "fork_open"));
    check_count_mode(&out, "fork_open");
}

/// Records the program of a finished case again in count mode (no arguments): the same
/// output and exit code as natively, and the counts the program printed.
fn check_count_mode(out: &Outcome, name: &str) {
    let trace = out.dir.path().join("count");
    let run = Invocation::new(out.dir.path().join(name), out.dir.path()).record_args(&["--mode", "count"]).run_recorded(&trace);
    let problems = compare_runs(&out.native, &run);
    assert!(problems.is_empty(), "count mode: {problems:?}\n{}", run.describe());
    let stats = counted(&trace);
    for (function, &(_, n)) in &out.counts {
        let calls: u64 = stats.iter().filter(|f| f.module == name && f.name == *function).map(|f| f.calls).sum();
        assert_eq!(calls, n, "count mode: calls of {function}");
    }
}

#[test]
fn handlers_that_swap_chunks_while_a_stub_holds_a_record_slot() {
    // stepping_swaps.c single-steps through 300 calls of loopfn; its SIGTRAP handler takes
    // turns at filling chunks while an exit stub holds record slots it has reserved but not
    // written: right before the reservation and right after (so that the slots run past the
    // chunk's end and a new chunk is taken under the stub), right after only (the slots lie
    // in the chunk handed over), and after the stub's checks, two chunks (the chunk holding
    // the slots goes to the recorder before the stub writes them). The stubs checked the
    // slots against the new chunk's end alone: with values recorded the program crashed, or
    // calls were lost and another chunk's header overwritten. In timing mode it was killed:
    // the chunk swaps, stepped through, blocked the trap signal. The recorder took a chunk
    // with slots still to be written, and read their zeros as calls.
    let dir = TempDir::new("stepping-swaps");
    let prog = compile("stepping_swaps.c", dir.path(), "stepping_swaps", &["-O2", "-g"]);
    let calls = 300;
    let modes: [(&str, &[&str]); 4] = [
        ("timing", &[]),
        ("values of loopfn", &["-A", "loopfn", "-R", "loopfn"]),
        ("every value", &["-A", "*", "-R", "*"]),
        ("count", &["--mode", "count"]),
    ];
    for (mode, extra) in modes {
        let trace = dir.join(mode.replace(' ', "-"));
        // The handler's own record would take the room it leaves.
        let mut args = vec!["record", "--exclude", "on_trap", "-o", path_str(&trace)];
        args.extend_from_slice(extra);
        let n = calls.to_string();
        args.extend(["--", path_str(&prog), &n]);
        let r = fnscope_cmd(&args);
        assert_eq!((r.code, r.signal), (0, None), "{mode}: {}", r.describe());
        let counts = parse_counts(&r.stderr);
        if mode == "count" {
            let stats = counted(&trace);
            for (function, &(kind, n)) in &counts {
                let calls: u64 = stats.iter().filter(|f| f.module == "stepping_swaps" && f.name == *function).map(|f| f.calls).sum();
                assert_eq!(calls, if kind == Kind::Skipped { 0 } else { n }, "count mode: calls of {function}");
            }
            continue;
        }
        // Each way of getting in the way met the stubs at least once a call in three.
        let met: Vec<u64> = r.stdout.split_whitespace().collect::<Vec<_>>().chunks(2).take(3).filter_map(|w| w.get(1)?.parse().ok()).collect();
        assert!(
            met.len() == 3 && met.iter().all(|&m| m >= calls / 3),
            "{mode}: the handler did not meet the exit stubs' reservations as often as it should (did the stubs change?)\n{}",
            r.describe()
        );
        let stats = report(&trace).unwrap_or_else(|e| panic!("{mode}: {e}"));
        let mut problems = check_counts(&stats, "stepping_swaps", &counts);
        problems.extend(report_invariants(&stats));
        if !info(&trace).contains("records lost:     0\n") {
            problems.push(format!("records lost:\n{}", info(&trace)));
        }
        if !extra.is_empty() {
            // Every call's own values, once each, in order: `loopfn(i) = v;` or, around the
            // handler's calls, `loopfn(i) {` ... `} = v /* loopfn */`.
            let replay = fnscope_cmd(&["replay", "-i", path_str(&trace)]);
            let (mut args, mut rets) = (Vec::new(), Vec::new());
            for line in replay.stdout.lines() {
                if let Some((_, rest)) = line.split_once("loopfn(") {
                    args.push(rest.split(')').next().unwrap_or("").to_string());
                }
                let ret = line.split_once("/* loopfn */").map(|(head, _)| head).or_else(|| line.contains("loopfn(").then_some(line));
                if let Some((_, v)) = ret.and_then(|l| l.rsplit_once(" = ")) {
                    rets.push(v.trim_end_matches([';', ' ']).to_string());
                }
            }
            let want_args: Vec<String> = (0..calls).map(|i| i.to_string()).collect();
            let want_rets: Vec<String> = (0..calls).map(|i| (7 * i).to_string()).collect();
            if args != want_args || rets != want_rets {
                problems.push(format!(
                    "the calls of loopfn in the replay are not loopfn(i) = 7i for i in 0..{calls}: arguments {:?}..., values {:?}...",
                    &args[..args.len().min(5)],
                    &rets[..rets.len().min(5)]
                ));
            }
        }
        assert!(problems.is_empty(), "{mode}:\n  - {}\n{}", problems.join("\n  - "), r.describe());
    }
}

#[test]
fn signal_handlers() {
    check_case(&Case::new("signals.c", "signals"));
}

#[test]
fn fork_children() {
    check_case(&Case {
        code: 3,
        ..Case::new("fork.c", "fork")
    });
}

#[test]
fn exec_vfork_posix_spawn() {
    check_case(&Case {
        code: 4,
        ..Case::new("exec_self.c", "exec_self")
    });
}

#[test]
fn pthread_exit_from_deep() {
    check_case(&Case::new("pthread_exit.c", "pthread_exit"));
}

#[test]
fn exit_from_deep() {
    check_case(&Case {
        code: 5,
        ..Case::new("exit_deep.c", "exit_deep")
    });
}

#[test]
fn abort_from_deep() {
    // SIGABRT: 128 + 6.
    check_case(&Case {
        code: 134,
        ..Case::new("abort.c", "abort")
    });
}

#[test]
fn crash_from_deep() {
    // SIGSEGV: 128 + 11. The calls running at the crash are closed by the recorder from the
    // shadow stack in shared memory (before, they were lost).
    let out = check_case(&Case { code: 139, ..Case::new("crash.c", "crash") });
    let r = fnscope_cmd(&["replay", "-i", path_str(&out.trace)]);
    for line in ["inner(); /* cut off */", "} /* middle, cut off */", "} /* outer, cut off */"] {
        assert!(r.stdout.contains(line), "no {line:?} in the replay:\n{}", r.stdout);
    }
}

#[test]
fn sigkill_abrupt_end() {
    // SIGKILL: 128 + 9. The calls made before it are in the trace (checked by check_case);
    // the reader must also say that the trace did not end normally.
    let out = check_case(&Case {
        code: 137,
        ..Case::new("sigkill.c", "sigkill")
    });
    let text = info(&out.trace);
    assert!(
        text.to_lowercase().contains("abrupt"),
        "`fnscope info` does not say that the trace ended abruptly:\n{text}"
    );
    // die (counted by the program) and main were running when the process died: the
    // recorder closed them from the shared shadow stack (before, they were lost).
    let r = fnscope_cmd(&["replay", "-i", path_str(&out.trace)]);
    assert!(r.stdout.contains("die(); /* cut off */"), "die is not recorded as cut off:\n{}", r.stdout);
    assert!(r.stdout.contains("} /* main, cut off */"), "main is not recorded as cut off:\n{}", r.stdout);
}

#[test]
fn unhookable_heads_and_relocated_prologues() {
    let out = check_case(&Case::new("asm_heads.c", "asm_heads"));
    // The skipped functions are reported by reason, with the codes of fnscope_abi::skip_reason:
    // the 1-byte short_ret is too short for any form; the others (branch-into-patch by the
    // 5-byte rule) are hooked through islands in a neighbour's moved bytes.
    let text = info(&out.trace);
    assert!(text.contains("too-short"), "`fnscope info` does not list reason too-short:\n{text}");
    assert!(!text.contains("branch-into-patch"), "{text}");
}

#[test]
fn return_values() {
    check_case(&Case::new("retvals.c", "retvals"));
}

#[test]
fn arguments_varargs_static_chain() {
    check_case(&Case::new("args.c", "args"));
}

#[test]
fn registers_preserved() {
    check_case(&Case::new("registers.c", "registers"));
}

#[test]
fn cpp_virtual_and_templates() {
    check_case(&Case::new("cpp_virtual.cpp", "cpp_virtual"));
}

/// A signal sent to `fnscope record` reaches the traced program: it handles SIGTERM and
/// exits normally, and record exits with its status.
#[test]
fn signals_pass_through_record() {
    let dir = TempDir::new("sigterm");
    let exe = compile("sigterm_wait.c", dir.path(), "sigterm_wait", O2);
    let trace = dir.join("trace");

    // Starts the command, waits for "ready", sends SIGTERM to the process we started
    // (the program natively, fnscope under record), and collects the rest.
    let run_and_signal = |mut cmd: Command| -> Run {
        cmd.current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        let pid = child.id() as i32;
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut stderr = child.stderr.take().unwrap();
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
            s
        });
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        assert_eq!(first, "ready\n", "no ready line from {cmd:?}");
        // SAFETY: signalling the child we started and have not waited for yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        // The program gives up by itself after 30 s (alarm), so this wait is bounded.
        let start = Instant::now();
        let status = child.wait().unwrap();
        assert!(start.elapsed() < Duration::from_secs(60));
        use std::os::unix::process::ExitStatusExt;
        Run {
            code: status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            signal: status.signal(),
            stdout: first + &rest,
            stderr: err_reader.join().unwrap(),
        }
    };

    let native = run_and_signal(Command::new(&exe));
    assert_eq!(native.code, 0, "natively:\n{}", native.describe());
    assert!(
        native.stdout.contains("got signal 15"),
        "{}",
        native.describe()
    );

    let mut cmd = Command::new(fnscope());
    cmd.arg("record").arg("-o").arg(&trace).arg("--").arg(&exe);
    let traced = run_and_signal(cmd);
    let mut problems = compare_runs(&native, &traced);
    let counts = parse_counts(&native.stderr);
    match report(&trace) {
        Ok(s) => problems.extend(check_counts(&s, "sigterm_wait", &counts)),
        Err(e) => problems.push(e),
    }
    assert!(
        problems.is_empty(),
        "{}\n{}",
        problems.join("\n"),
        traced.describe()
    );
}

// ---------------------------------------------------------------------------------------
// Bad input

#[test]
fn missing_program_is_a_one_line_error() {
    let dir = TempDir::new("missing");
    let prog = dir.join("no-such-program");
    let r = Invocation::new(&prog, dir.path()).run_recorded(&dir.join("trace"));
    let line = assert_one_line_error(&r, "record of a missing program");
    assert!(
        line.contains(path_str(&prog)),
        "the error does not name the program: {line}"
    );
}

#[test]
fn non_elf_program_is_a_one_line_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("notelf");
    // Executable, but neither ELF nor a script with #!: execve refuses it (ENOEXEC).
    let prog = dir.join("notelf");
    fs::write(&prog, "echo this is not a program\n").unwrap();
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).unwrap();
    let r = Invocation::new(&prog, dir.path()).run_recorded(&dir.join("trace"));
    let line = assert_one_line_error(&r, "record of a text file");
    assert!(
        line.contains(path_str(&prog)),
        "the error does not name the program: {line}"
    );
    assert!(
        line.to_lowercase().contains("elf"),
        "the error does not say it is not ELF: {line}"
    );
}

#[test]
fn foreign_architecture_is_a_one_line_error() {
    let dir = TempDir::new("foreign");
    let exe = compile("basic.c", dir.path(), "basic", O2);
    // e_machine (offset 18, u16) = 183, EM_AARCH64: a valid ELF header for another CPU.
    let mut bytes = fs::read(&exe).unwrap();
    bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
    let prog = dir.join("aarch64-prog");
    fs::write(&prog, &bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).unwrap();
    let r = Invocation::new(&prog, dir.path()).run_recorded(&dir.join("trace"));
    let line = assert_one_line_error(&r, "record of an aarch64 ELF");
    let l = line.to_lowercase();
    assert!(
        ["x86-64", "x86_64", "aarch64", "architecture", "machine"]
            .iter()
            .any(|w| l.contains(w)),
        "the error does not say the architecture is wrong: {line}"
    );
}

/// A static executable cannot take the preloaded agent. fnscope may refuse it or run it
/// untraced, but must say why ("static") and, if it runs it, not change it.
#[test]
fn static_program_is_explained() {
    let dir = TempDir::new("static");
    let exe = compile(
        "basic.c",
        dir.path(),
        "basic-static",
        &["-O2", "-g", "-static"],
    );
    let inv = Invocation::new(&exe, dir.path())
        .args(BASIC_ARGS)
        .stdin(BASIC_STDIN);
    let native = inv.run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let r = inv.run_recorded(&dir.join("trace"));
    assert!(
        r.code != 101 && !r.stderr.contains("panicked"),
        "fnscope panicked\n{}",
        r.describe()
    );
    let said: String = fnscope_lines(&r.stderr).join("\n");
    assert!(
        said.to_lowercase().contains("static"),
        "fnscope does not say the program is static\n{}",
        r.describe()
    );
    if r.code == 0 {
        let problems = compare_runs(&native, &r);
        assert!(
            problems.is_empty(),
            "{}\n{}",
            problems.join("\n"),
            r.describe()
        );
    } else {
        assert_one_line_error(&r, "record of a static program");
    }
}

/// Without .symtab the functions are found through .eh_frame (and .dynsym) and named
/// sub_<address>; they are still hooked and counted.
#[test]
fn stripped_program_still_records() {
    let dir = TempDir::new("stripped");
    let exe = compile("basic.c", dir.path(), "basic", O2);
    let native = Invocation::new(&exe, dir.path())
        .args(BASIC_ARGS)
        .stdin(BASIC_STDIN)
        .run_native();
    let counts = parse_counts(&native.stderr);

    let stripped = dir.join("basic-stripped");
    fs::copy(&exe, &stripped).unwrap();
    let st = Command::new("strip")
        .arg("--strip-all")
        .arg(&stripped)
        .status()
        .expect("strip");
    assert!(st.success());
    assert!(
        nm_functions(&stripped).is_empty(),
        "strip left a symbol table"
    );

    let inv = Invocation::new(&stripped, dir.path())
        .args(BASIC_ARGS)
        .stdin(BASIC_STDIN);
    let native = inv.run_native();
    let trace = dir.join("trace");
    let traced = inv.run_recorded(&trace);
    let mut problems = compare_runs(&native, &traced);
    match report(&trace) {
        Ok(stats) => {
            let mine: Vec<&FnStat> = stats
                .iter()
                .filter(|f| f.module == "basic-stripped")
                .collect();
            if mine.iter().map(|f| f.calls).sum::<u64>() == 0 {
                problems.push("no calls recorded in basic-stripped".to_string());
            }
            // Names are gone, but each counted function is still one function with the
            // same number of calls.
            for (name, (kind, n)) in &counts {
                if *kind == Kind::Count && !mine.iter().any(|f| f.calls == *n) {
                    problems.push(format!("no function with {n} calls (that is {name})"));
                }
            }
            problems.extend(report_invariants(&stats));
        }
        Err(e) => problems.push(e),
    }
    assert!(
        problems.is_empty(),
        "{}\n{}\n=== info ===\n{}",
        problems.join("\n"),
        traced.describe(),
        info(&trace)
    );
}

#[test]
fn report_on_missing_trace_is_a_one_line_error() {
    let dir = TempDir::new("notrace");
    let missing = dir.join("no-trace-here");
    for args in [
        vec!["report", "-i", path_str(&missing), "--json"],
        vec!["info", "-i", path_str(&missing)],
        vec!["replay", "-i", path_str(&missing), "--format", "lines"],
    ] {
        let r = fnscope_cmd(&args);
        let line = assert_one_line_error(&r, &args.join(" "));
        assert!(
            line.contains(path_str(&missing)),
            "the error does not name the path: {line}"
        );
    }
}

/// Records basic.c once, for the tests that damage traces.
fn recorded_basic(tag: &str) -> (TempDir, PathBuf, Vec<FnStat>) {
    let dir = TempDir::new(tag);
    let exe = compile("basic.c", dir.path(), "basic", O2);
    let trace = dir.join("trace");
    let r = Invocation::new(&exe, dir.path()).run_recorded(&trace);
    assert_eq!(r.code, 0, "{}", r.describe());
    let stats = report(&trace).unwrap_or_else(|e| panic!("{e}"));
    (dir, trace, stats)
}

/// A trace cut short (disk full, recorder killed) reads up to its last complete chunk, or
/// gives an error; never a panic, never more calls than were recorded.
#[test]
fn truncated_trace_never_panics() {
    let (dir, trace, full) = recorded_basic("truncated");
    let len = fs::metadata(trace.join("trace.fns")).unwrap().len();
    let mut cuts = vec![len - 1, len.saturating_sub(100), len / 2, 64, 16, 12, 9, 0];
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts.into_iter().filter(|&c| c < len) {
        let copy = dir.join(format!("cut-{cut}"));
        copy_dir(&trace, &copy);
        let f = fs::OpenOptions::new()
            .write(true)
            .open(copy.join("trace.fns"))
            .unwrap();
        f.set_len(cut).unwrap();
        let r = fnscope_cmd(&["report", "-i", path_str(&copy), "--json"]);
        assert!(
            r.code != 101 && !r.stderr.contains("panicked"),
            "report panicked on a trace cut to {cut} of {len} bytes\n{}",
            r.describe()
        );
        if r.code == 0 {
            let stats = parse_report(&r.stdout).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
            for f in &stats {
                let whole = full
                    .iter()
                    .filter(|g| g.name == f.name && g.module == f.module)
                    .map(|g| g.calls)
                    .sum::<u64>();
                assert!(
                    f.calls <= whole,
                    "cut to {cut} bytes: {} has {} calls, the whole trace only {whole}",
                    f.name,
                    f.calls
                );
            }
        } else {
            assert_one_line_error(&r, &format!("report on a trace cut to {cut} bytes"));
        }
        for args in [
            vec!["info", "-i", path_str(&copy)],
            vec!["replay", "-i", path_str(&copy)],
        ] {
            let r = fnscope_cmd(&args);
            assert!(
                r.code != 101 && !r.stderr.contains("panicked"),
                "{} panicked on a trace cut to {cut} bytes\n{}",
                args[0],
                r.describe()
            );
        }
    }
}

/// The header is the 8-byte magic `FNSCOPE\0` then the format version (u32, little-endian):
/// a trace from a newer fnscope is refused with a message that says so.
#[test]
fn newer_trace_version_is_refused() {
    let (_dir, trace, _) = recorded_basic("newer");
    let file = trace.join("trace.fns");
    let mut bytes = fs::read(&file).unwrap();
    assert_eq!(
        &bytes[..8],
        b"FNSCOPE\0",
        "trace.fns does not start with the documented magic"
    );
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    fs::write(&file, &bytes).unwrap();
    for args in [
        vec!["report", "-i", path_str(&trace), "--json"],
        vec!["info", "-i", path_str(&trace)],
        vec!["replay", "-i", path_str(&trace), "--format", "lines"],
    ] {
        let r = fnscope_cmd(&args);
        let line = assert_one_line_error(&r, &format!("{} on a version 99 trace", args[0]));
        assert!(
            line.to_lowercase().contains("newer"),
            "the error does not say newer: {line}"
        );
    }
}

/// Random damage inside the trace (bit rot, a bad copy) gives errors or warnings, never a
/// panic. The damage is pseudo-random but the same on every run.
#[test]
fn corrupt_trace_never_panics() {
    let (dir, trace, _) = recorded_basic("corrupt");
    let original = fs::read(trace.join("trace.fns")).unwrap();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for trial in 0..12 {
        let copy = dir.join(format!("corrupt-{trial}"));
        copy_dir(&trace, &copy);
        let mut bytes = original.clone();
        // Keep magic and version intact so the damage reaches the chunk reader.
        let flips = 1 + trial * 3;
        for _ in 0..flips {
            let at = 12 + (next() as usize) % (bytes.len() - 12);
            bytes[at] ^= 1 << (next() % 8);
        }
        fs::write(copy.join("trace.fns"), &bytes).unwrap();
        for args in [
            vec!["report", "-i", path_str(&copy), "--json"],
            vec!["info", "-i", path_str(&copy)],
            vec!["replay", "-i", path_str(&copy), "--format", "lines"],
        ] {
            let r = fnscope_cmd(&args);
            assert!(
                r.code != 101 && !r.stderr.contains("panicked"),
                "{} panicked on a trace with {flips} flipped bits (trial {trial})\n{}",
                args[0],
                r.describe()
            );
            if args[0] == "report" && r.code == 0 {
                parse_report(&r.stdout).unwrap_or_else(|e| panic!("trial {trial}: {e}"));
            }
        }
    }
}

#[test]
fn a_program_that_turns_the_time_stamp_counter_off() {
    // Timing mode reads the counter at every hooked call: the program dies of SIGSEGV at the
    // next one, and the agent says why first. Count mode does not read it.
    let dir = TempDir::new("tsc_off");
    let exe = compile_c_text(
        dir.path(),
        "tsc_off",
        "#include <stdio.h>\n#include <sys/prctl.h>\n\
         int work(int x) { return x * 3 + 1; }\n\
         int main(void)\n{\n    if (prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0) != 0)\n        return 2;\n\
             int s = 0;\n    for (int i = 0; i < 100; i++)\n        s = work(s) % 1000;\n    printf(\"%d\\n\", s);\n    return 0;\n}\n",
    );
    let inv = Invocation::new(&exe, dir.path());
    let native = inv.run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let counted_run = inv.clone().record_args(&["--mode", "count"]).run_recorded(&dir.join("count"));
    let problems = compare_runs(&native, &counted_run);
    assert!(problems.is_empty(), "count mode: {problems:?}\n{}", counted_run.describe());
    let work: u64 = counted(&dir.join("count")).iter().filter(|f| f.name == "work").map(|f| f.calls).sum();
    assert_eq!(work, 100);
    let timed = inv.run_recorded(&dir.join("time"));
    assert!(
        timed.stderr.contains("turns the time-stamp counter off") && timed.stderr.contains("--mode count"),
        "timing mode must say why the program dies\n{}",
        timed.describe()
    );
}

/// A program built with AddressSanitizer runs traced as natively. ASan ends a program whose
/// first library loaded is not its runtime, and `LD_PRELOAD` loads fnscope's agent first: the
/// recorder turns that check off (`ASAN_OPTIONS`). The calls are recorded, and a heap overflow
/// is reported as natively: the same stacks of the access and the allocation, the same exit
/// code.
#[test]
fn address_sanitizer_programs_run_traced() {
    let dir = TempDir::new("asan");
    let src = dir.join("asan.c");
    fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\n\
         __attribute__((noinline)) int f(int x) { return x * 2 + 1; }\n\
         __attribute__((noinline)) int bad(int n) { int *p = malloc(4 * sizeof(int)); int r = p[n]; free(p); return r; }\n\
         int main(int argc, char **argv) { long s = 0; for (int i = 0; i < 1000; i++) s += f(i);\n\
         printf(\"%ld\\n\", s); fflush(stdout); return argc > 1 ? bad(argc + 2) : 0; }\n",
    )
    .unwrap();
    let exe = dir.join("asan");
    let built = Command::new("gcc").args(["-O1", "-g", "-fsanitize=address", "-o"]).arg(&exe).arg(&src).output().expect("run gcc");
    assert!(built.status.success(), "gcc -fsanitize=address failed (libasan is part of gcc):\n{}", String::from_utf8_lossy(&built.stderr));
    // The report's stack lines without their addresses, which differ from run to run.
    let stacks = |stderr: &str| -> Vec<String> {
        stderr.lines().filter(|l| l.trim_start().starts_with('#')).map(|l| l.split_whitespace().filter(|w| !w.starts_with("0x")).collect::<Vec<_>>().join(" ")).collect()
    };
    for args in [vec![], vec!["overflow".to_string()]] {
        let inv = Invocation { args: args.clone(), ..Invocation::new(&exe, dir.path()) };
        let native = inv.run_native();
        let trace = dir.join(format!("t{}", args.len()));
        let traced = inv.run_recorded(&trace);
        assert_eq!((traced.code, &traced.stdout), (native.code, &native.stdout), "{args:?}: {}", traced.describe());
        assert_eq!(native.stdout, "1000000\n");
        assert_eq!(stacks(&program_stderr(&traced.stderr)), stacks(&native.stderr), "{args:?}");
        assert_eq!(calls_of(&report(&trace).unwrap(), "asan", "f").0, 1000, "{args:?}");
    }
    let overflow = Invocation { args: vec!["overflow".into()], ..Invocation::new(&exe, dir.path()) }.run_native();
    assert!(overflow.code != 0 && overflow.stderr.contains("heap-buffer-overflow") && stacks(&overflow.stderr).len() >= 4, "{}", overflow.describe());
}
