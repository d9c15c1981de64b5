//! The edges of `fnscope record` and of the trace file a user meets early: two recorders
//! aimed at one folder, set-user-ID programs, paths that are not programs, what happens when
//! the shared buffer is full or `/dev/shm` too small for it, and a damaged chunk header.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Calls `tick` every millisecond until the file named by its argument exists; says
/// `started` on stdout after its fifth call.
const WAITER: &str = r#"
#include <stdio.h>
#include <unistd.h>
int tick(int i) { return i * 3 + 1; }
int main(int argc, char **argv) {
    long s = 0;
    for (int i = 0; access(argv[1], F_OK) != 0; i++) {
        s += tick(i);
        if (i == 4) {
            printf("started\n");
            fflush(stdout);
        }
        usleep(1000);
        if (i > 100000) return 3;
    }
    printf("waited %d\n", s > 0);
    return 0;
}
"#;

/// One call of `f`; exits with 0.
const TRIVIAL: &str = r#"
int f(int x) { return x + 1; }
int main(void) { return f(1) - 2; }
"#;

fn waiter(dir: &TempDir) -> PathBuf {
    compile_c_text(dir.path(), "waiter", WAITER)
}

/// Starts `fnscope record -o TRACE -- waiter STOP` in the background.
fn start_waiting_recorder(trace: &Path, prog: &Path, stop: &Path) -> std::process::Child {
    Command::new(fnscope())
        .arg("record")
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(prog)
        .arg(stop)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fnscope record")
}

/// Waits until the recorded program has called `tick` five times.
fn wait_for_ticks(child: &mut std::process::Child) {
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(child.stdout.as_mut().expect("piped stdout"));
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n", "the recorded program did not start");
}

