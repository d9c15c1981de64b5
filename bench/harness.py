#!/usr/bin/env python3
"""fnscope benchmark harness: fnscope against uftrace on the workloads of bench/workloads.

Run it through bench/run.sh (which builds fnscope first); see bench/README.md for what every
column means. Standard library only.

Environment:
  BENCH_RUNS=N      timed rounds (default 5); every configuration runs once per round, the
                    configurations alternating, and the table gives median (min-max)
  BENCH_ONLY=a,b    only these workloads (names as in the table: fib, smallfuncs, virtual,
                    threads-1, threads-2, threads-4, threads-8, churn, python, trivial)
  BENCH_TIMEOUT=S   give up on one run after S seconds (default 600)
  FNSCOPE=PATH      the fnscope binary (default target/release/fnscope)
  UFTRACE=PATH      the uftrace binary (default: uftrace on PATH, installed when missing)
  PYTHON311=PATH    the Python for the `python` workload (default /usr/bin/python3.11)
  BENCH_EXTRA=a,b   the measurements after the rounds, for the targets of issues 8 and 11
                    (default inprocess,startup,views,many; `none` for none): inprocess.py (11
                    rounds), startup.py (BENCH_RUNS rounds, cold cache included),
                    views.py (report and replay over fib(38), 126 million calls) and
                    tools/many_functions.py (calls of 64 to 4,096 distinct functions, 3 runs)
"""

import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WL = os.path.join(HERE, "workloads")
OUT = os.path.join(ROOT, "target", "bench")
BIN = os.path.join(OUT, "bin")
TRACES = os.path.join(OUT, "traces")

# Below this many calls, per-call figures mean nothing (the `trivial` row).
MIN_CALLS_PER_CALL_FIGURES = 1000


def log(msg):
    print("bench: " + msg, file=sys.stderr, flush=True)


def env_int(name, default):
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        n = int(v)
    except ValueError:
        sys.exit("bench: %s=%r is not a number" % (name, v))
    if n < 1:
        sys.exit("bench: %s must be at least 1" % name)
    return n


# --------------------------------------------------------------------------------------------
# Workloads


class Workload:
    def __init__(self, name, exe, args, startup_args, pg_exe=None, expected_known=True,
                 desc="", no_uftrace=None):
        self.name = name
        self.exe = exe              # binary built with -O2 (or the real program)
        self.args = args            # arguments of the measured run
        self.startup_args = startup_args  # arguments of the start-up run (returns at once)
        self.pg_exe = pg_exe        # -pg build for plain `uftrace record`, or None
        self.no_uftrace = no_uftrace  # why uftrace is not run on it, or None
        self.expected_known = expected_known
        self.desc = desc


def build_workloads(python311):
    """Builds the C/C++ workloads into target/bench/bin and returns the workload list."""
    os.makedirs(BIN, exist_ok=True)
    sources = [
        ("fib", "fib.c", "gcc", []),
        ("smallfuncs", "smallfuncs.c", "gcc", []),
        ("virtual", "virtual.cpp", "g++", []),
        ("threads", "threads.c", "gcc", ["-pthread"]),
        ("churn", "churn.c", "gcc", ["-pthread"]),
        ("trivial", "trivial.c", "gcc", []),
    ]
    for name, src, cc, extra in sources:
        if shutil.which(cc) is None:
            sys.exit("bench: %s not found: install it (apt-get install -y build-essential g++)"
                     % cc)
        path = os.path.join(WL, src)
        for suffix, flags in (("", ["-O2"]), (".pg", ["-O2", "-pg"])):
            out = os.path.join(BIN, name + suffix)
            cmd = [cc] + flags + extra + ["-o", out, path]
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True)
            if r.returncode != 0:
                sys.exit("bench: building %s failed:\n$ %s\n%s" % (src, " ".join(cmd), r.stdout))
    tool = os.path.join(BIN, "rdtsc_cost")
    r = subprocess.run(["gcc", "-O2", "-o", tool, os.path.join(HERE, "tools", "rdtsc_cost.c")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        sys.exit("bench: building rdtsc_cost.c failed:\n" + r.stdout)

    b = lambda n: os.path.join(BIN, n)  # noqa: E731
    ws = [
        Workload("fib", b("fib"), ["32"], ["0"], b("fib.pg"),
                 desc="recursive fib(32)"),
        Workload("smallfuncs", b("smallfuncs"), ["400000"], ["0"], b("smallfuncs.pg"),
                 desc="15 small functions with 1-8 int/float/pointer/struct arguments"),
        Workload("virtual", b("virtual"), ["150000"], ["0"], b("virtual.pg"),
                 desc="C++ virtual calls through base pointers"),
    ]
    for t in (1, 2, 4, 8):
        ws.append(Workload("threads-%d" % t, b("threads"), [str(t), "3000000"], [str(t), "0"],
                           b("threads.pg"),
                           desc="the same 3M-iteration call loop split over %d thread(s)" % t))
    ws.append(Workload("churn", b("churn"), ["20000"], ["0"], b("churn.pg"),
                       desc="80,000 threads, 4 at a time, of 6 calls each",
                       no_uftrace="`uftrace report` takes minutes over tens of thousands of "
                                  "tasks (and uftrace kept 288,630 of the 480,000 calls)"))
    ws.append(Workload("python", python311, [os.path.join(WL, "pybench.py")], ["-c", "pass"],
                       None, expected_known=False,
                       desc="Debian's python3.11 running bench/workloads/pybench.py"))
    ws.append(Workload("trivial", b("trivial"), [], None, b("trivial.pg"), expected_known=False,
                       desc="main() { return 0; }: start-up only"))
    return ws


# --------------------------------------------------------------------------------------------
# Running


class Run:
    def __init__(self, wall, cpu, rc, out, err, timed_out=False):
        self.wall = wall
        self.cpu = cpu
        self.rc = rc
        self.out = out
        self.err = err
        self.timed_out = timed_out


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd, timeout, cwd=None):
    """Runs cmd; wall time of the whole command, CPU time (user + system) of it and of every
    descendant it waited for."""
    c0 = cpu_children()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = p.communicate()
        timed_out = True
    t1 = time.perf_counter()
    c1 = cpu_children()
    return Run(t1 - t0, c1 - c0, p.returncode, out.decode("utf-8", "replace"),
               err.decode("utf-8", "replace"), timed_out)


def dir_size(path):
    total = 0
    for dp, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dp, f)).st_size
            except OSError:
                pass
    return total


