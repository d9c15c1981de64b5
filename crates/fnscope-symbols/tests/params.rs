//! Signatures from the DWARF of C and C++ programs compiled by gcc and g++ at test time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use fnscope_symbols::argspec::{ArgSpec, RetSpec};
use fnscope_symbols::params::{signatures, Signature};

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fnscope-symbols-params");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles `tests/<source>` with `compiler` and `flags` into `name`.
fn compile(compiler: &str, source: &str, name: &str, flags: &[&str]) -> PathBuf {
    let out = tmp(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(source);
    run(Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src));
    out
}

/// Link-time address of each function symbol, by name (`nm`'s view, independent of DWARF).
fn symbols(path: &Path) -> HashMap<String, u64> {
    let out = Command::new("nm").arg(path).output().expect("nm");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (a, kind, name) = (w.next()?, w.next()?, w.next()?);
            matches!(kind, "T" | "t")
                .then(|| Some((name.to_string(), u64::from_str_radix(a, 16).ok()?)))?
        })
        .collect()
}

/// Each function's signature as `args -> ret` text, by symbol name, checked to round-trip
/// through the spec parsers.
fn texts(path: &Path) -> HashMap<String, String> {
    let sigs = signatures(path, |_| true).unwrap();
    symbols(path)
        .into_iter()
        .filter_map(|(name, a)| {
            let Signature { args, ret } = sigs.get(&a)?;
            assert_eq!(
                ArgSpec::parse(&args.to_string()).as_ref(),
                Ok(args),
                "{name}: {args}"
            );
            assert_eq!(
                RetSpec::parse(&ret.to_string()).as_ref(),
                Ok(ret),
                "{name}: {ret}"
            );
            Some((name, format!("{args} -> {ret}")))
        })
        .collect()
}

/// Every mismatch at once, so that one run shows what changed.
fn check(got: &HashMap<String, String>, want: &[(&str, &str)]) {
    let bad: Vec<String> = want
        .iter()
        .filter(|(name, spec)| got.get(*name).map(String::as_str) != Some(*spec))
        .map(|(name, spec)| {
            format!(
                "{name}: want `{spec}`, got `{}`",
                got.get(*name).map_or("nothing", String::as_str)
            )
        })
        .collect();
    assert!(bad.is_empty(), "\n{}", bad.join("\n"));
}

/// The functions of params.c, at any optimisation level.
const C_SIGNATURES: &[(&str, &str)] = &[
    ("ints8", "arg1/i8:a,arg2/u8:b -> rax/i8"),
    ("ints16", "arg1/i16:a,arg2/u16:b -> rax/u16"),
    ("ints32", "arg1/i32:a,arg2/u32:b -> rax/i32"),
    ("ints64", "arg1/i64:a,arg2/u64:b -> rax/u64"),
    ("flags", "arg1/b:on,arg2/c:c,arg3/c:u -> rax/b"),
    ("signs", "arg1/i32:s,arg2/u32:m -> rax/i32"),
    ("pointers", "arg1/p:p,arg2/s:s,arg3/s:cs,arg4/s:n,arg5/p:fn -> rax/p"),
    ("names", "arg1/s:s -> rax/s"),
    ("floats", "fparg1/f32:f,fparg2/f64:d -> xmm0/f32"),
    ("longd", "arg1/i32:i,stack1/f80:x,fparg1/f64:d -> st0/f80"),
    (
        "eight",
        "arg1/i64:a,arg2/i64:b,arg3/i64:c,arg4/i64:d,arg5/i64:e,arg6/i64:f,stack1/i64:g,stack2/i64:h -> rax/i64",
    ),
    ("mixes", "arg1/i32:i,fparg1/f64:d,arg2/s:p,fparg2/f32:f,arg3/i64:l -> xmm0/f64"),
    ("by_pair", "{arg1/i32:a,arg1+4/i32:b}:p,arg2/i32:x -> rax/i32"),
    ("by_vec", "{fparg1/f64:x,fparg2/f64:y}:v,{arg1/i64:a,fparg3/f64:b}:m -> xmm0/f64"),
    // The 40-byte struct is copied to stack slots 1-5.
    ("by_big", "arg1/i32:i,arg2/i64:j,fparg1/f64:d -> rax/i64"),
    (
        "after_big",
        "arg1/i64:a,arg2/i64:c,arg3/i64:d,arg4/i64:e,arg5/i64:f,arg6/i64:g,stack6/i64:h -> rax/i64",
    ),
    ("wide", "arg1/i128:a,arg3/i64:b,arg4/i128:c -> rax/i128"),
    // One register left is not enough for w, but is for f.
    (
        "wide_late",
        "arg1/i64:a,arg2/i64:b,arg3/i64:c,arg4/i64:d,arg5/i64:e,stack1/i128:w,arg6/i64:f -> rax/i64",
    ),
    ("nothing", "arg1/i32:x -> void"),
    ("empty", " -> void"),
    ("ret_pair", "arg1/i32:a,arg2/i32:b -> {rax/i32:a,rax+4/i32:b}"),
    ("ret_vec", "fparg1/f64:x -> {xmm0/f64:x,xmm1/f64:y}"),
    ("ret_mixed", "arg1/i64:a,fparg1/f64:b -> {rax/i64:a,xmm0/f64:b}"),
    // Returned through a buffer whose address comes in rdi.
    ("ret_big", "arg2/i64:a,arg3/i32:b -> rax/p"),
    (
        "by_three",
        "{fparg1/f32:f_0,fparg1+4/f32:f_1,arg1/f32:f_2,arg1+4/c:tag}:t,{arg2/i32:i,arg2/f32:f}:w -> xmm0/f32",
    ),
    (
        "late_pair",
        "arg1/i64:a,arg2/i64:b,arg3/i64:c,arg4/i64:d,arg5/i64:e,{arg6/i32:a,arg6+4/i32:b}:p,stack1/i64:f -> rax/i32",
    ),
    ("sum", "arg1/i32:n -> rax/i32"),
    ("main", " -> rax/i32"),
];

