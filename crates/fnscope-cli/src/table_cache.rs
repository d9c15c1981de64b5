//! The recorder's cache of compressed image table bodies ([`fnscope_format::FrameStore`]):
//! `tables/` next to the extracted agent (`~/.cache/fnscope/tables/`). A program's table body
//! is the same each run; for a big one, compressing it is the longest thing the recorder
//! does for that program (15 ms for `cc1plus`'s 2.9 MiB), and the program may have ended
//! before it is done.
//!
//! One file per body, named by the body's 128-bit xxh3 hash: a body can only find its own
//! frame, so nothing ever makes an entry stale. Each file holds a magic, the body's length
//! and the frame's hash, then the frame; a file that does not check out is removed and the
//! body compressed again. Files are written under a temporary name and renamed, so readers
//! never see half a file. The folder is kept under [`MAX_BYTES`], oldest used first out
//! (reading a file marks it used). `record --no-cache` neither reads nor writes it;
//! `rm -rf ~/.cache/fnscope/tables` clears it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;
use twox_hash::XxHash3_128;

/// Smaller bodies compress in well under a millisecond: not worth a file.
const MIN_BODY: usize = 256 << 10;
/// Bound on the folder's size.
const MAX_BYTES: u64 = 64 << 20;
const MAGIC: &[u8; 8] = b"FNSTBL1\0";
const HEAD: usize = 8 + 8 + 16;

/// The cache folder (see the module's documentation).
pub struct TableCache {
    dir: PathBuf,
}

impl TableCache {
    /// The cache next to the agent library at `agent`, if its folder can be made.
    pub fn next_to(agent: &Path) -> Option<TableCache> {
        let dir = agent.parent()?.join("tables");
        std::fs::create_dir_all(&dir).ok()?;
        Some(TableCache { dir })
    }

    fn file(&self, body: &[u8]) -> PathBuf {
        self.dir.join(format!("{:032x}.zst", XxHash3_128::oneshot(body)))
    }

    /// Removes the files used longest ago until the folder holds at most [`MAX_BYTES`].
    fn trim(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= MAX_BYTES {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

impl fnscope_format::FrameStore for TableCache {
    fn get(&self, body: &[u8]) -> Option<Vec<u8>> {
        if body.len() < MIN_BODY {
            return None;
        }
        let path = self.file(body);
        let mut bytes = std::fs::read(&path).ok()?;
        let sound = bytes.len() > HEAD
            && bytes[..8] == *MAGIC
            && bytes[8..16] == (body.len() as u64).to_le_bytes()
            && bytes[16..HEAD] == XxHash3_128::oneshot(&bytes[HEAD..]).to_le_bytes();
        if !sound {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        // Used now: `trim` removes the files used longest ago first.
        let _ = std::fs::File::options().write(true).open(&path).and_then(|f| f.set_modified(SystemTime::now()));
        bytes.drain(..HEAD);
        Some(bytes)
    }

    fn put(&self, body: &[u8], frame: &[u8]) {
        static N: AtomicU32 = AtomicU32::new(0);
        if body.len() < MIN_BODY {
            return;
        }
        let mut bytes = Vec::with_capacity(HEAD + frame.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&XxHash3_128::oneshot(frame).to_le_bytes());
        bytes.extend_from_slice(frame);
        let tmp = self.dir.join(format!(".{}.{}.tmp", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        if std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, self.file(body))).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        self.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fnscope_format::FrameStore;

    fn body(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    /// A kept frame comes back for its body only; a damaged file is refused and removed;
    /// small bodies are not kept; the folder stays under its bound, the file used longest
    /// ago going first.
    #[test]
    fn frames_come_back_whole_for_their_body_only() {
        let root = std::env::temp_dir().join(format!("fnscope-table-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cache = TableCache::next_to(&root.join("agent.so")).unwrap();
        let (a, b) = (body(1, MIN_BODY), body(2, MIN_BODY));
        let frame = zstd::bulk::compress(&a, 1).unwrap();
        assert_eq!(cache.get(&a), None);
        cache.put(&a, &frame);
        assert_eq!(cache.get(&a), Some(frame.clone()));
        assert_eq!(cache.get(&b), None, "another body");

        let small = body(3, MIN_BODY - 1);
        cache.put(&small, &frame);
        assert_eq!(cache.get(&small), None, "small bodies are compressed each time");

        let path = cache.file(&a);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get(&a), None, "damaged frame");
        assert!(!path.exists(), "a damaged file is removed");

        // Four of these pass the bound by their headers: the one used longest ago goes.
        let big = vec![0u8; (MAX_BYTES / 4) as usize];
        let bodies: Vec<Vec<u8>> = (10..14).map(|s| body(s, MIN_BODY)).collect();
        cache.put(&bodies[0], &big);
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.put(&bodies[1], &big);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(cache.get(&bodies[0]).is_some());
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.put(&bodies[2], &big);
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.put(&bodies[3], &big);
        let kept: Vec<bool> = bodies.iter().map(|b| cache.file(b).exists()).collect();
        assert_eq!(kept, [true, false, true, true], "the one used longest ago went");
        let total: u64 = std::fs::read_dir(&cache.dir).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum();
        assert!(total <= MAX_BYTES, "{total}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
