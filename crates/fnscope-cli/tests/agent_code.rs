//! The agent's slow paths run in the middle of a hooked call (a record with values, a chunk
//! swap, frames closed after a `longjmp`, the unwinder's pre-hooks). They must call nothing
//! outside the agent: with libc traced, a libc function is hooked, and a slow path that calls
//! it re-enters the stubs (`-R '*' --lib libc` hung at exit that way) and has the agent's calls
//! recorded as the program's. This reads the agent's machine code with objdump and walks its
//! call graph from every function the stubs call into.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Where the CLI's build script leaves the agent: `<target>/agent/release`, next to the
/// profile folder of the `fnscope` binary under test.
fn agent_library() -> PathBuf {
    let bin = Path::new(fnscope());
    let target = bin.parent().and_then(Path::parent).expect("fnscope lies in <target>/<profile>/");
    target.join("agent").join("release").join("libfnscope_agent.so")
}

fn tool_output(tool: &str, args: &[&str], file: &Path) -> String {
    let out = Command::new(tool).args(args).arg(file).output().unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
    assert!(out.status.success(), "{tool} {args:?} {} failed:\n{}", file.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("tool output is UTF-8")
}

/// Where an indirect call through a GOT slot goes: a function of the agent (by address) or
/// a symbol the dynamic linker binds.
enum Slot {
    Local(u64),
    Symbol(String),
}

/// The GOT slots of `readelf -rW`: relative relocations (the agent's own functions) and
/// symbol relocations (imports, and the agent's exported functions).
fn got_slots(relocs: &str) -> HashMap<u64, Slot> {
    let mut slots = HashMap::new();
    for line in relocs.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let Some(&kind) = w.get(2) else { continue };
        let Ok(at) = u64::from_str_radix(w[0], 16) else { continue };
        match kind {
            "R_X86_64_RELATIVE" => {
                if let Some(Ok(to)) = w.get(3).map(|a| u64::from_str_radix(a, 16)) {
                    slots.insert(at, Slot::Local(to));
                }
            }
            "R_X86_64_GLOB_DAT" | "R_X86_64_JUMP_SLOT" | "R_X86_64_64" => {
                if let Some(sym) = w.get(4) {
                    slots.insert(at, Slot::Symbol(sym.split('@').next().unwrap_or(sym).to_string()));
                }
            }
            _ => {}
        }
    }
    slots
}

struct Code {
    /// Function start addresses and names, sorted.
    starts: Vec<(u64, String)>,
    /// Callees of each function: names of the agent's functions, or `extern:NAME`.
    calls: HashMap<String, BTreeSet<String>>,
}

fn read_code(disassembly: &str, slots: &HashMap<u64, Slot>) -> Code {
    let mut starts = Vec::new();
    let mut raw: Vec<(String, String)> = Vec::new();
    let mut current = String::new();
    for line in disassembly.lines() {
        if let Some((addr, rest)) = line.split_once(" <") {
            if let (Ok(a), Some(name)) = (u64::from_str_radix(addr, 16), rest.strip_suffix(">:")) {
                current = name.to_string();
                starts.push((a, current.clone()));
                continue;
            }
        }
        let Some(ins) = line.split('\t').nth(1) else { continue };
        if ins.starts_with("call") || ins.starts_with("jmp") {
            raw.push((current.clone(), line.to_string()));
        }
    }
    starts.sort();
    let symbol_of = |a: u64| -> Option<String> {
        let i = starts.partition_point(|(s, _)| *s <= a);
        (i > 0).then(|| starts[i - 1].1.clone())
    };
    let defined: BTreeSet<&str> = starts.iter().map(|(_, n)| n.as_str()).collect();
    let mut calls: HashMap<String, BTreeSet<String>> = HashMap::new();
    for (f, line) in raw {
        let ins = line.split('\t').nth(1).unwrap_or_default();
        let target = if let Some((_, comment)) = ins.split_once("# ") {
            // call *0x…(%rip)  # <slot> <name>: through the GOT.
            let slot = comment.split_whitespace().next().and_then(|s| u64::from_str_radix(s, 16).ok());
            match slot.and_then(|s| slots.get(&s)) {
                Some(Slot::Local(to)) => symbol_of(*to),
                Some(Slot::Symbol(name)) if defined.contains(name.as_str()) => Some(name.clone()),
                Some(Slot::Symbol(name)) => Some(format!("extern:{name}")),
                None => None,
            }
        } else if let Some((_, named)) = ins.split_once(" <") {
            let name = named.trim_end_matches('>');
            let name = name.split("+0x").next().unwrap_or(name);
            match name.strip_suffix("@plt") {
                Some(import) => Some(format!("extern:{import}")),
                None => Some(name.to_string()),
            }
        } else {
            None
        };
        if let Some(t) = target {
            calls.entry(f).or_default().insert(t);
        }
    }
    Code { starts, calls }
}

#[test]
fn slow_paths_call_nothing_outside_the_agent() {
    let agent = agent_library();
    assert!(agent.exists(), "no agent library at {}", agent.display());
    let code = read_code(&tool_output("objdump", &["-d", "--no-show-raw-insn"], &agent), &got_slots(&tool_output("readelf", &["-rW"], &agent)));
    // Every function the stubs call through SAVE_ALL, except thread and count-mode set-up,
    // which first point the thread at a state that records nothing.
    let roots = [
        "fnscope_args_enter",
        "fnscope_args_exit",
        "fnscope_settle",
        "fnscope_exit_mismatch",
        "fnscope_entry_dead",
        "fnscope_prehook_handler",
    ];
    // A panic ends the program: what the panic machinery calls (and the landing pads'
    // `_Unwind_Resume`) does not matter here.
    let stop = |name: &str| name.contains("panic") || name == "abort" || name == "_Unwind_Resume";
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut todo: Vec<(String, String)> = roots.iter().map(|r| (r.to_string(), r.to_string())).collect();
    for r in roots {
        assert!(code.starts.iter().any(|(_, n)| n == r), "{r} is not in the agent's code");
    }
    // Each function outside, with the first path found to it.
    let mut outside: BTreeMap<String, String> = BTreeMap::new();
    while let Some((f, path)) = todo.pop() {
        if seen.contains_key(&f) || stop(&f) {
            continue;
        }
        seen.insert(f.clone(), path.clone());
        for callee in code.calls.get(&f).into_iter().flatten() {
            match callee.strip_prefix("extern:") {
                Some(name) if stop(name) => {}
                Some(name) => {
                    outside.entry(name.to_string()).or_insert_with(|| path.clone());
                }
                None => todo.push((callee.clone(), format!("{path} -> {callee}"))),
            }
        }
    }
    assert!(seen.len() > roots.len() * 3, "the walk found almost nothing: {:?}", seen.keys().collect::<Vec<_>>());
    let list: Vec<String> = outside.iter().map(|(name, path)| format!("{name}, via {path}")).collect();
    assert!(list.is_empty(), "slow paths call outside the agent:\n{}", list.join("\n"));
}