def rmtree(path):
    shutil.rmtree(path, ignore_errors=True)


def first_line(text, default=""):
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:160]
    return default


def bench_calls(stdout):
    m = re.search(r"^bench-calls: (\d+)", stdout, re.M)
    return int(m.group(1)) if m else None


SUMMARY_RE = re.compile(r"(\d+) functions hooked, (\d+) skipped; (\d+) calls (?:recorded|counted)")


class Config:
    """One way of running a workload: native, or under a tool."""

    key = ""
    label = ""

    def applicable(self, w):
        """None when the configuration can run w, else why not."""
        return None

    def command(self, w, args, trace_dir, probe=False):
        raise NotImplementedError

    def measure(self, w, r, trace_dir):
        """(calls, trace bytes, hooked, skipped) of a finished run; raises RuntimeError."""
        raise NotImplementedError


class Native(Config):
    key, label = "native", "native"

    def command(self, w, args, trace_dir, probe=False):
        return [w.exe] + args

    def measure(self, w, r, trace_dir):
        return bench_calls(r.out), None, None, None


class Fnscope(Config):
    def __init__(self, fnscope, mode):
        self.fnscope = fnscope
        self.mode = mode
        self.key = "fnscope-" + mode
        self.label = "fnscope (timing)" if mode == "time" else "fnscope --mode count"

    def command(self, w, args, trace_dir, probe=False):
        cmd = [self.fnscope, "record"]
        if self.mode != "time":
            cmd += ["--mode", self.mode]
        return cmd + ["-o", trace_dir, "--", w.exe] + args

    def measure(self, w, r, trace_dir):
        m = None
        for line in r.err.splitlines():
            if line.startswith("fnscope:"):
                m = SUMMARY_RE.search(line) or m
        hooked = skipped = calls = None
        if m:
            hooked, skipped, calls = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if calls is None:
            # No summary line: ask the report.
            rep = subprocess.run([self.fnscope, "report", "-i", trace_dir, "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True)
            if rep.returncode != 0:
                raise RuntimeError("no summary line and `fnscope report` failed: "
                                   + first_line(rep.stderr))
            calls = sum(int(f.get("calls", 0)) for f in json.loads(rep.stdout))
        return calls, dir_size(trace_dir), hooked, skipped


UFTRACE_PATCHED_ALL = re.compile(r"patched all \((\d+)\) functions")
UFTRACE_STAT = re.compile(r"^\S*\s*(total|patched|failed|skipped|no match):\s+(\d+)", re.M)


class Uftrace(Config):
    def __init__(self, uftrace, pg):
        self.uftrace = uftrace
        self.pg = pg
        self.key = "uftrace-pg" if pg else "uftrace-P"
        self.label = "uftrace (-pg build)" if pg else "uftrace -P ."

    def applicable(self, w):
        if self.uftrace is None:
            return "uftrace not installed"
        if w.no_uftrace:
            return w.no_uftrace
        if self.pg and w.pg_exe is None:
            return "no -pg build of %s" % os.path.basename(w.exe)
        return None

    def command(self, w, args, trace_dir, probe=False):
        cmd = [self.uftrace, "record"]
        if probe:
            cmd.append("-v")
        cmd += ["-d", trace_dir, "--no-libcall"]
        if self.pg:
            return cmd + [w.pg_exe] + args
        return cmd + ["-P", ".", w.exe] + args

    def calls(self, trace_dir):
        rep = subprocess.run([self.uftrace, "report", "-d", trace_dir, "-f", "call",
                              "--no-pager"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
        if rep.returncode != 0:
            if "cannot open record data" in rep.stderr:
                return 0  # no function was hooked, or none ran: uftrace wrote no data
            raise RuntimeError("`uftrace report` failed: " + first_line(rep.stderr))
        total = 0
        for line in rep.stdout.splitlines():
            m = re.match(r"^\s*(\d+)\s+(.*)$", line)
            if not m:
                continue
            # linux:schedule lines are scheduler events, not calls.
            if not m.group(2).startswith("linux:"):
                total += int(m.group(1))
        return total

    def measure(self, w, r, trace_dir):
        return self.calls(trace_dir), dir_size(trace_dir), None, None

    def patch_stats(self, err):
        """(patched, failed + skipped, stats) from the -v output of `uftrace record -P`."""
        patched = failed = 0
        found = False
        if "dynamic patch type" in err and "patch stats" not in err and "patched all" not in err:
            return 0, None, {}  # nothing to patch (every function too small)
        for m in UFTRACE_PATCHED_ALL.finditer(err):
            patched += int(m.group(1))
            found = True
        stats = {}
        for m in UFTRACE_STAT.finditer(err):
            k = m.group(1)
            stats[k] = stats.get(k, 0) + int(m.group(2))
            found = True
        patched += stats.get("patched", 0)
        failed += stats.get("failed", 0) + stats.get("skipped", 0)
        if not found:
            return None
        return patched, failed, stats


def mcount_functions(exe):
    """Functions of a -pg build that call mcount: what plain `uftrace record` traces."""
    if exe is None or shutil.which("objdump") is None:
        return None
    r = subprocess.run(["objdump", "-d", "--no-show-raw-insn", exe], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, universal_newlines=True)
    if r.returncode != 0:
        return None
    return len(re.findall(r"\scall\s.*<(?:mcount|__fentry__)(?:@[\w.@]+)?>", r.stdout))


# --------------------------------------------------------------------------------------------
# Statistics and formatting


def med(v):
    v = [x for x in (v or []) if x is not None]
    return statistics.median(v) if v else None


def fmt_num(x, kind):
    if x is None:
        return "—"
    if kind == "ms":
        return "%.0f" % x if abs(x) >= 100 else "%.1f" % x
    if kind == "ns":
        return "%.0f" % x if abs(x) >= 1000 else "%.1f" % x
    if kind == "x":
        return "%.1f×" % x if abs(x) < 100 else "%.0f×" % x
    if kind == "b":
        return "%.1f" % x if abs(x) < 100 else "%.0f" % x
    if kind == "ratio":
        return "%.2f" % x
    return str(x)


def spread(v, kind):
    """median (min–max)"""
    v = [x for x in v if x is not None]
    if not v:
        return "—"
    m = fmt_num(med(v), kind)
    if len(v) == 1:
        return m
    return "%s (%s–%s)" % (m, fmt_num(min(v), kind), fmt_num(max(v), kind))


def sh(cmd):
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, cwd=ROOT)
        return r.stdout.strip()
    except OSError:
        return ""


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# --------------------------------------------------------------------------------------------
# Main


def ensure_uftrace():
    explicit = os.environ.get("UFTRACE")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    p = shutil.which("uftrace")
    if p:
        return p
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("uftrace is not installed: installing it (apt-get update; apt-get install -y "
            "uftrace)")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], env=env, stdout=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "uftrace"], env=env, stdout=sys.stderr)
        p = shutil.which("uftrace")
        if p:
            return p
        log("installing uftrace failed: the uftrace rows are n/a")
        return None
    log("uftrace is not installed and this is not root: install it with "
        "`sudo apt-get update && sudo apt-get install -y uftrace` and run again; "
        "the uftrace rows are n/a")
    return None


