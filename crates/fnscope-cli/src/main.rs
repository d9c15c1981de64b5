//! `fnscope`: function-level tracing and profiling of unmodified native programs.

mod agent_lib;
mod export;
mod flight;
mod funcs;
mod progress;
mod record;
mod server;
mod table_cache;
mod values;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "fnscope", version, about = "Trace and profile every function of an unmodified program")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create an upload token and print it (only this once).
    Create {
        /// A name to recognise the token by (who or what uploads with it).
        #[arg(long)]
        name: String,
        /// Database of the server.
        #[arg(long, default_value = "sqlite:fnscope.db")]
        db: String,
    },
}

// One command is parsed per run: a boxed `Record` would only make its fields harder to reach.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run a program with every hookable function traced, writing the trace to a folder.
    Record {
        /// Trace folder. A trace already in it is kept as FOLDER.old.
        #[arg(short = 'o', long = "output", default_value = "fnscope.data")]
        output: PathBuf,
        /// Also hook shared libraries whose path contains PATTERN (repeatable).
        #[arg(long = "lib", value_name = "PATTERN")]
        libs: Vec<String>,
        /// Shared buffer size in MiB. A thread holds a chunk of it (256 KiB, 64 KiB with
        /// --flight) from its first call; only the pages written take memory. When it is
        /// full, a thread that needs a new chunk waits at most about 2 seconds for fnscope to
        /// free one, then drops its records: the program runs on, and the calls lost are
        /// counted in the summary line and in `fnscope info`. [default: 1024, or 256 with
        /// --flight: 4,096 chunks, for 4,096 threads alive at once; 256 under an
        /// address-space limit (ulimit -v) below four times the whole region, call stacks
        /// included (about 6 GiB)]
        #[arg(long = "buffer-mb", value_name = "MIB")]
        buffer_mb: Option<u32>,
        /// Say what the agent does in each process.
        #[arg(short, long)]
        verbose: bool,
        /// `time`: entry and exit time of every call; `count`: only how many times each
        /// function ran, at the lowest cost.
        #[arg(long, value_enum, default_value_t = Mode::Time)]
        mode: Mode,
        /// Trace only the program started, not the programs it runs with `exec` or
        /// `posix_spawn` (by default every one is followed, even with an environment of its
        /// own). Forked processes are the same program and stay traced.
        #[arg(long)]
        no_follow_exec: bool,
        /// Analyse every module again instead of using the analyses of earlier runs (kept
        /// next to the agent library, per file version, and used automatically), and
        /// compress every image table again instead of taking big ones from earlier runs.
        #[arg(long)]
        no_cache: bool,
        /// Mono programs: turn the JIT's inlining off (adds `-O=-inline` to
        /// `MONO_ENV_OPTIONS`), so that every call of a managed method is a call of its own
        /// code and counts are exact. Slower: the small methods Mono inlines become calls.
        #[arg(long)]
        mono_no_inline: bool,
        /// When more than CHUNKS full chunks wait for the recorder (the program makes calls
        /// faster than they compress), write them to the trace uncompressed, so that the
        /// program does not wait; they are compressed when the program has ended. 0 writes
        /// every chunk uncompressed first; a large number never does. Not used by --flight,
        /// which copies every chunk. [default: 4, or half the buffer (at most 128 MiB of
        /// chunks) while every processor is busy: writing chunks uncompressed then costs the
        /// program more than it saves; and 0 while a backlog lasts and a processor is free]
        #[arg(long, value_name = "CHUNKS")]
        spill_after: Option<usize>,
        #[command(flatten)]
        filters: record::FilterArgs,
        #[command(flatten)]
        values: values::ValueArgs,
        #[command(flatten)]
        flight: flight::FlightArgs,
        /// Once recorded, upload the run to the fnscope server at URL.
        #[arg(long, value_name = "URL")]
        upload: Option<String>,
        /// Upload token (default: $FNSCOPE_TOKEN); with --upload.
        #[arg(long, requires = "upload")]
        token: Option<String>,
        /// KEY=VALUE tag of the uploaded run (repeatable); with --upload.
        #[arg(long = "tag", value_name = "KEY=VALUE", requires = "upload")]
        tags: Vec<String>,
        /// The program and its arguments, after `--`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
        command: Vec<String>,
    },
    /// Ask a program recorded with `record --flight` for a snapshot of its flight recorder
    /// now; the program goes on.
    Snapshot {
        /// Process id of the traced program (or of any of its traced processes).
        pid: u32,
    },
    /// Serve the team server: uploaded runs in one database, hot functions on web pages and
    /// as JSON under /api/.
    Serve {
        /// Address and port to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Database: sqlite:FILE (created if missing) or postgres://USER@HOST:PORT/DB.
        #[arg(long, default_value = "sqlite:fnscope.db")]
        db: String,
        /// Largest upload accepted (compressed), in bytes or with K, M or G.
        #[arg(long, default_value = "64M", value_parser = server::parse_size)]
        max_upload: u64,
    },
    /// Manage the server's upload tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Send recorded or merged traces to an fnscope server.
    Upload {
        /// Server URL, for example http://127.0.0.1:8080.
        #[arg(long, value_name = "URL")]
        server: String,
        /// Upload token (default: $FNSCOPE_TOKEN).
        #[arg(long)]
        token: Option<String>,
        /// KEY=VALUE tag of the runs: tester, device, build, task... (repeatable).
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
        /// Trace folders (or trace.fns files), recorded or merged.
        #[arg(required = true, value_name = "RUN")]
        runs: Vec<PathBuf>,
    },
    /// Show the recorded calls in time order.
    Replay {
        /// Trace folder (or trace.fns file).
        #[arg(short = 'i', long = "input", default_value = "fnscope.data")]
        input: PathBuf,
        /// `tree`: indented call tree per thread; `lines`: the function.txt line format.
        #[arg(long, value_enum, default_value_t = ReplayFormat::Tree)]
        format: ReplayFormat,
        /// Only this thread.
        #[arg(long)]
        tid: Option<u32>,
    },
    /// Hot functions: calls, total, self, average, min and max time; over several runs,
    /// calls summed and per run.
    Report {
        /// Trace folder (or trace.fns file); repeat to combine runs.
        #[arg(short = 'i', long = "input", default_value = "fnscope.data")]
        input: Vec<PathBuf>,
        /// Sort key (default: total time, or calls when no times were recorded).
        #[arg(long, value_enum)]
        sort: Option<SortArg>,
        /// Show only the first N functions (per module with --by module).
        #[arg(long)]
        top: Option<usize>,
        /// `module`: group the functions per shared object.
        #[arg(long, value_enum, default_value_t = By::Function)]
        by: By,
        /// One table per thread as well (a single recorded trace only).
        #[arg(long)]
        threads: bool,
        /// Print JSON (one object per function) instead of a table.
        #[arg(long)]
        json: bool,
        /// Match functions of different builds of a module by name.
        #[arg(long)]
        match_by_name: bool,
        /// Group each function's calls by its N-th recorded argument (`record -A`): calls,
        /// total, average and longest time per value; with --top, the first values of each.
        #[arg(long, value_name = "N", conflicts_with_all = ["by_ret", "threads", "match_by_name", "sort"])]
        by_arg: Option<usize>,
        /// Group each function's calls by its recorded return value (`record -R`).
        #[arg(long, conflicts_with_all = ["threads", "match_by_name", "sort"])]
        by_ret: bool,
    },
    /// Combine runs into one merged trace: per function, calls summed (and fewest/most in
    /// one run), times summed over the timed runs.
    Merge {
        /// Folder to write the merged trace to.
        #[arg(short = 'o', long = "output", required = true)]
        output: PathBuf,
        /// Trace folders (or trace.fns files) to combine; merged traces are accepted too.
        #[arg(required = true, value_name = "RUN")]
        runs: Vec<PathBuf>,
        /// Match functions of different builds of a module by name.
        #[arg(long)]
        match_by_name: bool,
    },
    /// Per function, the change in calls and time from RUN_A to RUN_B, largest first.
    Diff {
        /// The run to compare against (trace folder, trace.fns or merged trace).
        run_a: PathBuf,
        /// The run compared.
        run_b: PathBuf,
        /// Sort by the change in this (default: total time when both runs have times, else
        /// calls).
        #[arg(long, value_enum)]
        sort: Option<SortArg>,
        /// Show only the first N functions.
        #[arg(long)]
        top: Option<usize>,
        /// Print JSON (one object per function) instead of a table.
        #[arg(long)]
        json: bool,
        /// Match functions of different builds of a module by name.
        #[arg(long)]
        match_by_name: bool,
    },
    /// Function coverage: hookable functions executed, per module and source file; the
    /// functions never executed; the unhookable ones apart.
    Coverage {
        /// Trace folder (or trace.fns file); repeat to combine runs (a test suite).
        #[arg(short = 'i', long = "input", default_value = "fnscope.data")]
        input: Vec<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also write a static HTML report (index.html and a page per source file) here.
        #[arg(long, value_name = "OUT_DIR")]
        html: Option<PathBuf>,
        /// Match functions of different builds of a module by name.
        #[arg(long)]
        match_by_name: bool,
    },
    /// Every function of a binary: name, address, size, source line, and whether it can be
    /// hooked (and why not).
    Funcs {
        /// JSON array, one object per piece of code, instead of a table.
        #[arg(long)]
        json: bool,
        /// Only the functions that cannot be hooked.
        #[arg(long, conflicts_with = "pdb")]
        skipped: bool,
        /// Names as found in the file (mangled), not demangled.
        #[arg(long)]
        raw: bool,
        /// List the functions of this Windows PDB file instead (names, addresses, sizes).
        #[arg(long, value_name = "FILE", conflicts_with = "binary")]
        pdb: Option<PathBuf>,
        /// The ELF executable or shared library.
        #[arg(required_unless_present = "pdb")]
        binary: Option<PathBuf>,
    },
    /// What was traced: command, processes, threads, functions hooked and skipped, size.
    Info {
        /// Trace folder (or trace.fns file).
        #[arg(short = 'i', long = "input", default_value = "fnscope.data")]
        input: PathBuf,
    },
    /// Write the trace for another viewer: Perfetto, Chrome trace events, speedscope, the
    /// Firefox Profiler, or folded stacks for flame-graph tools.
    Export {
        /// The file format.
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// Folded stacks: weigh each stack by its calls instead of its self time.
        #[arg(long, conflicts_with = "self_time")]
        counts: bool,
        /// Folded stacks: weigh each stack by the time spent in its last function itself
        /// (the default, under which a frame's width in a flame graph is its total time).
        #[arg(long = "self")]
        self_time: bool,
        #[command(flatten)]
        common: export::Common,
    },
    /// Write an interactive SVG flame graph of the calls (an icicle graph with --reverse).
    Flamegraph {
        /// Widths by calls instead of time.
        #[arg(long)]
        counts: bool,
        /// Roots at the top, stacks growing down (icicle graph).
        #[arg(long)]
        reverse: bool,
        #[command(flatten)]
        common: export::Common,
    },
    /// Write the caller -> callee graph (graphviz DOT) with calls and time per edge.
    Callgraph {
        #[command(flatten)]
        common: export::Common,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum ExportFormat {
    /// Perfetto protobuf (ui.perfetto.dev).
    Perfetto,
    /// Chrome trace-event JSON.
    Chrome,
    /// speedscope evented profiles, one per thread.
    Speedscope,
    /// Firefox Profiler processed profile.
    Firefox,
    /// Collapsed stacks (`a;b;c N`).
    Folded,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Time,
    Count,
}

#[derive(Clone, Copy, ValueEnum)]
enum ReplayFormat {
    Tree,
    Lines,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum By {
    Function,
    Module,
}

#[derive(Clone, Copy, ValueEnum)]
enum SortArg {
    Calls,
    Total,
    #[value(name = "self")]
    SelfTime,
    Avg,
}

impl From<SortArg> for fnscope_analysis::SortKey {
    fn from(s: SortArg) -> Self {
        match s {
            SortArg::Calls => fnscope_analysis::SortKey::Calls,
            SortArg::Total => fnscope_analysis::SortKey::Total,
            SortArg::SelfTime => fnscope_analysis::SortKey::SelfTime,
            SortArg::Avg => fnscope_analysis::SortKey::Avg,
        }
    }
}

/// The sort key asked for, or the natural one: total time when times were recorded, calls
/// otherwise. Time keys on runs without times fall back to calls, with a warning.
fn sort_key(asked: Option<SortArg>, timed: bool) -> fnscope_analysis::SortKey {
    match asked {
        None if timed => fnscope_analysis::SortKey::Total,
        None | Some(SortArg::Calls) => fnscope_analysis::SortKey::Calls,
        Some(k) if timed => k.into(),
        Some(_) => {
            eprintln!("fnscope: warning: no times were recorded (count mode): sorting by calls");
            fnscope_analysis::SortKey::Calls
        }
    }
}

fn warn(warnings: &[String]) {
    for w in warnings {
        eprintln!("fnscope: warning: {w}");
    }
}

fn pretty(v: &serde_json::Value) -> Result<String> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}

/// Prints an analysis' output; a reader that stops early (`| head`) is not an error.
fn print_out(text: &str) -> Result<i32> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        r => {
            r.context("cannot write the output")?;
            Ok(0)
        }
    }
}