#[test]
fn c_signatures_at_o0() {
    let path = compile("gcc", "params.c", "c-O0", &["-g", "-O0"]);
    check(&texts(&path), C_SIGNATURES);
}

#[test]
fn c_signatures_at_o2() {
    let path = compile("gcc", "params.c", "c-O2", &["-g", "-O2"]);
    let got = texts(&path);
    check(&got, C_SIGNATURES);
    let clone = symbols(&path)
        .into_keys()
        .find(|n| n.starts_with("scaled."))
        .expect("gcc -O2 specialises scaled()");
    assert_eq!(
        got.get(&clone),
        None,
        "{clone} takes fewer arguments than its DWARF lists"
    );
}

#[test]
fn cpp_methods_and_classes() {
    let path = compile("g++", "params.cc", "cc-O0", &["-g", "-O0"]);
    check(
        &texts(&path),
        &[
            (
                "_ZN7Counter3addEid",
                "arg1/p:this,arg2/i32:k,fparg1/f64:f -> rax/i64",
            ),
            (
                "_ZNK7Counter2atEPKc",
                "arg1/p:this,arg2/s:why -> {rax/i32:x,rax+4/i32:y}",
            ),
            ("_ZN7Counter5twiceEi", "arg1/i32:k -> rax/i32"),
            (
                "_Z6by_refRK5PointOS_b",
                "arg1/p:p,arg2/p:q,arg3/b:b -> rax/i64",
            ),
            // A destructor, a copy constructor, or a member with one: passed as a pointer to a copy.
            (
                "_Z4kept5Owner6Copied6Holder5Point",
                "arg1/p:o,arg2/p:c,arg3/p:h,{arg4/i32:x,arg4+4/i32:y}:p -> rax/i64",
            ),
            // Returned through a buffer even though it would fit in rax.
            ("_Z4makel", "arg2/i64:v -> rax/p"),
            ("_ZN6CopiedC2ERKS_", "arg1/p:this,arg2/p:o -> void"),
        ],
    );
}

#[test]
fn want_picks_functions() {
    let path = compile("gcc", "params.c", "c-want", &["-g", "-O0"]);
    let syms = symbols(&path);
    let floats = syms["floats"];
    let sigs = signatures(&path, |a| a == floats).unwrap();
    assert_eq!(sigs.keys().copied().collect::<Vec<_>>(), [floats]);
}

#[test]
fn separate_debug_file_and_no_dwarf() {
    let full = compile("gcc", "params.c", "c-split", &["-g", "-O2"]);
    let dir = tmp("split");
    std::fs::create_dir_all(&dir).unwrap();
    let (prog, debug) = (dir.join("prog"), dir.join("prog.debug"));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    run(Command::new("strip").arg("-o").arg(&prog).arg(&full));
    assert!(
        signatures(&prog, |_| true).unwrap().is_empty(),
        "stripped, no debug link"
    );
    run(Command::new("objcopy")
        .arg("--add-gnu-debuglink")
        .arg(&debug)
        .arg(&prog));
    let sigs = signatures(&prog, |_| true).unwrap();
    let eight = &sigs[&symbols(&full)["eight"]];
    assert_eq!(eight.args.to_string(), "arg1/i64:a,arg2/i64:b,arg3/i64:c,arg4/i64:d,arg5/i64:e,arg6/i64:f,stack1/i64:g,stack2/i64:h");

    let plain = compile("gcc", "params.c", "c-nodebug", &["-O2"]);
    assert!(signatures(&plain, |_| true).unwrap().is_empty());
}

#[test]
fn unreadable_file_is_an_error() {
    let e = signatures(Path::new("/nonexistent/fnscope-params"), |_| true).unwrap_err();
    assert!(matches!(e, fnscope_symbols::SymbolError::Io { .. }), "{e}");
}
