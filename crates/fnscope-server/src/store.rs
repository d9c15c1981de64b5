//! The database: one code path for SQLite and PostgreSQL through sqlx's `Any` driver.
//!
//! A module build (its build-id, else its file name) has one row in `modules` and its
//! function table in `functions`, stored once; an upload stores, per module it loaded, one
//! blob of per-function figures by function index (`run_modules.counts`), and adds them to
//! the module's running totals (`modules.totals`), so that the hot functions of every run of
//! a build are read from one row, and those of any other selection from one blob per run.
//!
//! Runs are combined with [`fnscope_analysis::add_function`] and
//! [`fnscope_analysis::settle_calls_min`], the code of `report -i A -i B` and `merge`.

use crate::wire::Upload;
use fnscope_analysis::{add_function, get_varint, put_varint, settle_calls_min, Profile};
use fnscope_format::{FunctionSummary, ModuleSummary, RunInfo};
use sha2::{Digest, Sha256};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::{AnyPool, AssertSqlSafe, Row, SqlSafeStr};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use subtle::ConstantTimeEq;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The URL names neither SQLite nor PostgreSQL.
    #[error("unsupported database URL {0:?}: use sqlite:FILE or postgres://...")]
    Url(String),
    /// No random bytes for a token.
    #[error("no random bytes for a token: {0}")]
    Random(String),
    /// Some runs of the upload are stored already, others not: storing it would count those
    /// twice.
    #[error("{stored} of the upload's {total} runs were uploaded before (upload {upload}); upload the runs that are not")]
    PartlyStored {
        /// Runs already stored.
        stored: usize,
        /// Runs in the upload.
        total: usize,
        /// An upload that holds one of them.
        upload: i64,
    },
    /// A stored blob does not decode: the database was changed behind the server's back.
    #[error("stored figures of module {0} are damaged")]
    Damaged(i64),
    /// A token name is taken.
    #[error("a token named {0:?} exists already")]
    TokenExists(String),
}

/// The database behind the server.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
}

/// Which runs a page or API call is about. Every field narrows the selection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    /// Program file name (the first word of the command line).
    pub program: Option<String>,
    /// Build of the program: its module key (`build-id HEX` or `file NAME`).
    pub build: Option<String>,
    /// Host name.
    pub host: Option<String>,
    /// `KEY=VALUE` tags that must all be present.
    pub tags: Vec<(String, String)>,
    /// Runs started at or after this time (ns since the Unix epoch).
    pub since_ns: Option<i64>,
    /// Runs started before this time (ns since the Unix epoch).
    pub until_ns: Option<i64>,
    /// These uploads only.
    pub ids: Option<Vec<i64>>,
}

/// One stored upload, as listed on the runs page.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct RunRow {
    /// Upload id.
    pub id: i64,
    /// When it was uploaded (seconds since the Unix epoch).
    pub uploaded_unix: i64,
    /// Name of the token it was uploaded with.
    pub token: String,
    /// User that uploaded it.
    pub user: String,
    /// Host it was recorded on.
    pub host: String,
    /// Program file name.
    pub program: String,
    /// Module key of the program's build.
    pub build: String,
    /// Command line, words joined by spaces.
    pub command: String,
    /// `time`, `count` or `merged`.
    pub mode: String,
    /// Start of the (first) run, ns since the Unix epoch.
    pub start_unix_ns: i64,
    /// Runs it holds: 1 for a recorded trace, more for a merged one.
    pub runs: i64,
    /// Whether times were recorded.
    pub timed: bool,
    /// Calls of all functions.
    pub calls: i64,
    /// Functions hooked.
    pub hooked: i64,
    /// Functions skipped (not safely hookable).
    pub skipped: i64,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

/// What an upload did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Stored under this id.
    New(i64),
    /// Every run in it was stored before, in this upload: nothing written.
    Duplicate(i64),
}

/// Which functions a profile of stored runs lists per module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The first `n` called functions by the figure `key`.
    Top(usize, fnscope_analysis::SortKey),
    /// Every function of the table, called or not (coverage).
    All,
}

/// A module of a profile read from the store, with its id for links.
#[derive(Clone, Debug)]
pub struct StoredModule {
    /// Module id.
    pub id: i64,
    /// Function index of each function in `summary.functions`, in the same order.
    pub idx: Vec<i64>,
    /// The functions with their totals over the selected runs.
    pub summary: ModuleSummary,
}

/// The figures of one function in one upload, for the function page.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct FunctionRun {
    /// Upload id.
    pub upload: i64,
    /// Start of the run, ns since the Unix epoch.
    pub start_unix_ns: i64,
    /// Host.
    pub host: String,
    /// Runs in the upload.
    pub runs: i64,
    /// Calls, summed over the upload's runs.
    pub calls: u64,
    /// Summed duration of the timed calls.
    pub total_ns: u64,
    /// Summed self time of the timed calls.
    pub self_ns: u64,
}