/// `merge -o DIR` writes DIR/trace.fns: DIR may be new, empty, or a trace folder (whose
/// trace is replaced once every input has been read, so it may be one of the inputs).
fn check_merge_output(dir: &std::path::Path) -> Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("{} is not a folder; give a folder for the merged trace with -o", dir.display());
        }
        let is_trace = dir.join(fnscope_format::TRACE_FILE).exists();
        let empty = std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(false);
        if !is_trace && !empty {
            bail!("{} exists and is not an fnscope trace; choose another folder with -o", dir.display());
        }
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("fnscope: error: {}", one_line(&e));
            std::process::exit(2);
        }
    }
}

/// An error and its causes on one line, each cause once: many errors already say their
/// cause (`cannot write x: No space left on device`), and `{:#}` would repeat it.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !line.contains(&c) {
            line.push_str(": ");
            line.push_str(&c);
        }
    }
    line
}

fn run(cli: Cli) -> Result<i32> {
    use std::io::Write;
    match cli.command {
        Command::Record { output, libs, buffer_mb, verbose, mode, no_follow_exec, no_cache, mono_no_inline, spill_after, filters, values, flight, upload, token, tags, command } => {
            let count = mode == Mode::Count;
            let follow_exec = !no_follow_exec;
            let filters = filters.check(count)?;
            let values = values.check(count)?;
            let flight = flight.check(count)?;
            let chunk_size = if flight.is_some() { fnscope_abi::FLIGHT_CHUNK_SIZE } else { fnscope_abi::DEFAULT_CHUNK_SIZE };
            let chunks = match buffer_mb {
                Some(mb) => (u64::from(mb.max(2)) * (1 << 20) / u64::from(chunk_size)).clamp(2, u64::from(u32::MAX)) as u32,
                None => {
                    let n = record::default_chunks(chunk_size);
                    if verbose && n != fnscope_abi::DEFAULT_CHUNKS {
                        eprintln!("fnscope: the address space is limited (ulimit -v): the shared buffer has {n} chunks, not {}, room for as many threads at once", fnscope_abi::DEFAULT_CHUNKS);
                    }
                    n
                }
            };
            let plan_cache = !no_cache;
            let trace = output.clone();
            let flight_mode = flight.is_some();
            let out = record::record(&record::RecordOptions { output, libs, chunks, chunk_size, verbose, count, follow_exec, plan_cache, mono_no_inline, spill_after, filters, values, flight, command })?;
            if let Some(server) = upload {
                // A flight recording's calls are in its snapshots, which overlap and share
                // the run's identity: the last one goes (the crash or the exit, when taken).
                let runs = if flight_mode { flight::snapshot_dirs(&trace).pop().into_iter().collect() } else { vec![trace] };
                if runs.is_empty() {
                    eprintln!("fnscope: no snapshot was taken: nothing to upload");
                } else if let Err(e) = server::upload(&server::UploadOptions { server, token, tags }, &runs) {
                    // How the program ended comes first when it failed (its exit code, or
                    // its signal, which a caller checks); after a clean exit, the failed
                    // upload makes the exit code 2, so a script notices it.
                    eprintln!("fnscope: error: {}; the run stays in {} (`fnscope upload` sends it again)", one_line(&e), runs[0].display());
                    if out.signal.is_none() && out.exit_code == 0 {
                        return Ok(2);
                    }
                }
            }
            if out.signal.is_some() {
                record::end_like_the_program(out.exit_code, out.signal);
            }
            Ok(out.exit_code)
        }
        Command::Serve { listen, db, max_upload } => {
            server::serve(&listen, &db, max_upload)?;
            Ok(0)
        }
        Command::Token { command: TokenCommand::Create { name, db } } => {
            server::token_create(&db, &name)?;
            Ok(0)
        }
        Command::Upload { server, token, tags, runs } => {
            server::upload(&server::UploadOptions { server, token, tags }, &runs)?;
            Ok(0)
        }
        Command::Replay { input, format, tid } => {
            refuse_untimed(&input)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let r = match format {
                ReplayFormat::Tree => fnscope_analysis::replay_tree(&input, tid, &mut out),
                ReplayFormat::Lines => fnscope_analysis::replay_lines(&input, tid, &mut out),
            };
            let warnings = match r {
                Err(fnscope_analysis::AnalysisError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
                r => r?,
            };
            let _ = out.flush();
            for w in warnings {
                eprintln!("fnscope: warning: {w}");
            }
            Ok(0)
        }
        Command::Report { input, sort, top, by, threads, json, match_by_name, by_arg, by_ret } => {
            let group = match (by_arg, by_ret) {
                (Some(0), _) => bail!("--by-arg counts arguments from 1"),
                (Some(n), _) => Some(fnscope_analysis::GroupBy::Arg(n)),
                (None, true) => Some(fnscope_analysis::GroupBy::Ret),
                (None, false) => None,
            };
            if let Some(g) = group {
                let [one] = &input[..] else { bail!("--by-arg and --by-ret read one recorded trace") };
                let (groups, warnings) = fnscope_analysis::report_by_value(one, g)?;
                warn(&warnings);
                let text = if json { pretty(&serde_json::to_value(&groups)?)? } else { fnscope_analysis::render_by_value_text(&groups, g, top) };
                return print_out(&text);
            }
            let r = if input.len() == 1 {
                fnscope_analysis::report(&input[0], threads)?
            } else {
                if threads {
                    bail!("--threads needs a single recorded trace; combined runs have no threads");
                }
                fnscope_analysis::report_of(&fnscope_analysis::load_all(&input, match_by_name)?)
            };
            warn(&r.warnings);
            let key = sort_key(sort, r.timed);
            let text = match (by, json) {
                (By::Module, true) => pretty(&fnscope_analysis::report_by_module_json(&r, top, key))?,
                (By::Module, false) => fnscope_analysis::render_by_module_text(&r, top, key),
                (By::Function, true) => {
                    let mut funcs = r.functions.clone();
                    fnscope_analysis::sort(&mut funcs, key);
                    funcs.truncate(top.unwrap_or(usize::MAX));
                    let shown = fnscope_analysis::Report { functions: funcs, ..r };
                    pretty(&fnscope_analysis::report_json(&shown))?
                }
                (By::Function, false) => fnscope_analysis::render_report_text(&r, top, key),
            };
            print_out(&text)
        }
        Command::Merge { output, runs, match_by_name } => {
            check_merge_output(&output)?;
            let p = fnscope_analysis::load_all(&runs, match_by_name)?;
            warn(&p.warnings);
            p.write_merged(&output)?;
            let functions: usize = p.modules.iter().map(|m| m.functions.len()).sum();
            eprintln!(
                "fnscope: {} runs merged into {} ({} modules, {functions} functions)",
                p.run_count(),
                output.display(),
                p.modules.len()
            );
            Ok(0)
        }
        Command::Diff { run_a, run_b, sort, top, json, match_by_name } => {
            let a = fnscope_analysis::Profile::load(&run_a)?;
            let b = fnscope_analysis::Profile::load(&run_b)?;
            let key = sort_key(sort, a.timed() && b.timed());
            let (la, lb) = (run_a.display().to_string(), run_b.display().to_string());
            let d = fnscope_analysis::diff((&la, &a), (&lb, &b), match_by_name, key)?;
            warn(&d.warnings);
            let text = if json {
                pretty(&fnscope_analysis::diff_json(&d, top))?
            } else {
                fnscope_analysis::render_diff_text(&d, top)
            };
            print_out(&text)
        }
        Command::Coverage { input, json, html, match_by_name } => {
            let p = fnscope_analysis::load_all(&input, match_by_name)?;
            let c = fnscope_analysis::coverage(&p);
            warn(&c.warnings);
            if let Some(dir) = &html {
                let index = fnscope_analysis::write_coverage_html(&c, dir)?;
                eprintln!("fnscope: coverage report written to {}", index.display());
            }
            let text = if json {
                pretty(&fnscope_analysis::coverage_json(&c))?
            } else {
                fnscope_analysis::render_coverage_text(&c)
            };
            print_out(&text)
        }
        Command::Funcs { json, skipped, raw, pdb, binary } => {
            funcs::run(&funcs::FuncsOptions { binary, pdb, json, skipped, raw })?;
            Ok(0)
        }
        Command::Snapshot { pid } => {
            let dir = flight::request_snapshot(pid)?;
            println!("{}", dir.display());
            Ok(0)
        }
        Command::Info { input } => {
            let i = fnscope_analysis::info(&input)?;
            print!("{}", fnscope_analysis::render_info_text(&i));
            Ok(0)
        }
        Command::Export { format, counts, self_time: _, common } => {
            let format = match format {
                ExportFormat::Perfetto => fnscope_export::Format::Perfetto,
                ExportFormat::Chrome => fnscope_export::Format::Chrome,
                ExportFormat::Speedscope => fnscope_export::Format::Speedscope,
                ExportFormat::Firefox => fnscope_export::Format::Firefox,
                ExportFormat::Folded => fnscope_export::Format::Folded,
            };
            if counts && format != fnscope_export::Format::Folded {
                bail!("--counts applies to --format folded only");
            }
            let weight = if counts { fnscope_export::Weight::Calls } else { fnscope_export::Weight::SelfTime };
            export::run(&common, |input, opts, out, progress| fnscope_export::export(input, format, opts, weight, out, progress))
        }
        Command::Flamegraph { counts, reverse, common } => {
            let weight = if counts { fnscope_export::Weight::Calls } else { fnscope_export::Weight::SelfTime };
            let flame = fnscope_export::FlameOptions { weight, reverse };
            export::run(&common, |input, opts, out, progress| fnscope_export::flamegraph(input, opts, &flame, out, progress))
        }
        Command::Callgraph { common } => export::run(&common, fnscope_export::callgraph),
    }
}

/// Replay needs the time of every call: count-mode and merged traces have none.
fn refuse_untimed(input: &std::path::Path) -> Result<()> {
    let mut r = fnscope_format::TraceReader::open(input)?;
    if let Ok(Some(fnscope_format::Chunk::Meta(m))) = r.next_chunk() {
        if m.mode == "count" || m.mode == "merged" {
            anyhow::bail!(
                "{} is a {} trace: it holds how often functions ran, not when, so there is nothing to replay; \
                 use `fnscope report`, or record with the default --mode time",
                input.display(),
                m.mode
            );
        }
    }
    Ok(())
}
