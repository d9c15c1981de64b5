//! The agent library embedded in the `fnscope` binary, written out once to a cache folder.

use anyhow::{Context, Result};
use std::path::PathBuf;

static AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libfnscope_agent.so"));

/// Path of the agent library to preload: `FNSCOPE_AGENT` if set (development), else the
/// embedded copy, extracted under `$XDG_CACHE_HOME/fnscope` (or `~/.cache/fnscope`, or the
/// temporary folder) under a name that changes with its contents.
pub fn path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FNSCOPE_AGENT") {
        return Ok(PathBuf::from(p));
    }
    let name = format!("libfnscope_agent-{}.so", env!("FNSCOPE_AGENT_HASH"));
    let mut dirs = Vec::new();
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        dirs.push(PathBuf::from(x).join("fnscope"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cache").join("fnscope"));
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    dirs.push(std::env::temp_dir().join(format!("fnscope-{uid}")));
    let mut last_err = None;
    for d in dirs {
        let p = d.join(&name);
        // What lies there runs inside every traced program (the agent, and the code it
        // keeps next to it): only from a folder nobody else can write.
        if let Err(e) = private_folder(&d, uid) {
            last_err = Some(e);
            continue;
        }
        if std::fs::metadata(&p).map(|m| m.len() == AGENT.len() as u64).unwrap_or(false) {
            return Ok(p);
        }
        match write_atomically(&d, &p) {
            Ok(()) => return Ok(p),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no folder to write the agent to")))
        .context("cannot write the fnscope agent library to a cache folder; set XDG_CACHE_HOME to a folder of yours that no other user may write to")
}

/// Makes `dir` (only for its owner, when it is new) and checks that it belongs to `uid` and
/// that no one else may write into it (its group may, when that is the user's own): a folder
/// in the shared temporary folder may have been made by another user.
fn private_folder(dir: &std::path::Path, uid: u32) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if !dir.is_dir() {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e).with_context(|| format!("creating {}", dir.display())),
            _ => {}
        }
    }
    // A symbolic link is followed: what counts is who owns the folder it leads to.
    let m = std::fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    // Writable by the user's own group is fine (a umask of 002 with a group per user).
    // SAFETY: getgid cannot fail.
    let gid = unsafe { libc::getgid() };
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o002 != 0 || (m.mode() & 0o020 != 0 && m.gid() != gid) {
        anyhow::bail!("{} is not a folder of this user's that only it may write to: not used", dir.display());
    }
    Ok(())
}

fn write_atomically(dir: &std::path::Path, p: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".agent-{}.tmp", std::process::id()));
    std::fs::write(&tmp, AGENT).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, p).with_context(|| format!("renaming to {}", p.display()))?;
    Ok(())
}

/// The folder of the agent's cache of module analyses (see the agent's `plan_cache`): next to
/// the agent library, one per agent build, so that an analysis made by another version is
/// never used. Folders of other builds not used for a day are removed when a new one is made
/// (another fnscope may be using its own at the moment).
pub fn plan_cache_dir(agent: &std::path::Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(agent).ok()?;
    let id = format!("{}-{}-{}", agent.file_name()?.to_string_lossy(), m.len(), m.mtime_nsec() ^ m.mtime());
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let parent = agent.parent()?;
    let dir = parent.join(format!("plans-{hash:016x}"));
    if !dir.is_dir() {
        if let Ok(rd) = std::fs::read_dir(parent) {
            let day = std::time::Duration::from_secs(86_400);
            for e in rd.flatten() {
                let stale = e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|age| age > day));
                if stale && e.file_name().to_string_lossy().starts_with("plans-") {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        std::fs::create_dir_all(&dir).ok()?;
    }
    prune_code_files(&dir, KEPT_CODE_FILES, KEPT_CODE_BYTES);
    Some(dir)
}

/// The agent's copies of big modules' patched code kept in a cache folder (its
/// `code_cache`): at most this many, the newest,
const KEPT_CODE_FILES: usize = 8;
/// and at most this many bytes in all.
const KEPT_CODE_BYTES: u64 = 1 << 30;

/// Removes the oldest code files of `dir` beyond `files` or `bytes`, and temporary ones an
/// hour old (a writer that died). Files in use stay usable: a process maps one whole, and a
/// removed file lives on until it is unmapped.
fn prune_code_files(dir: &std::path::Path, files: usize, bytes: u64) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let hour = std::time::Duration::from_secs(3600);
    let mut kept = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(fnscope_abi::CODE_CACHE_PREFIX) else { continue };
        let Ok(m) = e.metadata() else { continue };
        let Ok(modified) = m.modified() else { continue };
        if rest.contains(".tmp") {
            if modified.elapsed().is_ok_and(|age| age > hour) {
                let _ = std::fs::remove_file(e.path());
            }
            continue;
        }
        kept.push((modified, m.len(), e.path()));
    }
    kept.sort_by_key(|k| std::cmp::Reverse(k.0));
    let mut total = 0;
    for (i, (_, len, path)) in kept.into_iter().enumerate() {
        total += len;
        if i >= files || total > bytes {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{private_folder, prune_code_files};
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, SystemTime};

    #[test]
    fn only_a_folder_no_one_else_may_write_to_is_used() {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let dir = std::env::temp_dir().join(format!("fnscope-private-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let made = dir.join("new");
        private_folder(&made, uid).unwrap();
        assert_eq!(std::fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_folder(&made, uid).is_err(), "a folder others may write to was used");
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o775)).unwrap();
        private_folder(&made, uid).unwrap();
        assert!(private_folder(&made, uid.wrapping_add(1)).is_err(), "another user's folder was used");
        std::os::unix::fs::symlink(&made, dir.join("link")).unwrap();
        private_folder(&dir.join("link"), uid).unwrap();
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o757)).unwrap();
        assert!(private_folder(&dir.join("link"), uid).is_err(), "a link to a folder others may write to was used");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn code_files_beyond_the_newest_few_are_removed() {
        let dir = std::env::temp_dir().join(format!("fnscope-prune-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let now = SystemTime::now();
        let make = |name: &str, len: usize, age_s: u64| {
            let p = dir.join(name);
            std::fs::write(&p, vec![0u8; len]).unwrap();
            std::fs::File::options().write(true).open(&p).unwrap().set_modified(now - Duration::from_secs(age_s)).unwrap();
        };
        for i in 0..5 {
            make(&format!("code-{i}"), 100, 10 * (i + 1));
        }
        make("code-old.tmp1.2", 10, 7200);
        make("code-new.tmp3.4", 10, 5);
        make("0123456789abcdef.plan", 10, 100_000);
        prune_code_files(&dir, 3, 1 << 20);
        let mut left: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["0123456789abcdef.plan", "code-0", "code-1", "code-2", "code-new.tmp3.4"]);
        // The byte limit: the newest that fit.
        prune_code_files(&dir, 3, 250);
        assert!(dir.join("code-1").exists() && !dir.join("code-2").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
