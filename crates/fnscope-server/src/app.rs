//! The HTTP side: the upload endpoint, the JSON API under `/api/` and the HTML pages.

use crate::pages;
use crate::store::{RunRow, Selection, Store, StoreError, Stored, Want};
use crate::wire::{Upload, WireError, CONTENT_TYPE};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fnscope_analysis::{Profile, SortKey};
use http_body_util::BodyExt;
use serde_json::json;
use std::sync::Arc;

/// Functions listed per module on the hot-functions page unless `top` says otherwise.
pub const DEFAULT_TOP: usize = 20;

/// What every request handler shares.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The database.
    pub store: Store,
    /// Largest accepted upload body, in bytes (compressed).
    pub max_upload: u64,
}

/// A request that cannot be answered, with the status and the message the client shows.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let status = match e {
            StoreError::PartlyStored { .. } => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<fnscope_analysis::AnalysisError> for ApiError {
    fn from(e: fnscope_analysis::AnalysisError) -> ApiError {
        ApiError::bad(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The whole application: API and pages.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/upload", post(upload))
        .route("/api/runs", get(api_runs))
        .route("/api/runs/{id}", get(api_run))
        .route("/api/hot", get(api_hot))
        .route("/api/functions/{module}/{idx}", get(api_function))
        .route("/api/compare", get(api_compare))
        .route("/api/coverage", get(api_coverage))
        .route("/", get(page_runs))
        .route("/hot", get(page_hot))
        .route("/functions/{module}/{idx}", get(page_function))
        .route("/compare", get(page_compare))
        .route("/coverage", get(page_coverage))
        .with_state(Arc::new(state))
}

/// Query parameters as given, in order (`tag` may repeat).
type Params = Query<Vec<(String, String)>>;

fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter()
        .find(|(k, v)| k == name && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A time given as `YYYY-MM-DD` (UTC midnight) or as seconds since the Unix epoch, in ns.
fn parse_time(name: &str, s: &str) -> ApiResult<i64> {
    let bad = || {
        ApiError::bad(format!(
            "{name}={s:?}: give a date YYYY-MM-DD or seconds since 1970"
        ))
    };
    if let Ok(secs) = s.parse::<i64>() {
        return secs.checked_mul(1_000_000_000).ok_or_else(bad);
    }
    let parts: Vec<&str> = s.split('-').collect();
    let [y, m, d] = parts[..] else {
        return Err(bad());
    };
    let (y, m, d) = (
        y.parse::<i64>().map_err(|_| bad())?,
        m.parse::<i64>().map_err(|_| bad())?,
        d.parse::<i64>().map_err(|_| bad())?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || !(1970..=2500).contains(&y) {
        return Err(bad());
    }
    Ok(days_from_civil(y, m, d) * 86_400 * 1_000_000_000)
}

fn parse_ids(name: &str, s: &str) -> ApiResult<Vec<i64>> {
    s.split(',')
        .filter(|w| !w.trim().is_empty())
        .map(|w| {
            w.trim()
                .parse::<i64>()
                .map_err(|_| ApiError::bad(format!("{name}: {w:?} is not a run id")))
        })
        .collect()
}

fn parse_tag(s: &str) -> ApiResult<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(ApiError::bad(format!("tag {s:?}: give KEY=VALUE"))),
    }
}

/// The run selection of a page's query: `program`, `build`, `host`, `tag=KEY=VALUE`
/// (repeatable), `since` and `until` (dates), `runs` (ids, comma-separated).
pub fn selection(q: &[(String, String)]) -> ApiResult<Selection> {
    let mut s = Selection {
        program: param(q, "program").map(str::to_string),
        build: param(q, "build").map(str::to_string),
        host: param(q, "host").map(str::to_string),
        ..Selection::default()
    };
    for (k, v) in q {
        if k == "tag" && !v.is_empty() {
            s.tags.push(parse_tag(v)?);
        }
    }
    if let Some(t) = param(q, "since") {
        s.since_ns = Some(parse_time("since", t)?);
    }
    if let Some(t) = param(q, "until") {
        s.until_ns = Some(parse_time("until", t)?);
    }
    if let Some(ids) = param(q, "runs") {
        s.ids = Some(parse_ids("runs", ids)?);
    }
    Ok(s)
}

/// One side of a comparison: run ids (`3,4`) or a tag (`tester=alice`).
fn side(q: &[(String, String)], name: &str) -> ApiResult<Selection> {
    let Some(v) = param(q, name) else {
        return Err(ApiError::bad(format!(
            "give {name}=IDS (run ids, comma-separated) or {name}=KEY=VALUE (a tag)"
        )));
    };
    let mut s = selection(q)?;
    s.ids = None;
    if v.contains('=') {
        s.tags.push(parse_tag(v)?);
    } else {
        s.ids = Some(parse_ids(name, v)?);
    }
    Ok(s)
}

fn sort_key(q: &[(String, String)], timed: bool) -> ApiResult<SortKey> {
    Ok(match param(q, "sort") {
        None if timed => SortKey::Total,
        None | Some("calls") => SortKey::Calls,
        Some("total") => SortKey::Total,
        Some("self") => SortKey::SelfTime,
        Some("avg") => SortKey::Avg,
        Some(s) => {
            return Err(ApiError::bad(format!(
                "sort={s:?}: use calls, total, self or avg"
            )))
        }
    })
}

fn top_n(q: &[(String, String)]) -> ApiResult<usize> {
    match param(q, "top") {
        None => Ok(DEFAULT_TOP),
        Some(s) => s
            .parse()
            .map_err(|_| ApiError::bad(format!("top={s:?} is not a number"))),
    }
}

async fn upload(State(st): State<Arc<AppState>>, req: Request) -> ApiResult<Response> {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    let Some(token) = token else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "no upload token: send `Authorization: Bearer TOKEN` (fnscope upload --token, or FNSCOPE_TOKEN)",
        ));
    };
    let Some(name) = st.store.token_name(&token).await? else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unknown upload token (create one with `fnscope token create`)",
        ));
    };
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype != CONTENT_TYPE {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "content type {ctype:?}: uploads are {CONTENT_TYPE} (what `fnscope upload` sends)"
            ),
        ));
    }
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the upload is larger than this server's limit of {} bytes (fnscope serve --max-upload)", st.max_upload),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.max_upload) {
        return Err(too_large());
    }
    // Read as it arrives, stopping as soon as the limit is passed.
    let mut body = req.into_body();
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad(format!("the upload ended early: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if (bytes.len() + data.len()) as u64 > st.max_upload {
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
    }
    let limit = st.max_upload;
    let u = tokio::task::spawn_blocking(move || Upload::decode(&bytes, limit))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| match e {
            WireError::TooLarge(_) => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
            e => ApiError::bad(e.to_string()),
        })?;
    let runs = u.runs.len();
    Ok(match st.store.insert(&u, &name).await? {
        Stored::New(id) => (
            StatusCode::CREATED,
            Json(json!({ "id": id, "runs": runs, "duplicate": false, "url": format!("/api/runs/{id}") })),
        )
            .into_response(),
        Stored::Duplicate(id) => (
            StatusCode::OK,
            Json(json!({ "id": id, "runs": runs, "duplicate": true, "url": format!("/api/runs/{id}") })),
        )
            .into_response(),
    })
}