fn finish(child: std::process::Child) -> Run {
    let out = child.wait_with_output().expect("wait for fnscope record");
    Run {
        code: out.status.code().unwrap_or(-1),
        signal: None,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Item 16: a second `record` into a folder being recorded into is refused, naming the folder
/// and the first recorder's pid, and leaves the first trace whole.
#[test]
fn second_recorder_into_the_same_folder_is_refused() {
    let dir = TempDir::new("lock");
    let prog = waiter(&dir);
    let trivial = compile_c_text(dir.path(), "trivial", TRIVIAL);
    let trace = dir.join("trace");
    let stop = dir.join("stop");
    let mut first = start_waiting_recorder(&trace, &prog, &stop);
    let first_pid = first.id();
    wait_for_ticks(&mut first);

    let second = Invocation::new(&trivial, dir.path()).run_recorded(&trace);
    let line = assert_one_line_error(&second, "record into a folder in use");
    assert!(line.contains(path_str(&trace)), "the error names the folder: {line}");
    assert!(line.contains(&format!("pid {first_pid}")), "the error names the recorder holding it: {line}");
    assert!(line.contains("-o"), "the error says what to do: {line}");

    fs::write(&stop, "").unwrap();
    let first = finish(first);
    assert_eq!(first.code, 0, "{}", first.describe());
    let (calls, _) = summary_counts(&first.stderr);
    let stats = report(&trace).unwrap();
    let (ticks, _) = calls_of(&stats, "waiter", "tick");
    assert!(ticks > 0 && ticks < calls, "the first trace keeps its calls: {ticks} of {calls}");
    let info = info(&trace);
    assert!(info.contains("complete:         yes"), "{info}");

    // The folder is free again once the first recorder is done.
    let third = Invocation::new(&trivial, dir.path()).run_recorded(&trace);
    assert_eq!(third.code, 0, "{}", third.describe());
    assert_eq!(calls_of(&report(&trace).unwrap(), "trivial", "f").0, 1);
    // Recording again did not lose the first recording: it is kept next to the folder, as
    // uftrace keeps uftrace.data.old.
    // The note names the real folder (the temporary folder may be reached through a link).
    let old = fs::canonicalize(dir.path()).unwrap().join("trace.old");
    assert!(third.stderr.contains(&format!("kept as {}", old.display())), "{}", third.describe());
    assert_eq!(calls_of(&report(&old).unwrap(), "waiter", "tick").0, ticks, "the first trace, kept");
}

/// The trace file of the trace folder `dir`, as bytes (each recording's differ: it holds its
/// start time).
fn trace_bytes(dir: &Path) -> Vec<u8> {
    fs::read(dir.join("trace.fns")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Recording again keeps the trace recorded before as `FOLDER.old`, and replaces an older
/// `FOLDER.old` only when it holds nothing but a trace: a file the user put there, or a
/// folder that cannot be moved, makes `record` refuse and leaves both traces as they were.
/// The folder kept is the real one, however `-o` names it.
#[test]
fn earlier_traces_are_kept_and_nothing_else_is_removed() {
    let dir = TempDir::new("old");
    let root = fs::canonicalize(dir.path()).unwrap();
    let trivial = compile_c_text(&root, "trivial", TRIVIAL);
    let (trace, old) = (root.join("trace"), root.join("trace.old"));
    let record = |o: &Path, cwd: &Path| Invocation::new(&trivial, cwd).run_recorded(o);
    let ok = |r: Run| assert_eq!(r.code, 0, "{}", r.describe());

    ok(record(&trace, &root));
    let first = trace_bytes(&trace);
    // A trailing slash names the same folder: it moves to trace.old, not trace/.old.
    ok(record(&root.join("trace/"), &root));
    assert_eq!(trace_bytes(&old), first, "the first recording, kept");
    let second = trace_bytes(&trace);
    // Through a link: the folder it points to moves, and the link then points to the new one.
    let link = root.join("link");
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    ok(record(&link, &root));
    assert_eq!(trace_bytes(&old), second, "the second recording replaced the first");
    assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays a link");
    assert_eq!(calls_of(&report(&link).unwrap(), "trivial", "f").0, 1);
    let third = trace_bytes(&trace);

    // A file of the user's in trace.old: nothing is removed, nothing moves.
    fs::write(old.join("notes.txt"), "mine").unwrap();
    let r = record(&trace, &root);
    let line = assert_one_line_error(&r, "an older trace folder holding a user's file");
    assert!(line.contains(path_str(&old)) && line.contains("-o"), "names the folder and what to do: {line}");
    assert_eq!(fs::read_to_string(old.join("notes.txt")).unwrap(), "mine");
    assert_eq!(trace_bytes(&old), second, "the older trace is untouched");
    assert_eq!(trace_bytes(&trace), third, "the trace is untouched");
    fs::remove_file(old.join("notes.txt")).unwrap();

    // Recording into the current folder, which holds a trace: it cannot be renamed.
    let r = record(Path::new("."), &trace);
    let line = assert_one_line_error(&r, "-o . in a trace folder");
    assert!(line.contains("current folder"), "{line}");
    assert_eq!(trace_bytes(&trace), third, "the trace is untouched");

    // The trace folder cannot be moved (immutable): the older trace, set aside to make room,
    // is put back.
    let chattr = |flag: &str| Command::new("chattr").arg(flag).arg(&trace).status().is_ok_and(|s| s.success());
    assert!(chattr("+i"), "chattr +i {} failed: this test needs ext4 or another file system with the immutable flag", trace.display());
    let r = record(&trace, &root);
    assert!(chattr("-i"), "chattr -i {}", trace.display());
    let line = assert_one_line_error(&r, "a trace folder that cannot be renamed");
    assert!(line.contains("cannot keep") && line.contains("-o"), "{line}");
    assert_eq!(trace_bytes(&old), second, "the older trace is back");
    assert_eq!(trace_bytes(&trace), third, "the trace is untouched");
    let names: Vec<String> = fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.contains(".removing")), "nothing left set aside: {names:?}");
}

/// A failed `--upload` is said on one line, and `record` still ends as the program ended when
/// the program failed (its exit code, its signal); after a clean exit it exits with 2.
#[test]
fn failed_upload_keeps_how_the_program_ended() {
    let dir = TempDir::new("upload-fails");
    let exits = |code: &str| format!("int f(int x) {{ return x + 1; }}\nint main(void) {{ return f({code}); }}\n");
    let cases = [
        ("ok", exits("-1"), 2, None),
        ("fails", exits("2"), 3, None),
        ("crashes", "int f(volatile int *p) { return *p; }\nint main(void) { return f(0); }\n".to_string(), 139, Some(11)),
    ];
    // Port 1 on the loopback: nothing listens, the connection is refused at once.
    for (name, source, code, signal) in cases {
        let prog = compile_c_text(dir.path(), name, &source);
        let trace = dir.join(format!("{name}.trace"));
        let r = Invocation {
            record_args: vec!["--upload".into(), "http://127.0.0.1:1".into(), "--token".into(), "t".into()],
            ..Invocation::new(&prog, dir.path())
        }
        .run_recorded(&trace);
        assert_eq!((r.code, r.signal), (code, signal), "{name}: {}", r.describe());
        assert!(r.stderr.contains("fnscope: error:") && r.stderr.contains(path_str(&trace)), "{name}: {}", r.describe());
        assert_eq!(calls_of(&report(&trace).unwrap(), name, "f").0, 1, "{name}: the trace is whole");
    }
}

/// Item 16: the lock dies with its recorder, so a killed recorder does not block the folder.
#[test]
fn folder_of_a_killed_recorder_can_be_recorded_into() {
    let dir = TempDir::new("lock-kill");
    let prog = waiter(&dir);
    let trivial = compile_c_text(dir.path(), "trivial", TRIVIAL);
    let trace = dir.join("trace");
    let stop = dir.join("stop");
    let mut first = start_waiting_recorder(&trace, &prog, &stop);
    wait_for_ticks(&mut first);
    first.kill().unwrap();
    first.wait().unwrap();
    let again = Invocation::new(&trivial, dir.path()).run_recorded(&trace);
    // The killed recorder's program still runs; let it end.
    fs::write(&stop, "").unwrap();
    assert_eq!(again.code, 0, "{}", again.describe());
    assert_eq!(calls_of(&report(&trace).unwrap(), "trivial", "f").0, 1);
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// `fnscope record` run through `setpriv` as the user `nobody`, with a cache folder it can
/// write the agent to.
fn record_as_nobody(dir: &TempDir, trace: &Path, prog: &Path) -> Run {
    let cache = dir.join("cache");
    fs::create_dir_all(&cache).unwrap();
    chmod(&cache, 0o777);
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(fnscope())
        .arg("record")
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(prog)
        .env("XDG_CACHE_HOME", &cache)
        .current_dir(dir.path());
    run(&mut cmd, b"", TIMEOUT)
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A program with file capabilities (`setcap`) that the caller does not hold runs in the
/// loader's secure mode, which ignores LD_PRELOAD: refused with the reason, as a set-user-ID
/// program is, where it ran untraced and the trace said only that nothing was hooked. Root
/// records it.
#[test]
fn program_with_file_capabilities_is_refused() {
    let dir = TempDir::new("setcap");
    chmod(dir.path(), 0o755);
    let prog = if is_root() {
        let prog = compile_c_text(dir.path(), "trivial", TRIVIAL);
        chmod(&prog, 0o755);
        let set = Command::new("setcap").args(["cap_net_raw+ep"]).arg(&prog).output().expect("run setcap (apt-get install libcap2-bin)");
        assert!(set.status.success(), "setcap failed: {}", String::from_utf8_lossy(&set.stderr));
        let r = Invocation::new(&prog, dir.path()).run_recorded(&dir.join("root"));
        assert_eq!(r.code, 0, "root holds every capability: {}", r.describe());
        assert_eq!(calls_of(&report(&dir.join("root")).unwrap(), "trivial", "f").0, 1);
        prog
    } else {
        // Without root no file gets capabilities: a program of the system that has some.
        ["ping", "mtr-packet", "arping"]
            .iter()
            .filter_map(|n| find_in_path(n))
            .find(|p| Command::new("getcap").arg(p).output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cap_")))
            .expect("no program with file capabilities on PATH (ping): run the tests as root")
    };
    let out = dir.join("out");
    fs::create_dir_all(&out).unwrap();
    chmod(&out, 0o777);
    let r = if is_root() { record_as_nobody(&dir, &out.join("caps"), &prog) } else { Invocation::new(&prog, dir.path()).run_recorded(&out.join("caps")) };
    let line = assert_one_line_error(&r, "record a program with file capabilities");
    assert!(line.contains(path_str(&prog)) && line.contains("file capabilities") && line.contains("LD_PRELOAD"), "{line}");
}

/// Item 18: a set-user-ID or set-group-ID program that the loader would run in secure mode
/// (where it ignores LD_PRELOAD) is refused with the reason and what to do; root recording
/// its own set-user-ID program is not.
#[test]
fn setuid_program_in_secure_mode_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new("setuid");
    chmod(dir.path(), 0o755);
    if !is_root() {
        // Without root no file can be given another owner: use a set-user-ID program of the
        // system, which the loader runs in secure mode for us.
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        let prog = ["su", "passwd", "mount", "chsh", "newgrp"]
            .iter()
            .filter_map(|n| find_in_path(n))
            .find(|p| fs::metadata(p).is_ok_and(|m| m.mode() & 0o4000 != 0 && m.uid() != me))
            .expect("no set-user-ID program owned by another user on PATH (su, passwd, mount)");
        let r = Invocation::new(&prog, dir.path()).run_recorded(&dir.join("t"));
        let line = assert_one_line_error(&r, "record a set-user-ID program");
        assert!(line.contains("set-user-ID") && line.contains("LD_PRELOAD"), "{line}");
        assert!(line.contains(path_str(&prog)), "{line}");
        return;
    }
    let prog = compile_c_text(dir.path(), "trivial", TRIVIAL);
    let out = dir.join("out");
    fs::create_dir_all(&out).unwrap();
    chmod(&out, 0o777);

    // The control: the same program without the bit records as `nobody`, so the refusal
    // below is about the bit, not about the user.
    chmod(&prog, 0o755);
    let plain = record_as_nobody(&dir, &out.join("plain"), &prog);
    assert_eq!(plain.code, 0, "{}", plain.describe());
    assert_eq!(calls_of(&report(&out.join("plain")).unwrap(), "trivial", "f").0, 1);

    chmod(&prog, 0o4755);
    let r = record_as_nobody(&dir, &out.join("suid"), &prog);
    let line = assert_one_line_error(&r, "record a root-owned set-user-ID program as nobody");
    assert!(line.contains(path_str(&prog)), "the error names the program: {line}");
    assert!(line.contains("set-user-ID"), "the error says why: {line}");
    assert!(line.contains("LD_PRELOAD"), "the error says why: {line}");
    assert!(line.contains("owner") && line.contains("root"), "the error says what to do: {line}");
    assert!(!out.join("suid").join("trace.fns").exists(), "nothing was recorded");

    chmod(&prog, 0o2755);
    let r = record_as_nobody(&dir, &out.join("sgid"), &prog);
    let line = assert_one_line_error(&r, "record a set-group-ID program as nobody");
    assert!(line.contains("set-group-ID") && line.contains(path_str(&prog)), "{line}");

    // Root running its own set-user-ID program: no secure mode, so no refusal.
    chmod(&prog, 0o4755);
    let trace = dir.join("root");
    let r = Invocation::new(&prog, dir.path()).run_recorded(&trace);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(calls_of(&report(&trace).unwrap(), "trivial", "f").0, 1);
}

/// Item 19: every path that is not a program gets an error naming it and saying what to do.
#[test]
fn paths_that_are_not_programs_are_named() {
    let dir = TempDir::new("notprog");
    let trace = dir.join("t");
    let record = |prog: &Path| Invocation::new(prog, dir.path()).run_recorded(&trace);

    let folder = dir.join("some_folder");
    fs::create_dir_all(&folder).unwrap();
    let line = assert_one_line_error(&record(&folder), "record a folder");
    assert!(line.contains(path_str(&folder)) && line.contains("folder"), "{line}");
    assert!(!line.contains("os error"), "a plain explanation, not an OS error: {line}");

    let prog = compile_c_text(dir.path(), "trivial", TRIVIAL);
    chmod(&prog, 0o644);
    let line = assert_one_line_error(&record(&prog), "record a non-executable file");
    assert!(line.contains(path_str(&prog)) && line.contains("not executable"), "{line}");
    assert!(line.contains("chmod +x"), "the error says what to do: {line}");

    let empty = dir.join("empty");
    fs::write(&empty, "").unwrap();
    chmod(&empty, 0o755);
    let line = assert_one_line_error(&record(&empty), "record an empty file");
    assert!(line.contains(path_str(&empty)) && line.contains("empty"), "{line}");

    let missing = dir.join("missing");
    let line = assert_one_line_error(&record(&missing), "record a missing file");
    assert!(line.contains(path_str(&missing)) && line.contains("no such file"), "{line}");
    assert!(!trace.exists(), "no trace folder is made for a program that cannot run");
}

/// 48 threads each make a call and hold their chunk until all have made theirs: with the
/// smallest buffer (32 chunks) some threads find no chunk at all.
const CROWD: &str = r#"
#include <pthread.h>
#define N 48
static pthread_barrier_t bar;
int f(int x) { return x + 1; }
static void *worker(void *a) {
    f((int)(long)a);
    pthread_barrier_wait(&bar);
    return 0;
}
int main(void) {
    pthread_t t[N];
    pthread_barrier_init(&bar, 0, N);
    for (int i = 0; i < N; i++) pthread_create(&t[i], 0, worker, (void *)(long)i);
    for (int i = 0; i < N; i++) pthread_join(t[i], 0);
    return 0;
}
"#;

/// Item 21: `record --help` says what a full buffer does, and it is what happens: records
/// are dropped (the program is not held up), counted, and reported by the summary and `info`.
#[test]
fn full_buffer_drops_and_counts_as_the_help_says() {
    let help = fnscope_cmd(&["record", "--help"]);
    assert_eq!(help.code, 0, "{}", help.describe());
    let text = help.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(!text.contains("the program waits for the recorder"), "{text}");
    assert!(text.contains("drops its records"), "{text}");
    assert!(text.contains("2 seconds"), "{text}");
    assert!(text.contains("summary line") && text.contains("fnscope info"), "{text}");

    let dir = TempDir::new("full");
    let prog = compile_c_text(dir.path(), "crowd", CROWD);
    let trace = dir.join("t");
    let mut cmd = Command::new(fnscope());
    cmd.args(["record", "--buffer-mb", "2", "-o"]).arg(&trace).arg("--").arg(&prog);
    let r = run(&mut cmd, b"", TIMEOUT);
    assert_eq!(r.code, 0, "{}", r.describe());
    let (_, lost) = summary_counts(&r.stderr);
    assert!(lost > 0, "with 48 threads and a 2 MiB buffer some calls must be lost:\n{}", r.stderr);
    let info = info(&trace);
    assert!(info.contains(&format!("records lost:     {lost}\n")), "info agrees with the summary ({lost}):\n{info}");
    let (f_calls, _) = calls_of(&report(&trace).unwrap(), "crowd", "f");
    assert!(f_calls < 48, "f's lost calls are not in the trace: {f_calls}");
}

/// 3,000 threads alive at once, each calling `f` once before a barrier and twice after it;
/// prints a sum of their results.
const THRONG: &str = r#"
#include <pthread.h>
#include <stdio.h>
#define N 3000
static pthread_barrier_t bar;
int f(int x) { return x + 1; }
static void *worker(void *a) {
    int s = f((int)(long)a);
    pthread_barrier_wait(&bar);
    s += f(s) + f(s + 1);
    return (void *)(long)s;
}
int main(void) {
    static pthread_t t[N];
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 64 << 10);
    pthread_barrier_init(&bar, 0, N);
    for (int i = 0; i < N; i++)
        if (pthread_create(&t[i], &at, worker, (void *)(long)i)) return 1;
    long sum = 0;
    for (int i = 0; i < N; i++) {
        void *r;
        pthread_join(t[i], &r);
        sum += (long)r;
    }
    printf("%ld\n", sum);
    return 0;
}
"#;

/// A thread holds a chunk of the shared buffer from its first call to its end: with the
/// default buffer, a program with thousands of threads alive at once loses no call (with 1,024
/// chunks, 1,976 calls were lost, made by threads that found no chunk free).
#[test]
fn thousands_of_threads_alive_at_once_lose_no_call() {
    let dir = TempDir::new("throng");
    let prog = compile_c_text(dir.path(), "throng", THRONG);
    let native = run(&mut Command::new(&prog), b"", TIMEOUT);
    assert_eq!(native.code, 0, "{}", native.describe());
    let trace = dir.join("t");
    let r = run(Command::new(fnscope()).args(["record", "-o"]).arg(&trace).arg("--").arg(&prog), b"", TIMEOUT);
    assert_eq!((r.code, r.stdout.as_str()), (0, native.stdout.as_str()), "{}", r.describe());
    let (calls, lost) = summary_counts(&r.stderr);
    assert_eq!((calls, lost), (1 + 3000 + 9000, 0), "main, the workers and f's calls, none lost:\n{}", r.stderr);
    let stats = report(&trace).unwrap();
    assert_eq!(calls_of(&stats, "throng", "f").0, 9000);
    assert_eq!(calls_of(&stats, "throng", "worker").0, 3000);
}

/// A folder `small` in `dir` and the shell command that mounts a tmpfs of `size` on it (for
/// [`in_mount_namespace`]).
fn tmpfs_folder(dir: &TempDir, size: &str) -> (PathBuf, String) {
    let small = dir.join("small");
    fs::create_dir_all(&small).unwrap();
    let mount = format!("mount -t tmpfs -o size={size} fnscope-test '{}' || exit 99", path_str(&small));
    (small, mount)
}

/// Runs the shell `script`, which mounts what it needs and exits with 99 when it cannot, in a
/// mount namespace of its own (with a user namespace of its own when not root), in `dir`.
fn in_mount_namespace(dir: &TempDir, script: &str) -> Run {
    let mut cmd = Command::new("unshare");
    cmd.args(if is_root() { &["-m"][..] } else { &["-U", "-r", "-m"][..] }).args(["sh", "-c", script]).current_dir(dir.path());
    let r = run(&mut cmd, b"", TIMEOUT);
    assert_ne!(r.code, 99, "nothing could be mounted in a mount namespace of its own (unshare -m):\n{}", r.describe());
    r
}

/// Four threads of fib(27), 635,621 calls each, at once: more records than the recorder
/// copies as they come on two processors, so that the shared buffer fills well past a few
/// chunks.
const FIB_THREADS: &str = r#"
#include <pthread.h>
#include <stdio.h>
long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
static void *run(void *a) { return (void *)fib(27); }
int main(void) {
    pthread_t t[4];
    long s = 0;
    for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, run, 0);
    for (int i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); s += (long)r; }
    printf("%ld\n", s);
    return 0;
}
"#;

/// A `/dev/shm` smaller than the shared buffer (64 MiB in a Docker container by default)
/// took the region file, and the first page written past its room was a SIGBUS: the recorder
/// died with the trace. The region is memory of its own then. Run in a mount namespace of
/// its own with a 16 MiB tmpfs on /dev/shm (a user namespace too when not root).
#[test]
fn dev_shm_smaller_than_the_buffer_is_not_a_crash() {
    let dir = TempDir::new("small-shm");
    let prog = compile_c_text(dir.path(), "fib_threads", FIB_THREADS);
    let native = Invocation::new(&prog, dir.path()).run_native();
    assert_eq!(native.code, 0, "{}", native.describe());
    let trace = dir.join("t");
    let script = format!(
        "mount -t tmpfs -o size=16m fnscope-test /dev/shm || exit 99; exec '{}' record -v -o '{}' -- '{}'",
        fnscope(),
        path_str(&trace),
        path_str(&prog)
    );
    let r = in_mount_namespace(&dir, &script);
    assert_eq!((r.code, &r.stdout), (0, &native.stdout), "{}", r.describe());
    assert!(r.stderr.contains("/dev/shm has room for 16 MiB") && r.stderr.contains("memory of its own"), "{}", r.stderr);
    // Without the agent's lines of -v, which say "functions hooked" too.
    let recorder: Vec<&str> = r.stderr.lines().filter(|l| !l.starts_with("fnscope: pid ")).collect();
    assert_eq!(summary_counts(&recorder.join("\n")), (4 * 635_621 + 4 + 1, 0), "{}", r.stderr);
    assert_eq!(calls_of(&report(&trace).unwrap(), "fib_threads", "fib").0, 4 * 635_621);
}

/// A trace folder on a file system that fills up (here a 2 MiB tmpfs, in a mount namespace
/// of its own) stops the trace, not the program: before, the recorder quit at the first
/// failed write, the program ran on orphaned, and the trace had no END chunk (times in
/// uncalibrated ticks). Now the program's output and end are as without fnscope (exit code 2
/// after a clean exit, as a failed upload), and the trace, cut after its last whole chunk
/// and ended, reads with its clock and says what is missing.
#[test]
fn full_disk_stops_the_trace_not_the_program() {
    let dir = TempDir::new("full-disk");
    // 7,049,155 calls of fib: a trace of more than 3 MiB.
    let prog = compile_c_text(dir.path(), "fib32", "long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }\nint main(void) { return fib(32) != 2178309; }\n");
    let (small, mount) = tmpfs_folder(&dir, "2m");
    let trace = small.join("t");
    let script = format!(
        "{mount}; '{}' record -o '{}' -- '{}'; code=$?; cp -r '{}' '{}'; exit $code",
        fnscope(),
        path_str(&trace),
        path_str(&prog),
        path_str(&trace),
        path_str(&dir.join("kept"))
    );
    let r = in_mount_namespace(&dir, &script);
    assert_eq!(r.code, 2, "{}", r.describe());
    assert!(r.stderr.contains("No space left on device") && r.stderr.contains("the program runs on"), "{}", r.stderr);
    let kept = dir.join("kept");
    let (calls, _) = calls_of(&report(&kept).unwrap(), "fib32", "fib");
    assert!(calls > 0 && calls < 7_049_155, "{calls} calls of fib in the trace");
    let shown = fnscope_cmd(&["report", "-i", path_str(&kept)]);
    assert_eq!(shown.code, 0, "{}", shown.describe());
    assert!(shown.stderr.contains("could not write the trace to the end (No space left on device"), "{}", shown.stderr);
    assert!(!shown.stderr.contains("not calibrated"), "the trace was ended: {}", shown.stderr);
    // main returns last: it is among the calls not written.
    let missing = 7_049_155 + 1 - calls;
    assert!(shown.stderr.contains(&format!(": {missing} calls made after that are missing")), "fib's and main's calls not written: {}", shown.stderr);
}

/// An agent that cannot write its image table (the trace folder's file system full from the
/// start: a 128 KiB tmpfs, in a mount namespace of its own) leaves its process untraced, which
/// the program does not notice; the trace said it was complete, and `record` that no function
/// could be hooked. Now the summary, `info` and the views say that a process image ran
/// untraced, and why is on the agent's line.
#[test]
fn untraced_process_images_are_counted() {
    let python = Path::new("/usr/bin/python3.11");
    assert!(python.exists(), "python3.11 is needed (.ci/run installs it)");
    let dir = TempDir::new("untraced");
    let (small, mount) = tmpfs_folder(&dir, "128k");
    let trace = small.join("t");
    let script = format!(
        "{mount}; '{}' record -o '{}' -- {} -c 'print(42)'; code=$?; '{}' info -i '{}'; exit $code",
        fnscope(),
        path_str(&trace),
        path_str(python),
        fnscope(),
        path_str(&trace)
    );
    let r = in_mount_namespace(&dir, &script);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.starts_with("42\n"), "{}", r.describe());
    assert!(r.stdout.contains("complete:         no, 1 process image(s) ran untraced"), "{}", r.stdout);
    assert!(r.stderr.contains("tracing disabled in pid") && r.stderr.contains("No space left on device"), "{}", r.stderr);
    assert!(r.stderr.contains("1 process image(s) ran untraced"), "{}", r.stderr);
    assert!(!r.stderr.contains("no function could be hooked"), "{}", r.stderr);
}

