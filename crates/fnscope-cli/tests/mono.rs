//! Managed code on Mono: C# programs compiled by `mcs` here run under `fnscope record`
//! exactly as they run natively, and every managed method's calls in the trace equal the
//! program's own count of them.
//!
//! Mono (`mono-runtime`, `mono-mcs`) must be installed: these tests fail without it (see
//! `.ci/run`), they never skip.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const SOURCE: &str = include_str!("programs/mono_calls.cs");

fn tool(name: &str) -> PathBuf {
    find_in_path(name).unwrap_or_else(|| {
        panic!("`{name}` is not installed: apt-get install mono-runtime mono-mcs (see .ci/run)")
    })
}

/// Compiles `source` with `mcs` into `dir/NAME.exe`.
fn compile(dir: &TempDir, name: &str, source: &str) -> PathBuf {
    let cs = dir.join(format!("{name}.cs"));
    std::fs::write(&cs, source).expect("write the C# source");
    let exe = dir.join(format!("{name}.exe"));
    let r = run(
        Command::new(tool("mcs")).arg(format!("-out:{}", exe.display())).arg(&cs),
        b"",
        TIMEOUT,
    );
    assert_eq!(r.code, 0, "mcs failed: {}", r.describe());
    exe
}

/// Runs `inv` natively and under `fnscope record -o TRACE`, and checks that output and exit
/// code are the same. With `--mono-no-inline` among the record options, the native run has
/// inlining off too (what the option sets). Returns the native run.
fn same_as_native(inv: &Invocation, trace: &Path) -> Run {
    let mut native = inv.clone();
    if inv.record_args.iter().any(|a| a == "--mono-no-inline") {
        native = native.env("MONO_ENV_OPTIONS", "-O=-inline");
    }
    let native = native.run_native();
    let recorded = inv.run_recorded(trace);
    let problems = compare_runs(&native, &recorded);
    assert!(problems.is_empty(), "{:?}: {problems:?}\n{}", inv.args, recorded.describe());
    native
}

/// The program's own counts: its `COUNT key n` lines.
fn own_counts(stdout: &str) -> BTreeMap<String, u64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("COUNT "))
        .map(|l| {
            let (k, n) = l.split_once(' ').expect("COUNT key n");
            (k.to_string(), n.parse().expect("a count"))
        })
        .collect()
}

/// The methods (as Mono names them) whose calls each key of the program counts. Generic code
/// shared between reference types carries Mono's name of the shared code (`T_REF`).
const METHODS: &[(&str, &[&str])] = &[
    ("fib", &["P:Fib (int)"]),
    ("max", &["P:Max<int> (int,int)", "P:Max<double> (double,double)", "P:Max<T_REF> (T_REF,T_REF)"]),
    ("speakDog", &["Dog:Speak ()"]),
    ("speakCat", &["Cat:Speak ()"]),
    ("areaSquare", &["Square:Area ()"]),
    ("areaCircle", &["Circle:Area ()"]),
    ("boxInt", &["Box`1<int>:Get ()"]),
    ("boxString", &["Box`1<T_REF>:Get ()"]),
    ("level1", &["P:Level1 (int)"]),
    ("level2", &["P:Level2 (int)"]),
    ("level3", &["P:Level3 (int)"]),
    ("catcher", &["P:Catcher (int)"]),
    ("deep", &["P:Deep (int)"]),
    ("worker", &["P:Worker (object)"]),
    ("update", &["HitEffectController:Update ()"]),
    ("cctor", &["Config:.cctor ()"]),
];

/// Runs the program with `runner` (`mono`, or a program embedding Mono) natively (inlining
/// off, as `--mono-no-inline` sets it) and under `record RECORD_ARGS --mono-no-inline`; checks
/// that output and exit code are the same and that each method's recorded calls equal the
/// program's count. Returns the trace folder and the program's counts.
fn counts_match(dir: &TempDir, runner: &Path, record_args: &[&str]) -> (PathBuf, BTreeMap<String, u64>) {
    let exe = compile(dir, "calls", SOURCE);
    let mut args: Vec<&str> = record_args.to_vec();
    args.push("--mono-no-inline");
    let inv = Invocation::new(runner, dir.path()).args(&[path_str(&exe), "60"]).record_args(&args);
    let trace = dir.join("trace");
    let native = same_as_native(&inv, &trace);
    assert_eq!(native.code, 3, "the program itself failed: {}", native.describe());
    let own = own_counts(&native.stdout);
    assert_eq!(own.len(), METHODS.len(), "COUNT lines: {own:?}");
    let calls = managed_calls(&trace);
    let mut wrong = Vec::new();
    for (key, names) in METHODS {
        let got: u64 = names.iter().map(|n| calls.get(*n).copied().unwrap_or(0)).sum();
        if got != own[*key] || own[*key] == 0 {
            wrong.push(format!("{key} ({names:?}): the program counted {}, the trace has {got}", own[*key]));
        }
    }
    assert!(wrong.is_empty(), "{}\n{}", wrong.join("\n"), info(&trace));
    (trace, own)
}