/// One function of a stored table.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct FunctionRow {
    /// Module id.
    pub module: i64,
    /// Module path.
    pub module_path: String,
    /// Module key (`build-id HEX` or `file NAME`).
    pub module_key: String,
    /// Index in the module's table.
    pub idx: i64,
    /// Link-time address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Symbol name as found in the file.
    pub name: String,
    /// Whether some run hooked it.
    pub hooked: bool,
    /// Why it was skipped, when it was.
    pub reason: String,
}

/// Bytes of one function's running totals: the index (u32), runs with it (u64), eight u64.
const TOTAL_ENTRY: usize = 4 + 9 * 8;
/// Rows per multi-row INSERT of function tables (8 values each; both databases accept
/// far more than 4,000 parameters in one statement).
const INSERT_BATCH: usize = 500;

/// File name of a path.
fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// How runs identify a module build: as [`fnscope_analysis::combine`] matches modules.
pub fn module_key(path: &str, build_id: Option<&str>) -> String {
    match build_id {
        Some(id) => format!("build-id {id}"),
        None => format!("file {}", basename(path)),
    }
}

/// Lowercase hex of bytes.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// What identifies a run across uploads: where, when and what was recorded.
fn run_key(r: &RunInfo) -> String {
    let mut h = Sha256::new();
    for part in [
        r.host.as_bytes(),
        r.start_unix_ns.to_le_bytes().as_slice(),
        r.mode.as_bytes(),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    for w in &r.command {
        h.update((w.len() as u64).to_le_bytes());
        h.update(w.as_bytes());
    }
    hex(&h.finalize())
}

/// The eight figures of a function, in the order running totals store them.
fn figures(f: &mut FunctionSummary) -> [&mut u64; 8] {
    [
        &mut f.calls,
        &mut f.calls_min,
        &mut f.calls_max,
        &mut f.timed_calls,
        &mut f.total_ns,
        &mut f.self_ns,
        &mut f.min_ns,
        &mut f.max_ns,
    ]
}

fn read_u64s(b: &[u8], out: &mut [u64]) {
    for (i, o) in out.iter_mut().enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i * 8..i * 8 + 8]);
        *o = u64::from_le_bytes(w);
    }
}

/// Flag of a counts entry: calls_min and calls_max equal calls (an upload of one run).
const ONE_RUN: u8 = 1;
/// Flag of a counts entry: times follow.
const TIMED: u8 = 2;

/// A counts blob, compact because selections read one per selected run: for each function
/// with calls, in index order, the index's increase over the previous one (varint), a flags
/// byte ([`ONE_RUN`], [`TIMED`]), calls, then calls_min and calls_max unless `ONE_RUN`, then
/// timed_calls, total_ns, self_ns, min_ns and max_ns if `TIMED` (all varints). A count-mode
/// run costs about 4 bytes per called function.
fn encode_counts(funcs: &BTreeMap<u32, FunctionSummary>) -> Vec<u8> {
    let mut out = Vec::with_capacity(funcs.len() * 5);
    let mut prev = 0;
    for (&i, f) in funcs {
        put_varint(&mut out, u64::from(i - prev));
        prev = i;
        let one_run = f.calls_min == f.calls && f.calls_max == f.calls;
        let timed = f.timed_calls > 0 || f.total_ns > 0;
        out.push(if one_run { ONE_RUN } else { 0 } | if timed { TIMED } else { 0 });
        put_varint(&mut out, f.calls);
        if !one_run {
            put_varint(&mut out, f.calls_min);
            put_varint(&mut out, f.calls_max);
        }
        if timed {
            for v in [f.timed_calls, f.total_ns, f.self_ns, f.min_ns, f.max_ns] {
                put_varint(&mut out, v);
            }
        }
    }
    out
}

/// Reads a counts blob, handing each function's index and figures to `each`. One summary is
/// reused: selections read millions of entries. Every function in a blob was called, so it
/// was hooked in that run.
fn decode_counts(
    b: &[u8],
    module: i64,
    nfuncs: i64,
    mut each: impl FnMut(u32, &FunctionSummary),
) -> Result<(), StoreError> {
    let damaged = || StoreError::Damaged(module);
    let mut f = FunctionSummary {
        hooked: true,
        ..FunctionSummary::default()
    };
    let (mut at, mut idx) = (0usize, 0u64);
    while at < b.len() {
        idx += get_varint(b, &mut at).ok_or_else(damaged)?;
        let flags = *b.get(at).ok_or_else(damaged)?;
        at += 1;
        // An index past the module's table is damage (and must not size a vector).
        if flags & !(ONE_RUN | TIMED) != 0 || idx >= nfuncs.max(0) as u64 || idx > u64::from(u32::MAX) {
            return Err(damaged());
        }
        let mut next = || get_varint(b, &mut at).ok_or_else(damaged);
        f.calls = next()?;
        (f.calls_min, f.calls_max) = if flags & ONE_RUN != 0 {
            (f.calls, f.calls)
        } else {
            (next()?, next()?)
        };
        [f.timed_calls, f.total_ns, f.self_ns, f.min_ns, f.max_ns] = if flags & TIMED != 0 {
            [next()?, next()?, next()?, next()?, next()?]
        } else {
            [0; 5]
        };
        each(idx as u32, &f);
    }
    Ok(())
}