EXTRA = ("inprocess", "startup", "views", "many")


def extra_wanted():
    """The measurements BENCH_EXTRA names (see the module comment), checked before the
    rounds so that a mistake costs no time."""
    want = os.environ.get("BENCH_EXTRA", ",".join(EXTRA))
    want = [] if want.strip() == "none" else [x.strip() for x in want.split(",") if x.strip()]
    unknown = set(want) - set(EXTRA)
    if unknown:
        sys.exit("bench: unknown measurement(s) in BENCH_EXTRA: %s (known: %s, or none)" % (
            ", ".join(sorted(unknown)), ", ".join(EXTRA)))
    if "views" in want and not os.path.exists("/usr/bin/time"):
        sys.exit("bench: views.py needs GNU time: apt-get install -y time, or leave views out of "
                 "BENCH_EXTRA")
    return want


def run_extra(want, fnscope, uftrace, runs):
    """Runs the measurements `want` names, by the scripts that also run on their own: a dict
    with `inprocess` (costs: one rdtsc, rdtscp and clock_gettime in ns, medians over its
    rounds; got: ns per call per configuration and round), `startup` (rows of startup.measure), `views` (calls, rows of
    views.measure) and `many` (many_functions.measure), for those that ran, and `failed` ({name: why}) for those that did not: a
    failure there costs its rows of the last table, not the rounds already measured."""
    import inprocess
    import startup
    import views
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
    import many_functions
    todo = {
        "inprocess": ("in-process cost per call (inprocess.py, 11 rounds)",
                      lambda: dict(zip(("costs", "got"), inprocess.measure(fnscope, 11, uftrace=uftrace)))),
        "startup": ("start-up (startup.py, %d rounds, cold cache included)" % runs,
                    lambda: startup.measure([fnscope], runs, True)),
        "views": ("report and replay over fib(38) (views.py)",
                  lambda: views.measure(fnscope, 38, 1, ["report", "replay"])),
        "many": ("calls of many distinct functions (tools/many_functions.py, 3 runs)",
                 lambda: many_functions.measure(fnscope, 3, uftrace)),
    }
    out = {"failed": {}}
    for name in want:
        what, measure = todo[name]
        log(what)
        try:
            out[name] = measure()
        # The scripts end with sys.exit on a run they cannot use.
        except (Exception, SystemExit) as e:
            why = "%s: %s" % (type(e).__name__, e)
            log("%s failed: %s" % (name, why))
            out["failed"][name] = why
    return out


