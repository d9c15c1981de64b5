//! Builds the agent library (a `cdylib` of the same workspace) and leaves it in OUT_DIR, so
//! that the `fnscope` binary carries its agent inside and `cargo install` gives a complete
//! tool. A target directory of its own keeps the nested cargo off the outer build's lock.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let crates = manifest_dir.parent().expect("crates/ folder").to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // <target>/<profile>/build/fnscope-cli-<hash>/out: the agent gets <target>/agent, shared
    // by the debug and release builds of the CLI (the agent is always built optimised).
    let target_dir = out.ancestors().nth(4).map(|t| t.join("agent")).unwrap_or_else(|| out.join("agent-target"));
    for dep in ["fnscope-agent", "fnscope-abi", "fnscope-symbols", "fnscope-x86"] {
        println!("cargo:rerun-if-changed={}", crates.join(dep).join("src").display());
        println!("cargo:rerun-if-changed={}", crates.join(dep).join("Cargo.toml").display());
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--lib")
        .arg("--manifest-path")
        .arg(crates.join("fnscope-agent").join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    // The agent runs inside other programs: always optimised, whatever profile builds the CLI.
    cmd.arg("--release");
    cmd.env_remove("CARGO_TARGET_DIR").env_remove("RUSTC_WORKSPACE_WRAPPER");
    // Symbols stay (profilers and debuggers name the stubs), debug info goes: the library is
    // embedded in the binary and written out on first use.
    cmd.env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        cmd.env("CARGO_ENCODED_RUSTFLAGS", flags);
    }
    let status = cmd.status().expect("cannot run cargo to build the fnscope agent");
    assert!(status.success(), "building the fnscope agent failed");
    let built = target_dir.join("release").join("libfnscope_agent.so");
    let bytes = std::fs::read(&built).unwrap_or_else(|e| panic!("cannot read {}: {e}", built.display()));
    std::fs::write(out.join("libfnscope_agent.so"), &bytes)
        .unwrap_or_else(|e| panic!("cannot write the agent to {}: {e}", out.display()));
    // The name the agent is extracted under changes with its contents; hashing here keeps
    // that work out of every `fnscope record`.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&bytes[..], &mut h);
    println!("cargo:rustc-env=FNSCOPE_AGENT_HASH={:016x}", std::hash::Hasher::finish(&h));
}
