//! A big module's code as patched in a copy (see `hook::write_in_copy`), kept between runs
//! so that a later start-up maps it instead of making it again.
//!
//! Making the copy costs the kernel a fresh 2 MiB page each 2 MiB of code and the agent a
//! copy of every byte: about 13 of the 20 ms a warm `cc1` start-up spent hooking, on a
//! virtual machine where fresh memory is dear. A later start-up whose copy would be the same
//! bytes maps the file that holds them (its pages are the page cache's, shared by every
//! process running that code) and puts it in the mapping's place.
//!
//! The copy is the module's code as the process has it before the jumps, plus the jumps: a
//! file is named by a hash of everything those bytes come from, so that a file is only ever
//! used where its bytes are the ones the copy would hold:
//! - the module file's version (path, device, inode, size, modification time) and the
//!   mapping's place in it (file offset, length, protection): what the loader mapped;
//! - every jump this agent wrote into that mapping before (the unwinder's pre-hooks), and
//!   every jump of the copy, each with its offset in the mapping and its bytes (a jump's
//!   bytes depend on where its trampoline lies, which `hook::alloc_near` keeps at the same
//!   distance from the module from run to run where it can);
//! - not a module with text relocations (its code depends on where it was loaded): the
//!   caller does not ask.
//!
//! Files live in the analysis cache's folder (one per agent build), are written once under a
//! temporary name of their own and renamed, and never change after (a process may be running
//! the code in one); each ends with a checksum of the code, checked before it is first used
//! and again whenever the file was written since (see `checked_mark`): a damaged file is
//! removed and the copy made again. The recorder keeps the folder's few newest
//! (see the CLI's `agent_lib`).

use std::path::{Path, PathBuf};

/// The file that would hold the copy of the mapping at file offset `offset` of `module`
/// (`len` bytes, protection `prot`) with `earlier` jumps already written into it and
/// `patches` to write (offsets in the mapping, bytes), in the order they are written; `None`
/// when nothing is cached.
pub fn file_for<'a>(module: &Path, offset: u64, len: usize, prot: u32, earlier: &[(u64, Vec<u8>)], patches: impl Iterator<Item = (u64, &'a [u8])>) -> Option<PathBuf> {
    let dir = crate::plan_cache::dir()?;
    let stamp = crate::sys::file_stamp(module)?;
    let mut key = Vec::with_capacity(1 << 16);
    key.extend_from_slice(b"FNSCODE1");
    key.extend_from_slice(module.as_os_str().as_encoded_bytes());
    key.push(0);
    for w in stamp.into_iter().chain([offset, len as u64, u64::from(prot), earlier.len() as u64]) {
        key.extend_from_slice(&w.to_le_bytes());
    }
    let put = |key: &mut Vec<u8>, at: u64, bytes: &[u8]| {
        key.extend_from_slice(&at.to_le_bytes());
        key.push(bytes.len() as u8);
        key.extend_from_slice(bytes);
    };
    for (at, bytes) in earlier {
        put(&mut key, *at, bytes);
    }
    key.push(0xff);
    for (at, bytes) in patches {
        put(&mut key, at, bytes);
    }
    // 128 bits: the checksum of the key, and of the key under another first word (FNV, a
    // byte at a time, took a millisecond over the 600 KB of a big module's key).
    let first = crate::plan_cache::checksum(&key);
    key[..8].copy_from_slice(b"FNSCODE2");
    let second = crate::plan_cache::checksum(&key);
    Some(dir.join(format!("{}{first:016x}{second:016x}", fnscope_abi::CODE_CACHE_PREFIX)))
}

/// Maps `file`'s code (`len` bytes, read only) where the kernel likes, once its checksum
/// matches (or matched before: [`checked_mark`]); `None` when there is no such file or it is
/// damaged (then it is removed).
pub fn map(file: &Path, len: usize) -> Option<u64> {
    let (addr, tail, version) = crate::sys::map_prefix(file, len).ok()?;
    let mark = checked_mark(tail);
    if version.mtime_nsec != mark {
        // SAFETY: `[addr, addr + len)` is the private read-only mapping just made, of a file
        // that never changes once in place (see the module's documentation).
        let code = unsafe { core::slice::from_raw_parts(addr as *const u8, len) };
        if crate::plan_cache::checksum(code) != u64::from_le_bytes(tail) {
            crate::sys::munmap(addr as *mut u8, len);
            crate::sys::unlink(file);
            return None;
        }
        crate::sys::set_mtime_nsec(file, &version, mark);
    }
    Some(addr)
}

/// The nanoseconds of the modification time of a code file whose checksum (its last word,
/// `sum`) was found to match. Summing a big module's copy read all of its pages (about 20 MiB
/// for `cc1`, a fifth of a warm start-up) where the program uses few; a file is checked once,
/// then marked. Any write to the file sets its modification time anew, with nanoseconds that
/// are this mark once in a billion times, so a file changed since is checked again. Never 0,
/// which a file system without nanoseconds keeps: there every start-up checks.
fn checked_mark(sum: [u8; 8]) -> i64 {
    1 + (u64::from_le_bytes(sum) % 999_999_998) as i64
}

/// Keeps `code`, a finished copy, as `file` (best effort: a cache that cannot be written
/// costs the next start-up the copy, nothing more). The file is marked checked
/// ([`checked_mark`]): its bytes are those just summed.
pub fn store(file: &Path, code: &[u8]) {
    let tmp = file.with_extension(format!("tmp{}.{}", crate::sys::getpid(), crate::sys::gettid()));
    let sum = crate::plan_cache::checksum(code).to_le_bytes();
    match crate::sys::write_new_file_parts(&tmp, &[code, &sum]) {
        Ok(()) => {
            if let Ok(version) = crate::sys::file_version(&tmp) {
                crate::sys::set_mtime_nsec(&tmp, &version, checked_mark(sum));
            }
            if crate::sys::rename(&tmp, file).is_err() {
                crate::sys::unlink(&tmp);
            }
        }
        // Another writer's (same ids in another pid namespace): left alone.
        Err(crate::sys::Errno::EXISTS) => {}
        Err(_) => crate::sys::unlink(&tmp),
    }
}