def targets_8_11(p, extra, m, rdtsc):
    """Prints the targets of issues 8 and 11 next to what this run measured (`m`: the median
    of a figure of the main table), each ratio taken to the floor measured in the same run:
    by the in-process rounds when they ran, else `rdtsc` (the cost measured before the
    rounds)."""
    ip = extra.get("inprocess")
    st = dict(extra.get("startup", []))
    vw = extra.get("views")
    failed = extra.get("failed", {})
    if not (ip or st or vw or failed):
        return

    def med_of(name):
        v = ip["got"].get(name) if ip else None
        return statistics.median(v) if v else None

    floor = 2 * ip["costs"]["rdtsc"] if ip else 2 * rdtsc["rdtsc"] if "rdtsc" in rdtsc else None

    def to_floor(x):
        return "—" if x is None or not floor else "%.2f× the floor" % (x / floor)

    p("")
    p("### Targets (issues 8 and 11)")
    p("")
    if ip:
        p("Floor: two `rdtsc`, %.1f ns, measured in every round of the in-process runs "
          "(bench/inprocess.py, 11 rounds, medians); the header's floor was measured once, "
          "before the rounds." % floor)
        p("")
    for name, why in sorted(failed.items()):
        p("- not measured: %s (%s)" % (name, why.replace("\n", " ")[:300]))
    if failed:
        p("")
    p("| figure | target | measured |")
    p("|---|---|---|")
    timing = med_of("timing")
    if ip:
        p("| timing mode, in-process ns/call, fib | ≤ 1.25× the floor | %s ns, %s |" % (
            fmt_num(timing, "ns"), to_floor(timing)))
    cpu = m(("fib", "fnscope-time"), "cpu_ns_call")
    p("| whole-tree CPU per call, fib (program + recorder, main table) | ≤ 2× the floor | %s ns, "
      "%s |" % (fmt_num(cpu, "ns"), to_floor(cpu)))
    uf = med_of("uftrace -P .")
    if uf and timing:
        p("| vs `uftrace record -P .`, in-process | ≥ 6× cheaper | %.2f× cheaper (%s vs %s ns) |" % (
            uf / timing, fmt_num(uf, "ns"), fmt_num(timing, "ns")))
    p("| trace bytes per call, fib / python3.11 | ≤ 1 | %s / %s |" % (
        fmt_num(m(("fib", "fnscope-time"), "bytes_call"), "b"),
        fmt_num(m(("python", "fnscope-time"), "bytes_call"), "b")))
    if st:
        first, later = st.get("cc1plus, cold cache"), st.get("cc1plus --version")
        if first and later:
            p("| `cc1plus --version` traced, first run / later runs | ≤ 400 ms / ≤ 60 ms | %s / %s ms "
              "(native %s ms) |" % (fmt_num(first[1] * 1e3, "ms"), fmt_num(later[1] * 1e3, "ms"),
                                   fmt_num(later[0] * 1e3, "ms")))
        mk = st.get("make -j2")
        if mk:
            p("| `make -j2` of a generated 10-file C project, traced / native | ≤ 3× | %.1f× "
              "(%s vs %s ms) |" % (mk[1] / mk[0], fmt_num(mk[1] * 1e3, "ms"),
                                  fmt_num(mk[0] * 1e3, "ms")))
    if vw:
        calls, rows = vw
        got = {r[0]: r for r in rows}
        if "report" in got and "replay" in got:
            p("| `report` / `replay` over %.0f M calls | ≤ 4 s / ≤ 30 s, both ≤ 100 MB | %.1f s, "
              "%.0f MB / %.1f s, %.0f MB |" % (calls / 1e6, got["report"][1], got["report"][3],
                                               got["replay"][1], got["replay"][3]))
    plain, values, flight = med_of("fib3 timing"), med_of("fib3 -A (3 args) -R"), med_of(
        "fib3 -A (3 args) -R --flight")
    if plain and values and flight:
        p("| issue 11: three integer arguments and the return value recorded, ÷ a plain timed "
          "call | ≤ 1.3× | %.2f× (%s vs %s ns); with --flight %.2f× |" % (
              values / plain, fmt_num(values, "ns"), fmt_num(plain, "ns"), flight / plain))


