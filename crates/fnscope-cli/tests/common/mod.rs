//! Helpers shared by the end-to-end tests: temporary directories, running a program with a
//! time limit, running it under `fnscope record`, and reading `fnscope report --json`.
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The fnscope binary built by cargo for this test run.
pub fn fnscope() -> &'static str {
    env!("CARGO_BIN_EXE_fnscope")
}

/// Generous: the slowest case (a debug build of fnscope recording 250k calls) takes a few
/// seconds; a hang must still end the test with a message rather than block CI forever.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// A directory under the system temp dir, removed when dropped - unless the test failed
/// (then it is kept and its path printed, so the programs and traces can be inspected), or
/// FNSCOPE_TEST_KEEP is set.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "fnscope-test-{tag}-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if thread::panicking() || std::env::var_os("FNSCOPE_TEST_KEEP").is_some() {
            eprintln!("test files kept in {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// What a finished process did.
#[derive(Debug, Clone)]
pub struct Run {
    /// Exit code, or 128 + N when killed by signal N (what a shell, and `fnscope record`,
    /// report).
    pub code: i32,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// For failure messages.
    pub fn describe(&self) -> String {
        format!(
            "exit code {}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            self.signal
                .map(|s| format!(" (signal {s})"))
                .unwrap_or_default(),
            clip(&self.stdout),
            clip(&self.stderr)
        )
    }
}

/// Shortens long outputs in failure messages to their start and end.
pub fn clip(s: &str) -> String {
    const MAX: usize = 6000;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut head = MAX / 2;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - MAX / 2;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[... {} bytes ...]\n{}",
        &s[..head],
        tail - head,
        &s[tail..]
    )
}

/// Runs `cmd` to completion with `stdin` as its input, collecting its output. The process
/// gets its own process group, so that on timeout it is killed together with anything it
/// started; the test then fails with whatever it had printed.
pub fn run(cmd: &mut Command, stdin: &[u8], timeout: Duration) -> Run {
    let desc = format!("{cmd:?}");
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.process_group(0);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {desc}: {e}"));
    let pid = child.id() as i32;

    let mut input = child.stdin.take().expect("piped stdin");
    let data = stdin.to_vec();
    // A program that does not read its input must not block us: write from a thread and
    // ignore EPIPE.
    let writer = thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_reader = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });

    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > timeout => {
                // SAFETY: kill(2) with a negative pid signals the process group we created.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                let _ = child.wait();
                let stdout = String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned();
                let stderr = String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned();
                panic!(
                    "{desc} did not finish within {timeout:?}; killed.\n\
                     --- stdout ---\n{}\n--- stderr ---\n{}",
                    clip(&stdout),
                    clip(&stderr)
                );
            }
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("waiting for {desc}: {e}"),
        }
    };
    let _ = writer.join();
    // Processes the program left behind (a forked child that outlived it) would keep the
    // pipes open; they are in the same group, so end them before collecting the output.
    // SAFETY: as above; ESRCH when the group is already empty is fine.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned();
    Run {
        code: status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        signal: status.signal(),
        stdout,
        stderr,
    }
}

/// How a program is started, natively or under `fnscope record`.
#[derive(Clone, Debug, Default)]
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    /// Options of `fnscope record` (before `--`).
    pub record_args: Vec<String>,
    /// Time limit of each run, if not [`TIMEOUT`].
    pub timeout: Option<Duration>,
}

impl Invocation {
    pub fn new(program: impl Into<PathBuf>, cwd: impl Into<PathBuf>) -> Invocation {
        Invocation {
            program: program.into(),
            cwd: cwd.into(),
            ..Default::default()
        }
    }

    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Invocation {
        self.args = args.iter().map(|a| a.as_ref().to_string()).collect();
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Invocation {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn record_args<S: AsRef<str>>(mut self, args: &[S]) -> Invocation {
        self.record_args = args.iter().map(|a| a.as_ref().to_string()).collect();
        self
    }

    pub fn timeout(mut self, limit: Duration) -> Invocation {
        self.timeout = Some(limit);
        self
    }

    pub fn stdin(mut self, data: &[u8]) -> Invocation {
        self.stdin = data.to_vec();
        self
    }

    /// Runs the program directly.
    pub fn run_native(&self) -> Run {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).current_dir(&self.cwd);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        run(&mut cmd, &self.stdin, self.timeout.unwrap_or(TIMEOUT))
    }

    /// Runs it as `fnscope record -o TRACE -- PROGRAM ARGS...`, from the same directory,
    /// with the same environment and input.
    pub fn run_recorded(&self, trace: &Path) -> Run {
        let mut cmd = Command::new(fnscope());
        cmd.arg("record")
            .args(&self.record_args)
            .arg("-o")
            .arg(trace)
            .arg("--")
            .arg(&self.program);
        cmd.args(&self.args).current_dir(&self.cwd);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        run(&mut cmd, &self.stdin, self.timeout.unwrap_or(TIMEOUT))
    }
}

/// Runs `fnscope ARGS...` (an analysis command) and returns what it did.
pub fn fnscope_cmd(args: &[&str]) -> Run {
    let mut cmd = Command::new(fnscope());
    cmd.args(args);
    run(&mut cmd, b"", TIMEOUT)
}

/// stderr without fnscope's own lines: `record` adds one summary line (and notes or
/// warnings), all starting with `fnscope:`. Everything else is the program's and must be
/// unchanged.
pub fn program_stderr(stderr: &str) -> String {
    stderr
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("fnscope:"))
        .collect()
}

