//! Arguments, return values and injections (`record -A`, `-R`, `--args auto`, `--inject`),
//! on tests/programs/values.c, whose functions print their own arguments and return values
//! in fnscope's notation (`CALL name(args) = ret`): those lines are the oracle.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn build(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/values.c");
    let exe = dir.join("values");
    let st = Command::new("gcc").args(["-O1", "-g", "-o"]).arg(&exe).arg(&src).status().expect("cannot run gcc");
    assert!(st.success(), "gcc values.c failed");
    exe
}

/// Records `exe` with `opts`; checks the program's output and exit status are those of a
/// native run, and returns the program's output.
fn record(dir: &Path, trace: &str, opts: &[&str], exe: &Path) -> (PathBuf, String) {
    let out = dir.join(trace);
    let mut cmd = Command::new(fnscope());
    cmd.arg("record").arg("-o").arg(&out).args(opts).arg("--").arg(exe);
    let r = run(&mut cmd, b"", Duration::from_secs(120));
    assert_eq!(r.code, 0, "record failed: {}", clip(&r.stderr));
    (out, r.stdout)
}

fn replay(trace: &Path, format: &str) -> String {
    let r = fnscope_cmd(&["replay", "-i", path_str(trace), "--format", format]);
    assert_eq!(r.code, 0, "replay: {}", clip(&r.stderr));
    r.stdout
}

