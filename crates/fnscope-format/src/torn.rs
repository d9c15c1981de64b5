//! [`end_torn_trace`]: a trace file whose writing failed part-way (a full disk) made whole.

use crate::{chunk_head, io_err, EndInfo, FormatError, TraceReader, KIND_END};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Cuts the trace file at `path` after its last whole chunk (a write that failed part-way
/// leaves one cut short) and appends the END chunk that `end` makes from the length it was
/// cut to (by which the writer tells which of its chunks are in), in the room the cut gave
/// back when the file system is full. The trace then reads to its end with its clock
/// calibrated, and the END chunk says what is missing ([`EndInfo::write_error`]). Returns
/// the file's length. When even the END chunk cannot be written, the file is left cut,
/// without it, and the error is returned: it reads as a trace that ended abruptly.
pub fn end_torn_trace(path: &Path, end: impl FnOnce(u64) -> EndInfo) -> Result<u64, FormatError> {
    let mut reader = TraceReader::open(path)?;
    let mut whole = reader.offset();
    loop {
        match reader.next_verbatim().map(|chunk| chunk.is_some()) {
            Ok(true) => whole = reader.offset(),
            Ok(false) => {
                if !reader.truncated() {
                    whole = reader.offset();
                }
                break;
            }
            // Damaged: what follows the last whole chunk goes.
            Err(_) => break,
        }
    }
    drop(reader);
    let file = std::fs::OpenOptions::new().write(true).open(path).map_err(io_err("open", path))?;
    file.set_len(whole).map_err(io_err("cut", path))?;
    // A few hundred bytes of JSON: far below the chunk size limit.
    let payload = serde_json::to_vec(&end(whole)).expect("EndInfo serializes");
    let head = chunk_head(KIND_END, payload.len() as u32, &[&payload]);
    let written = file.write_all_at(&head, whole).and_then(|()| file.write_all_at(&payload, whole + head.len() as u64));
    if let Err(e) = written {
        // No END chunk cut short either.
        let _ = file.set_len(whole);
        return Err(io_err("write", path)(e));
    }
    Ok(whole + (head.len() + payload.len()) as u64)
}
