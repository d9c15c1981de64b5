//! Benchmark of the hot-functions page (bench/server.sh runs it): fills a database with
//! RUNS count-mode runs of one build of FUNCTIONS functions, through the same
//! `Store::insert` an upload takes, then serves the application on a loopback port and
//! times `GET /hot?program=bench` (every run of the build: its running totals),
//! `GET /hot?tag=group=0` (a tenth of them) and nine runs in ten by id (both read from the
//! runs' own figures).
//!
//! `server_bench --db URL [--functions N] [--runs N] [--called FRACTION] [--repeat N]`

use fnscope_format::{FunctionSummary, ModuleSummary, RunInfo};
use fnscope_server::{AppState, Store, Upload};
use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

struct Args {
    db: String,
    functions: usize,
    runs: usize,
    called: f64,
    repeat: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        db: String::new(),
        functions: 50_000,
        runs: 1_000,
        called: 0.2,
        repeat: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag} {v}: not a number"))
        };
        match flag.as_str() {
            "--db" => a.db = v,
            "--functions" => a.functions = num(&v)?,
            "--runs" => a.runs = num(&v)?,
            "--repeat" => a.repeat = num(&v)?,
            "--called" => {
                a.called = v
                    .parse()
                    .map_err(|_| format!("--called {v}: not a fraction"))?
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.db.is_empty() {
        return Err("give --db sqlite:FILE or --db postgres://...".into());
    }
    Ok(a)
}

/// A small deterministic generator, so that every database gets the same runs.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn upload(a: &Args, run: usize) -> Upload {
    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (run as u64 + 1);
    let functions = (0..a.functions)
        .map(|i| {
            let called = (next(&mut rng) % 1_000_000) as f64 / 1e6 < a.called;
            // Lower indexes are hotter, as a few functions are in real programs.
            let calls = if called {
                1 + next(&mut rng) % (1_000_000 / (i as u64 + 1))
            } else {
                0
            };
            FunctionSummary {
                address: 0x1000 + 16 * i as u64,
                size: 16,
                name: format!("bench_function_{i:06}"),
                hooked: true,
                calls,
                calls_min: calls,
                calls_max: calls,
                ..FunctionSummary::default()
            }
        })
        .collect();
    Upload {
        version: fnscope_server::wire::VERSION,
        user: "bench".into(),
        tags: BTreeMap::from([("group".to_string(), (run % 10).to_string())]),
        runs: vec![RunInfo {
            trace: format!("run{run}"),
            command: vec!["/opt/bench".into()],
            host: format!("host{}", run % 7),
            start_unix_ns: 1_700_000_000_000_000_000 + run as u64,
            mode: "count".into(),
        }],
        modules: vec![ModuleSummary {
            path: "/opt/bench".into(),
            build_id: Some("00bench".into()),
            functions,
        }],
        timed: false,
    }
}

fn time_get(url: &str, repeat: usize) -> Result<(Duration, Duration, usize), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..repeat {
        let t = Instant::now();
        let mut r = agent
            .get(url)
            .call()
            .map_err(|e| format!("GET {url}: {e}"))?;
        let mut body = String::new();
        r.body_mut()
            .as_reader()
            .read_to_string(&mut body)
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed());
        if r.status() != 200 {
            return Err(format!("GET {url}: {} {body}", r.status()));
        }
        size = body.len();
    }
    times.sort();
    Ok((times[times.len() / 2], times[times.len() - 1], size))
}

async fn bench(a: Args) -> Result<(), String> {
    let store = Store::open(&a.db).await.map_err(|e| e.to_string())?;
    let have = store
        .runs(&fnscope_server::Selection::default())
        .await
        .map_err(|e| e.to_string())?
        .len();
    let t = Instant::now();
    for run in have..a.runs {
        let u = upload(&a, run);
        store.insert(&u, "bench").await.map_err(|e| e.to_string())?;
        if (run + 1) % 100 == 0 {
            eprintln!(
                "{} runs stored, {:.1} s",
                run + 1,
                t.elapsed().as_secs_f64()
            );
        }
    }
    if have < a.runs {
        let n = a.runs - have;
        println!(
            "filled: {n} runs of {} functions ({:.0}% called per run) in {:.1} s, {:.1} ms per upload",
            a.functions,
            a.called * 100.0,
            t.elapsed().as_secs_f64(),
            t.elapsed().as_secs_f64() * 1e3 / n as f64
        );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let state = AppState {
        store,
        max_upload: fnscope_server::DEFAULT_MAX_UPLOAD,
    };
    tokio::spawn(fnscope_server::serve(listener, state));
    let repeat = a.repeat;
    // Nine runs in ten by id: the slowest kind of selection, every run's own figures read.
    let most: Vec<String> = (1..=a.runs)
        .filter(|i| i % 10 != 0)
        .map(|i| i.to_string())
        .collect();
    let most = format!("/api/hot?runs={}&top=20", most.join(","));
    tokio::task::spawn_blocking(move || {
        for (what, path, repeat) in [
            (
                "hot page, every run of the build",
                "/hot?program=bench&top=20",
                repeat,
            ),
            (
                "hot JSON, every run of the build",
                "/api/hot?program=bench&top=20",
                repeat,
            ),
            (
                "hot page, a tenth of the runs (tag)",
                "/hot?tag=group=0&top=20",
                repeat,
            ),
            (
                "hot JSON, nine runs in ten (ids)",
                most.as_str(),
                repeat.min(5),
            ),
        ] {
            let (median, max, size) = time_get(&format!("http://{addr}{path}"), repeat)?;
            println!(
                "{what}: median {:.1} ms, max {:.1} ms over {repeat} requests ({size} bytes)",
                median.as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3
            );
        }
        Ok::<(), String>(())
    })
    .await
    .map_err(|e| e.to_string())?
}

fn main() {
    let result = parse().and_then(|a| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(bench(a))
    });
    if let Err(e) = result {
        eprintln!("server_bench: {e}");
        std::process::exit(1);
    }
}