/// `name(args) = ret` of each call in a replay tree.
fn replayed_calls(tree: &str) -> Vec<String> {
    tree.lines()
        .filter_map(|l| l.split_once("| ").map(|(_, c)| c.trim()))
        .filter_map(|c| c.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

fn oracle(stdout: &str, names: &[&str]) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .filter(|c| names.iter().any(|n| c.starts_with(&format!("{n}("))))
        .map(str::to_string)
        .collect()
}

const SPECS: [&str; 12] = [
    "-A", "add3@arg1/i32,arg2/i32,arg3/i32", "-R", "add3@i32",
    "-A", "widths@arg1/i8,arg2/u8,arg3/i16,arg4/u16,arg5/i32,arg6/u64", "-R", "widths@i64",
    "-A", "slen@arg1/s", "-R", "slen@u64",
];

#[test]
fn values_are_those_the_functions_print() {
    let dir = TempDir::new("values-exact");
    let exe = build(dir.path());
    let native = run(&mut Command::new(&exe), b"", Duration::from_secs(30));
    let mut opts: Vec<&str> = SPECS.to_vec();
    opts.extend(["-A", "scale@fparg1/f64,fparg2/f32", "-R", "scale@f64", "-A", "many@arg1,arg2,arg3,arg4,arg5,arg6,arg7,arg8", "-R", "many", "-A", "mkpt@arg1/i32,arg2/i32", "-R", "mkpt@{rax/i32:x,rax+4/i32:y}"]);
    let (trace, out) = record(dir.path(), "t", &opts, &exe);
    assert_eq!(out, native.stdout, "tracing changed the program's output");
    let want = oracle(&out, &["add3", "widths", "slen", "scale", "many", "mkpt"]);
    assert_eq!(want.len(), 12, "the program printed: {out}");
    let got = replayed_calls(&replay(&trace, "tree"));
    assert_eq!(got.iter().filter(|c| !c.starts_with("limit")).cloned().collect::<Vec<_>>(), want);
}

#[test]
fn dwarf_gives_what_an_explicit_spec_gives() {
    let dir = TempDir::new("values-dwarf");
    let exe = build(dir.path());
    let (explicit, out) = record(dir.path(), "explicit", &SPECS, &exe);
    let (dwarf, _) = record(dir.path(), "dwarf", &["-A", "add3", "-R", "add3", "-A", "widths", "-R", "widths", "-A", "slen", "-R", "slen"], &exe);
    let (auto, _) = record(dir.path(), "auto", &["--args", "auto"], &exe);
    let calls = |t: &Path| replayed_calls(&replay(t, "tree")).into_iter().filter(|c| ["add3(", "widths(", "slen("].iter().any(|p| c.starts_with(p))).collect::<Vec<_>>();
    let want = oracle(&out, &["add3", "widths", "slen"]);
    assert_eq!(calls(&explicit), want);
    assert_eq!(calls(&dwarf), want);
    assert_eq!(calls(&auto), want);
    // DWARF knows the struct's fields and that `scale` returns a double.
    let all = replayed_calls(&replay(&auto, "tree"));
    assert!(all.contains(&"mkpt(3, -4) = {x=3, y=-4}".to_string()), "{all:?}");
    assert!(all.contains(&"scale(-0.25, 8) = -2".to_string()), "{all:?}");
}

#[test]
fn lines_format_is_technique_a() {
    let dir = TempDir::new("values-lines");
    let exe = build(dir.path());
    let (trace, _) = record(dir.path(), "t", &["-A", "add3@arg1/i32,arg2/i32,arg3/i32", "-R", "add3", "-R", "main@void"], &exe);
    let lines = replay(&trace, "lines");
    let shape = |l: &str, tail: &str| -> bool {
        let Some((head, rest)) = l.split_once('[') else { return false };
        let Some((clock, event)) = rest.split_once(']') else { return false };
        let Some((sec, ns)) = clock.split_once(',') else { return false };
        head.parse::<u64>().is_ok() && sec.parse::<u64>().is_ok() && ns.len() <= 9 && ns.parse::<u64>().is_ok() && event == tail
    };
    assert!(lines.lines().any(|l| shape(l, "enter:add3args:(1, -2, 300)")), "{lines}");
    assert!(lines.lines().any(|l| shape(l, "leave:add3ret:299")), "{lines}");
    // `void` on main: replay shows no value, the line still carries the raw rax (0, main's
    // return value), as technique A prints it for every function.
    assert!(lines.lines().any(|l| shape(l, "leave:mainret:0")), "{lines}");
    let tree = replay(&trace, "tree");
    assert!(tree.lines().any(|l| l.ends_with("} /* main */")), "{tree}");
}

#[test]
fn injections_change_calls_and_are_recorded() {
    let dir = TempDir::new("values-inject");
    let exe = build(dir.path());
    let (trace, out) = record(
        dir.path(),
        "t",
        &["--lib", "libc.so", "--filter", "main", "--filter", "open", "--filter", "limit", "--inject", "open=ret:-1,errno:ENOENT,when:nth=2", "--inject", "limit@arg1=21", "-R", "limit"],
        &exe,
    );
    assert!(out.contains("OPEN 0 ok\nOPEN 1 failed: No such file or directory\nOPEN 2 ok\n"), "{out}");
    assert!(out.contains("CALL limit(21) = 42\nlimit returned 42\n"), "{out}");
    let tree = replay(&trace, "tree");
    let injected: Vec<&str> = tree.lines().filter(|l| l.contains("/* injected: ")).collect();
    assert_eq!(injected.len(), 2, "{tree}");
    assert!(injected[0].contains("open();"), "{tree}");
    assert!(injected[0].contains("injected: open=ret:-1,errno:2,when:nth=2"), "{tree}");
    assert!(injected[1].contains("limit() = 42;") && injected[1].contains("injected: limit@arg1=21"), "{tree}");
    let info = info(&trace);
    assert!(info.contains("injection:        open=ret:-1,errno:2,when:nth=2: 1 calls changed"), "{info}");
    assert!(info.contains("injection:        limit@arg1=21: 1 calls changed"), "{info}");
}

#[test]
fn report_groups_calls_by_a_value() {
    let dir = TempDir::new("values-by");
    let exe = build(dir.path());
    let (trace, _) = record(dir.path(), "t", &["-A", "slen@arg1/s", "-R", "slen@u64"], &exe);
    let rows = |opts: &[&str]| -> Vec<(u64, String)> {
        let mut args = vec!["report", "-i", path_str(&trace)];
        args.extend(opts);
        let r = fnscope_cmd(&args);
        assert_eq!(r.code, 0, "{}", clip(&r.stderr));
        let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
        let mut rows: Vec<(u64, String)> = v.as_array().expect("array").iter().map(|g| (g["calls"].as_u64().unwrap(), g["value"].as_str().unwrap().to_string())).collect();
        rows.sort();
        rows
    };
    // slen is called with six different strings, and returns 0 twice (NULL, a bad pointer).
    let by_arg = rows(&["--by-arg", "1", "--json"]);
    assert_eq!(by_arg.len(), 6, "{by_arg:?}");
    assert!(by_arg.iter().all(|(n, _)| *n == 1) && by_arg.iter().any(|(_, v)| v == "\"abc\""), "{by_arg:?}");
    let by_ret = rows(&["--by-ret", "--json"]);
    assert_eq!(by_ret, [(1, "12".to_string()), (1, "3".to_string()), (1, "64".to_string()), (1, "69".to_string()), (2, "0".to_string())]);
}

#[test]
fn sqlite3_reports_out_of_memory_when_malloc_fails() {
    let sqlite = find_in_path("sqlite3").expect("sqlite3 is missing: .ci/run installs it");
    let dir = TempDir::new("values-sqlite");
    let sql = b"create table t(a); insert into t values(1); select * from t;\n";
    let native = run(Command::new(&sqlite).arg(":memory:"), sql, Duration::from_secs(30));
    assert_eq!((native.code, native.stdout.as_str()), (0, "1\n"));
    let trace = dir.path().join("t");
    let mut cmd = Command::new(fnscope());
    cmd.args(["record", "-o"]).arg(&trace).args(["--lib", "libc.so", "--filter", "malloc", "--inject", "malloc=ret:0,when:nth=200", "--"]).arg(&sqlite).arg(":memory:");
    let r = run(&mut cmd, sql, Duration::from_secs(60));
    assert_ne!(r.code, 0, "{}", clip(&r.stderr));
    assert!(program_stderr(&r.stderr).contains("out of memory"), "{}", clip(&r.stderr));
    // The 200th call of malloc, and no other before it, returned NULL.
    let tree = replay(&trace, "tree");
    let mallocs: Vec<&str> = tree.lines().filter(|l| l.contains("| malloc()")).collect();
    let first = mallocs.iter().position(|l| l.ends_with("/* injected: malloc=ret:0,when:nth=200 */"));
    assert_eq!(first, Some(199), "{}", clip(&tree));
}

#[test]
fn cat_takes_its_error_path_when_open_fails_with_eio() {
    let cat = find_in_path("cat").expect("cat");
    let dir = TempDir::new("values-cat");
    let native = run(Command::new(&cat).arg("/etc/hostname"), b"", Duration::from_secs(30));
    assert_eq!(native.code, 0);
    let trace = dir.path().join("t");
    let mut cmd = Command::new(fnscope());
    cmd.args(["record", "-o"]).arg(&trace).args(["--lib", "libc.so", "--filter", "open*", "--inject", "open*=ret:-1,errno:EIO", "--"]).arg(&cat).arg("/etc/hostname");
    let r = run(&mut cmd, b"", Duration::from_secs(60));
    assert_eq!(r.code, 1, "{}", clip(&r.stderr));
    assert_eq!(r.stdout, "");
    assert!(program_stderr(&r.stderr).contains("cat: /etc/hostname: Input/output error"), "{}", clip(&r.stderr));
    let tree = replay(&trace, "tree");
    assert!(tree.contains("/* injected: open*=ret:-1,errno:5 */"), "{tree}");
}

#[test]
fn exception_through_a_tail_call_from_a_recorded_function() {
    // `withargs` tail-calls `plain` (g++ -O2 makes it a `jmp`): both calls share one return
    // slot holding the plain exit stub while `withargs`'s entry expects the args one. The
    // unwinder must find the real return address there, or std::terminate is called.
    let dir = TempDir::new("values-tail");
    let src = dir.path().join("tail.cc");
    std::fs::write(
        &src,
        r#"#include <cstdio>
__attribute__((noinline)) int plain(int x) { if (x > 0) throw x; return x + 1; }
__attribute__((noinline)) int withargs(int x) { return plain(x * 3); }
int main() {
  std::printf("%d\n", withargs(-5));
  try { withargs(1); } catch (int v) { std::printf("caught %d\n", v); }
  return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("tail");
    let st = Command::new("g++").args(["-O2", "-o"]).arg(&exe).arg(&src).status().expect("g++");
    assert!(st.success());
    let (trace, out) = record(dir.path(), "t", &["-A", "withargs*@arg1/i32", "-R", "withargs*@i32"], &exe);
    assert_eq!(out, "-14\ncaught 3\n");
    let tree = replay(&trace, "tree");
    for want in ["| main() {", "|   withargs(-5) {", "|   } = -14 /* withargs(int) */", "|   withargs(1) {", "|     plain(int); /* unwound */", "|   } /* withargs(int), unwound */"] {
        assert!(tree.lines().any(|l| l.ends_with(want)), "{want:?} not in\n{tree}");
    }
}

#[test]
fn exports_carry_the_values_as_slice_arguments() {
    let dir = TempDir::new("values-export");
    let exe = build(dir.path());
    let (trace, _) = record(dir.path(), "t", &SPECS, &exe);
    // Perfetto, decoded with Perfetto's own schema.
    let pf = dir.path().join("t.pftrace");
    let r = fnscope_cmd(&["export", "--format", "perfetto", "-i", path_str(&trace), "-o", path_str(&pf)]);
    assert_eq!(r.code, 0, "{}", clip(&r.stderr));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/decode_perfetto.py");
    let d = run(Command::new("python3").arg(script).arg(&pf), b"", Duration::from_secs(120));
    assert_eq!(d.code, 0, "decode_perfetto.py (needs `pip install perfetto protobuf`, .ci/run does): {}", clip(&d.stderr));
    let file: serde_json::Value = serde_json::from_str(d.stdout.lines().next().expect("one file")).unwrap();
    assert_eq!(file["problems"], serde_json::json!([]));
    let add3 = file["slices"].as_array().unwrap().iter().find(|s| s["name"] == "add3").expect("an add3 slice");
    assert_eq!(add3["args"]["arg1"], "1");
    assert_eq!(add3["args"]["arg2"], "-2");
    assert_eq!(add3["args"]["arg3"], "300");
    assert_eq!(add3["args"]["return"], "299");
    let slens: Vec<&serde_json::Value> = file["slices"].as_array().unwrap().iter().filter(|s| s["name"] == "slen").map(|s| &s["args"]["arg1"]).collect();
    assert_eq!(slens[0], "\"abc\"");
    assert_eq!(slens[4], "NULL");
    // Chrome JSON.
    let cj = dir.path().join("t.json");
    let r = fnscope_cmd(&["export", "--format", "chrome", "-i", path_str(&trace), "-o", path_str(&cj)]);
    assert_eq!(r.code, 0, "{}", clip(&r.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cj).unwrap()).unwrap();
    let events = v.get("traceEvents").unwrap_or(&v).as_array().unwrap().clone();
    let w = events.iter().find(|e| e["name"] == "widths").expect("a widths event");
    assert_eq!((&w["args"]["arg1"], &w["args"]["arg6"], &w["args"]["return"]), (&"-5".into(), &"1099511627776".into(), &"1099511622021".into()));
}

#[test]
fn bad_specs_and_count_mode_are_refused() {
    let r = fnscope_cmd(&["record", "-o", "/nonexistent/x", "-A", "f@arg1/q", "--", "true"]);
    assert_one_line_error(&r, "unknown type");
    let r = fnscope_cmd(&["record", "-o", "/nonexistent/x", "--inject", "f=ret:x", "--", "true"]);
    assert_one_line_error(&r, "not a number");
    let r = fnscope_cmd(&["record", "-o", "/nonexistent/x", "--mode", "count", "-A", "f", "--", "true"]);
    assert_one_line_error(&r, "timing mode");
}

#[test]
fn values_survive_fork_threads_and_deep_recursion() {
    let dir = TempDir::new("values-fork");
    let exe = compile_c_text(
        dir.path(),
        "forks",
        r#"
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
__attribute__((noinline, noipa)) long work(long k) { return 2 * k; }
__attribute__((noinline, noipa)) long deep(long n) { return n == 0 ? 0 : 1 + deep(n - 1); }
static void *run(void *arg) {
    long base = (long)arg, s = 0;
    for (long i = 0; i < 1000; i++) s += work(base + i);
    return (void *)s;
}
int main(void) {
    long s = work(1);
    pid_t p = fork();
    if (p == 0) { s += work(2); _exit(s == 6 ? 0 : 1); }
    int st = 0;
    waitpid(p, &st, 0);
    s += work(3);
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, run, (void *)(i * 10000));
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    s += deep(5000);
    printf("%ld %d\n", s, WEXITSTATUS(st));
    return 0;
}
"#,
    );
    let native = run(&mut Command::new(&exe), b"", Duration::from_secs(30));
    let (trace, out) = record(dir.path(), "t", &["-A", "work@arg1/i64", "-R", "work@i64", "-A", "deep@arg1/i64", "-R", "deep@i64"], &exe);
    assert_eq!(out, native.stdout);
    assert!(out.ends_with(" 0\n"), "the child saw a wrong value: {out}");
    let tree = replay(&trace, "tree");
    let calls = replayed_calls(&tree);
    let works: Vec<&String> = calls.iter().filter(|c| c.starts_with("work(")).collect();
    assert_eq!(works.len(), 4003, "work calls: parent, child, parent, 4 threads x 1000");
    for c in &works {
        let (arg, ret) = c.strip_prefix("work(").and_then(|r| r.split_once(") = ")).expect("work(K) = V");
        assert_eq!(arg.parse::<i64>().unwrap() * 2, ret.parse::<i64>().unwrap(), "{c}");
    }
    // Beyond 4,096 levels the calls are recorded without values; the others are exact.
    let entered: Vec<&str> = tree.lines().filter_map(|l| l.split_once("| ").map(|(_, c)| c.trim())).filter(|c| c.starts_with("deep(")).collect();
    assert_eq!(entered.len(), 5001);
    let with_values = entered.iter().filter(|c| c.as_bytes().get(5).is_some_and(u8::is_ascii_digit)).count();
    assert!((4000..=4096).contains(&with_values), "{with_values}");
}

#[test]
fn chunks_written_uncompressed_are_compacted_to_the_same_calls() {
    let dir = TempDir::new("values-spill");
    let exe = build(dir.path());
    let (normal, out) = record(dir.path(), "normal", &SPECS, &exe);
    let recorded = |stderr: &str| stderr.split(" calls recorded").next().and_then(|s| s.rsplit(' ').next()).map(str::to_string);
    // Every chunk goes to the trace uncompressed while the program runs, as when the
    // recorder falls behind; they are compressed when it has ended.
    let mut opts = SPECS.to_vec();
    opts.extend(["--spill-after", "0", "-v"]);
    let out_dir = dir.path().join("spilled");
    let mut cmd = Command::new(fnscope());
    cmd.arg("record").arg("-o").arg(&out_dir).args(&opts).arg("--").arg(&exe);
    let r = run(&mut cmd, b"", Duration::from_secs(120));
    assert_eq!(r.code, 0, "record failed: {}", clip(&r.stderr));
    assert_eq!(r.stdout, out);
    assert!(r.stderr.contains("written uncompressed to keep up"), "{}", clip(&r.stderr));
    let info = fnscope_cmd(&["info", "-i", path_str(&normal)]);
    let normal_calls = info.stdout.lines().find_map(|l| l.strip_prefix("calls recorded:")).map(|s| s.trim().to_string());
    assert!(normal_calls.is_some(), "{}", info.stdout);
    assert_eq!(recorded(&r.stderr), normal_calls, "{}", clip(&r.stderr));
    let want = oracle(&out, &["add3", "widths", "slen"]);
    let calls = |t: &Path| replayed_calls(&replay(t, "tree")).into_iter().filter(|c| ["add3(", "widths(", "slen("].iter().any(|p| c.starts_with(p))).collect::<Vec<_>>();
    assert_eq!(calls(&out_dir), want);
    assert_eq!(calls(&normal), want);
    // Nothing uncompressed is left.
    let mut reader = fnscope_format::TraceReader::open(&out_dir).unwrap();
    let mut kinds = Vec::new();
    while let Some((kind, _)) = reader.next_verbatim().unwrap() {
        kinds.push(kind);
    }
    assert!(kinds.contains(&fnscope_format::KIND_EVENTS) && !kinds.contains(&fnscope_format::KIND_RAW), "{kinds:?}");
}

#[test]
fn every_count_of_register_arguments_with_and_without_the_return_value() {
    // The exit stub has one writer for each shape of unit (k integer-register arguments, with
    // or without rax): a function of each shape prints its own values, the oracle.
    let dir = TempDir::new("values-shapes");
    let mut src = String::from("#include <stdio.h>\n#define F __attribute__((noinline, noipa))\n");
    let mut opts: Vec<String> = Vec::new();
    for k in 0..=6 {
        let params: Vec<String> = (1..=k).map(|i| format!("long a{i}")).collect();
        let fmt: Vec<&str> = (1..=k).map(|_| "%ld").collect();
        let args: Vec<String> = (1..=k).map(|i| format!("a{i}")).collect();
        let sum = if k == 0 { "-7".to_string() } else { args.join(" * 3 + ") };
        let (params, args) = (if k == 0 { "void".to_string() } else { params.join(", ") }, args.join(", "));
        let comma = if k == 0 { "" } else { ", " };
        for (name, ret) in [(format!("r{k}"), true), (format!("n{k}"), false)] {
            src += &format!(
                "F long {name}({params}) {{ long v = {sum}; printf(\"CALL {name}({}){}\\n\"{comma}{args}{}); return v; }}\n",
                fmt.join(", "),
                if ret { " = %ld" } else { "" },
                if ret { ", v" } else { "" },
            );
            let spec: Vec<String> = (1..=k).map(|i| format!("arg{i}/i64")).collect();
            if k > 0 {
                opts.extend(["-A".to_string(), format!("{name}@{}", spec.join(","))]);
            }
            if ret {
                opts.extend(["-R".to_string(), format!("{name}@i64")]);
            }
        }
    }
    src += "int main(void) {\n";
    for k in 0..=6 {
        let args: Vec<String> = (1..=k).map(|i| format!("{}L", [-1i64, 1 << 40, -300, 7, -(1 << 61), 65535][i - 1])).collect();
        src += &format!("    r{k}({a}); n{k}({a});\n", a = args.join(", "));
    }
    src += "    return 0;\n}\n";
    let exe = compile_c_text(dir.path(), "shapes", &src);
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let (trace, out) = record(dir.path(), "t", &opts, &exe);
    // n0 has no values to record.
    let names: Vec<String> = (0..=6).flat_map(|k| [format!("r{k}"), format!("n{k}")]).filter(|n| n != "n0").collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let want = oracle(&out, &names);
    assert_eq!(want.len(), 13, "the program printed: {out}");
    let got: Vec<String> = replayed_calls(&replay(&trace, "tree")).into_iter().filter(|c| names.iter().any(|n| c.starts_with(&format!("{n}(")))).collect();
    assert_eq!(got, want);
}

#[test]
fn the_program_finds_errno_as_natively() {
    // With values recorded, the agent's start-up left errno at 22 (or 2) for main to find;
    // its hooks (fork, exit, dlopen, exec) could change it too.
    let dir = TempDir::new("errno");
    let exe = compile_c_text(
        dir.path(),
        "errno_main",
        "#include <errno.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n#include <sys/wait.h>\n\
         int main(void)\n{\n    int at_start = errno;\n    errno = 1234;\n    pid_t child = fork();\n    int after_fork = errno;\n\
             if (child == 0)\n        _exit(at_start == 0 && after_fork == 1234 ? 0 : 1);\n    int status;\n    waitpid(child, &status, 0);\n\
             printf(\"errno at start %d, after fork %d, child %d\\n\", at_start, after_fork, WEXITSTATUS(status));\n    return 0;\n}\n",
    );
    let inv = Invocation::new(&exe, dir.path());
    let native = inv.run_native();
    assert_eq!(native.stdout, "errno at start 0, after fork 1234, child 0\n", "{}", native.describe());
    for (i, opts) in [&["-A", "*", "-R", "*"][..], &["-A", "*", "-R", "*", "--lib", "libc.so"], &["--mode", "count", "--lib", "libc.so"]].into_iter().enumerate() {
        let traced = inv.clone().record_args(opts).run_recorded(&dir.join(format!("trace{i}")));
        let problems = compare_runs(&native, &traced);
        assert!(problems.is_empty(), "{opts:?}: {problems:?}\n{}", traced.describe());
    }
}
