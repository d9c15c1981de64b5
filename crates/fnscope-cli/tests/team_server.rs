//! End-to-end tests of the team server (`fnscope serve`, `token create`, `upload`,
//! `record --upload`): a real server on a free loopback port, against SQLite and against a
//! real PostgreSQL started from Debian's packages; real traces recorded with the CLI; the
//! API's figures checked against `report -i ... --json` of the same runs; technique C's
//! example; bad requests; concurrent uploads; the hot-functions page in headless Chromium.

mod common;

use common::*;
use fnscope_server::{Upload, CONTENT_TYPE};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// Technique C's example: three testers' counts of f1..f4.
const TESTERS: [(&str, [u64; 4]); 3] = [
    ("alice", [7000, 6000, 5000, 4000]),
    ("bob", [7300, 6320, 4800, 4500]),
    ("carol", [7200, 6300, 5100, 4500]),
];

/// Calls f1..f4 as often as its four arguments say.
const HOT_C: &str = r#"
#include <stdlib.h>
int f1(int x) { return x * 3 + 1; }
int f2(int x) { return x ^ 5; }
int f3(int x) { return x + 7; }
int f4(int x) { return x - 2; }
int main(int argc, char **argv) {
    volatile int s = 0;
    if (argc < 5) return 2;
    for (int i = atoi(argv[1]); i > 0; i--) s += f1(i);
    for (int i = atoi(argv[2]); i > 0; i--) s += f2(i);
    for (int i = atoi(argv[3]); i > 0; i--) s += f3(i);
    for (int i = atoi(argv[4]); i > 0; i--) s += f4(i);
    return 0;
}
"#;

/// Another build, recorded in time mode: nested calls give self and total times.
const TIMED_C: &str = r#"
#include <stdlib.h>
int leaf(int x) { volatile int y = x; for (int i = 0; i < 50; i++) y += i; return y; }
int middle(int x) { return leaf(x) + leaf(x + 1); }
int top(int n) { int s = 0; for (int i = 0; i < n; i++) s += middle(i); return s; }
int main(int argc, char **argv) { return top(argc > 1 ? atoi(argv[1]) : 10) == 12345; }
"#;