/// The runs a selection picks; run ids that name no run are an error (404), not an empty
/// selection.
async fn select(st: &AppState, sel: &Selection) -> ApiResult<Vec<RunRow>> {
    if let Some(ids) = &sel.ids {
        let known = Selection {
            ids: Some(ids.clone()),
            ..Selection::default()
        };
        let found: Vec<i64> = st.store.runs(&known).await?.iter().map(|r| r.id).collect();
        if let Some(id) = ids.iter().find(|i| !found.contains(i)) {
            return Err(ApiError::new(StatusCode::NOT_FOUND, format!("no run {id}")));
        }
    }
    Ok(st.store.runs(sel).await?)
}

async fn api_runs(
    State(st): State<Arc<AppState>>,
    Query(q): Params,
) -> ApiResult<Json<Vec<RunRow>>> {
    Ok(Json(select(&st, &selection(&q)?).await?))
}

async fn one_run(st: &AppState, id: i64) -> ApiResult<RunRow> {
    let sel = Selection {
        ids: Some(vec![id]),
        ..Selection::default()
    };
    st.store
        .runs(&sel)
        .await?
        .pop()
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no run {id}")))
}

async fn api_run(State(st): State<Arc<AppState>>, Path(id): Path<i64>) -> ApiResult<Json<RunRow>> {
    Ok(Json(one_run(&st, id).await?))
}

/// The hot functions of a selection, per module: the data of `/hot` and `/api/hot`.
pub struct Hot {
    /// The runs selected.
    pub runs: Vec<RunRow>,
    /// Runs combined (a merged upload counts its runs).
    pub run_count: u64,
    /// Whether some run recorded times.
    pub timed: bool,
    /// The figure functions are ranked by.
    pub key: SortKey,
    /// Per module: id, module file name, path, build-id, and its top functions as
    /// `report --json` shows them, each with its function index.
    pub modules: Vec<HotModule>,
}