/// Running totals per function index: figures and how many runs had the function.
#[derive(Default)]
struct Totals {
    funcs: Vec<FunctionSummary>,
    runs_with: Vec<u64>,
}

impl Totals {
    fn decode(b: &[u8], module: i64, nfuncs: i64) -> Result<Totals, StoreError> {
        if !b.len().is_multiple_of(TOTAL_ENTRY) {
            return Err(StoreError::Damaged(module));
        }
        let mut t = Totals::default();
        let mut v = [0u64; 9];
        for e in b.chunks_exact(TOTAL_ENTRY) {
            let i = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize;
            if i as i64 >= nfuncs {
                return Err(StoreError::Damaged(module));
            }
            read_u64s(&e[4..], &mut v);
            t.grow(i + 1);
            t.runs_with[i] = v[0];
            for (slot, x) in figures(&mut t.funcs[i]).into_iter().zip(&v[1..]) {
                *slot = *x;
            }
        }
        Ok(t)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, (f, &n)) in self.funcs.iter().zip(&self.runs_with).enumerate() {
            if n == 0 {
                continue;
            }
            out.extend_from_slice(&(i as u32).to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
            // Totals carry no names: the copy costs no allocation.
            for v in figures(&mut f.clone()) {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    fn grow(&mut self, len: usize) {
        if self.funcs.len() < len {
            self.funcs.resize(len, FunctionSummary::default());
            self.runs_with.resize(len, 0);
        }
    }

    /// Adds one upload's figures of function `i`, which `runs` runs had.
    fn add(&mut self, i: usize, f: &FunctionSummary, runs: u64) {
        self.grow(i + 1);
        add_function(&mut self.funcs[i], f, self.runs_with[i] == 0);
        self.runs_with[i] = self.runs_with[i].saturating_add(runs);
    }
}

fn row_run(r: &AnyRow) -> Result<RunRow, sqlx::Error> {
    Ok(RunRow {
        id: r.try_get("id")?,
        uploaded_unix: r.try_get("uploaded_unix")?,
        token: r.try_get("token")?,
        user: r.try_get("user_name")?,
        host: r.try_get("host")?,
        program: r.try_get("program")?,
        build: r.try_get("build")?,
        command: r.try_get("command")?,
        mode: r.try_get("mode")?,
        start_unix_ns: r.try_get("start_unix_ns")?,
        runs: r.try_get("runs")?,
        timed: r.try_get::<i64, _>("timed")? != 0,
        calls: r.try_get("calls")?,
        hooked: r.try_get("hooked")?,
        skipped: r.try_get("skipped")?,
        tags: BTreeMap::new(),
    })
}

/// The schema's steps: version, description, SQL (PostgreSQL's spelling).
const MIGRATIONS: [(i64, &str, &str); 1] =
    [(1, "init", include_str!("../migrations/0001_init.sql"))];

/// The migrations for one database: the SQL of [`MIGRATIONS`], with SQLite's spelling of an
/// auto-numbered key where needed.
#[derive(Debug)]
struct Schema {
    sqlite: bool,
}

impl<'s> MigrationSource<'s> for Schema {
    fn resolve(
        self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send + 's>> {
        Box::pin(async move {
            Ok(MIGRATIONS
                .iter()
                .map(|&(version, description, sql)| {
                    let sql = if self.sqlite {
                        sql.replace("BIGSERIAL PRIMARY KEY", "INTEGER PRIMARY KEY AUTOINCREMENT")
                    } else {
                        sql.to_string()
                    };
                    Migration::new(
                        version,
                        description.into(),
                        MigrationType::Simple,
                        AssertSqlSafe(sql).into_sql_str(),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// A statement put together at run time. Audited: only constant text, `$N` placeholders and
/// integer ids ([`id_list`]) ever go into one; user text is always bound.
fn audited(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}

/// Comma-separated ids for an `IN (...)` list; they are integers, never user text.
fn id_list(ids: impl IntoIterator<Item = i64>) -> String {
    ids.into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Store {
    /// Opens (creating a SQLite file if needed) the database at `url` and brings its schema
    /// up to date.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let sqlite = url.starts_with("sqlite:");
        if !sqlite && !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(StoreError::Url(url.to_string()));
        }
        let url = if sqlite && !url.contains('?') {
            format!("{url}?mode=rwc")
        } else {
            url.to_string()
        };
        let pool = AnyPoolOptions::new()
            .max_connections(if sqlite { 8 } else { 16 })
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if sqlite {
                        // Readers do not wait for the writer; writers queue for each other
                        // instead of failing at once.
                        sqlx::query("PRAGMA journal_mode=WAL")
                            .execute(&mut *conn)
                            .await?;
                        sqlx::query("PRAGMA busy_timeout=30000")
                            .execute(&mut *conn)
                            .await?;
                        sqlx::query("PRAGMA synchronous=NORMAL")
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await?;
        Migrator::new(Schema { sqlite }).await?.run(&pool).await?;
        Ok(Store { pool })
    }

    /// Creates an upload token named `name` and returns it; only its SHA-256 is stored.
    pub async fn create_token(&self, name: &str) -> Result<String, StoreError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| StoreError::Random(e.to_string()))?;
        let token = format!("fns_{}", hex(&raw));
        let r = sqlx::query(
            "INSERT INTO tokens (name, hash, created_unix) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(sha256_hex(token.as_bytes()))
        .bind(now_unix())
        .execute(&self.pool)
        .await?;
        if r.rows_affected() == 0 {
            return Err(StoreError::TokenExists(name.to_string()));
        }
        Ok(token)
    }

    /// How many upload tokens exist.
    pub async fn token_count(&self) -> Result<i64, StoreError> {
        let r = sqlx::query("SELECT COUNT(*) AS n FROM tokens")
            .fetch_one(&self.pool)
            .await?;
        Ok(r.try_get("n")?)
    }

    /// The name of the token `token`, if it is one; every stored hash is compared in
    /// constant time.
    pub async fn token_name(&self, token: &str) -> Result<Option<String>, StoreError> {
        let want = sha256_hex(token.as_bytes());
        let rows = sqlx::query("SELECT name, hash FROM tokens")
            .fetch_all(&self.pool)
            .await?;
        let mut found = None;
        for r in rows {
            let hash: String = r.try_get("hash")?;
            if bool::from(hash.as_bytes().ct_eq(want.as_bytes())) {
                found = Some(r.try_get("name")?);
            }
        }
        Ok(found)
    }

    /// Stores an upload in one transaction: all of it or, on any error, nothing.
    pub async fn insert(&self, u: &Upload, token: &str) -> Result<Stored, StoreError> {
        let first = &u.runs[0];
        let program = first
            .command
            .first()
            .map_or("", |c| basename(c))
            .to_string();
        let build = u
            .modules
            .iter()
            .find(|m| !program.is_empty() && basename(&m.path) == program)
            .map_or_else(String::new, |m| module_key(&m.path, m.build_id.as_deref()));
        let all = || u.modules.iter().flat_map(|m| &m.functions);
        let calls: u64 = all().fold(0u64, |s, f| s.saturating_add(f.calls));
        let hooked = all().filter(|f| f.hooked).count();
        let skipped = all().filter(|f| !f.hooked).count();
        let mode = if u.runs.len() > 1 {
            fnscope_analysis::MODE_MERGED
        } else {
            first.mode.as_str()
        };
        let runs = u.runs.len() as u64;

        let mut tx = self.pool.begin().await?;
        // A write first: SQLite then takes the write lock (waiting for other writers) before
        // anything is read, so the transaction cannot be refused later for a stale read.
        let id: i64 = sqlx::query(
            "INSERT INTO uploads (uploaded_unix, token, user_name, host, program, build, command, mode, \
             start_unix_ns, runs, timed, calls, hooked, skipped) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING id",
        )
        .bind(now_unix())
        .bind(token)
        .bind(&u.user)
        .bind(&first.host)
        .bind(&program)
        .bind(&build)
        .bind(first.command.join(" "))
        .bind(mode)
        .bind(u.runs.iter().map(|r| r.start_unix_ns).min().unwrap_or(0) as i64)
        .bind(runs as i64)
        .bind(i64::from(u.timed))
        .bind(calls as i64)
        .bind(hooked as i64)
        .bind(skipped as i64)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;

        let mut stored_before = None;
        let mut n_stored = 0;
        for r in &u.runs {
            let key = run_key(r);
            let done = sqlx::query("INSERT INTO run_keys (key, upload_id) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
                .bind(&key)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                n_stored += 1;
                if stored_before.is_none() {
                    let row = sqlx::query("SELECT upload_id FROM run_keys WHERE key = $1")
                        .bind(&key)
                        .fetch_one(&mut *tx)
                        .await?;
                    stored_before = Some(row.try_get::<i64, _>("upload_id")?);
                }
            }
        }
        if let Some(before) = stored_before {
            tx.rollback().await?;
            if n_stored == u.runs.len() {
                return Ok(Stored::Duplicate(before));
            }
            return Err(StoreError::PartlyStored {
                stored: n_stored,
                total: u.runs.len(),
                upload: before,
            });
        }
        for (k, v) in &u.tags {
            sqlx::query("INSERT INTO upload_tags (upload_id, key, value) VALUES ($1, $2, $3)")
                .bind(id)
                .bind(k)
                .bind(v)
                .execute(&mut *tx)
                .await?;
        }

        // One build may appear under several paths in one trace: gather by module key, and
        // take the modules in key order so that concurrent uploads lock them in one order.
        let mut by_key: BTreeMap<String, Vec<&ModuleSummary>> = BTreeMap::new();
        for m in &u.modules {
            by_key
                .entry(module_key(&m.path, m.build_id.as_deref()))
                .or_default()
                .push(m);
        }
        for (key, parts) in by_key {
            sqlx::query(
                "INSERT INTO modules (key, path, build_id, nfuncs, runs, totals) VALUES ($1, $2, $3, 0, 0, $4) \
                 ON CONFLICT (key) DO NOTHING",
            )
            .bind(&key)
            .bind(&parts[0].path)
            .bind(parts[0].build_id.clone())
            .bind(Vec::<u8>::new())
            .execute(&mut *tx)
            .await?;
            // Taking the row's lock before reading its totals serialises concurrent uploads
            // of one build on PostgreSQL.
            let row = sqlx::query(
                "UPDATE modules SET runs = runs + $1 WHERE key = $2 RETURNING id, nfuncs, totals",
            )
            .bind(runs as i64)
            .bind(&key)
            .fetch_one(&mut *tx)
            .await?;
            let module: i64 = row.try_get("id")?;
            let mut nfuncs: i64 = row.try_get("nfuncs")?;
            let mut totals = Totals::decode(&row.try_get::<Vec<u8>, _>("totals")?, module, nfuncs)?;

            // Functions are found by name and rank, as `report -i` matches runs: generated
            // code (Mono's) reuses addresses for other methods.
            let mut table: HashMap<String, (i64, bool)> = HashMap::new();
            for r in sqlx::query("SELECT idx, fkey, hooked FROM functions WHERE module_id = $1")
                .bind(module)
                .fetch_all(&mut *tx)
                .await?
            {
                table.insert(r.try_get("fkey")?, (r.try_get("idx")?, r.try_get::<i64, _>("hooked")? != 0));
            }
            let mut new_funcs: Vec<(i64, &FunctionSummary, String)> = Vec::new();
            let mut now_hooked = Vec::new();
            let mut counts: BTreeMap<u32, FunctionSummary> = BTreeMap::new();
            let keyed = parts.iter().flat_map(|m| m.functions.iter().zip(fnscope_analysis::function_key_texts(m)));
            for (f, fkey) in keyed {
                let idx = match table.get(&fkey) {
                    Some(&(idx, was_hooked)) => {
                        if f.hooked && !was_hooked {
                            now_hooked.push(idx);
                            table.insert(fkey, (idx, true));
                        }
                        idx
                    }
                    None => {
                        let idx = nfuncs;
                        nfuncs += 1;
                        table.insert(fkey.clone(), (idx, f.hooked));
                        new_funcs.push((idx, f, fkey));
                        idx
                    }
                };
                if f.calls > 0 || f.timed_calls > 0 {
                    let first = !counts.contains_key(&(idx as u32));
                    add_function(counts.entry(idx as u32).or_default(), f, first);
                }
            }
            for batch in new_funcs.chunks(INSERT_BATCH) {
                let mut sql = String::from(
                    "INSERT INTO functions (module_id, idx, address, size, name, hooked, reason, fkey) VALUES ",
                );
                for i in 0..batch.len() {
                    let placeholders: Vec<String> = (1..=8).map(|k| format!("${}", i * 8 + k)).collect();
                    sql.push_str(&format!("{}({})", if i > 0 { ", " } else { "" }, placeholders.join(", ")));
                }
                let mut q = sqlx::query(audited(sql));
                for (idx, f, fkey) in batch {
                    q = q
                        .bind(module)
                        .bind(*idx)
                        .bind(f.address as i64)
                        .bind(f.size as i64)
                        .bind(f.name.clone())
                        .bind(i64::from(f.hooked))
                        .bind(f.reason.clone())
                        .bind(fkey.clone());
                }
                q.execute(&mut *tx).await?;
            }
            for idx in now_hooked {
                sqlx::query("UPDATE functions SET hooked = 1, reason = '' WHERE module_id = $1 AND idx = $2")
                    .bind(module)
                    .bind(idx)
                    .execute(&mut *tx)
                    .await?;
            }
            for (&i, f) in &counts {
                totals.add(i as usize, f, runs);
            }
            sqlx::query(
                "INSERT INTO run_modules (upload_id, module_id, counts) VALUES ($1, $2, $3)",
            )
            .bind(id)
            .bind(module)
            .bind(encode_counts(&counts))
            .execute(&mut *tx)
            .await?;
            sqlx::query("UPDATE modules SET nfuncs = $1, totals = $2 WHERE id = $3")
                .bind(nfuncs)
                .bind(totals.encode())
                .bind(module)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Stored::New(id))
    }

    /// The uploads a selection picks, newest first, with their tags.
    pub async fn runs(&self, sel: &Selection) -> Result<Vec<RunRow>, StoreError> {
        let mut sql = String::from("SELECT * FROM uploads WHERE 1 = 1");
        let mut binds: Vec<String> = Vec::new();
        let mut arg = |sql: &mut String, cond: &str, v: String| {
            binds.push(v);
            sql.push_str(&cond.replace('?', &format!("${}", binds.len())));
        };
        if let Some(p) = &sel.program {
            arg(&mut sql, " AND program = ?", p.clone());
        }
        if let Some(b) = &sel.build {
            arg(&mut sql, " AND build = ?", b.clone());
        }
        if let Some(h) = &sel.host {
            arg(&mut sql, " AND host = ?", h.clone());
        }
        for (k, v) in &sel.tags {
            arg(
                &mut sql,
                " AND id IN (SELECT upload_id FROM upload_tags WHERE key = ?",
                k.clone(),
            );
            arg(&mut sql, " AND value = ?)", v.clone());
        }
        if let Some(t) = sel.since_ns {
            sql.push_str(&format!(" AND start_unix_ns >= {t}"));
        }
        if let Some(t) = sel.until_ns {
            sql.push_str(&format!(" AND start_unix_ns < {t}"));
        }
        if let Some(ids) = &sel.ids {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            sql.push_str(&format!(" AND id IN ({})", id_list(ids.iter().copied())));
        }
        sql.push_str(" ORDER BY id DESC");
        let mut q = sqlx::query(audited(sql));
        for b in binds {
            q = q.bind(b);
        }
        let mut runs = Vec::new();
        for r in q.fetch_all(&self.pool).await? {
            runs.push(row_run(&r)?);
        }
        if runs.is_empty() {
            return Ok(runs);
        }
        let index: HashMap<i64, usize> = runs.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
        let tags = format!(
            "SELECT upload_id, key, value FROM upload_tags WHERE upload_id IN ({})",
            id_list(runs.iter().map(|r| r.id))
        );
        for r in sqlx::query(audited(tags)).fetch_all(&self.pool).await? {
            let id: i64 = r.try_get("upload_id")?;
            if let Some(&i) = index.get(&id) {
                runs[i].tags.insert(r.try_get("key")?, r.try_get("value")?);
            }
        }
        Ok(runs)
    }

    /// The combined profile of some uploads: per module they loaded, the functions `want`
    /// asks for with their figures summed over the uploads' runs, exactly as
    /// `report -i A -i B` combines traces.
    pub async fn profile(
        &self,
        runs: &[RunRow],
        want: Want,
    ) -> Result<(Profile, Vec<StoredModule>), StoreError> {
        let mut profile = Profile::default();
        for r in runs {
            for _ in 0..r.runs {
                profile.runs.push(RunInfo {
                    host: r.host.clone(),
                    start_unix_ns: r.start_unix_ns as u64,
                    mode: if r.timed { "time" } else { "count" }.to_string(),
                    ..RunInfo::default()
                });
            }
        }
        if runs.is_empty() {
            return Ok((profile, Vec::new()));
        }
        let total_runs = profile.run_count();
        let ids = id_list(runs.iter().map(|r| r.id));
        let runs_of: HashMap<i64, i64> = runs.iter().map(|r| (r.id, r.runs)).collect();
        // Per module: the selected runs that loaded it.
        let mut loaded: BTreeMap<i64, u64> = BTreeMap::new();
        for r in sqlx::query(audited(format!(
            "SELECT upload_id, module_id FROM run_modules WHERE upload_id IN ({ids})"
        )))
        .fetch_all(&self.pool)
        .await?
        {
            let upload: i64 = r.try_get("upload_id")?;
            *loaded.entry(r.try_get("module_id")?).or_default() +=
                runs_of.get(&upload).copied().unwrap_or(0) as u64;
        }
        let mut out = Vec::new();
        for (&module, &selected) in &loaded {
            let m = sqlx::query(
                "SELECT key, path, build_id, nfuncs, runs, totals FROM modules WHERE id = $1",
            )
            .bind(module)
            .fetch_one(&self.pool)
            .await?;
            let all_runs: i64 = m.try_get("runs")?;
            let nfuncs: i64 = m.try_get("nfuncs")?;
            // Every run that loaded the module is selected: its running totals are the answer.
            let totals = if selected as i64 == all_runs {
                Totals::decode(&m.try_get::<Vec<u8>, _>("totals")?, module, nfuncs)?
            } else {
                let mut t = Totals::default();
                for r in sqlx::query(audited(format!(
                    "SELECT upload_id, counts FROM run_modules WHERE module_id = $1 AND upload_id IN ({ids})"
                )))
                .bind(module)
                .fetch_all(&self.pool)
                .await?
                {
                    let n = runs_of.get(&r.try_get::<i64, _>("upload_id")?).copied().unwrap_or(0) as u64;
                    decode_counts(&r.try_get::<Vec<u8>, _>("counts")?, module, nfuncs, |i, f| t.add(i as usize, f, n))?;
                }
                t
            };
            let chosen: Vec<usize> = match want {
                Want::All => (0..nfuncs as usize).collect(),
                Want::Top(n, key) => top(&totals, n, key),
            };
            let table = self.table(module, &chosen, want == Want::All).await?;
            let mut summary = ModuleSummary {
                path: m.try_get("path")?,
                build_id: m.try_get("build_id")?,
                functions: Vec::with_capacity(chosen.len()),
            };
            let mut idx = Vec::with_capacity(chosen.len());
            for i in chosen {
                let Some(t) = table.get(&(i as i64)) else {
                    continue;
                };
                let mut f = totals.funcs.get(i).cloned().unwrap_or_default();
                settle_calls_min(
                    &mut f,
                    totals.runs_with.get(i).copied().unwrap_or(0),
                    total_runs,
                );
                f.address = t.address;
                f.size = t.size;
                f.name = t.name.clone();
                f.hooked = t.hooked;
                f.reason = t.reason.clone();
                summary.functions.push(f);
                idx.push(i as i64);
            }
            profile.modules.push(summary.clone());
            out.push(StoredModule {
                id: module,
                idx,
                summary,
            });
        }
        Ok((profile, out))
    }

    /// Rows of a module's function table: those indexes, or all of them.
    async fn table(
        &self,
        module: i64,
        idx: &[usize],
        all: bool,
    ) -> Result<HashMap<i64, FunctionRow>, StoreError> {
        let mut sql = "SELECT f.*, m.path, m.key FROM functions f JOIN modules m ON m.id = f.module_id WHERE f.module_id = $1".to_string();
        if !all {
            if idx.is_empty() {
                return Ok(HashMap::new());
            }
            sql.push_str(&format!(
                " AND f.idx IN ({})",
                id_list(idx.iter().map(|&i| i as i64))
            ));
        }
        let mut out = HashMap::new();
        for r in sqlx::query(audited(sql))
            .bind(module)
            .fetch_all(&self.pool)
            .await?
        {
            let f = row_function(&r)?;
            out.insert(f.idx, f);
        }
        Ok(out)
    }

    /// One function of a stored table.
    pub async fn function(&self, module: i64, idx: i64) -> Result<Option<FunctionRow>, StoreError> {
        let r = sqlx::query(
            "SELECT f.*, m.path, m.key FROM functions f JOIN modules m ON m.id = f.module_id WHERE f.module_id = $1 AND f.idx = $2",
        )
        .bind(module)
        .bind(idx)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match r {
            Some(r) => Some(row_function(&r)?),
            None => None,
        })
    }

    /// The same function (by name) in every stored build of modules with the same file name.
    pub async fn builds_of(&self, f: &FunctionRow) -> Result<Vec<FunctionRow>, StoreError> {
        let mut out = Vec::new();
        for r in sqlx::query("SELECT f.*, m.path, m.key FROM functions f JOIN modules m ON m.id = f.module_id WHERE f.name = $1")
            .bind(&f.name)
            .fetch_all(&self.pool)
            .await?
        {
            let g = row_function(&r)?;
            if basename(&g.module_path) == basename(&f.module_path) {
                out.push(g);
            }
        }
        Ok(out)
    }

    /// A function's figures in each upload that called it, oldest first.
    pub async fn function_runs(&self, f: &FunctionRow) -> Result<Vec<FunctionRun>, StoreError> {
        let mut out = Vec::new();
        for r in sqlx::query(
            "SELECT u.id, u.start_unix_ns, u.host, u.runs, rm.counts FROM run_modules rm \
             JOIN uploads u ON u.id = rm.upload_id WHERE rm.module_id = $1 ORDER BY u.start_unix_ns, u.id",
        )
        .bind(f.module)
        .fetch_all(&self.pool)
        .await?
        {
            let mut found = None;
            decode_counts(&r.try_get::<Vec<u8>, _>("counts")?, f.module, i64::from(u32::MAX), |i, s| {
                if i64::from(i) == f.idx {
                    found = Some(s.clone());
                }
            })?;
            let Some(s) = found else { continue };
            out.push(FunctionRun {
                upload: r.try_get("id")?,
                start_unix_ns: r.try_get("start_unix_ns")?,
                host: r.try_get("host")?,
                runs: r.try_get("runs")?,
                calls: s.calls,
                total_ns: s.total_ns,
                self_ns: s.self_ns,
            });
        }
        Ok(out)
    }
}

fn row_function(r: &AnyRow) -> Result<FunctionRow, sqlx::Error> {
    Ok(FunctionRow {
        module: r.try_get("module_id")?,
        module_path: r.try_get("path")?,
        module_key: r.try_get("key")?,
        idx: r.try_get("idx")?,
        address: r.try_get::<i64, _>("address")? as u64,
        size: r.try_get::<i64, _>("size")? as u64,
        name: r.try_get("name")?,
        hooked: r.try_get::<i64, _>("hooked")? != 0,
        reason: r.try_get("reason")?,
    })
}

/// Indexes of the `n` called functions with the largest `key` figure, largest first.
fn top(t: &Totals, n: usize, key: fnscope_analysis::SortKey) -> Vec<usize> {
    use fnscope_analysis::SortKey;
    let k = |f: &FunctionSummary| match key {
        SortKey::Calls => f.calls,
        SortKey::Total => f.total_ns,
        SortKey::SelfTime => f.self_ns,
        SortKey::Avg => f.total_ns.checked_div(f.timed_calls).unwrap_or(0),
    };
    let mut called: Vec<usize> = (0..t.funcs.len())
        .filter(|&i| t.funcs[i].calls > 0)
        .collect();
    let by = |a: &usize, b: &usize| k(&t.funcs[*b]).cmp(&k(&t.funcs[*a])).then(a.cmp(b));
    if called.len() > n && n > 0 {
        called.select_nth_unstable_by(n - 1, by);
        called.truncate(n);
    }
    called.sort_by(by);
    called
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(calls: u64, total_ns: u64) -> FunctionSummary {
        FunctionSummary {
            calls,
            calls_min: calls,
            calls_max: calls,
            timed_calls: calls,
            total_ns,
            self_ns: total_ns / 2,
            min_ns: 1,
            max_ns: total_ns,
            ..FunctionSummary::default()
        }
    }

    #[test]
    fn counts_blobs_round_trip() {
        let mut merged = f(30, 0);
        (
            merged.timed_calls,
            merged.min_ns,
            merged.calls_min,
            merged.calls_max,
        ) = (0, 0, 0, 20);
        let counted = FunctionSummary {
            calls: 300,
            calls_min: 300,
            calls_max: 300,
            ..FunctionSummary::default()
        };
        let funcs = BTreeMap::from([
            (0, counted),
            (3, f(10, 500)),
            (4, merged),
            (70_000, f(1, 9)),
        ]);
        let b = encode_counts(&funcs);
        let mut back = Vec::new();
        decode_counts(&b, 1, 1 << 20, |i, f| back.push((i, f.clone()))).unwrap();
        let funcs: Vec<_> = funcs
            .into_iter()
            .map(|(i, f)| (i, FunctionSummary { hooked: true, ..f }))
            .collect();
        assert_eq!(back, funcs);
        assert_eq!(
            b[..4],
            [0, ONE_RUN, 0xac, 0x02],
            "index 0, one run, 300 calls"
        );
        assert!(matches!(
            decode_counts(&b[..b.len() - 1], 7, 1 << 20, |_, _| ()),
            Err(StoreError::Damaged(7))
        ));
        assert!(
            matches!(
                decode_counts(&[1, 4, 1], 7, 1 << 20, |_, _| ()),
                Err(StoreError::Damaged(7))
            ),
            "unknown flag"
        );
        let mut none = 0;
        decode_counts(&[], 7, 1 << 20, |_, _| none += 1).unwrap();
        assert_eq!(none, 0);
    }

    #[test]
    fn totals_combine_like_combine() {
        let mut t = Totals::default();
        t.add(2, &f(7000, 70), 1);
        t.add(2, &f(7300, 30), 1);
        t.add(5, &f(4, 4), 2);
        let t = Totals::decode(&t.encode(), 1, 1 << 20).unwrap();
        assert_eq!(t.runs_with, [0, 0, 2, 0, 0, 2]);
        let g = &t.funcs[2];
        assert_eq!((g.calls, g.calls_min, g.calls_max), (14_300, 7000, 7300));
        assert_eq!((g.total_ns, g.min_ns, g.max_ns), (100, 1, 70));
        let mut h = t.funcs[5].clone();
        settle_calls_min(&mut h, t.runs_with[5], 3);
        assert_eq!(h.calls_min, 0, "one run of three did not call it");
        assert!(Totals::decode(&[0; TOTAL_ENTRY + 1], 4, 1 << 20).is_err());
        // An index past the table is damage, not a reason to allocate.
        let far = [&u32::MAX.to_le_bytes()[..], &[0u8; TOTAL_ENTRY - 4]].concat();
        assert!(Totals::decode(&far, 4, 100).is_err());
    }

    #[test]
    fn run_keys_tell_runs_apart() {
        let r = RunInfo {
            command: vec!["a b".into()],
            host: "h".into(),
            start_unix_ns: 5,
            mode: "count".into(),
            ..RunInfo::default()
        };
        let mut moved = r.clone();
        moved.trace = "elsewhere".into();
        assert_eq!(
            run_key(&r),
            run_key(&moved),
            "the trace's path is not part of the run"
        );
        let mut split = r.clone();
        split.command = vec!["a".into(), "b".into()];
        assert_ne!(run_key(&r), run_key(&split));
        let mut later = r.clone();
        later.start_unix_ns = 6;
        assert_ne!(run_key(&r), run_key(&later));
    }
}
