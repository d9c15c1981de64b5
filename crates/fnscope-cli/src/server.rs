//! `serve`, `token create`, `upload` and `record --upload`: the command-line side of the team
//! server (fnscope-server).

use anyhow::{anyhow, bail, Context, Result};
use fnscope_server::{AppState, Store, Upload, CONTENT_TYPE};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the server's figures go and who may send them.
pub struct UploadOptions {
    /// Server base URL (`http://host:8080`).
    pub server: String,
    /// Upload token; `FNSCOPE_TOKEN` when not given.
    pub token: Option<String>,
    /// `KEY=VALUE` tags.
    pub tags: Vec<String>,
}

/// A size with an optional K, M or G suffix (powers of 1024), for clap.
pub fn parse_size(s: &str) -> Result<u64, String> {
    crate::export::size_value(s).ok_or_else(|| format!("{s:?} is not a size: give bytes, or a number with K, M or G"))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

/// `fnscope serve`: runs the server until killed.
pub fn serve(listen: &str, db: &str, max_upload: u64) -> Result<()> {
    runtime()?.block_on(async {
        let store = Store::open(db).await.with_context(|| format!("cannot open the database {db}"))?;
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr().context("cannot read the listening address")?;
        eprintln!("fnscope: serving http://{addr}/ (database {db}, uploads up to {max_upload} bytes)");
        if store.token_count().await.context("cannot read the tokens")? == 0 {
            eprintln!("fnscope: no upload token yet: create one with `fnscope token create --name NAME --db {db}`");
        }
        fnscope_server::serve(listener, AppState { store, max_upload }).await.context("the server stopped")
    })
}

/// `fnscope token create`: prints a new upload token, which is not stored anywhere else.
pub fn token_create(db: &str, name: &str) -> Result<()> {
    let token = runtime()?.block_on(async {
        let store = Store::open(db).await.with_context(|| format!("cannot open the database {db}"))?;
        store.create_token(name).await.context("cannot create the token")
    })?;
    println!("{token}");
    eprintln!("fnscope: token {name:?} created; it is shown only this once (the database keeps its SHA-256)");
    Ok(())
}

fn parse_tags(tags: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for t in tags {
        match t.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                out.insert(k.to_string(), v.to_string());
            }
            _ => bail!("--tag {t:?}: give KEY=VALUE, for example --tag tester=alice"),
        }
    }
    Ok(out)
}

/// The JSON error message of a refused request, or its body as it is.
fn server_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string())
}

/// `fnscope upload`: sends each run's profile; reports each run's fate, fails if any failed.
pub fn upload(opts: &UploadOptions, runs: &[PathBuf]) -> Result<()> {
    let token = opts
        .token
        .clone()
        .or_else(|| std::env::var("FNSCOPE_TOKEN").ok())
        .ok_or_else(|| anyhow!("no upload token: give --token TOKEN or set FNSCOPE_TOKEN (create one with `fnscope token create`)"))?;
    let tags = parse_tags(&opts.tags)?;
    let base = opts.server.trim_end_matches('/');
    if !base.starts_with("http://") && !base.starts_with("https://") {
        bail!("--server {base:?}: give the server's URL, for example http://127.0.0.1:8080");
    }
    if base.starts_with("https://") {
        bail!("--server {base:?}: this fnscope speaks plain HTTP only; put the server behind a TLS proxy on a trusted network, or use http://");
    }
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_default();
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut failed = 0;
    for run in runs {
        if let Err(e) = upload_one(&agent, base, &token, &user, &tags, run) {
            eprintln!("fnscope: error: {}: {}", run.display(), crate::one_line(&e));
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} of {} runs were not uploaded", runs.len());
    }
    Ok(())
}

fn upload_one(
    agent: &ureq::Agent,
    base: &str,
    token: &str,
    user: &str,
    tags: &BTreeMap<String, String>,
    run: &Path,
) -> Result<()> {
    let profile = fnscope_analysis::Profile::load(run)?;
    if profile.truncated {
        bail!("the trace ends early or is damaged; the server keeps complete runs only");
    }
    let body = Upload::from_profile(profile, user.to_string(), tags.clone()).encode()?;
    let url = format!("{base}/api/upload");
    let mut resp = agent
        .post(&url)
        .header("Authorization", &format!("Bearer {token}"))
        .header("Content-Type", CONTENT_TYPE)
        .send(&body[..])
        .with_context(|| format!("cannot reach {url}"))?;
    let status = resp.status();
    let mut text = String::new();
    resp.body_mut()
        .as_reader()
        .read_to_string(&mut text)
        .context("cannot read the server's answer")?;
    if !status.is_success() {
        bail!("the server refused it ({status}): {}", server_message(&text));
    }
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("the server's answer is not JSON: {text}"))?;
    let id = &v["id"];
    if v["duplicate"].as_bool() == Some(true) {
        println!("{}: already on the server as run {id} (counted once): {base}/hot?runs={id}", run.display());
    } else {
        println!("{}: uploaded as run {id}: {base}/hot?runs={id}", run.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2k"), Ok(2048));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        for bad in ["", "0", "M", "12T", "-1", "99999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
