//! Finding the separate debug file of a stripped ELF file, the way gdb does.

use std::path::{Path, PathBuf};

/// Root of the system's separate debug files.
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// Candidate paths for the debug file, most specific first: by build id, then by the
/// `.gnu_debuglink` name next to the file, in its `.debug/` folder, and under
/// `/usr/lib/debug/<folder>/`.
pub(crate) fn candidates(
    path: &Path,
    build_id: Option<&[u8]>,
    debuglink: Option<&[u8]>,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(id) = build_id {
        if id.len() >= 2 {
            let hex = to_hex(id);
            out.push(
                Path::new(DEBUG_ROOT)
                    .join(".build-id")
                    .join(&hex[..2])
                    .join(format!("{}.debug", &hex[2..])),
            );
        }
    }
    if let Some(link) = debuglink {
        if let Ok(name) = std::str::from_utf8(link) {
            // A name with a slash could point anywhere; gdb only accepts plain file names.
            if !name.is_empty() && !name.contains('/') {
                // The link is relative to the real file, not to a symlink pointing at it.
                let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
                if let Some(dir) = real.parent() {
                    out.push(dir.join(name));
                    out.push(dir.join(".debug").join(name));
                    let rel = dir.strip_prefix("/").unwrap_or(dir);
                    out.push(Path::new(DEBUG_ROOT).join(rel).join(name));
                }
            }
        }
    }
    out.retain(|p| p.as_path() != path);
    out
}

/// Lower-case hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The CRC-32 of a whole file, as `.gnu_debuglink` records it (the common IEEE polynomial,
/// as zlib's crc32), read in pieces.
pub(crate) fn crc32_of_file(path: &Path) -> std::io::Result<u32> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hasher.finalize());
        }
        hasher.update(&buf[..n]);
    }
}
