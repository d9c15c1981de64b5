-- One schema for both databases, written for PostgreSQL; for SQLite, store.rs spells
-- `BIGSERIAL PRIMARY KEY` as `INTEGER PRIMARY KEY AUTOINCREMENT` (the one difference).
-- Upload tokens: only their SHA-256 is kept.
CREATE TABLE tokens (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    hash TEXT NOT NULL,
    created_unix BIGINT NOT NULL
);
-- One row per upload: a recorded trace (one run) or a merged one (several runs).
CREATE TABLE uploads (
    id BIGSERIAL PRIMARY KEY,
    uploaded_unix BIGINT NOT NULL,
    token TEXT NOT NULL,
    user_name TEXT NOT NULL,
    host TEXT NOT NULL,
    program TEXT NOT NULL,
    build TEXT NOT NULL,
    command TEXT NOT NULL,
    mode TEXT NOT NULL,
    start_unix_ns BIGINT NOT NULL,
    runs BIGINT NOT NULL,
    timed BIGINT NOT NULL,
    calls BIGINT NOT NULL,
    hooked BIGINT NOT NULL,
    skipped BIGINT NOT NULL
);
CREATE INDEX uploads_start ON uploads(start_unix_ns);
CREATE TABLE upload_tags (
    upload_id BIGINT NOT NULL REFERENCES uploads(id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (upload_id, key)
);
CREATE INDEX upload_tags_kv ON upload_tags(key, value);
-- Identity of every run ever uploaded, so that a run sent twice counts once.
CREATE TABLE run_keys (
    key TEXT PRIMARY KEY,
    upload_id BIGINT NOT NULL REFERENCES uploads(id)
);
-- One row per build of a module (its build-id, else its file name), with the totals of
-- every run that loaded it, kept up to date by each upload.
CREATE TABLE modules (
    id BIGSERIAL PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    path TEXT NOT NULL,
    build_id TEXT,
    nfuncs BIGINT NOT NULL,
    runs BIGINT NOT NULL,
    totals BYTEA NOT NULL
);
-- A build's function table, stored once; uploads refer to functions by idx.
CREATE TABLE functions (
    module_id BIGINT NOT NULL REFERENCES modules(id),
    idx BIGINT NOT NULL,
    address BIGINT NOT NULL,
    size BIGINT NOT NULL,
    name TEXT NOT NULL,
    hooked BIGINT NOT NULL,
    reason TEXT NOT NULL,
    -- How uploads find the function: fnscope_analysis::function_key_texts (name and rank,
    -- or the address of an unnamed piece), as report -i matches runs.
    fkey TEXT NOT NULL,
    PRIMARY KEY (module_id, idx)
);
CREATE INDEX functions_name ON functions(name);
CREATE UNIQUE INDEX functions_fkey ON functions(module_id, fkey);
-- Per upload and module: the called functions' figures by idx (see store::encode_counts).
CREATE TABLE run_modules (
    upload_id BIGINT NOT NULL REFERENCES uploads(id),
    module_id BIGINT NOT NULL REFERENCES modules(id),
    counts BYTEA NOT NULL,
    PRIMARY KEY (upload_id, module_id)
);
CREATE INDEX run_modules_module ON run_modules(module_id);