/// An address space limited below the shared buffer's size is an error that says so, with
/// the size and what to do, not a bare "Cannot allocate memory".
#[test]
fn address_space_limit_below_the_buffer_is_named() {
    let dir = TempDir::new("ulimit-v");
    let prog = compile_c_text(dir.path(), "trivial", TRIVIAL);
    let script = format!("ulimit -v 600000 && exec '{}' record -o '{}' -- '{}'", fnscope(), path_str(&dir.join("t")), path_str(&prog));
    let r = run(Command::new("sh").args(["-c", &script]).current_dir(dir.path()), b"", TIMEOUT);
    let line = assert_one_line_error(&r, "record under ulimit -v 600000");
    assert!(line.contains("cannot map the shared buffer (") && line.contains(" MiB") && line.contains("ulimit -v") && line.contains("--buffer-mb"), "{line}");
}

/// Under an address-space limit the default region (4,096 chunks, 1.5 GiB with the call
/// stacks) would take more than a quarter of, the default buffer is the 256 MiB of earlier
/// versions (1,024 chunks): with the limit at 1.3 GiB, the program is recorded whole, where
/// mapping the full default failed.
#[test]
fn address_space_limit_shrinks_the_default_buffer() {
    let dir = TempDir::new("ulimit-v-default");
    let prog = compile_c_text(dir.path(), "trivial", TRIVIAL);
    let trace = dir.join("t");
    let script = format!("ulimit -v 1400000 && exec '{}' record -v -o '{}' -- '{}'", fnscope(), path_str(&trace), path_str(&prog));
    let r = run(Command::new("sh").args(["-c", &script]).current_dir(dir.path()), b"", TIMEOUT);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stderr.contains("the shared buffer has 1024 chunks, not 4096"), "-v says so:\n{}", r.stderr);
    // The summary line, after -v's lines of each process.
    let summary = r.stderr.lines().rfind(|l| l.contains(" calls recorded")).unwrap_or_default();
    assert_eq!(summary_counts(summary), (2, 0), "main's call and f's:\n{}", r.stderr);
    assert_eq!(calls_of(&report(&trace).unwrap(), "trivial", "f").0, 1);
}

