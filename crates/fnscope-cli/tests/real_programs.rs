//! Programs nobody here wrote, as the distribution ships them (stripped, dynamically linked),
//! must run under `fnscope record` exactly as they run natively, and the trace must hold
//! calls of them.
//!
//! A missing program skips its test with a printed reason on a developer machine, but fails
//! it when CI is set: CI must not pass by testing nothing.
//!
//! Run with `--nocapture` to see `fnscope info` for each (functions hooked and skipped by
//! reason).

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;

/// The program at `path`, or None (after saying why) when it is not installed.
fn require(path: Option<PathBuf>, what: &str) -> Option<PathBuf> {
    match path {
        Some(p) if is_executable(&p) => Some(p),
        _ => {
            assert!(
                !in_ci(),
                "{what} is not installed, and CI is set: install it (see .ci/run) instead of \
                 skipping this test"
            );
            eprintln!("SKIPPED: {what} is not installed");
            None
        }
    }
}

/// An environment that does not depend on the user running the tests.
fn quiet_env(inv: Invocation, home: &Path) -> Invocation {
    inv.env("HOME", path_str(home))
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Test Author")
        .env("GIT_AUTHOR_EMAIL", "author@example.com")
        .env("GIT_AUTHOR_DATE", "2024-01-02T03:04:05Z")
        .env("GIT_COMMITTER_NAME", "Test Committer")
        .env("GIT_COMMITTER_EMAIL", "committer@example.com")
        .env("GIT_COMMITTER_DATE", "2024-01-02T03:04:05Z")
}

/// Runs `inv` natively and under record (trace in `trace`) and checks: same exit code and
/// output, a readable report, and calls recorded in the program's own module. Returns the
/// native run.
fn same_under_record(inv: &Invocation, trace: &Path) -> Run {
    let native = inv.run_native();
    let traced = inv.run_recorded(trace);
    let mut problems = compare_runs(&native, &traced);
    let module = inv
        .program
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let mut calls = 0;
    match report(trace) {
        Ok(stats) => {
            problems.extend(report_invariants(&stats));
            calls = calls_per_module(&stats).get(&module).copied().unwrap_or(0);
            if calls == 0 {
                problems.push(format!(
                    "no calls of {module} in the report; modules: {:?}",
                    calls_per_module(&stats)
                ));
            }
        }
        Err(e) => problems.push(e),
    }
    let info_text = info(trace);
    assert!(
        problems.is_empty(),
        "{:?} {:?}:\n  - {}\n=== record run ===\n{}\n=== info ===\n{info_text}",
        inv.program,
        inv.args,
        problems.join("\n  - "),
        traced.describe()
    );
    eprintln!(
        "\n=== {} {:?}: {calls} calls of {module}\n{info_text}",
        inv.program.display(),
        inv.args
    );
    native
}

#[test]
fn python3_threads_and_fork_with_libc_hooked_in_both_modes() {
    // In count mode, the fork hook of the parent took the thread's counters for a thread
    // state, and python3 (whose counter there is not 0) crashed after os.fork().
    let Some(python) = require(Some(PathBuf::from("/usr/bin/python3.11")), "/usr/bin/python3.11") else {
        return;
    };
    let dir = TempDir::new("python-fork");
    let script = "import os, threading\n\
                  out = [0] * 4\n\
                  def work(k): out[k] = sum(i * i for i in range(20000 * (k + 1)))\n\
                  ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]\n\
                  [t.start() for t in ts]; [t.join() for t in ts]\n\
                  pid = os.fork()\n\
                  if pid == 0: os._exit(7)\n\
                  print(sum(out), os.waitpid(pid, 0)[1] >> 8)\n";
    let want: u64 = (1..=4u64).map(|k| (0..20000 * k).map(|i| i * i).sum::<u64>()).sum();
    for mode in ["time", "count"] {
        let inv = quiet_env(Invocation::new(&python, dir.path()), dir.path())
            .args(&["-c", script])
            .record_args(&["--mode", mode, "--lib", "libc.so"]);
        let native = inv.run_native();
        assert_eq!(native.stdout, format!("{want} 7\n"), "{}", native.describe());
        let trace = dir.join(format!("trace-{mode}"));
        let traced = inv.run_recorded(&trace);
        let problems = compare_runs(&native, &traced);
        assert!(problems.is_empty(), "{mode} mode: {problems:?}\n{}", traced.describe());
        let libc: u64 = counted(&trace).iter().filter(|f| f.module == "libc.so.6").map(|f| f.calls).sum();
        assert!(libc > 0, "{mode} mode: no libc calls\n{}", info(&trace));
    }
}

