//! The recorder's cache of compressed image table bodies ([`fnscope_format::FrameStore`]):
//! `tables/` next to the extracted agent (`~/.cache/fnscope/tables/`). A program's table body
//! is the same each run; for a big one, compressing it is the longest thing the recorder
//! does for that program (15 ms for `cc1plus`'s 2.9 MiB), and the program may have ended
//! before it is done.
//!
//! One file per body, named by the body's 128-bit xxh3 hash, so nothing ever makes an entry
//! stale. Each file holds a magic, the body's length and hash, and the frame's hash, then the
//! frame; a file that does not check out (another body's, cut short, damaged) is removed and
//! the body compressed again (one of another version, by its magic, is left to that version). Files are written under a temporary name of their own (created
//! exclusively) and renamed, so readers never see half a file. Only bodies that are the same
//! each run are kept: a body with a `module` line (a library loaded later, at an address of
//! that run, or a JIT's code, which grows) is not. The folder (`tables/` next to the
//! agent library: `$XDG_CACHE_HOME/fnscope`, `~/.cache/fnscope` or the temporary folder) is
//! kept under [`MAX_BYTES`], oldest used first out (reading a file marks it used). `record
//! --no-cache` neither reads nor writes it; removing the folder clears it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;
use twox_hash::XxHash3_128;

/// Smaller bodies compress in well under a millisecond: not worth a file.
const MIN_BODY: usize = 256 << 10;
/// Bound on the folder's size.
const MAX_BYTES: u64 = 64 << 20;
const MAGIC: &[u8; 8] = b"FNSTBL2\0";
/// Magic, body length, body hash, frame hash.
const HEAD: usize = 8 + 8 + 16 + 16;

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

    fn file(&self, hash: u128) -> PathBuf {
        self.dir.join(format!("{hash:032x}.zst"))
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
        let hash = XxHash3_128::oneshot(body);
        let path = self.file(hash);
        let mut bytes = std::fs::read(&path).ok()?;
        // Another version's file is that version's to use, not to remove.
        if !bytes.starts_with(MAGIC) {
            return None;
        }
        let sound = bytes.len() > HEAD
            && bytes[8..16] == (body.len() as u64).to_le_bytes()
            && bytes[16..32] == hash.to_le_bytes()
            && bytes[32..HEAD] == XxHash3_128::oneshot(&bytes[HEAD..]).to_le_bytes();
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
        if body.len() < MIN_BODY || !same_each_run(body) {
            return;
        }
        let hash = XxHash3_128::oneshot(body);
        let mut bytes = Vec::with_capacity(HEAD + frame.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&hash.to_le_bytes());
        bytes.extend_from_slice(&XxHash3_128::oneshot(frame).to_le_bytes());
        bytes.extend_from_slice(frame);
        // A name no other writer uses, on this host or another sharing the folder.
        let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let tmp = self.dir.join(format!(".{}.{}.{stamp:x}.tmp", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        // A name taken already is another writer's file: not ours to remove.
        let Ok(mut f) = std::fs::File::options().write(true).create_new(true).open(&tmp) else { return };
        if std::io::Write::write_all(&mut f, &bytes).and_then(|()| std::fs::rename(&tmp, self.file(hash))).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        self.trim();
    }
}

/// Whether a table body is the same in every run of its program: it has no `module` line
/// (the head holds the modules of start-up; one in the body is a library loaded later, at an
/// address of that run, or a JIT's code, whose methods are added as they are compiled).
fn same_each_run(body: &[u8]) -> bool {
    const LINE: &[u8] = b"module\t";
    !(body.starts_with(LINE) || body.windows(LINE.len() + 1).any(|w| w[0] == b'\n' && w[1..] == *LINE))
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
        assert!(!cache.file(XxHash3_128::oneshot(&small)).exists(), "small bodies are compressed each time");
        let mut loaded_later = body(4, MIN_BODY);
        loaded_later.extend_from_slice(b"\nmodule\t1\t7f0000000000\t-\t/lib/libz.so\n");
        let mut jit = b"module\t1\t0\t-\t[jit]\n".to_vec();
        jit.extend_from_slice(&body(5, MIN_BODY));
        for (b, why) in [(&loaded_later, "a module line"), (&jit, "a module line first")] {
            cache.put(b, &frame);
            assert!(!cache.file(XxHash3_128::oneshot(b)).exists(), "a body with {why} is not kept");
        }
        // A file of another version is left alone.
        let other = cache.file(XxHash3_128::oneshot(&b));
        std::fs::write(&other, b"FNSTBL9\0whatever").unwrap();
        assert_eq!(cache.get(&b), None);
        assert!(other.exists(), "another version's file stays");
        std::fs::remove_file(&other).unwrap();

        // Another body's file under this body's name (a clash of temporary names between
        // hosts sharing the folder) is refused: the body's hash is in the file.
        let path = cache.file(XxHash3_128::oneshot(&a));
        std::fs::copy(cache.file(XxHash3_128::oneshot(&a)), cache.dir.join("saved")).unwrap();
        cache.put(&b, &frame);
        std::fs::rename(cache.file(XxHash3_128::oneshot(&b)), &path).unwrap();
        assert_eq!(cache.get(&a), None, "another body's file");
        assert!(!path.exists(), "a file that does not check out is removed");
        std::fs::rename(cache.dir.join("saved"), &path).unwrap();
        assert_eq!(cache.get(&a), Some(frame.clone()));

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
        let kept: Vec<bool> = bodies.iter().map(|b| cache.file(XxHash3_128::oneshot(b)).exists()).collect();
        assert_eq!(kept, [true, false, true, true], "the one used longest ago went");
        let total: u64 = std::fs::read_dir(&cache.dir).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum();
        assert!(total <= MAX_BYTES, "{total}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