/// Calls of each managed method, by name, from `report --json` (which has no times in count
/// mode).
fn managed_calls(trace: &Path) -> BTreeMap<String, u64> {
    let r = fnscope_cmd(&["report", "-i", path_str(trace), "--json"]);
    assert_eq!(r.code, 0, "{}", r.describe());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("report --json is JSON");
    let mut out = BTreeMap::new();
    for f in v.as_array().expect("an array") {
        if f["module"] == "[mono]" {
            let name = f["name"].as_str().expect("a name").to_string();
            *out.entry(name).or_insert(0) += f["calls"].as_u64().expect("calls");
        }
    }
    out
}

#[test]
fn timing_mode_counts_every_managed_call_and_changes_nothing() {
    let dir = TempDir::new("mono-time");
    let (trace, own) = counts_match(&dir, &tool("mono"), &[]);
    // The names reach the call-by-call views as Mono gives them.
    let lines = fnscope_cmd(&["replay", "-i", path_str(&trace), "--format", "lines"]);
    assert_eq!(lines.code, 0, "{}", lines.describe());
    let enter = lines
        .stdout
        .lines()
        .filter(|l| {
            let Some((head, rest)) = l.split_once('[') else { return false };
            head.parse::<u64>().is_ok() && rest.ends_with("]enter:HitEffectController:Update ()")
        })
        .count();
    assert_eq!(enter as u64, own["update"], "enter lines of HitEffectController:Update ()");
}

#[test]
fn count_mode_counts_every_managed_call_and_changes_nothing() {
    let dir = TempDir::new("mono-count");
    counts_match(&dir, &tool("mono"), &["--mode", "count"]);
}

/// A program embedding Mono through `libmonosgen-2.0`, built by gcc from
/// `programs/mono_embed.c` with `defines`.
fn embedder(dir: &TempDir, defines: &[&str]) -> PathBuf {
    let c = dir.join("embed.c");
    std::fs::write(&c, include_str!("programs/mono_embed.c")).expect("write the C source");
    let flags = run(Command::new("pkg-config").args(["--cflags", "--libs", "monosgen-2"]), b"", TIMEOUT);
    assert_eq!(flags.code, 0, "pkg-config monosgen-2 failed (apt-get install libmono-2.0-dev): {}", flags.describe());
    let exe = dir.join("embed");
    let r = run(
        Command::new("gcc").args(defines).arg("-o").arg(&exe).arg(&c).args(flags.stdout.split_whitespace()).arg("-ldl"),
        b"",
        TIMEOUT,
    );
    assert_eq!(r.code, 0, "gcc failed: {}", r.describe());
    exe
}

#[test]
fn a_program_linked_with_libmonosgen_is_traced_like_mono() {
    let dir = TempDir::new("mono-embed");
    let exe = embedder(&dir, &[]);
    counts_match(&dir, &exe, &[]);
}

#[test]
fn libmonosgen_loaded_by_dlopen_is_traced_like_mono() {
    let dir = TempDir::new("mono-dlopen");
    let exe = embedder(&dir, &["-DLOAD_AT_RUN_TIME"]);
    counts_match(&dir, &exe, &[]);
}

/// A program nobody here wrote: the C# compiler, compiling a C# file under tracing, writes
/// the same assembly as natively but for the module's random id (MVID, 16 bytes).
#[test]
fn mcs_compiles_the_same_assembly_under_tracing() {
    let dir = TempDir::new("mono-mcs");
    let cs = dir.join("calls.cs");
    std::fs::write(&cs, SOURCE).expect("write the C# source");
    let (native_dir, traced_dir) = (dir.join("native"), dir.join("traced"));
    for d in [&native_dir, &traced_dir] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let out = |d: &Path| format!("-out:{}", d.join("calls.exe").display());
    let native = Invocation::new(tool("mcs"), dir.path()).args(&[out(&native_dir), path_str(&cs).to_string()]).run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let trace = dir.join("trace");
    let traced = Invocation::new(tool("mcs"), dir.path()).args(&[out(&traced_dir), path_str(&cs).to_string()]).run_recorded(&trace);
    let problems = compare_runs(&native, &traced);
    assert!(problems.is_empty(), "{problems:?}");
    let a = std::fs::read(native_dir.join("calls.exe")).expect("native output");
    let b = std::fs::read(traced_dir.join("calls.exe")).expect("traced output");
    assert_eq!(a.len(), b.len(), "assembly sizes differ");
    let differ: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    if let (Some(first), Some(last)) = (differ.first(), differ.last()) {
        assert!(last - first < 16, "the assemblies differ beyond one 16-byte id: at {differ:?}");
    }
    let stats = report(&trace).expect("report");
    let problems = report_invariants(&stats);
    assert!(problems.is_empty(), "{problems:?}");
    let managed = managed_calls(&trace);
    let calls: u64 = managed.values().sum();
    eprintln!("mcs: {} managed methods called, {calls} calls\n{}", managed.len(), info(&trace));
    assert!(managed.iter().any(|(n, &c)| n.starts_with("Mono.CSharp.") && c > 0), "no calls of the compiler's own methods");
    assert!(calls > 100_000, "only {calls} managed calls");
}