/// Offsets and kinds of the chunks of a trace file.
fn chunks(file: &[u8]) -> Vec<(usize, u32)> {
    let mut at = 16;
    let mut v = Vec::new();
    while at + 12 <= file.len() {
        let kind = u32::from_le_bytes(file[at..at + 4].try_into().unwrap());
        let len = u32::from_le_bytes(file[at + 4..at + 8].try_into().unwrap()) as usize;
        v.push((at, kind));
        at += 12 + len;
    }
    v
}

/// Item 20: the checksum covers the chunk's kind: a real trace with the kind of an EVENTS
/// chunk changed is reported as damaged, and `info` no longer says it is complete.
#[test]
fn flipped_chunk_kind_is_damage() {
    let dir = TempDir::new("kind");
    let prog = waiter(&dir);
    let stop = dir.join("stop");
    fs::write(&stop, "").unwrap();
    let good = dir.join("good");
    let r = Invocation::new(&prog, dir.path()).args(&[path_str(&stop)]).run_recorded(&good);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(info(&good).contains("complete:         yes"));
    let bytes = fs::read(good.join("trace.fns")).unwrap();
    let (events_at, _) = *chunks(&bytes)
        .iter()
        .find(|(_, kind)| *kind == 3)
        .expect("the trace has an EVENTS chunk");
    // An unknown kind (skipped by readers) and a known one (decoded as something else).
    for new_kind in [7u8, 2] {
        let bad = dir.join(format!("bad{new_kind}"));
        copy_dir(&good, &bad);
        let mut b = bytes.clone();
        b[events_at] = new_kind;
        fs::write(bad.join("trace.fns"), &b).unwrap();
        let info = info(&bad);
        assert!(!info.contains("complete:         yes"), "kind {new_kind}:\n{info}");
        let rep = fnscope_cmd(&["report", "-i", path_str(&bad)]);
        assert!(
            rep.stderr.contains(&format!("damaged at byte offset {events_at}")),
            "kind {new_kind}: report names the damaged chunk\n{}",
            rep.describe()
        );
    }
}