#[test]
fn python3_script() {
    // Debian's interpreter explicitly: the python3 on PATH may be another build (pyenv).
    let Some(python) = require(
        Some(PathBuf::from("/usr/bin/python3.11")),
        "/usr/bin/python3.11",
    ) else {
        return;
    };
    let dir = TempDir::new("python");
    let inv = quiet_env(Invocation::new(&python, dir.path()), dir.path())
        .args(&["-c", "print(sum(i*i for i in range(1000)))"]);
    let native = same_under_record(&inv, &dir.join("trace"));
    // The sum of i*i for i < 1000, computed here rather than trusted from the output.
    let want: u64 = (0..1000u64).map(|i| i * i).sum();
    assert_eq!(native.stdout, format!("{want}\n"));
}

#[test]
fn git_version_init_commit_log() {
    let Some(git) = require(find_in_path("git"), "git") else {
        return;
    };
    let dir = TempDir::new("git");
    // The same sequence natively (in native/) and under record (in traced/): with fixed
    // names and dates the commit ids, and so all outputs, are the same.
    for side in ["native", "traced"] {
        fs::create_dir_all(dir.join(side).join("repo")).unwrap();
        fs::write(dir.join(side).join("repo/hello.txt"), "hello, fnscope\n").unwrap();
    }
    let steps: &[&[&str]] = &[
        &["--version"],
        &["init", "-q", "repo"],
        &["-C", "repo", "add", "hello.txt"],
        &["-C", "repo", "commit", "-q", "-m", "first commit"],
        &[
            "-C",
            "repo",
            "log",
            "--format=%H %an <%ae> %ad %s",
            "--date=iso-strict",
        ],
        &["-C", "repo", "status", "--short", "--branch"],
    ];
    for (i, args) in steps.iter().enumerate() {
        // Each side has its own directory, so the two halves are run here rather than by
        // same_under_record (one directory for both).
        let native_inv =
            quiet_env(Invocation::new(&git, dir.join("native")), dir.path()).args(args);
        let traced_inv =
            quiet_env(Invocation::new(&git, dir.join("traced")), dir.path()).args(args);
        let trace = dir.join(format!("trace-{i}"));
        let native = native_inv.run_native();
        assert_eq!(
            native.code,
            0,
            "git {args:?} natively\n{}",
            native.describe()
        );
        let traced = traced_inv.run_recorded(&trace);
        let mut problems = compare_runs(&native, &traced);
        match report(&trace) {
            Ok(stats) => {
                problems.extend(report_invariants(&stats));
                if calls_per_module(&stats).get("git").copied().unwrap_or(0) == 0 {
                    problems.push("no calls of git in the report".to_string());
                }
            }
            Err(e) => problems.push(e),
        }
        let info_text = info(&trace);
        assert!(
            problems.is_empty(),
            "git {args:?}:\n  - {}\n=== record run ===\n{}\n=== info ===\n{info_text}",
            problems.join("\n  - "),
            traced.describe()
        );
        eprintln!("\n=== git {args:?}\n{info_text}");
    }
}

#[test]
fn sqlite3_memory_and_file() {
    let Some(sqlite) = require(find_in_path("sqlite3"), "sqlite3") else {
        return;
    };
    let dir = TempDir::new("sqlite");
    let inv = quiet_env(Invocation::new(&sqlite, dir.path()), dir.path())
        .args(&[":memory:", "select 1+1;"]);
    let native = same_under_record(&inv, &dir.join("trace-memory"));
    assert_eq!(native.stdout, "2\n");

    // A database file: created, filled and queried natively in one directory and under
    // record in another.
    let script = "create table t(x integer primary key, y text);\
                  insert into t(y) values ('a'),('bb'),('ccc');\
                  select count(*), sum(length(y)) from t;\
                  select x, upper(y) from t order by x desc;";
    let mut outputs = Vec::new();
    for (side, record) in [("native", false), ("traced", true)] {
        let sub = dir.join(side);
        fs::create_dir_all(&sub).unwrap();
        let inv =
            quiet_env(Invocation::new(&sqlite, &sub), dir.path()).args(&["db.sqlite", script]);
        let run = if record {
            let trace = dir.join("trace-file");
            let r = inv.run_recorded(&trace);
            let stats = report(&trace).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                calls_per_module(&stats)
                    .get("sqlite3")
                    .copied()
                    .unwrap_or(0)
                    > 0,
                "no calls of sqlite3 recorded\n{}",
                info(&trace)
            );
            r
        } else {
            inv.run_native()
        };
        outputs.push(run);
    }
    let problems = compare_runs(&outputs[0], &outputs[1]);
    assert!(
        problems.is_empty(),
        "{}\n{}",
        problems.join("\n"),
        outputs[1].describe()
    );
    assert_eq!(outputs[0].stdout, "3|6\n3|CCC\n2|BB\n1|A\n");
}