/// Managed and native calls share one timeline and one tree: managed → P/Invoke → native
/// (`--lib`) → callback → managed.
#[test]
fn managed_and_native_calls_nest_in_one_tree() {
    let dir = TempDir::new("mono-pinvoke");
    let c = dir.join("nat.c");
    std::fs::write(&c, "int native_apply(int (*cb)(int), int x) { return cb(x) + cb(x + 1); }\n").expect("write C");
    let r = run(Command::new("gcc").args(["-shared", "-fPIC", "-O1", "-o"]).arg(dir.join("libnat.so")).arg(&c), b"", TIMEOUT);
    assert_eq!(r.code, 0, "gcc failed: {}", r.describe());
    let exe = compile(
        &dir,
        "pinvoke",
        r#"using System; using System.Runtime.InteropServices;
class Q {
  delegate int Cb(int x);
  [DllImport("nat")] static extern int native_apply(Cb cb, int x);
  static int Square(int x) { return x * x; }
  static int Run() { Cb cb = Square; int r = native_apply(cb, 3); GC.KeepAlive(cb); return r; }
  static int Main() { Console.WriteLine(Run()); return 0; }
}"#,
    );
    let inv = Invocation::new(tool("mono"), dir.path())
        .args(&[path_str(&exe)])
        .env("LD_LIBRARY_PATH", path_str(dir.path()))
        .record_args(&["--lib", "libnat", "--mono-no-inline"]);
    let trace = dir.join("trace");
    let native = same_as_native(&inv, &trace);
    assert_eq!(native.stdout, "25\n", "{}", native.describe());
    let lines = fnscope_cmd(&["replay", "-i", path_str(&trace), "--format", "lines"]);
    assert_eq!(lines.code, 0, "{}", lines.describe());
    // The open calls at each `enter:Q:Square (int)`.
    let mut open: Vec<&str> = Vec::new();
    let mut seen = Vec::new();
    for l in lines.stdout.lines() {
        let Some((_, event)) = l.split_once(']') else { continue };
        if let Some(f) = event.strip_prefix("enter:") {
            if f == "Q:Square (int)" {
                seen.push(open.clone());
            }
            open.push(f);
        } else if let Some(f) = event.strip_prefix("leave:") {
            assert_eq!(open.pop(), Some(f), "leave without its enter: {l}");
        }
    }
    assert_eq!(seen.len(), 2, "calls of Q:Square (int)");
    for stack in seen {
        let at = |name: &str| stack.iter().position(|f| *f == name);
        let (run, apply) = (at("Q:Run ()"), at("native_apply"));
        assert!(run.is_some() && apply.is_some() && run < apply, "Q:Square (int) called under {stack:?}");
    }
}

/// Exceptions raised by code and by the runtime (signals), rethrown, filtered, run through
/// `finally`, and one left unhandled: output (stack traces included), stderr and exit code as
/// natively, and every call counted.
#[test]
fn managed_exceptions_of_every_kind_behave_as_natively() {
    const METHODS: &[(&str, &str)] = &[
        ("deref", "E:Deref (C)"),
        ("mid", "E:Mid (C)"),
        ("div", "E:Div (int,int)"),
        ("rethrow", "E:Rethrow ()"),
        ("filtered", "E:Filtered (int)"),
        ("fin", "E:Fin (int&)"),
    ];
    let dir = TempDir::new("mono-exceptions");
    let exe = compile(&dir, "exceptions", include_str!("programs/mono_exceptions.cs"));
    for (i, args) in [vec![path_str(&exe)], vec![path_str(&exe), "unhandled"]].into_iter().enumerate() {
        let inv = Invocation::new(tool("mono"), dir.path()).args(&args).record_args(&["--mono-no-inline"]);
        let trace = dir.join(format!("trace{i}"));
        let native = same_as_native(&inv, &trace);
        let own = own_counts(&native.stdout);
        let calls = managed_calls(&trace);
        for (key, name) in METHODS {
            let got = calls.get(*name).copied().unwrap_or(0);
            assert!(got == own[*key] && got > 0, "{args:?}: {name}: the program counted {}, the trace has {got}", own[*key]);
        }
    }
}