def many_functions_section(p, got):
    """Prints what tools/many_functions.py measured (`got`, its `measure`), if it ran: the
    workloads above call few functions, real programs thousands."""
    if not got:
        return
    p("")
    p("### Calls of many distinct functions (tools/many_functions.py)")
    p("")
    p("Programs that call N small functions in turn, timing their own rounds; ns per call, "
      "medians of 3 runs. The mock-ups run a call's branches only (see the script).")
    p("")
    p("| functions | native | fnscope | fnscope, functions in a library (`--lib`) | uftrace -P . | "
      "uftrace ÷ fnscope | mock-up: plain | hooked | direct jump to the stub | slot calls the "
      "function |")
    p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    mock = {row[0]: row[1:] for row in got["mockups"]}
    for n, native, traced, in_lib, peer in got["programs"]:
        designs = mock.get(n, (None,) * 4)
        p("| %d | %s | %s | %s | %s | %s | %s |" % (
            n, fmt_num(native, "ns"), fmt_num(traced, "ns"), fmt_num(in_lib, "ns"), fmt_num(peer, "ns"),
            "—" if not peer or not traced else "%.2f" % (peer / traced),
            " | ".join(fmt_num(x, "ns") for x in designs)))


def main():
    if len(sys.argv) > 1:
        if sys.argv[1] in ("-h", "--help"):
            print(__doc__.strip())
            return
        sys.exit("bench: harness.py takes no arguments (see --help); settings are environment "
                 "variables")
    load_start = "%.2f" % os.getloadavg()[0]
    runs = env_int("BENCH_RUNS", 5)
    timeout = env_int("BENCH_TIMEOUT", 600)
    only = [s.strip() for s in os.environ.get("BENCH_ONLY", "").split(",") if s.strip()]
    extra_todo = extra_wanted()

    fnscope = os.environ.get("FNSCOPE") or os.path.join(ROOT, "target", "release", "fnscope")
    fnscope = os.path.abspath(fnscope)
    if not os.access(fnscope, os.X_OK):
        sys.exit("bench: no fnscope at %s: run bench/run.sh (it builds it), or `cargo build "
                 "--release -p fnscope-cli`, or set FNSCOPE" % fnscope)
    # Run a copy, so that a rebuild of target/release during the run changes nothing (the
    # agent library is embedded in the binary).
    os.makedirs(BIN, exist_ok=True)
    pinned = os.path.join(BIN, "fnscope")
    shutil.copy2(fnscope, pinned + ".tmp")
    os.replace(pinned + ".tmp", pinned)
    fnscope = pinned
    uftrace = ensure_uftrace()
    python311 = os.environ.get("PYTHON311") or "/usr/bin/python3.11"

    log("building the workloads into %s" % os.path.relpath(BIN, ROOT))
    workloads = build_workloads(python311)
    if only:
        unknown = set(only) - {w.name for w in workloads}
        if unknown:
            sys.exit("bench: unknown workload(s) in BENCH_ONLY: %s" % ", ".join(sorted(unknown)))
        workloads = [w for w in workloads if w.name in only]

    rec_help = sh([fnscope, "record", "--help"])
    count_supported = "--mode" in rec_help

    configs = [Native(), Fnscope(fnscope, "time")]
    count_cfg = Fnscope(fnscope, "count")
    if count_supported:
        configs.append(count_cfg)
    uf_p, uf_pg = Uftrace(uftrace, False), Uftrace(uftrace, True)
    configs += [uf_p, uf_pg]
    all_labels = [c.label for c in configs]
    if not count_supported:
        all_labels.insert(2, count_cfg.label)

    rd = run([os.path.join(BIN, "rdtsc_cost")], 60)
    rdtsc = {}
    for m in re.finditer(r"^([\w_]+)-ns: ([\d.]+)", rd.out, re.M):
        rdtsc[m.group(1)] = float(m.group(2))

    # State per (workload, config).
    na = {}        # why the configuration can't be measured
    samples = {}   # list of dicts per timed round
    info = {}      # hooked, skipped, notes
    for w in workloads:
        if not os.access(w.exe, os.X_OK):
            for c in configs:
                na[(w.name, c.key)] = "%s not found" % w.exe
            continue
        for c in configs:
            why = c.applicable(w)
            if why:
                na[(w.name, c.key)] = why
            samples[(w.name, c.key)] = []
            info[(w.name, c.key)] = {}

    os.makedirs(TRACES, exist_ok=True)

    def do_run(w, c, args, tag, probe=False):
        d = os.path.join(TRACES, "%s.%s.%s" % (w.name, c.key, tag))
        rmtree(d)
        r = run(c.command(w, args, d, probe), timeout)
        try:
            if r.timed_out:
                raise RuntimeError("timed out after %d s (BENCH_TIMEOUT)" % timeout)
            if r.rc != 0:
                raise RuntimeError("exit status %s: %s" % (r.rc, first_line(r.err, "no message")))
            calls, nbytes, hooked, skipped = c.measure(w, r, d)
        finally:
            if not probe:
                rmtree(d)
        return r, calls, nbytes, hooked, skipped, d

    # Warm-up: every configuration once on the start-up run (fills the page cache; the
    # uftrace -P run is verbose, for its patching statistics), and pg-build function counts.
    log("warm-up (start-up runs; uftrace patch statistics)")
    for w in workloads:
        for c in configs:
            k = (w.name, c.key)
            if k in na:
                continue
            args = w.startup_args if w.startup_args is not None else w.args
            probe = c is uf_p
            try:
                r, calls, nbytes, hooked, skipped, d = do_run(w, c, args, "warm", probe)
            except RuntimeError as e:
                na[k] = str(e)
                continue
            if probe:
                st = uf_p.patch_stats(r.err)
                rmtree(d)
                if st is None:
                    info[k]["note"] = "no patch statistics in -v output"
                else:
                    info[k]["hooked"], info[k]["skipped"], info[k]["stats"] = st
                    if st[0] == 0 and st[2].get("total"):
                        na[k] = "dynamic patching hooked no function (%s)" % ", ".join(
                            "%s %d" % kv for kv in sorted(st[2].items()))
            if c is uf_pg:
                info[k]["hooked"] = mcount_functions(w.pg_exe)
                info[k]["skipped"] = None

    # Timed rounds: the configurations alternate, their order rotating from round to round.
    t_start = time.time()
    for rnd in range(runs):
        log("round %d/%d" % (rnd + 1, runs))
        for w in workloads:
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            for c in order:
                k = (w.name, c.key)
                if k in na:
                    continue
                s = {}
                try:
                    r, calls, nbytes, hooked, skipped, _ = do_run(w, c, w.args, "run")
                    s.update(wall=r.wall, cpu=r.cpu, calls=calls, bytes=nbytes)
                    if hooked is not None:
                        info[k]["hooked"], info[k]["skipped"] = hooked, skipped
                    if w.startup_args is not None:
                        r2, _, _, _, _, _ = do_run(w, c, w.startup_args, "start")
                        s.update(st_wall=r2.wall, st_cpu=r2.cpu)
                    else:
                        s.update(st_wall=r.wall, st_cpu=r.cpu)
                except RuntimeError as e:
                    na[k] = str(e)
                    log("%s / %s: %s" % (w.name, c.label, e))
                    continue
                samples[k].append(s)
                log("  %-11s %-22s %8.1f ms  %s calls" % (
                    w.name, c.label, s["wall"] * 1e3, s["calls"]))
    elapsed = time.time() - t_start

    # Raw samples first, so that they survive a failure below.
    os.makedirs(OUT, exist_ok=True)
    raw = {
        "runs": runs, "rdtsc_ns": rdtsc, "count_mode": count_supported,
        "na": {"%s/%s" % k: v for k, v in na.items()},
        "samples": {"%s/%s" % k: v for k, v in samples.items()},
        "info": {"%s/%s" % k: {a: b for a, b in v.items()} for k, v in info.items()},
    }
    with open(os.path.join(OUT, "results.json"), "w") as fh:
        json.dump(raw, fh, indent=1, sort_keys=True)
    # A uftrace that could not trace fib in the rounds is left out of the in-process runs too.
    usable = uftrace if ("fib", "uftrace-P") not in na else None
    extra = run_extra(extra_todo, fnscope, usable, runs)
    raw["extra"] = extra
    with open(os.path.join(OUT, "results.json"), "w") as fh:
        json.dump(raw, fh, indent=1, sort_keys=True)

    # ----------------------------------------------------------------------------------------
    # Figures per (workload, config), paired with the native run of the same round.
    figures = {}
    for w in workloads:
        nat = samples.get((w.name, "native"), [])
        expected = med([s["calls"] for s in nat if s.get("calls") is not None])
        if not w.expected_known:
            expected = None
        for c in configs:
            k = (w.name, c.key)
            ss = samples.get(k, [])
            f = {"runs": len(ss)}
            figures[k] = f
            if not ss:
                continue
            f["wall_ms"] = [s["wall"] * 1e3 for s in ss]
            f["st_ms"] = [s["st_wall"] * 1e3 for s in ss]
            f["calls"] = med([s["calls"] for s in ss])
            f["calls_min"] = min(s["calls"] or 0 for s in ss)
            f["calls_max"] = max(s["calls"] or 0 for s in ss)
            if c.key == "native":
                continue
            pairs = list(zip(ss, nat))
            if not pairs:
                continue
            f["slowdown"] = [s["wall"] / n["wall"] for s, n in pairs]
            f["startup_ms"] = [(s["st_wall"] - n["st_wall"]) * 1e3 for s, n in pairs]
            calls = f["calls"]
            if f["calls_min"] >= MIN_CALLS_PER_CALL_FIGURES:
                f["ns_call"] = [(s["wall"] - n["wall"]) * 1e9 / s["calls"] for s, n in pairs]
                f["ns_call_net"] = [
                    ((s["wall"] - n["wall"]) - (s["st_wall"] - n["st_wall"])) * 1e9 / s["calls"]
                    for s, n in pairs]
                f["cpu_ns_call"] = [(s["cpu"] - n["cpu"]) * 1e9 / s["calls"] for s, n in pairs]
                f["bytes_call"] = [s["bytes"] / s["calls"] for s in ss if s["bytes"] is not None]
            if expected is not None and calls is not None:
                lo, hi = f["calls_min"] - expected, f["calls_max"] - expected
                slack = max(100, expected // 10000)
                if 0 <= lo and hi <= slack:
                    f["check"] = "ok (+%d)" % hi if lo == hi else "ok (+%d..+%d)" % (lo, hi)
                else:
                    f["check"] = "**%+d** vs %d" % (hi if abs(hi) > abs(lo) else lo, expected)

    # ----------------------------------------------------------------------------------------
    # Output
    commit = sh(["git", "rev-parse", "--short=12", "HEAD"]) or "?"
    if sh(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += " (+ uncommitted changes)"
    lines = []
    p = lines.append
    p("## fnscope benchmark")
    p("")
    p("- commit %s, %s" % (commit, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    p("- %s, %d CPUs, Linux %s; load average %s at the start, %s at the end" % (
        cpu_model(), os.cpu_count() or 0, platform.release(), load_start,
        "%.2f" % os.getloadavg()[0]))
    p("- %s; %s; %s" % (
        first_line(sh([fnscope, "--version"])) or "fnscope ?",
        first_line(sh([uftrace, "--version"])) if uftrace else "uftrace: not installed",
        first_line(sh(["gcc", "--version"]))))
    if rdtsc:
        p("- one `rdtsc` costs %.1f ns here (`rdtscp` %.1f ns, `clock_gettime` %.1f ns): the "
          "floor of timing mode, two timestamps per call, is %.1f ns/call" % (
              rdtsc.get("rdtsc", 0), rdtsc.get("rdtscp", 0), rdtsc.get("clock_gettime", 0),
              2 * rdtsc.get("rdtsc", 0)))
    p("- %d timed round(s), configurations alternating; figures are median (min–max) over the "
      "rounds; %.0f s of timed runs" % (runs, elapsed))
    p("- count mode: %s" % ("measured (`fnscope record --mode count`)" if count_supported else
                            "n/a (not implemented: `fnscope record --help` has no --mode)"))
    p("")
    p("| workload | tool | calls recorded | check | wall ms | slowdown | ns/call | "
      "ns/call net of start-up | CPU ns/call | bytes/call | hooked / skipped | start-up ms |")
    p("|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for w in workloads:
        for label in all_labels:
            c = next((x for x in configs if x.label == label), None)
            if c is None:
                p("| %s | %s | n/a (not implemented) | | | | | | | | | |" % (w.name, label))
                continue
            k = (w.name, c.key)
            f = figures.get(k, {})
            if k in na or not f.get("runs"):
                p("| %s | %s | n/a (%s) | | | | | | | | | |" % (
                    w.name, label, na.get(k, "no run").replace("|", "/")))
                continue
            calls = f.get("calls")
            if c.key == "native":
                p("| %s | native | %s | %s | %s | 1.0× | | | | | | %s |" % (
                    w.name, "%d expected" % calls if (calls and w.expected_known) else "—",
                    "" if w.expected_known else "n/a", spread(f["wall_ms"], "ms"),
                    spread(f["st_ms"], "ms")))
                continue
            calls_s = "—" if calls is None else "%d" % calls
            if f.get("calls_min") != f.get("calls_max"):
                calls_s += " (%d–%d)" % (f["calls_min"], f["calls_max"])
            ii = info.get(k, {})
            hs = "—"
            if ii.get("hooked") is not None:
                hs = "%d / %s" % (ii["hooked"], "—" if ii.get("skipped") is None
                                  else ii["skipped"])
                if c.key == "uftrace-pg":
                    hs = "%d (mcount) / —" % ii["hooked"]
            p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                w.name, label, calls_s, f.get("check", "—"), spread(f["wall_ms"], "ms"),
                spread(f.get("slowdown", []), "x"), spread(f.get("ns_call", []), "ns"),
                spread(f.get("ns_call_net", []), "ns"), spread(f.get("cpu_ns_call", []), "ns"),
                fmt_num(med(f.get("bytes_call", [])), "b"), hs,
                spread(f.get("startup_ms", []), "ms")))

    # Ratios fnscope / uftrace.
    def m(k, field):
        v = figures.get(k, {}).get(field)
        return med(v) if v else None

    def ratio(a, b):
        return "—" if a is None or b is None or b <= 0 else fmt_num(a / b, "ratio")

    p("")
    p("### fnscope / uftrace, per workload (below 1: fnscope is cheaper)")
    p("")
    p("| workload | ns/call ÷ uftrace -P . | ns/call ÷ uftrace -pg | CPU ns/call ÷ uftrace -P . "
      "| bytes/call ÷ uftrace -P . | start-up ÷ uftrace -P . | count-mode ns/call ÷ uftrace "
      "-P . |")
    p("|---|--:|--:|--:|--:|--:|--:|")
    for w in workloads:
        f, up, upg = (w.name, "fnscope-time"), (w.name, "uftrace-P"), (w.name, "uftrace-pg")
        cnt = (w.name, "fnscope-count")
        p("| %s | %s | %s | %s | %s | %s | %s |" % (
            w.name, ratio(m(f, "ns_call"), m(up, "ns_call")),
            ratio(m(f, "ns_call"), m(upg, "ns_call")),
            ratio(m(f, "cpu_ns_call"), m(up, "cpu_ns_call")),
            ratio(m(f, "bytes_call"), m(up, "bytes_call")),
            ratio(m(f, "startup_ms"), m(up, "startup_ms")),
            ratio(m(cnt, "ns_call"), m(up, "ns_call")) if count_supported
            else "n/a (not implemented)"))

    # The targets of issue 4 that this table measures.
    p("")
    p("### Targets (issue 4)")
    p("")
    p("| figure | target | measured |")
    p("|---|---|---|")
    fib_ns, fib_up = m(("fib", "fnscope-time"), "ns_call"), m(("fib", "uftrace-P"), "ns_call")
    p("| timing mode, fib, ns/call | ≤ 25, and ≥ 5× less than uftrace -P . | %s ns, net of "
      "start-up %s ns (uftrace -P .: %s ns, %s× more; floor 2 × rdtsc = %s ns) |" % (
          fmt_num(fib_ns, "ns"), fmt_num(m(("fib", "fnscope-time"), "ns_call_net"), "ns"),
          fmt_num(fib_up, "ns"),
          "—" if not fib_ns or not fib_up else "%.1f" % (fib_up / fib_ns),
          fmt_num(2 * rdtsc["rdtsc"], "ns") if "rdtsc" in rdtsc else "?"))
    if count_supported:
        p("| count mode, fib, ns/call | ≤ 2 | %s ns (net of start-up: %s ns; CPU: %s ns) |" % (
            fmt_num(m(("fib", "fnscope-count"), "ns_call"), "ns"),
            fmt_num(m(("fib", "fnscope-count"), "ns_call_net"), "ns"),
            fmt_num(m(("fib", "fnscope-count"), "cpu_ns_call"), "ns")))
        a = figures.get(("threads-8", "fnscope-count"), {}).get("calls")
        b = figures.get(("threads-8", "native"), {}).get("calls")
        if a is not None and b is not None:
            p("| count mode, correct with many threads | exact counts | threads-8: %d counted, "
              "%d expected (+ main and C runtime functions) |" % (a, b))
    else:
        p("| count mode, fib, ns/call | ≤ 2 | n/a (not implemented) |")
    p("| trace size, fib, timing mode | ≤ 8 bytes/call (uftrace: 32) | %s (uftrace -P .: %s) |"
      % (fmt_num(m(("fib", "fnscope-time"), "bytes_call"), "b"),
         fmt_num(m(("fib", "uftrace-P"), "bytes_call"), "b")))
    for field, what in (("cpu_ns_call", "CPU ns/call"), ("ns_call", "wall ns/call")):
        a, b = m(("threads-8", "fnscope-time"), field), m(("threads-1", "fnscope-time"), field)
        p("| 8 threads vs 1 thread, %s | ≤ 1.5× | %s (%s vs %s) |" % (
            what, ratio(a, b), fmt_num(a, "ns"), fmt_num(b, "ns")))
    p("| start-up to hook all functions of a large binary | ≤ 200 ms (20 MB libpython3.11 "
      "with symbols) | %s ms for Debian's python3.11 `-c pass` (6.8 MB, stripped; %s / %s "
      "functions hooked / skipped) |" % (
          fmt_num(m(("python", "fnscope-time"), "startup_ms"), "ms"),
          info.get(("python", "fnscope-time"), {}).get("hooked", "?"),
          info.get(("python", "fnscope-time"), {}).get("skipped", "?")))
    targets_8_11(p, extra, m, rdtsc)
    many_functions_section(p, extra.get("many"))
    table = "\n".join(lines) + "\n"
    sys.stdout.write(table)
    sys.stdout.flush()

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "results.md"), "w") as fh:
        fh.write(table)
    log("table written to %s; raw samples in results.json" % os.path.relpath(
        os.path.join(OUT, "results.md"), ROOT))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
