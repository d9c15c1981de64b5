//! `fnscope`: function-level tracing and profiling of unmodified native programs.

mod agent_lib;
mod record;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "fnscope", version, about = "Trace and profile every function of an unmodified program")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with every hookable function traced, writing the trace to a folder.
    Record {
        /// Trace folder.
        #[arg(short = 'o', long = "output", default_value = "fnscope.data")]
        output: PathBuf,
        /// Also hook shared libraries whose path contains PATTERN (repeatable).
        #[arg(long = "lib", value_name = "PATTERN")]
        libs: Vec<String>,
        /// Shared buffer size in MiB (the program waits for the recorder when it is full).
        #[arg(long = "buffer-mb", default_value_t = 64)]
        buffer_mb: u32,
        /// Say what the agent does in each process.
        #[arg(short, long)]
        verbose: bool,
        /// `time`: entry and exit time of every call; `count`: only how many times each
        /// function ran, at the lowest cost.
        #[arg(long, value_enum, default_value_t = Mode::Time)]
        mode: Mode,
        /// The program and its arguments, after `--`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
        command: Vec<String>,
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
    /// Hot functions: calls, total, self, average, min and max time.
    Report {
        /// Trace folder (or trace.fns file).
        #[arg(short = 'i', long = "input", default_value = "fnscope.data")]
        input: PathBuf,
        /// Sort key.
        #[arg(long, value_enum, default_value_t = SortArg::Total)]
        sort: SortArg,
        /// Show only the first N functions.
        #[arg(long)]
        top: Option<usize>,
        /// One table per thread as well.
        #[arg(long)]
        threads: bool,
        /// Print JSON (one object per function) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// What was traced: command, processes, threads, functions hooked and skipped, size.
    Info {
        /// Trace folder (or trace.fns file).
        #[arg(short = 'i', long = "input", default_value = "fnscope.data")]
        input: PathBuf,
    },
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

fn main() {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("fnscope: error: {e:#}");
            std::process::exit(2);
        }
    }
}

fn run(cli: Cli) -> Result<i32> {
    use std::io::Write;
    match cli.command {
        Command::Record { output, libs, buffer_mb, verbose, mode, command } => {
            let chunks = (buffer_mb.max(2) * (1 << 20) / fnscope_abi::DEFAULT_CHUNK_SIZE).max(2);
            let count = mode == Mode::Count;
            let out = record::record(&record::RecordOptions { output, libs, chunks, verbose, count, command })?;
            Ok(out.exit_code)
        }
        Command::Replay { input, format, tid } => {
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
        Command::Report { input, sort, top, threads, json } => {
            let r = fnscope_analysis::report(&input, threads)?;
            for w in &r.warnings {
                eprintln!("fnscope: warning: {w}");
            }
            if json {
                let mut funcs = r.functions.clone();
                fnscope_analysis::sort(&mut funcs, sort.into());
                if let Some(n) = top {
                    funcs.truncate(n);
                }
                let shown = fnscope_analysis::Report { functions: funcs, ..r };
                println!("{}", serde_json::to_string_pretty(&fnscope_analysis::report_json(&shown))?);
            } else {
                print!("{}", fnscope_analysis::render_report_text(&r, top, sort.into()));
            }
            Ok(0)
        }
        Command::Info { input } => {
            let i = fnscope_analysis::info(&input)?;
            print!("{}", fnscope_analysis::render_info_text(&i));
            Ok(0)
        }
    }
}
