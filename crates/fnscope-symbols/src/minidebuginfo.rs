//! MiniDebugInfo: the xz-compressed ELF file that `.gnu_debugdata` holds.

use std::io::{self, Write};

/// Cap on the decompressed size. Real MiniDebugInfo holds a symbol table of a few MB at most;
/// the cap keeps a hostile file from filling memory.
const MAX_DECOMPRESSED: usize = 64 << 20;

/// A `Vec` that refuses to grow past [`MAX_DECOMPRESSED`].
struct Capped(Vec<u8>);

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.len() + buf.len() > MAX_DECOMPRESSED {
            return Err(io::Error::other("MiniDebugInfo larger than the cap"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The decompressed contents, or `None` if they are not valid xz (or too large).
pub(crate) fn decompress(xz: &[u8]) -> Option<Vec<u8>> {
    let mut out = Capped(Vec::new());
    lzma_rs::xz_decompress(&mut &xz[..], &mut out).ok()?;
    Some(out.0)
}