/// fib(n) calls itself 2·fib(n+1)−1 times, all in one call tree under `main`.
const FIB: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(int argc, char **argv) { printf("%ld\n", fib(atoi(argv[1]))); return 0; }
"#;

/// Runs `fnscope ARGS` with its output thrown away; returns its exit code and the highest
/// peak resident memory (VmHWM, KiB) seen while it ran. VmHWM belongs to the address space
/// made by `exec`, unlike `wait4`'s maxrss, which starts from the spawning test process's.
fn peak_memory_kib(args: &[&str]) -> (i32, u64) {
    let mut child = Command::new(fnscope())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let t0 = Instant::now();
    loop {
        let hwm = fs::read_to_string(&status_file).ok().and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        });
        peak = peak.max(hwm.unwrap_or(0));
        if let Some(st) = child.try_wait().unwrap() {
            return (st.code().unwrap_or(-1), peak);
        }
        assert!(t0.elapsed() < TIMEOUT, "fnscope {args:?} did not finish");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Item 22: `replay` streams: its memory does not grow with the number of calls, even when
/// they all sit in one call tree (1.6 million calls here; a tree of them in memory took over
/// 100 MB).
#[test]
fn replay_memory_does_not_grow_with_calls() {
    let dir = TempDir::new("replay-mem");
    let prog = compile_c_text(dir.path(), "fib", FIB);
    let trace = dir.join("t");
    let r = Invocation::new(&prog, dir.path()).args(&["29"]).run_recorded(&trace);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(r.stdout, "514229\n");
    let (calls, lost) = summary_counts(&r.stderr);
    assert_eq!(lost, 0);
    assert!(calls >= 1_664_079, "fib(29) makes 1,664,079 calls: {calls}");
    for format in ["tree", "lines"] {
        let (code, kib) = peak_memory_kib(&["replay", "-i", path_str(&trace), "--format", format]);
        assert_eq!(code, 0, "replay --format {format}");
        assert!(kib < 48 * 1024, "replay --format {format} of {calls} calls peaked at {kib} KiB");
    }
    let mut cmd = Command::new(fnscope());
    cmd.args(["replay", "--format", "lines", "-i", path_str(&trace)]);
    let out = run(&mut cmd, b"", TIMEOUT);
    assert_eq!(out.stdout.lines().count() as u64, 2 * calls, "every call entered and left once");
}
