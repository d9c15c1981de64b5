//! fnscope's team server (technique C): runs uploaded from many machines are kept in one
//! database (SQLite or PostgreSQL), and their hot functions, per module, summed and averaged
//! across the chosen runs, are shown on web pages and as JSON under `/api/`.
//!
//! Data path: `fnscope upload` reads a trace with [`fnscope_analysis::Profile::load`] and
//! sends that profile ([`wire::Upload`], zstd-compressed JSON); the server stores each
//! module build's function table once and the upload's per-function figures by function
//! index ([`store`]); pages and API combine the chosen runs with the code of
//! `report -i A -i B` and `merge` and render them with `report_json`, `diff` and `coverage`.

pub mod app;
pub mod pages;
pub mod store;
pub mod wire;

pub use app::{router, serve, AppState};
pub use store::{Selection, Store, StoreError, Stored};
pub use wire::{Upload, WireError, CONTENT_TYPE};

/// Default upload size limit (compressed bytes).
pub const DEFAULT_MAX_UPLOAD: u64 = 64 << 20;