/// One module of [`Hot`].
pub struct HotModule {
    /// Module id.
    pub id: i64,
    /// Module path.
    pub path: String,
    /// Build-id.
    pub build_id: Option<String>,
    /// Its top functions (`report_json` objects) with `module_id` and `idx` added.
    pub functions: Vec<serde_json::Value>,
}

async fn hot(st: &AppState, q: &[(String, String)]) -> ApiResult<Hot> {
    let runs = select(st, &selection(q)?).await?;
    let timed = runs.iter().any(|r| r.timed);
    let key = sort_key(q, timed)?;
    let (profile, modules) = st.store.profile(&runs, Want::Top(top_n(q)?, key)).await?;
    let mut out = Vec::new();
    for m in modules {
        // Each module through the CLI's report: the same figures and JSON as
        // `report -i A -i B --json`.
        let one = Profile {
            runs: profile.runs.clone(),
            modules: vec![m.summary.clone()],
            ..Profile::default()
        };
        let mut report = fnscope_analysis::report_of(&one);
        fnscope_analysis::sort(&mut report.functions, key);
        if report.functions.is_empty() {
            continue;
        }
        let mut functions = Vec::new();
        let items = fnscope_analysis::report_json(&report);
        for (f, mut item) in report
            .functions
            .iter()
            .zip(items.as_array().cloned().unwrap_or_default())
        {
            if let Some(pos) = m
                .summary
                .functions
                .iter()
                .position(|s| s.address == f.address)
            {
                item["module_id"] = json!(m.id);
                item["idx"] = json!(m.idx[pos]);
            }
            functions.push(item);
        }
        out.push(HotModule {
            id: m.id,
            path: m.summary.path.clone(),
            build_id: m.summary.build_id.clone(),
            functions,
        });
    }
    Ok(Hot {
        run_count: profile.run_count(),
        runs,
        timed,
        key,
        modules: out,
    })
}

fn key_name(k: SortKey) -> &'static str {
    match k {
        SortKey::Calls => "calls",
        SortKey::Total => "total",
        SortKey::SelfTime => "self",
        SortKey::Avg => "avg",
    }
}

async fn api_hot(
    State(st): State<Arc<AppState>>,
    Query(q): Params,
) -> ApiResult<Json<serde_json::Value>> {
    let h = hot(&st, &q).await?;
    Ok(Json(json!({
        "runs": h.run_count,
        "uploads": h.runs.iter().map(|r| r.id).collect::<Vec<_>>(),
        "timed": h.timed,
        "sort": key_name(h.key),
        "modules": h.modules.iter().map(|m| json!({
            "module_id": m.id,
            "module": m.path.rsplit('/').next().unwrap_or(&m.path),
            "path": m.path,
            "build_id": m.build_id,
            "functions": m.functions,
        })).collect::<Vec<_>>(),
    })))
}

/// A function's page data.
pub struct FunctionPage {
    /// The function.
    pub function: crate::store::FunctionRow,
    /// Its demangled name.
    pub name: String,
    /// Its figures per upload that called it.
    pub runs: Vec<crate::store::FunctionRun>,
    /// The same function in other builds.
    pub builds: Vec<crate::store::FunctionRow>,
}

async fn function_page(st: &AppState, module: i64, idx: i64) -> ApiResult<FunctionPage> {
    let Some(f) = st.store.function(module, idx).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no function {idx} in module {module}"),
        ));
    };
    let runs = st.store.function_runs(&f).await?;
    let builds = st.store.builds_of(&f).await?;
    Ok(FunctionPage {
        name: fnscope_symbols::demangle(&f.name),
        function: f,
        runs,
        builds,
    })
}

async fn api_function(
    State(st): State<Arc<AppState>>,
    Path((module, idx)): Path<(i64, i64)>,
) -> ApiResult<Json<serde_json::Value>> {
    let p = function_page(&st, module, idx).await?;
    Ok(Json(json!({
        "function": p.function,
        "name": p.name,
        "runs": p.runs,
        "builds": p.builds,
        "callers": null,
        "callees": null,
    })))
}

async fn side_profile(st: &AppState, sel: &Selection, what: &str) -> ApiResult<Profile> {
    let runs = select(st, sel).await?;
    if runs.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("side {what} selects no run"),
        ));
    }
    Ok(st.store.profile(&runs, Want::All).await?.0)
}

