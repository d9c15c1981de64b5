//! What `fnscope upload` sends: the per-function profile of one recorded or merged trace,
//! computed on the client by [`fnscope_analysis::Profile::load`] (the code `report` and
//! `merge` use), as JSON compressed with zstd. The zstd frame carries a checksum of its
//! content, so a body damaged on the way is refused, not stored with a changed figure.
//!
//! The server never sees the trace itself: a profile is a few bytes per function of the
//! program, a trace can be gigabytes of calls.

use fnscope_analysis::Profile;
use fnscope_format::{ModuleSummary, RunInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;

/// The `Content-Type` of an upload body.
pub const CONTENT_TYPE: &str = "application/vnd.fnscope.profile+zstd";

/// Version of [`Upload`]'s layout; the server refuses others.
pub const VERSION: u32 = 1;

/// Decompressed uploads may be this many times larger than the compressed limit: profiles
/// compress about tenfold, and a bound keeps a crafted body from filling the server's memory.
const INFLATE_FACTOR: u64 = 64;

/// One upload: the profile of a trace and what the uploader says about it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Upload {
    /// Layout version, [`VERSION`].
    pub version: u32,
    /// Who uploaded (the client's user name).
    pub user: String,
    /// `KEY=VALUE` tags given with `--tag`: tester, device, build, task...
    pub tags: BTreeMap<String, String>,
    /// The runs the profile is made of: one for a recorded trace, several for a merged one.
    pub runs: Vec<RunInfo>,
    /// Per module, every function with its totals over `runs`.
    pub modules: Vec<ModuleSummary>,
    /// Whether the runs recorded times (time mode); count-mode runs give calls only.
    pub timed: bool,
}

/// Why an upload body cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The zstd stream is damaged or ends early.
    #[error("the upload is not a complete zstd stream ({0}): it was truncated or damaged")]
    Compression(std::io::Error),
    /// The body inflates beyond the bound.
    #[error("the upload inflates to more than {0} bytes")]
    TooLarge(u64),
    /// The JSON inside does not describe a profile.
    #[error("the upload is not a fnscope profile: {0}")]
    Json(#[from] serde_json::Error),
    /// Another layout version.
    #[error("upload format version {0} is not supported (this server reads version {VERSION})")]
    Version(u32),
    /// Nothing in it.
    #[error("the upload lists no run")]
    NoRun,
    /// The zstd frame has no content checksum, so damage could not be told.
    #[error("the upload carries no content checksum: send it with this version of `fnscope upload`")]
    NoChecksum,
}

/// zstd's frame magic number, little-endian.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Whether `body` starts a zstd frame whose header says no content checksum follows it
/// (bit 2 of the frame header descriptor, RFC 8878 section 3.1.1.1.1.5).
fn lacks_checksum(body: &[u8]) -> bool {
    body.starts_with(&ZSTD_MAGIC) && body.get(4).is_some_and(|d| d & 0b100 == 0)
}

/// `data` compressed as one zstd frame with a content checksum, as upload bodies are.
pub fn compress(data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3)?;
    e.include_checksum(true)?;
    e.write_all(data)?;
    e.finish()
}

impl Upload {
    /// The upload of a profile that [`Profile::load`] read.
    pub fn from_profile(p: Profile, user: String, tags: BTreeMap<String, String>) -> Upload {
        Upload {
            version: VERSION,
            user,
            tags,
            timed: p.timed(),
            runs: p.runs,
            modules: p.modules,
        }
    }

    /// The body to send: JSON, zstd-compressed with a content checksum.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let json = serde_json::to_vec(self)?;
        compress(&json).map_err(WireError::Compression)
    }

    /// Reads a body, refusing anything incomplete; `limit` is the server's bound on
    /// compressed bodies.
    pub fn decode(body: &[u8], limit: u64) -> Result<Upload, WireError> {
        if lacks_checksum(body) {
            return Err(WireError::NoChecksum);
        }
        let bound = limit.saturating_mul(INFLATE_FACTOR);
        let mut json = Vec::new();
        zstd::stream::read::Decoder::new(body)
            .map_err(WireError::Compression)?
            .take(bound.saturating_add(1))
            .read_to_end(&mut json)
            .map_err(WireError::Compression)?;
        if json.len() as u64 > bound {
            return Err(WireError::TooLarge(bound));
        }
        let u: Upload = serde_json::from_slice(&json)?;
        if u.version != VERSION {
            return Err(WireError::Version(u.version));
        }
        if u.runs.is_empty() {
            return Err(WireError::NoRun);
        }
        Ok(u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload() -> Upload {
        Upload {
            version: VERSION,
            user: "u".into(),
            runs: vec![RunInfo {
                host: "h".into(),
                mode: "count".into(),
                ..RunInfo::default()
            }],
            modules: vec![ModuleSummary {
                path: "/bin/x".into(),
                ..ModuleSummary::default()
            }],
            ..Upload::default()
        }
    }

    #[test]
    fn bodies_round_trip_and_bad_ones_are_refused() {
        let body = upload().encode().unwrap();
        assert_eq!(Upload::decode(&body, 1 << 20).unwrap(), upload());
        assert!(matches!(
            Upload::decode(&body[..body.len() - 3], 1 << 20),
            Err(WireError::Compression(_))
        ));
        assert!(matches!(
            Upload::decode(b"{}", 1 << 20),
            Err(WireError::Compression(_))
        ));
        let mut v2 = upload();
        v2.version = 2;
        assert!(matches!(
            Upload::decode(&v2.encode().unwrap(), 1 << 20),
            Err(WireError::Version(2))
        ));
        let mut empty = upload();
        empty.runs.clear();
        assert!(matches!(
            Upload::decode(&empty.encode().unwrap(), 1 << 20),
            Err(WireError::NoRun)
        ));
        let zeros = compress(&vec![b' '; 10_000]).unwrap();
        assert!(matches!(
            Upload::decode(&zeros, 100),
            Err(WireError::TooLarge(6400))
        ));
    }

    #[test]
    fn a_flipped_byte_never_changes_what_is_read() {
        let body = upload().encode().unwrap();
        assert!(body.starts_with(&ZSTD_MAGIC) && !lacks_checksum(&body));
        // The frame header is outside the checksum, so damage there may be refused or
        // harmless (a larger window, say); it must never change the content.
        for i in 0..body.len() {
            for bit in 0..8 {
                let mut bad = body.clone();
                bad[i] ^= 1 << bit;
                if let Ok(u) = Upload::decode(&bad, 1 << 20) {
                    assert_eq!(u, upload(), "byte {i} bit {bit} flipped changed the upload");
                }
            }
        }
        let json = serde_json::to_vec(&upload()).unwrap();
        assert!(matches!(
            Upload::decode(&zstd::encode_all(&json[..], 3).unwrap(), 1 << 20),
            Err(WireError::NoChecksum)
        ));
    }
}
