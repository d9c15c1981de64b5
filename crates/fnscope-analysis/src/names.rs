//! Turning `(image sid, function id)` into one function shared by all images.
//!
//! Forked children keep their parent's image (same sid), and every exec of the same binary
//! gets a new sid with the same functions: both must count as one function. A function is
//! therefore identified by its module path, the module's build-id and its link-time address;
//! code generated at run time (see [`is_generated`]) by its module and name instead, since a
//! runtime reuses the addresses of code it freed for other functions.

use fnscope_format::ImageTable;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Whether a module path names code generated at run time rather than a file: a bracketed
/// name such as `[mono]`, whose addresses are run-time addresses.
pub(crate) fn is_generated(path: &str) -> bool {
    path.starts_with('[') && path.ends_with(']')
}

/// One function as reports show it.
#[derive(Clone, Debug)]
pub(crate) struct FuncInfo {
    pub raw_name: String,
    /// File name of the module.
    pub module: String,
    /// Path of the module, shared by its functions.
    pub path: Arc<str>,
    pub address: u64,
    /// Demangled on first use: most functions of a big program are never called.
    name: Option<String>,
}

/// Module path, build-id, and the address or (generated code) the raw name.
type FuncKey = (String, Option<String>, Result<u64, String>);

#[derive(Default)]
pub(crate) struct Names {
    funcs: Vec<FuncInfo>,
    by_key: HashMap<FuncKey, u32>,
    /// Function index by id, one table per image.
    tables: Vec<Vec<u32>>,
    /// Image sid to its table in `tables`.
    by_sid: HashMap<u32, usize>,
    /// The last image looked up, and its table: records come in segments of one image, so
    /// this saves a hash lookup per call (half of `report`'s time on big traces).
    last: Option<(u32, usize)>,
    unknown: HashMap<(u32, u32), u32>,
    /// Line tables of the modules asked about, loaded on first use (`None`: none found).
    lines: HashMap<Arc<str>, Option<fnscope_symbols::SourceLines>>,
    /// `file:line` of each function asked about, by index.
    sources: Vec<Option<Option<String>>>,
}

impl Names {
    pub fn new<'a>(images: impl IntoIterator<Item = &'a ImageTable>) -> Names {
        let mut n = Names::default();
        for t in images {
            n.add_image(t);
        }
        n
    }

    fn add_image(&mut self, t: &ImageTable) {
        let mut ids = Vec::with_capacity(t.funcs.len());
        let mut paths: HashMap<u32, Arc<str>> = HashMap::new();
        for f in &t.funcs {
            let (path, build_id) = match t.module(f.module) {
                Some(m) => (m.path.clone(), m.build_id.clone()),
                None => (String::from("?"), None),
            };
            let shared = paths.entry(f.module).or_insert_with(|| Arc::from(path.as_str())).clone();
            let module = Path::new(&path)
                .file_name()
                .map_or_else(|| path.clone(), |s| s.to_string_lossy().into_owned());
            let next = self.funcs.len() as u32;
            let at = if is_generated(&path) { Err(f.raw_name.clone()) } else { Ok(f.address) };
            let idx = *self.by_key.entry((path, build_id, at)).or_insert(next);
            if idx == next {
                self.funcs.push(FuncInfo {
                    raw_name: f.raw_name.clone(),
                    module,
                    path: shared,
                    address: f.address,
                    name: None,
                });
            }
            ids.push(idx);
        }
        self.by_sid.insert(t.sid, self.tables.len());
        self.tables.push(ids);
        self.last = None;
    }

    /// The function that records of image `sid` call `id`; ids no table names get a
    /// placeholder of their own, so that they still show up in reports.
    ///
    /// Every call of a trace is named here, one after the other from the same image: that
    /// case is inlined into the caller's loop (a fifth of `report`'s main thread when it was
    /// a call).
    #[inline]
    pub fn index(&mut self, sid: u32, id: u32) -> u32 {
        if let Some((_, t)) = self.last.filter(|&(s, _)| s == sid) {
            if let Some(&i) = self.tables[t].get(id as usize) {
                return i;
            }
        }
        self.index_slow(sid, id)
    }

    #[cold]
    fn index_slow(&mut self, sid: u32, id: u32) -> u32 {
        let table = match self.last {
            Some((s, t)) if s == sid => Some(t),
            _ => {
                let t = self.by_sid.get(&sid).copied();
                if let Some(t) = t {
                    self.last = Some((sid, t));
                }
                t
            }
        };
        if let Some(&i) = table.and_then(|t| self.tables[t].get(id as usize)) {
            return i;
        }
        let next = self.funcs.len() as u32;
        let i = *self.unknown.entry((sid, id)).or_insert(next);
        if i == next {
            let label = format!("<unknown function {id} of image {sid}>");
            self.funcs.push(FuncInfo {
                raw_name: label.clone(),
                module: "?".into(),
                path: Arc::from("?"),
                address: 0,
                name: Some(label),
            });
        }
        i
    }

    pub fn info(&self, idx: u32) -> &FuncInfo {
        &self.funcs[idx as usize]
    }

    /// Where function `idx` is in the sources, `file:line` (or the file alone), from its
    /// module's DWARF or separate debug file when there is one.
    pub fn source(&mut self, idx: u32) -> Option<&str> {
        let i = idx as usize;
        if i >= self.sources.len() {
            self.sources.resize(i + 1, None);
        }
        if self.sources[i].is_none() {
            let f = &self.funcs[i];
            let lines = self
                .lines
                .entry(f.path.clone())
                .or_insert_with(|| fnscope_symbols::SourceLines::load(Path::new(&*f.path)).ok().filter(|l| l.dwarf_file().is_some()));
            let found = lines.as_ref().and_then(|l| l.locate(f.address)).map(|loc| match loc.line {
                Some(n) => format!("{}:{n}", loc.file),
                None => loc.file,
            });
            self.sources[i] = Some(found);
        }
        self.sources[i].as_ref().and_then(|s| s.as_deref())
    }

    /// The demangled name of function `idx`.
    pub fn name(&mut self, idx: u32) -> &str {
        let f = &mut self.funcs[idx as usize];
        f.name
            .get_or_insert_with(|| fnscope_symbols::demangle(&f.raw_name))
    }
}