/// A running `fnscope serve`, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(db: &str, max_upload: &str) -> Server {
        let mut child = Command::new(fnscope())
            .args(["serve", "--listen", "127.0.0.1:0", "--db", db, "--max-upload", max_upload])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start fnscope serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    if let Some(at) = line.find("http://") {
                        let url = line[at..].split_whitespace().next().unwrap().trim_end_matches('/').to_string();
                        return Server { child, url };
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("fnscope serve --db {db} did not start: {}", seen.join("\n"));
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A PostgreSQL 15 cluster in a temporary folder, stopped when dropped.
struct Postgres {
    dir: TempDir,
    port: u16,
    next_db: usize,
}

fn as_postgres(cmd: &str) -> Run {
    let root = nix_is_root();
    let mut c = if root {
        let mut c = Command::new("su");
        c.args(["postgres", "-s", "/bin/sh", "-c", cmd]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", cmd]);
        c
    };
    run(&mut c, b"", TIMEOUT)
}

fn nix_is_root() -> bool {
    let r = run(Command::new("id").arg("-u"), b"", TIMEOUT);
    r.stdout.trim() == "0"
}

impl Postgres {
    fn start() -> Postgres {
        for tool in ["initdb", "pg_ctl", "createdb"] {
            assert!(
                Path::new(PG_BIN).join(tool).exists(),
                "{PG_BIN}/{tool} is missing: install postgresql-15 (.ci/run does)"
            );
        }
        let dir = TempDir::new("server-pg");
        if nix_is_root() {
            let r = run(Command::new("chown").args(["-R", "postgres"]).arg(dir.path()), b"", TIMEOUT);
            assert_eq!(r.code, 0, "chown: {}", r.describe());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let d = dir.path().display();
        let r = as_postgres(&format!("{PG_BIN}/initdb -D {d}/data -A trust -U fnscope --no-sync"));
        assert_eq!(r.code, 0, "initdb failed: {}", r.describe());
        let r = as_postgres(&format!(
            "{PG_BIN}/pg_ctl -D {d}/data -l {d}/log -o '-k {d} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off' -w start"
        ));
        assert_eq!(r.code, 0, "pg_ctl start failed: {}\n{}", r.describe(), std::fs::read_to_string(dir.join("log")).unwrap_or_default());
        Postgres { dir, port, next_db: 0 }
    }

    /// A new, empty database's URL.
    fn database(&mut self) -> String {
        self.next_db += 1;
        let name = format!("t{}", self.next_db);
        let r = as_postgres(&format!("{PG_BIN}/createdb -h 127.0.0.1 -p {} -U fnscope {name}", self.port));
        assert_eq!(r.code, 0, "createdb failed: {}", r.describe());
        format!("postgres://fnscope@127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_postgres(&format!("{PG_BIN}/pg_ctl -D {}/data -m fast stop", self.dir.path().display()));
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, String) {
    let mut r = r.expect("request failed");
    let mut s = String::new();
    r.body_mut().as_reader().read_to_string(&mut s).unwrap();
    (r.status().as_u16(), s)
}

fn get(url: &str) -> (u16, String) {
    answer(agent().get(url).call())
}

fn get_json(url: &str) -> Value {
    let (status, body) = get(url);
    assert_eq!(status, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {body}"))
}

fn post(url: &str, token: Option<&str>, ctype: &str, body: &[u8]) -> (u16, String) {
    let a = agent();
    let mut req = a.post(&format!("{url}/api/upload")).header("Content-Type", ctype);
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    answer(req.send(body))
}

fn ok(args: &[&str]) -> Run {
    let r = fnscope_cmd(args);
    assert_eq!(r.code, 0, "fnscope {args:?} failed: {}", r.describe());
    r
}

fn create_token(db: &str, name: &str) -> String {
    let r = ok(&["token", "create", "--name", name, "--db", db]);
    let token = r.stdout.trim().to_string();
    assert!(token.len() > 32, "token create printed {:?}", r.stdout);
    token
}

/// The programs and their traces, recorded once per test.
struct Runs {
    dir: TempDir,
    /// Technique C's three count runs, in TESTERS order.
    counted: Vec<PathBuf>,
    /// Three time-mode runs of the other build.
    timed: Vec<PathBuf>,
    hot: PathBuf,
}

fn record(dir: &TempDir, out: &str, mode: &str, cmd: &[&str]) -> PathBuf {
    let trace = dir.join(out);
    let mut args = vec!["record", "--mode", mode, "-o", path_str(&trace), "--"];
    args.extend_from_slice(cmd);
    ok(&args);
    trace
}

fn record_runs() -> Runs {
    let dir = TempDir::new("server-runs");
    let hot = compile_c_text(dir.path(), "hot", HOT_C);
    let timed_prog = compile_c_text(dir.path(), "timed", TIMED_C);
    let mut counted = Vec::new();
    for (i, (_, n)) in TESTERS.iter().enumerate() {
        let args: Vec<String> = n.iter().map(u64::to_string).collect();
        let mut cmd = vec![path_str(&hot)];
        cmd.extend(args.iter().map(String::as_str));
        counted.push(record(&dir, &format!("count{i}"), "count", &cmd));
    }
    let timed = (0..3)
        .map(|i| record(&dir, &format!("time{i}"), "time", &[path_str(&timed_prog), &(20 + 10 * i).to_string()]))
        .collect();
    Runs { dir, counted, timed, hot }
}

fn upload(url: &str, token: &str, tags: &[&str], runs: &[&Path]) -> Run {
    let mut args = vec!["upload", "--server", url, "--token", token];
    for t in tags {
        args.extend(["--tag", t]);
    }
    args.extend(runs.iter().map(|p| path_str(p)));
    fnscope_cmd(&args)
}

/// `report -i A -i B ... --json`, per function name.
fn report_of(runs: &[&Path]) -> BTreeMap<String, Value> {
    let mut args = vec!["report", "--json"];
    for r in runs {
        args.extend(["-i", path_str(r)]);
    }
    let out = ok(&args);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    v.as_array().unwrap().iter().map(|f| (f["name"].as_str().unwrap().to_string(), f.clone())).collect()
}

/// The API's hot functions of module `module`, per name, without the server's link fields.
fn api_hot(url: &str, query: &str, module: &str) -> (Value, BTreeMap<String, Value>) {
    let v = get_json(&format!("{url}/api/hot?{query}"));
    let mut out = BTreeMap::new();
    for m in v["modules"].as_array().unwrap() {
        if m["module"] != module {
            continue;
        }
        for f in m["functions"].as_array().unwrap() {
            let mut f = f.clone();
            let o = f.as_object_mut().unwrap();
            assert!(o.remove("module_id").is_some() && o.remove("idx").is_some(), "no link fields: {f:?}");
            out.insert(f["name"].as_str().unwrap().to_string(), f);
        }
    }
    (v, out)
}

fn assert_same_as_report(url: &str, query: &str, module: &str, runs: &[&Path]) {
    let want: BTreeMap<String, Value> = report_of(runs).into_iter().filter(|(_, f)| f["module"] == module).collect();
    assert!(!want.is_empty(), "report lists nothing of {module}");
    let (_, got) = api_hot(url, &format!("{query}&top=1000"), module);
    assert_eq!(got, want, "/api/hot?{query} differs from report -i {runs:?} --json");
}

/// Technique C's example, uploaded with tags, read back through the API and the CLI's
/// report; duplicates counted once; `record --upload`.
fn technique_c(db: &str, runs: &Runs) -> Server {
    let server = Server::start(db, "64M");
    let token = create_token(db, "testers");
    let url = &server.url;
    for ((tester, _), trace) in TESTERS.iter().zip(&runs.counted) {
        let r = upload(url, &token, &[&format!("tester={tester}"), "device=pc"], &[trace]);
        assert_eq!(r.code, 0, "upload failed: {}", r.describe());
        assert!(r.stdout.contains("uploaded as run"), "{}", r.describe());
    }
    // The same run again is recognised, and counted once.
    let again = upload(url, &token, &["tester=alice"], &[&runs.counted[0]]);
    assert_eq!(again.code, 0, "{}", again.describe());
    assert!(again.stdout.contains("already on the server"), "{}", again.describe());
    let listed = get_json(&format!("{url}/api/runs"));
    assert_eq!(listed.as_array().unwrap().len(), 3, "runs: {listed}");

    let (v, hot) = api_hot(url, "program=hot&top=2", "hot");
    assert_eq!(v["runs"], 3);
    let names: Vec<&str> = v["modules"][0]["functions"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["f1", "f2"], "top 2: {v}");
    let (_, all) = api_hot(url, "program=hot&top=10", "hot");
    for (i, name) in ["f1", "f2", "f3", "f4"].iter().enumerate() {
        let calls: Vec<u64> = TESTERS.iter().map(|t| t.1[i]).collect();
        let sum: u64 = calls.iter().sum();
        let f = &all[*name];
        assert_eq!(f["calls"], sum, "{name}: {f}");
        assert_eq!(f["calls_min"], *calls.iter().min().unwrap(), "{name}: {f}");
        assert_eq!(f["calls_max"], *calls.iter().max().unwrap(), "{name}: {f}");
        let avg = f["calls_avg"].as_f64().unwrap();
        assert!((avg - sum as f64 / 3.0).abs() < 1e-9, "{name}: {f}");
    }
    let sums: Vec<u64> = ["f1", "f2", "f3", "f4"].iter().map(|n| all[*n]["calls"].as_u64().unwrap()).collect();
    assert_eq!(sums, [21500, 18620, 14900, 13000]);
    let avgs: Vec<String> = ["f1", "f2", "f3", "f4"].iter().map(|n| format!("{:.2}", all[*n]["calls_avg"].as_f64().unwrap())).collect();
    assert_eq!(avgs, ["7166.67", "6206.67", "4966.67", "4333.33"]);
    assert!(hot.contains_key("f1"));

    // Every run of the build (the stored totals) and a selection (the runs' own figures)
    // agree with the CLI.
    let counted: Vec<&Path> = runs.counted.iter().map(PathBuf::as_path).collect();
    assert_same_as_report(url, "program=hot", "hot", &counted);
    assert_same_as_report(url, "tag=device=pc&runs=1,3", "hot", &[counted[0], counted[2]]);
    let (_, bob) = api_hot(url, "tag=tester=bob", "hot");
    assert_eq!(bob["f2"]["calls"], 6320);
    assert_eq!(bob["f2"]["runs"], 1);

    // Time-mode runs of another build: a merged trace and a recorded one.
    let merged = runs.dir.join("merged");
    ok(&["merge", "-o", path_str(&merged), path_str(&runs.timed[0]), path_str(&runs.timed[1])]);
    let r = upload(url, &token, &["set=timed"], &[&merged, &runs.timed[2]]);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_same_as_report(url, "program=timed", "timed", &[&merged, &runs.timed[2]]);
    assert_same_as_report(url, "tag=set=timed&sort=self", "timed", &[&merged, &runs.timed[2]]);
    // A run the merged upload holds is not counted again.
    let r = upload(url, &token, &[], &[&runs.timed[1]]);
    assert!(r.code == 0 && r.stdout.contains("already on the server"), "{}", r.describe());
    let timed = get_json(&format!("{url}/api/runs?program=timed"));
    let n: i64 = timed.as_array().unwrap().iter().map(|r| r["runs"].as_i64().unwrap()).sum();
    assert_eq!(n, 3, "{timed}");

    // The other views answer with the selected runs' data.
    let cmp = get_json(&format!("{url}/api/compare?a=tester=alice&b=tester=bob"));
    let f4 = cmp.as_array().unwrap().iter().find(|f| f["name"] == "f4").unwrap();
    assert_eq!(f4["calls_delta"], 500, "{cmp}");
    let cov = get_json(&format!("{url}/api/coverage?program=hot"));
    let m = &cov["modules"][0];
    assert_eq!(m["module"], "hot", "{cov}");
    assert_eq!(m["executed"], 5, "main and f1..f4 ran: {cov}");
    let f = &v["modules"][0]["functions"][0];
    let page = get_json(&format!("{url}/api/functions/{}/{}", f["module_id"], f["idx"]));
    let per_run: Vec<u64> = page["runs"].as_array().unwrap().iter().map(|r| r["calls"].as_u64().unwrap()).collect();
    assert_eq!(per_run, [7000, 7300, 7200], "{page}");

    // Record, then upload, in one command.
    let trace = runs.dir.join("recorded-uploaded");
    let r = fnscope_cmd(&[
        "record", "--mode", "count", "-o", path_str(&trace), "--upload", url, "--token", &token, "--tag", "tester=dave",
        "--", path_str(&runs.hot), "0", "2", "3", "4",
    ]);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert!(r.stdout.contains("uploaded as run"), "{}", r.describe());
    let (_, dave) = api_hot(url, "tag=tester=dave", "hot");
    assert_eq!(dave["f3"]["calls"], 3, "{dave:?}");
    // f1 did not run in dave's run: its fewest calls in one run is 0 now.
    let (_, all) = api_hot(url, "program=hot", "hot");
    assert_eq!(all["f1"]["calls_min"], 0, "{all:?}");
    assert_same_as_report(url, "program=hot", "hot", &[counted[0], counted[1], counted[2], &trace]);
    assert_same_as_report(url, "tag=device=pc", "hot", &counted);
    server
}

/// 50 clients upload 20 distinct runs each at once; the database then holds exactly them.
fn concurrent_uploads(db: &str, runs: &Runs) {
    let server = Server::start(db, "64M");
    let token = create_token(db, "load");
    let base = fnscope_analysis::Profile::load(&runs.counted[0]).unwrap();
    let f1_of_run = |k: u64| 1 + k;
    let f2_calls = TESTERS[0].1[1];
    let clients: Vec<_> = (0..50u64)
        .map(|c| {
            let (url, token, base) = (server.url.clone(), token.clone(), base.clone());
            std::thread::spawn(move || {
                for i in 0..20u64 {
                    let k = c * 20 + i;
                    let mut p = base.clone();
                    p.runs[0].start_unix_ns += k + 1;
                    for m in &mut p.modules {
                        for f in m.functions.iter_mut().filter(|f| f.name == "f1") {
                            (f.calls, f.calls_min, f.calls_max) = (f1_of_run(k), f1_of_run(k), f1_of_run(k));
                        }
                    }
                    let body = Upload::from_profile(p, "load".into(), BTreeMap::from([("client".into(), c.to_string())]))
                        .encode()
                        .unwrap();
                    let (status, text) = post(&url, Some(&token), CONTENT_TYPE, &body);
                    assert_eq!(status, 201, "client {c} upload {i}: {text}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a client failed");
    }
    let listed = get_json(&format!("{}/api/runs", server.url));
    assert_eq!(listed.as_array().unwrap().len(), 1000);
    let (v, hot) = api_hot(&server.url, "program=hot&top=10", "hot");
    assert_eq!(v["runs"], 1000);
    assert_eq!(hot["f1"]["calls"], (0..1000).map(f1_of_run).sum::<u64>());
    assert_eq!(hot["f1"]["calls_min"], 1);
    assert_eq!(hot["f1"]["calls_max"], 1000);
    assert_eq!(hot["f2"]["calls"], 1000 * f2_calls);
    // One client's runs, read from the runs' own figures.
    let (v, one) = api_hot(&server.url, "tag=client=7", "hot");
    assert_eq!(v["runs"], 20);
    assert_eq!(one["f1"]["calls"], (140..160).map(f1_of_run).sum::<u64>());
}

#[test]
fn team_server_on_sqlite() {
    let runs = record_runs();
    let db = format!("sqlite:{}", runs.dir.join("c.db").display());
    let server = technique_c(&db, &runs);
    browser_shows_hot_functions(&server.url, &runs.dir);
    drop(server);
    concurrent_uploads(&format!("sqlite:{}", runs.dir.join("load.db").display()), &runs);
}

#[test]
fn team_server_on_postgres() {
    let runs = record_runs();
    let mut pg = Postgres::start();
    let db = pg.database();
    drop(technique_c(&db, &runs));
    concurrent_uploads(&pg.database(), &runs);
}

/// Technique C's hot-function page in headless Chromium shows the sums and averages.
fn browser_shows_hot_functions(url: &str, dir: &TempDir) {
    let chromium = find_in_path("chromium")
        .unwrap_or_else(|| panic!("chromium is not installed (apt-get install chromium; .ci/run installs it)"));
    let r = run(
        Command::new(chromium)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg(format!("--user-data-dir={}", dir.join("chromium").display()))
            .arg("--dump-dom")
            .arg(format!("{url}/hot?program=hot&top=2&tag=device=pc")),
        b"",
        TIMEOUT,
    );
    assert_eq!(r.code, 0, "chromium failed: {}", r.describe());
    let page = &r.stdout;
    assert!(page.contains("<span id=\"runs\">3</span>"), "not 3 runs: {}", clip(page));
    let mut at = 0;
    for (name, sum, avg) in [("f1", "21500", "7166.67"), ("f2", "18620", "6206.67")] {
        let row = page[at..].find(&format!(">{name}</a>")).map(|i| i + at).unwrap_or_else(|| panic!("no row {name} after the previous one: {}", clip(page)));
        let rest = &page[row..];
        let end = rest.find("</tr>").unwrap();
        let cells = &rest[..end];
        assert!(cells.contains(&format!("class=\"sum\">{sum}<")), "{name}: sum {sum} not shown: {cells}");
        assert!(cells.contains(&format!(">{avg}<")), "{name}: average {avg} not shown: {cells}");
        at = row + end;
    }
    assert!(!page.contains(">f3</a>"), "top 2 shows f3: {}", clip(page));
    assert!(page.contains("<svg"), "no bar chart: {}", clip(page));
}

/// Each bad request gets a clear 4xx, nothing is written, and the server serves on.
#[test]
fn bad_requests_are_refused_whole() {
    let dir = TempDir::new("server-bad");
    let hot = compile_c_text(dir.path(), "hot", HOT_C);
    let trace = record(&dir, "run", "count", &[path_str(&hot), "3", "2", "1", "1"]);
    let db = format!("sqlite:{}", dir.join("bad.db").display());
    let server = Server::start(&db, "4K");
    let url = &server.url;
    let token = create_token(&db, "ci");
    let good = Upload::from_profile(fnscope_analysis::Profile::load(&trace).unwrap(), "u".into(), BTreeMap::new())
        .encode()
        .unwrap();
    let json = zstd::decode_all(&good[..]).unwrap();
    let corrupt_json = fnscope_server::wire::compress(&json[..json.len() / 2]).unwrap();
    let no_checksum = zstd::encode_all(&json[..], 3).unwrap();
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x5a;
    let big: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    // What is tried, with which token, content type and body; the status and a piece of
    // the message expected.
    type Case<'a> = (&'a str, Option<&'a str>, &'a str, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("no token", None, CONTENT_TYPE, good.clone(), 401, "no upload token"),
        ("wrong token", Some("fns_wrong"), CONTENT_TYPE, good.clone(), 401, "unknown upload token"),
        ("wrong content type", Some(&token), "application/json", json.clone(), 415, "content type"),
        ("oversized", Some(&token), CONTENT_TYPE, big, 413, "limit of 4096 bytes"),
        ("truncated", Some(&token), CONTENT_TYPE, good[..good.len() - 7].to_vec(), 400, "truncated or damaged"),
        ("corrupt stream", Some(&token), CONTENT_TYPE, flipped, 400, ""),
        ("corrupt profile", Some(&token), CONTENT_TYPE, corrupt_json, 400, "not a fnscope profile"),
        ("no checksum", Some(&token), CONTENT_TYPE, no_checksum, 400, "no content checksum"),
    ];
    for (what, tok, ctype, body, status, message) in cases {
        let (got, text) = post(url, tok, ctype, &body);
        assert_eq!(got, status, "{what}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: not a JSON error: {text}"));
        assert!(v["error"].as_str().unwrap().contains(message), "{what}: {text}");
        assert_eq!(get_json(&format!("{url}/api/runs")), Value::Array(vec![]), "{what} wrote a run");
        assert_eq!(get_json(&format!("{url}/api/hot"))["modules"], Value::Array(vec![]), "{what} wrote figures");
    }
    for path in ["/api/runs/99", "/api/functions/99/0", "/api/hot?runs=99", "/api/compare?a=99&b=98", "/hot?runs=99"] {
        let (status, text) = get(&format!("{url}{path}"));
        assert_eq!(status, 404, "{path}: {text}");
    }
    let (status, _) = get(&format!("{url}/hot?since=yesterday"));
    assert_eq!(status, 400);
    // The client says what the server said.
    let r = upload(url, "fns_wrong", &[], &[&trace]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("401") && r.stderr.contains("unknown upload token"), "{}", r.describe());
    let r = upload(url, &token, &["notatag"], &[&trace]);
    assert!(r.code != 0 && r.stderr.contains("KEY=VALUE"), "{}", r.describe());
    // After all that, a good upload is stored.
    let r = upload(url, &token, &[], &[&trace]);
    assert_eq!(r.code, 0, "{}", r.describe());
    assert_eq!(get_json(&format!("{url}/api/runs")).as_array().unwrap().len(), 1);
}