/// Dynamic methods, created by the thousand and collected as the program goes: each is traced
/// under its own name, with its own calls, and the program runs as natively.
#[test]
fn dynamic_methods_are_traced_under_their_own_names() {
    let dir = TempDir::new("mono-dynamic");
    let exe = compile(
        &dir,
        "dynamic",
        r#"using System; using System.Reflection.Emit;
class D {
  static int Main(string[] args) {
    int n = int.Parse(args[0]); long total = 0;
    for (int i = 0; i < n; i++) {
      var dm = new DynamicMethod("Add" + i, typeof(int), new[] { typeof(int) }, typeof(D).Module);
      var il = dm.GetILGenerator();
      il.Emit(OpCodes.Ldarg_0); il.Emit(OpCodes.Ldc_I4, i); il.Emit(OpCodes.Add); il.Emit(OpCodes.Ret);
      var f = (Func<int, int>)dm.CreateDelegate(typeof(Func<int, int>));
      for (int k = 0; k <= i % 3; k++) total += f(k);
      if (i % 200 == 0) { GC.Collect(); GC.WaitForPendingFinalizers(); }
    }
    Console.WriteLine("total " + total);
    return 0;
  }
}"#,
    );
    let n = 1000;
    let inv = Invocation::new(tool("mono"), dir.path()).args(&[path_str(&exe).to_string(), n.to_string()]);
    let trace = dir.join("trace");
    same_as_native(&inv, &trace);
    let calls = managed_calls(&trace);
    for i in 0..n {
        let name = format!("(wrapper dynamic-method) object:Add{i} (int)");
        assert_eq!(calls.get(&name).copied(), Some(i % 3 + 1), "{name}");
    }
}

/// `--filter` decides for managed methods as for native functions, by Mono's name.
#[test]
fn record_filters_apply_to_managed_methods() {
    let dir = TempDir::new("mono-filter");
    let exe = compile(&dir, "calls", SOURCE);
    let inv = Invocation::new(tool("mono"), dir.path())
        .args(&[path_str(&exe), "20"])
        .record_args(&["--mono-no-inline", "--filter", "P:*"]);
    let trace = dir.join("trace");
    let native = same_as_native(&inv, &trace);
    let calls = managed_calls(&trace);
    let others: Vec<&String> = calls.keys().filter(|n| !n.starts_with("P:")).collect();
    assert!(others.is_empty(), "methods outside the filter traced: {others:?}");
    assert_eq!(calls.get("P:Fib (int)").copied(), Some(own_counts(&native.stdout)["fib"]));
}

/// Code of unloaded AppDomains is freed and its addresses reused for other methods: each
/// method keeps its own calls under its own name.
#[test]
fn code_of_unloaded_domains_does_not_lend_its_name() {
    let dir = TempDir::new("mono-domains");
    let exe = compile(
        &dir,
        "domains",
        r#"using System;
public class Worker : MarshalByRefObject {
  // Returns how many times it called Sq.
  public int Run(int n) { int calls = 0; for (int i = 0; i < n; i++) { Sq(i); calls++; } return calls; }
  static int Sq(int x) { return x * x; }
}
class A {
  static int Main() {
    int runs = 0, sqs = 0;
    for (int r = 0; r < 5; r++) {
      var d = AppDomain.CreateDomain("d" + r);
      var w = (Worker)d.CreateInstanceAndUnwrap(typeof(Worker).Assembly.FullName, "Worker");
      sqs += w.Run(100 + r); runs++;
      AppDomain.Unload(d);
      Console.WriteLine(new System.Text.StringBuilder().Append("round ").Append(r).ToString());
    }
    Console.WriteLine("COUNT run " + runs);
    Console.WriteLine("COUNT sq " + sqs);
    return 0;
  }
}"#,
    );
    let inv = Invocation::new(tool("mono"), dir.path()).args(&[path_str(&exe)]).record_args(&["--mono-no-inline"]);
    let trace = dir.join("trace");
    let native = same_as_native(&inv, &trace);
    let own = own_counts(&native.stdout);
    let calls = managed_calls(&trace);
    assert_eq!(calls.get("Worker:Run (int)").copied(), Some(own["run"]), "Worker:Run (int)");
    assert_eq!(calls.get("Worker:Sq (int)").copied(), Some(own["sq"]), "Worker:Sq (int)");
}