#[test]
fn rust_program_built_with_cargo() {
    // tests/programs/rust_app: threads, trait objects, recursion and panics caught with
    // catch_unwind (so the unwinder walks through hooked Rust frames), built in release mode.
    let dir = TempDir::new("rust");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/rust_app/Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let built = std::process::Command::new(cargo)
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(dir.join("target"))
        .status()
        .expect("cannot run cargo");
    assert!(built.success(), "building tests/programs/rust_app failed");
    let program = dir.join("target/release/rust_app");
    let inv = Invocation::new(&program, dir.path());
    let native = same_under_record(&inv, &dir.join("trace"));
    assert!(native.stdout.contains("panics caught 2, sum 36"), "{}", native.stdout);
    let stats = report(&dir.join("trace")).expect("report");
    // The program counts its own calls: fib exactly, area over both implementations.
    let own = |name: &str| -> u64 {
        native
            .stderr
            .lines()
            .find_map(|l| l.strip_prefix(&format!("count {name} ")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("the program did not print its count of {name}"))
    };
    assert_eq!(calls_of(&stats, "rust_app", "rust_app::fib").0, own("rust_app::fib"));
    let area = calls_of(&stats, "rust_app", "<rust_app::Square as rust_app::Shape>::area").0
        + calls_of(&stats, "rust_app", "<rust_app::Circle as rust_app::Shape>::area").0;
    assert_eq!(area, own("area"));
    assert_eq!(calls_of(&stats, "rust_app", "rust_app::may_panic").0, 8);
    // The two panics leave may_panic and the panic machinery's frames, which end late (as
    // unwound); the catch in main gives main its exit hook back, so its end is exact.
    let late = unwound_calls(&dir.join("trace"));
    assert_eq!(late.iter().filter(|n| *n == "rust_app::may_panic").count(), 2, "{late:?}");
    assert!(!late.iter().any(|n| n.contains("main") || n.contains("lang_start")), "{late:?}");
}

#[test]
fn bash_loop_records_its_calls() {
    // Debian's bash defines getenv itself: before, the agent's start-up ran bash's (hooked)
    // copy and the main thread recorded nothing at all.
    let Some(bash) = require(Some(PathBuf::from("/bin/bash")), "/bin/bash") else {
        return;
    };
    let dir = TempDir::new("bash");
    let inv = quiet_env(Invocation::new(&bash, dir.path()), dir.path())
        .args(&["-c", "f() { :; }; for i in $(seq 20000); do f; done; echo done"]);
    let native = same_under_record(&inv, &dir.join("trace"));
    assert_eq!(native.stdout, "done\n");
    let stats = report(&dir.join("trace")).expect("report");
    // Each call of f is one command bash executes.
    let executed = calls_of(&stats, "bash", "execute_command").0;
    assert!(executed >= 20_000, "execute_command ran {executed} times, want at least 20000\n{}", info(&dir.join("trace")));
}

#[test]
fn compiler_code_patched_in_one_copy() {
    // cc1plus has 21 MiB of code with 42,000 functions hooked: that mapping is patched in a
    // private copy (in huge pages) that then takes its place, instead of a page at a time.
    // Either way (the agent's choice, or forced by FNSCOPE_PATCH), the object the compiler
    // writes must be the one it writes natively, byte for byte.
    let Some(gxx) = require(find_in_path("g++"), "g++") else {
        return;
    };
    let dir = TempDir::new("cc1plus");
    let src = dir.join("v.cc");
    fs::write(&src, "#include <vector>\nint sum(const std::vector<int>& v) { int s = 0; for (int x : v) s += x; return s; }\n").unwrap();
    let compile = |obj: &str| quiet_env(Invocation::new(&gxx, dir.path()), dir.path()).args(&["-O2", "-c", "v.cc", "-o", obj]);
    let native = compile("native.o").run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let want = fs::read(dir.join("native.o")).unwrap();
    // Whether the kernel hands this process (and so the compiler) 2 MiB transparent huge
    // pages decides the agent's choice.
    let setting = |file: &str| fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{file}")).unwrap_or_default();
    let on = |s: &str| s.contains("[always]") || s.contains("[madvise]");
    let (all, per_size) = (setting("enabled"), setting("hugepages-2048kB/enabled"));
    let allowed = fs::read_to_string("/proc/self/status").unwrap_or_default().lines().all(|l| l != "THP_enabled:\t0");
    let huge = allowed && if per_size.contains("[inherit]") || per_size.is_empty() { on(&all) } else { on(&per_size) };
    let thp = format!("enabled {all:?}, 2 MiB {per_size:?}, this process {allowed}");
    for (patching, copied) in [("", huge), ("copy", true), ("in-place", false)] {
        let obj = format!("traced-{patching}.o");
        let trace = dir.join(format!("trace-{patching}"));
        let traced = compile(&obj).env("FNSCOPE_PATCH", patching).record_args(&["-v"]).run_recorded(&trace);
        assert_eq!(traced.code, 0, "FNSCOPE_PATCH={patching}: {}", traced.describe());
        assert!(fs::read(dir.join(&obj)).unwrap() == want, "FNSCOPE_PATCH={patching}: the traced compiler wrote another object");
        let stats = report(&trace).expect("report");
        let calls = calls_per_module(&stats).get("cc1plus").copied().unwrap_or(0);
        assert!(calls > 100_000, "FNSCOPE_PATCH={patching}: {calls} calls of cc1plus recorded\n{}", traced.describe());
        // The copy made, or the one an earlier run kept (the same bytes) mapped.
        let note = traced.stderr.lines().any(|l| {
            l.contains("cc1plus: code at") && (l.contains("patched in a copy that took its place") || l.contains("patched by mapping the copy kept by an earlier run"))
        });
        assert_eq!(note, copied, "FNSCOPE_PATCH={patching}, transparent huge pages {thp:?}\n{}", traced.describe());
    }
}

#[test]
fn node_script() {
    // node remaps its code onto huge pages, leaving gaps between the pieces: patches grouped
    // across a gap failed, and 0 calls were recorded while the summary said 73,697 hooked.
    // Its V8 builtins have no call frame information and V8 walks their frames: they must
    // not get a changed return address (it aborted in its stack walker).
    let Some(node) = require(find_in_path("node"), "node") else {
        return;
    };
    let dir = TempDir::new("node");
    let script = "let s = 0; for (let i = 0; i < 100000; i++) s += i; \
                  const m = new Map(); for (let i = 0; i < 1000; i++) m.set('k' + i, i); \
                  console.log(s, m.size, JSON.stringify({a: [1, 2, 3]}));";
    let inv = quiet_env(Invocation::new(&node, dir.path()), dir.path()).args(&["-e", script]);
    let native = same_under_record(&inv, &dir.join("trace"));
    assert_eq!(native.stdout, "4999950000 1000 {\"a\":[1,2,3]}\n");
    let text = info(&dir.join("trace"));
    assert!(!text.contains("patch-failed"), "some patches failed:\n{text}");
    // Count mode hooked V8's embedded builtins, which V8 copies next to its code range when
    // it starts (short builtin calls): the copies' jumps to fnscope led into unmapped memory,
    // and node crashed in one run of two.
    let count = inv.clone().record_args(&["--mode", "count"]);
    let trace = dir.join("trace-count");
    let traced = count.run_recorded(&trace);
    let problems = compare_runs(&native, &traced);
    assert!(problems.is_empty(), "count mode: {problems:?}\n{}", traced.describe());
    let stats = counted(&trace);
    assert!(stats.len() > 100, "count mode counted few functions: {stats:?}");
    let builtins: Vec<&str> = stats.iter().map(|f| f.name.as_str()).filter(|n| n.starts_with("Builtins_")).collect();
    assert!(builtins.is_empty(), "V8's embedded builtins were hooked in count mode: {builtins:?}");
}

/// The `python3.11 -m test` verdict line (`== Tests result: SUCCESS ==`).
fn regrtest_outcome(stdout: &str) -> String {
    stdout
        .lines()
        .find(|l| l.contains("Tests result:"))
        .map(|l| l.trim().to_string())
        .unwrap_or_else(|| panic!("no \"Tests result:\" line in:\n{}", clip(stdout)))
}

/// Runs Python's own test modules natively and under `record RECORD_ARGS`: same verdict, same
/// exit code, and calls of the hooked library recorded.
fn python_tests_pass_traced(tag: &str, record_args: &[&str], modules: &[&str]) {
    let Some(python) = require(Some(PathBuf::from("/usr/bin/python3.11")), "/usr/bin/python3.11") else {
        return;
    };
    let has_tests = Path::new("/usr/lib/python3.11/test").join(modules[0]).exists()
        || Path::new("/usr/lib/python3.11/test").join(format!("{}.py", modules[0])).exists();
    assert!(has_tests, "Python's test suite is not installed: install libpython3.11-testsuite (.ci/run does)");
    let dir = TempDir::new(tag);
    // test_signal's stress test counts signals received while handlers are swapped in a
    // loop, and on a busy two-core machine it fails natively now and then ("0 not greater
    // than 0"): a verdict that says nothing about fnscope.
    let mut args = vec!["-m", "test", "-i", "test_stress_modifying_handlers"];
    args.extend_from_slice(modules);
    // The four modules of the libc case take about a minute natively; traced, on a loaded
    // two-core machine, several.
    let inv = quiet_env(Invocation::new(&python, dir.path()), dir.path())
        .args(&args)
        .record_args(record_args)
        .timeout(std::time::Duration::from_secs(900));
    let native = inv.run_native();
    let trace = dir.join("trace");
    let traced = inv.run_recorded(&trace);
    assert_eq!(
        regrtest_outcome(&traced.stdout),
        regrtest_outcome(&native.stdout),
        "python3.11 -m test {modules:?} under record {record_args:?}\n=== native ===\n{}\n=== traced ===\n{}",
        native.describe(),
        traced.describe()
    );
    assert_eq!(traced.code, native.code, "{}", traced.describe());
    let stats = report(&trace).expect("report");
    let lib = record_args[1];
    let calls: u64 = calls_per_module(&stats).iter().filter(|(m, _)| m.contains(lib)).map(|(_, n)| n).sum();
    assert!(calls > 0, "no calls of {lib} recorded\n{}", info(&trace));
}

#[test]
fn python_test_suites_with_libc_hooked() {
    // Threads that end, fork, exec and signals, with the C library itself hooked.
    python_tests_pass_traced(
        "py-libc",
        &["--lib", "libc.so"],
        &["test_threading", "test_os", "test_subprocess", "test_signal"],
    );
}

#[test]
fn python_ctypes_with_libffi_hooked() {
    // libffi's ffi_call_unix64 returns from another stack pointer than it was entered with.
    python_tests_pass_traced("py-ffi", &["--lib", "libffi"], &["test_ctypes"]);
}

#[test]
fn java_with_libjvm() {
    // HotSpot walks its own native stacks and crashed (frame::sender) on return addresses
    // changed by timing mode: libjvm is refused there, with the reason and the alternative,
    // and count mode counts its calls.
    let (Some(java), Some(javac)) = (require(find_in_path("java"), "java"), require(find_in_path("javac"), "javac")) else {
        return;
    };
    let dir = TempDir::new("java");
    fs::write(
        dir.join("Hello.java"),
        "public class Hello {\n\
           static long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }\n\
           public static void main(String[] a) throws Exception {\n\
             Thread t = new Thread(() -> System.out.println(\"thread \" + fib(20)));\n\
             t.start(); t.join();\n\
             System.out.println(\"fib \" + fib(25));\n\
           }\n\
         }\n",
    )
    .unwrap();
    let built = std::process::Command::new(&javac).arg("Hello.java").current_dir(dir.path()).status().expect("javac");
    assert!(built.success(), "javac failed");
    for mode in ["time", "count"] {
        let inv = quiet_env(Invocation::new(&java, dir.path()), dir.path())
            .args(&["-cp", ".", "Hello"])
            .record_args(&["--lib", "libjvm", "--mode", mode]);
        let native = inv.run_native();
        assert_eq!(native.stdout, "thread 6765\nfib 75025\n", "{}", native.describe());
        let trace = dir.join(format!("trace-{mode}"));
        let traced = inv.run_recorded(&trace);
        let problems = compare_runs(&native, &traced);
        assert!(problems.is_empty(), "{mode} mode: {problems:?}\n{}", traced.describe());
        if mode == "time" {
            assert!(
                traced.stderr.contains("not hooking") && traced.stderr.contains("--mode count"),
                "timing mode must say why libjvm is not hooked\n{}",
                traced.describe()
            );
        } else {
            let r = fnscope_cmd(&["report", "-i", path_str(&trace), "--json"]);
            let json: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}\n{}", r.describe()));
            let counted: u64 = json
                .as_array()
                .expect("a JSON array")
                .iter()
                .filter(|f| f["module"] == "libjvm.so")
                .map(|f| f["calls"].as_u64().unwrap_or(0))
                .sum();
            assert!(counted > 0, "no libjvm calls counted\n{}", info(&trace));
        }
    }
}