async fn compare(st: &AppState, q: &[(String, String)]) -> ApiResult<fnscope_analysis::Diff> {
    let a = side_profile(st, &side(q, "a")?, "a").await?;
    let b = side_profile(st, &side(q, "b")?, "b").await?;
    let key = sort_key(q, a.timed() && b.timed())?;
    Ok(fnscope_analysis::diff(("a", &a), ("b", &b), false, key)?)
}

async fn api_compare(
    State(st): State<Arc<AppState>>,
    Query(q): Params,
) -> ApiResult<Json<serde_json::Value>> {
    let d = compare(&st, &q).await?;
    Ok(Json(fnscope_analysis::diff_json(
        &d,
        param(&q, "top").and_then(|t| t.parse().ok()),
    )))
}

async fn coverage(st: &AppState, q: &[(String, String)]) -> ApiResult<fnscope_analysis::Coverage> {
    let runs = select(st, &selection(q)?).await?;
    let (p, _) = st.store.profile(&runs, Want::All).await?;
    // Reading module files for source lines is blocking work.
    tokio::task::spawn_blocking(move || fnscope_analysis::coverage(&p))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

async fn api_coverage(
    State(st): State<Arc<AppState>>,
    Query(q): Params,
) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(fnscope_analysis::coverage_json(
        &coverage(&st, &q).await?,
    )))
}

/// Pages answer errors with a small HTML page and the same status.
fn page(r: ApiResult<maud::Markup>) -> Response {
    match r {
        Ok(m) => Html(m.into_string()).into_response(),
        Err(e) => (e.status, Html(pages::error(&e.message).into_string())).into_response(),
    }
}

async fn page_runs(State(st): State<Arc<AppState>>, Query(q): Params) -> Response {
    page(async { Ok(pages::runs(&select(&st, &selection(&q)?).await?, &q)) }.await)
}

async fn page_hot(State(st): State<Arc<AppState>>, Query(q): Params) -> Response {
    page(async { Ok(pages::hot(&hot(&st, &q).await?, &q)) }.await)
}

async fn page_function(
    State(st): State<Arc<AppState>>,
    Path((module, idx)): Path<(i64, i64)>,
) -> Response {
    page(async { Ok(pages::function(&function_page(&st, module, idx).await?)) }.await)
}

async fn page_compare(State(st): State<Arc<AppState>>, Query(q): Params) -> Response {
    page(
        async {
            if param(&q, "a").is_none() && param(&q, "b").is_none() {
                return Ok(pages::compare(None, &q));
            }
            Ok(pages::compare(Some(&compare(&st, &q).await?), &q))
        }
        .await,
    )
}

async fn page_coverage(State(st): State<Arc<AppState>>, Query(q): Params) -> Response {
    page(async { Ok(pages::coverage(&coverage(&st, &q).await?, &q)) }.await)
}

/// Serves the application on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn dates_and_seconds() {
        assert_eq!(
            parse_time("since", "2026-11-23").unwrap(),
            1_795_392_000 * 1_000_000_000
        );
        assert_eq!(
            parse_time("since", "2000-02-29").unwrap(),
            951_782_400 * 1_000_000_000
        );
        assert_eq!(
            parse_time("since", "1795392000").unwrap(),
            1_795_392_000 * 1_000_000_000
        );
        for bad in ["yesterday", "2026-13-01", "2026-11", "99999999999999999999"] {
            assert!(parse_time("since", bad).is_err(), "{bad}");
        }
        // The inverse the pages use agrees.
        let days = parse_time("since", "2024-12-31").unwrap() / 86_400_000_000_000;
        assert_eq!(fnscope_analysis::civil_from_days(days), (2024, 12, 31));
    }

    #[test]
    fn selections() {
        let s = selection(&q(&[
            ("program", "game"),
            ("tag", "tester=alice"),
            ("tag", "device=a=b"),
            ("runs", "3, 4"),
        ]))
        .unwrap();
        assert_eq!(s.program.as_deref(), Some("game"));
        assert_eq!(
            s.tags,
            [
                ("tester".into(), "alice".into()),
                ("device".into(), "a=b".into())
            ]
        );
        assert_eq!(s.ids, Some(vec![3, 4]));
        assert!(selection(&q(&[("tag", "novalue")])).is_err());
        assert!(selection(&q(&[("runs", "1,x")])).is_err());
        let a = side(&q(&[("a", "tester=bob"), ("runs", "1")]), "a").unwrap();
        assert_eq!((a.tags.len(), a.ids), (1, None));
        assert!(side(&q(&[]), "b").is_err());
    }
}