/// fnscope's own stderr lines.
pub fn fnscope_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("fnscope:"))
        .collect()
}

/// Compares the native run and the recorded one: the same exit code, the same stdout, the
/// same stderr apart from fnscope's lines. Returns the differences, empty when none.
pub fn compare_runs(native: &Run, traced: &Run) -> Vec<String> {
    let mut problems = Vec::new();
    if traced.code != native.code {
        problems.push(format!(
            "exit code under record is {}, natively {}",
            traced.code, native.code
        ));
    }
    // A parent sees how its child ended, not only the shell's 128 + N: `record` dies of the
    // signal that killed the program.
    if traced.signal != native.signal {
        problems.push(format!(
            "killed by signal {:?} under record, natively {:?}",
            traced.signal, native.signal
        ));
    }
    if let Some(d) = first_difference(&native.stdout, &traced.stdout) {
        problems.push(format!("stdout differs under record: {d}"));
    }
    let traced_err = program_stderr(&traced.stderr);
    if let Some(d) = first_difference(&native.stderr, &traced_err) {
        problems.push(format!(
            "stderr (without fnscope: lines) differs under record: {d}"
        ));
    }
    problems
}

/// Where two outputs first differ, line by line, or None when they are equal.
pub fn first_difference(want: &str, got: &str) -> Option<String> {
    if want == got {
        return None;
    }
    let w: Vec<&str> = want.split_inclusive('\n').collect();
    let g: Vec<&str> = got.split_inclusive('\n').collect();
    for i in 0..w.len().max(g.len()) {
        let (a, b) = (w.get(i), g.get(i));
        if a != b {
            return Some(format!(
                "line {}: natively {:?}, under record {:?} ({} vs {} lines)",
                i + 1,
                a.copied().unwrap_or("<end of output>"),
                b.copied().unwrap_or("<end of output>"),
                w.len(),
                g.len()
            ));
        }
    }
    Some("outputs differ".to_string())
}

/// One object of `fnscope report --json`.
#[derive(Debug, Clone)]
pub struct FnStat {
    pub name: String,
    pub module: String,
    pub calls: u64,
    pub total_ns: u64,
    pub self_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
}

/// Parses the output of `report --json`: an array of objects with at least the keys
/// `name`, `module` (strings), `calls`, `total_ns`, `self_ns`, `min_ns`, `max_ns` (unsigned
/// integers).
pub fn parse_report(json: &str) -> Result<Vec<FnStat>, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("report --json is not JSON: {e}"))?;
    let arr = v.as_array().ok_or("report --json is not a JSON array")?;
    let mut out = Vec::with_capacity(arr.len());
    for (i, o) in arr.iter().enumerate() {
        let s = |k: &str| -> Result<String, String> {
            o.get(k)
                .and_then(|x| x.as_str())
                .map(str::to_string)
                .ok_or_else(|| format!("report --json entry {i} has no string {k:?}: {o}"))
        };
        let n = |k: &str| -> Result<u64, String> {
            o.get(k).and_then(|x| x.as_u64()).ok_or_else(|| {
                format!("report --json entry {i} has no unsigned integer {k:?}: {o}")
            })
        };
        out.push(FnStat {
            name: s("name")?,
            module: s("module")?,
            calls: n("calls")?,
            total_ns: n("total_ns")?,
            self_ns: n("self_ns")?,
            min_ns: n("min_ns")?,
            max_ns: n("max_ns")?,
        });
    }
    Ok(out)
}

/// Runs `report -i TRACE --json` and parses it.
pub fn report(trace: &Path) -> Result<Vec<FnStat>, String> {
    let r = fnscope_cmd(&["report", "-i", path_str(trace), "--json"]);
    if r.code != 0 {
        return Err(format!("`fnscope report --json` failed: {}", r.describe()));
    }
    parse_report(&r.stdout)
}

/// Relations that hold for any correct report, whatever the timings: a listed function was
/// called, its fastest call is no slower than its slowest, which is no longer than all its
/// calls together, and the time spent in its own code is part of its total.
pub fn report_invariants(stats: &[FnStat]) -> Vec<String> {
    let mut problems = Vec::new();
    for f in stats {
        let mut bad = Vec::new();
        if f.calls == 0 && (f.total_ns != 0 || f.max_ns != 0) {
            bad.push("time without calls");
        }
        if f.calls > 0 && f.min_ns > f.max_ns {
            bad.push("min_ns > max_ns");
        }
        if f.max_ns > f.total_ns {
            bad.push("max_ns > total_ns");
        }
        if f.self_ns > f.total_ns {
            bad.push("self_ns > total_ns");
        }
        if !bad.is_empty() {
            problems.push(format!("report entry {f:?}: {}", bad.join(", ")));
        }
    }
    problems
}

