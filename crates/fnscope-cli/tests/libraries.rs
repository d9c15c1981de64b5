//! `--lib`: shared libraries are hooked when asked for, both those linked at build time and
//! those loaded later with `dlopen`; the counts come from the programs themselves
//! (tests/programs/counts.h protocol).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn gcc(args: &[&str], dir: &Path) {
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let status = Command::new("gcc")
        .args(args)
        .current_dir(&programs)
        .arg("-I")
        .arg(&programs)
        .env("TMPDIR", dir)
        .status()
        .expect("cannot run gcc");
    assert!(status.success(), "gcc {args:?} failed");
}

/// Builds libplugin.so, liblinked.so and the program that uses them into `dir`.
fn build(dir: &Path) {
    let d = path_str(dir);
    gcc(&["-O2", "-shared", "-fPIC", "-o", &format!("{d}/libplugin.so"), "plugin.c"], dir);
    gcc(&["-O2", "-shared", "-fPIC", "-o", &format!("{d}/liblinked.so"), "linked.c"], dir);
    gcc(
        &[
            "-O2",
            "-o",
            &format!("{d}/dlopen_main"),
            "dlopen_main.c",
            &format!("-L{d}"),
            "-llinked",
            "-Wl,-rpath,$ORIGIN",
            "-ldl",
        ],
        dir,
    );
}

/// Runs `inv` natively (it must succeed) and recorded into `dir`/trace: the same output and
/// exit code, and no return the recorder could not match. Returns the native run and the trace.
fn native_and_recorded(inv: &Invocation, dir: &TempDir) -> (Run, std::path::PathBuf) {
    let native = inv.run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let trace = dir.join("trace");
    let traced = inv.run_recorded(&trace);
    let problems = compare_runs(&native, &traced);
    assert!(problems.is_empty(), "{problems:?}\n{}", traced.describe());
    assert!(!traced.stderr.contains("matched no open call"), "{}", traced.describe());
    (native, trace)
}

/// `count NAME N` lines of the program's stderr.
fn own_counts(stderr: &str) -> Vec<(String, u64)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("count ")?;
            let (name, n) = rest.rsplit_once(' ')?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .collect()
}

