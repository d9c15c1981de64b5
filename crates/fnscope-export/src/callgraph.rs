//! Placeholder of the base branch: replaced by the real writer before this crate lands.

use crate::{ExportError, Options, Output, Progress};
use std::path::Path;

pub(crate) fn write(_input: &Path, _opts: &Options, _out: &Output, _progress: Progress<'_>) -> Result<Vec<String>, ExportError> {
    Err(ExportError::Unsupported("call graphs are not written yet".into()))
}