/// Calls of `name` in `module`, summed over the report's entries (one function may appear
/// once per process or image: fork and exec).
pub fn calls_of(stats: &[FnStat], module: &str, name: &str) -> (u64, usize) {
    let hits: Vec<&FnStat> = stats
        .iter()
        .filter(|f| f.module == module && f.name == name)
        .collect();
    (hits.iter().map(|f| f.calls).sum(), hits.len())
}

/// One function of `report --json` as both modes give it (count mode has no times).
#[derive(Debug, Clone)]
pub struct Counted {
    pub module: String,
    pub name: String,
    pub calls: u64,
}

/// Runs `report -i TRACE --json` on a trace of either mode: each function's calls.
pub fn counted(trace: &Path) -> Vec<Counted> {
    let r = fnscope_cmd(&["report", "-i", path_str(trace), "--json"]);
    let json: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("report --json: {e}\n{}", r.describe()));
    json.as_array()
        .unwrap_or_else(|| panic!("report --json is not an array\n{}", r.describe()))
        .iter()
        .map(|f| Counted {
            module: f["module"].as_str().unwrap_or_default().to_string(),
            name: f["name"].as_str().unwrap_or_default().to_string(),
            calls: f["calls"].as_u64().unwrap_or_else(|| panic!("no calls in {f}")),
        })
        .collect()
}

/// Calls per module, summed.
pub fn calls_per_module(stats: &[FnStat]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for f in stats {
        *m.entry(f.module.clone()).or_insert(0) += f.calls;
    }
    m
}

/// `fnscope info -i TRACE`, stdout and stderr together.
pub fn info(trace: &Path) -> String {
    let r = fnscope_cmd(&["info", "-i", path_str(trace)]);
    format!("{}{}", r.stdout, r.stderr)
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// Whether we run in CI, where a test must not skip itself for a missing tool.
pub fn in_ci() -> bool {
    match std::env::var("CI") {
        Ok(v) => !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"),
        Err(_) => false,
    }
}

/// An executable found on PATH, like `command -v`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Copies a directory tree (a trace directory, before damaging a copy of it).
pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The message of a failed fnscope command, checked the way a user would read it: the
/// command failed (non-zero exit), did not panic (Rust exits with 101 on a panic), and said
/// what went wrong on exactly one line.
pub fn assert_one_line_error(r: &Run, what: &str) -> String {
    assert!(
        r.code != 0,
        "{what}: fnscope succeeded but should have failed\n{}",
        r.describe()
    );
    assert!(
        r.code != 101 && !r.stderr.contains("panicked"),
        "{what}: fnscope panicked\n{}",
        r.describe()
    );
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() == 1,
        "{what}: want a one-line error on stderr, got {} lines\n{}",
        lines.len(),
        r.describe()
    );
    lines[0].to_string()
}

/// Writes `source` (C) to DIR/NAME.c and builds it with gcc into DIR/NAME (with -pthread,
/// without optimisation, so that every function of the source is a real call).
pub fn compile_c_text(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let result = Command::new("gcc")
        .args(["-O0", "-g", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
    assert!(
        result.status.success(),
        "gcc {name}.c failed:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// The numbers of `fnscope record`'s summary line: calls recorded (or counted) and calls
/// lost (0 when the line does not mention any).
pub fn summary_counts(stderr: &str) -> (u64, u64) {
    let line = fnscope_lines(stderr)
        .into_iter()
        .find(|l| l.contains("functions hooked"))
        .unwrap_or_else(|| panic!("no summary line in:\n{stderr}"));
    let number_before = |word: &str| -> Option<u64> {
        let at = line.find(word)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    let calls = number_before(" calls recorded")
        .or_else(|| number_before(" calls counted"))
        .unwrap_or_else(|| panic!("no call count in {line:?}"));
    (calls, number_before(" calls lost").unwrap_or(0))
}

/// The names of the calls `replay` shows as unwound (ended late), one per call.
pub fn unwound_calls(trace: &Path) -> Vec<String> {
    let r = fnscope_cmd(&["replay", "-i", path_str(trace)]);
    assert_eq!(r.code, 0, "replay failed\n{}", r.describe());
    r.stdout
        .lines()
        .filter_map(|l| {
            let inside = l.split_once("/* ")?.1.strip_suffix(", unwound */").or_else(|| l.ends_with("/* unwound */").then_some(""))?;
            let name = if inside.is_empty() { l.split_once("| ")?.1.trim().split('(').next()? } else { inside };
            Some(name.split('(').next().unwrap_or(name).trim().to_string())
        })
        .collect()
}