#[test]
fn linked_and_dlopened_libraries_are_hooked_with_lib() {
    let dir = TempDir::new("libs");
    build(dir.path());
    let plugin = dir.join("libplugin.so");
    let inv = Invocation::new(dir.join("dlopen_main"), dir.path()).args(&[path_str(&plugin)]);
    let native = inv.run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let trace = dir.join("trace");
    let mut cmd = Command::new(fnscope());
    cmd.args(["record", "--lib", "libplugin", "--lib", "liblinked", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(dir.join("dlopen_main"))
        .arg(&plugin)
        .current_dir(dir.path());
    let traced = run(&mut cmd, b"", std::time::Duration::from_secs(120));
    let problems = compare_runs(&native, &traced);
    assert!(problems.is_empty(), "{problems:?}\n{}", traced.describe());
    let stats = report(&trace).expect("report");
    let module_of = |name: &str| match name {
        "plugin_square" | "plugin_sum" => "libplugin.so",
        "linked_twice" => "liblinked.so",
        _ => "dlopen_main",
    };
    let counts = own_counts(&native.stderr);
    assert_eq!(counts.len(), 4, "the program prints four counts: {}", native.stderr);
    for (name, n) in counts {
        assert_eq!(calls_of(&stats, module_of(&name), &name), (n, 1), "calls of {name}");
    }
}

#[test]
fn library_loaded_again_at_the_same_address_is_hooked_again() {
    let dir = TempDir::new("reload");
    build(dir.path());
    let plugin = dir.join("libplugin.so");
    let args = [path_str(&plugin), "reload"];
    let inv = Invocation::new(dir.join("dlopen_main"), dir.path()).args(&args).record_args(&["--lib", "libplugin"]);
    let native = inv.run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    // Only a reload at the same address shows the fault this guards against.
    assert!(native.stdout.contains("reloaded at the same address"), "{}", native.stdout);
    let trace = dir.join("trace");
    let traced = inv.run_recorded(&trace);
    let problems = compare_runs(&native, &traced);
    assert!(problems.is_empty(), "{problems:?}\n{}", traced.describe());
    let stats = report(&trace).expect("report");
    // Each copy prints its own counts: their sum is what both copies ran.
    let mut want: std::collections::BTreeMap<String, u64> = Default::default();
    for (name, n) in own_counts(&native.stderr) {
        *want.entry(name).or_default() += n;
    }
    for name in ["plugin_square", "plugin_sum"] {
        assert_eq!(calls_of(&stats, "libplugin.so", name).0, want[name], "calls of {name} over both copies\n{}", info(&trace));
    }
}

#[test]
fn libraries_are_left_alone_without_lib() {
    let dir = TempDir::new("nolibs");
    build(dir.path());
    let plugin = dir.join("libplugin.so");
    let inv = Invocation::new(dir.join("dlopen_main"), dir.path()).args(&[path_str(&plugin)]);
    let native = inv.run_native();
    let traced = inv.run_recorded(&dir.join("trace"));
    let problems = compare_runs(&native, &traced);
    assert!(problems.is_empty(), "{problems:?}\n{}", traced.describe());
    let per_module = calls_per_module(&report(&dir.join("trace")).expect("report"));
    assert!(per_module.contains_key("dlopen_main"), "{per_module:?}");
    assert!(!per_module.contains_key("libplugin.so") && !per_module.contains_key("liblinked.so"), "{per_module:?}");
}

#[test]
fn count_mode_has_counters_for_a_large_library_loaded_late() {
    // 20,000 functions arriving by dlopen: count mode had room for 16,384 ids beyond the
    // program's own, and the rest were skipped as "no counter left" (libjvm has 25,000).
    let dir = TempDir::new("big-dlopen");
    let mut lib = String::new();
    for i in 0..20_000u32 {
        lib.push_str(&format!("__attribute__((noinline)) long big_{i}(long x) {{ return x * {} + {i}; }}\n", i + 3));
    }
    lib.push_str("long big_call(long x) { return big_19999(x) + big_0(x); }\n");
    std::fs::write(dir.join("big.c"), lib).unwrap();
    std::fs::write(
        dir.join("main.c"),
        "#include <dlfcn.h>\n#include <stdio.h>\n\
         int main(int argc, char **argv) {\n\
           void *h = dlopen(argv[1], RTLD_NOW); if (!h) return 1;\n\
           long (*f)(long) = (long (*)(long))dlsym(h, \"big_call\");\n\
           long s = 0; for (int i = 0; i < 10; i++) s += f(i);\n\
           printf(\"%ld\\n\", s); return 0; }\n",
    )
    .unwrap();
    let d = path_str(dir.path());
    gcc(&["-O1", "-shared", "-fPIC", "-o", &format!("{d}/libbig.so"), &format!("{d}/big.c")], dir.path());
    gcc(&["-O1", "-o", &format!("{d}/big_main"), &format!("{d}/main.c"), "-ldl"], dir.path());
    let lib = dir.join("libbig.so");
    let inv = Invocation::new(dir.join("big_main"), dir.path())
        .args(&[path_str(&lib)])
        .record_args(&["--mode", "count", "--lib", "libbig"]);
    let (_, trace) = native_and_recorded(&inv, &dir);
    let stats = counted(&trace);
    let calls = |name: &str| -> u64 { stats.iter().filter(|f| f.name == name).map(|f| f.calls).sum() };
    assert_eq!(calls("big_0"), 10);
    assert_eq!(calls("big_19999"), 10, "the last of 20,000 functions loaded late has no counter\n{}", info(&trace));
}

/// Tail calls from the program into a library traced with `--lib` and back: the two modules'
/// functions are entered through different stubs (the program's through the copy the agent
/// places beside its slots), so a function entered by a tail call from the other module finds
/// the other stub's exit in its return slot. It must take that for the tail call it is, not
/// close its caller as gone: exact counts, the calls nested as they ran, none unwound.
#[test]
fn tail_calls_between_the_program_and_a_library() {
    let dir = TempDir::new("tail-lib");
    let d = path_str(dir.path()).to_string();
    gcc(&["-O2", "-shared", "-fPIC", "-o", &format!("{d}/libtail_lib.so"), "tail_lib.c"], dir.path());
    gcc(&["-O2", "-o", &format!("{d}/tail_main"), "tail_main.c", &format!("-L{d}"), "-ltail_lib", "-Wl,-rpath,$ORIGIN"], dir.path());
    let inv = Invocation::new(dir.join("tail_main"), dir.path()).record_args(&["--lib", "libtail_lib"]);
    let (native, trace) = native_and_recorded(&inv, &dir);
    let stats = report(&trace).expect("report");
    let counts = own_counts(&native.stderr);
    assert_eq!(counts.len(), 6, "the program prints six counts: {}", native.stderr);
    for (name, n) in counts {
        let module = if name.starts_with("lib_") { "libtail_lib.so" } else { "tail_main" };
        assert_eq!(calls_of(&stats, module, &name), (n, 1), "calls of {name}");
    }
    assert_eq!(unwound_calls(&trace), Vec::<String>::new());
    let replay = fnscope_cmd(&["replay", "-i", path_str(&trace)]);
    assert_eq!(replay.code, 0, "{}", replay.describe());
    // Each tail call's callee nested in its caller: lib_leaf in to_lib, prog_leaf in lib_jump
    // in from_lib.
    let shape: Vec<String> = replay.stdout.lines().skip(1).take(11).map(|l| l.split_once('|').map_or(l, |(_, f)| f).trim_end().to_string()).collect();
    let want = [
        " main() {",
        "   outer() {",
        "     to_lib() {",
        "       lib_leaf();",
        "     } /* to_lib */",
        "     from_lib() {",
        "       lib_jump() {",
        "         prog_leaf();",
        "       } /* lib_jump */",
        "     } /* from_lib */",
        "   } /* outer */",
    ];
    assert_eq!(shape, want, "{}", replay.stdout);
}
