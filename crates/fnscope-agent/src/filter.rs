//! Record-time filters (`record --filter`, `--exclude`, `--app-only`), decided when a module
//! is hooked: a function or module left out is never patched, so it costs nothing.

use std::path::Path;

/// Folders whose modules `--app-only` treats as system code, unless the user gives others.
pub const DEFAULT_SYSTEM_DIRS: &str = "/usr/lib:/lib:/lib64:/usr/lib64:/usr/libexec:/usr/local/lib:/opt/mono";

/// Function patterns of one option: globs on the raw or demangled name, `@GLOB` on the
/// module (its file name or whole path), `file:GLOB` on the source file (file name or path).
#[derive(Default)]
struct Patterns {
    names: Vec<glob::Pattern>,
    modules: Vec<glob::Pattern>,
    files: Vec<glob::Pattern>,
}

impl Patterns {
    /// Parses one pattern per line; the recorder checked them, so a bad one is an error of
    /// the environment, reported as such.
    fn parse(text: &str) -> Result<Patterns, String> {
        let mut p = Patterns::default();
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (list, glob) = if let Some(m) = line.strip_prefix('@') {
                (&mut p.modules, m)
            } else if let Some(f) = line.strip_prefix("file:") {
                (&mut p.files, f)
            } else {
                (&mut p.names, line)
            };
            list.push(glob::Pattern::new(glob).map_err(|e| format!("bad pattern {line:?}: {e}"))?);
        }
        Ok(p)
    }

    fn is_empty(&self) -> bool {
        self.names.is_empty() && self.modules.is_empty() && self.files.is_empty()
    }
}

/// Whether a path (or its file name) matches one of `globs`.
fn path_matches(globs: &[glob::Pattern], path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    globs.iter().any(|g| g.matches(name) || g.matches(path))
}

/// The record-time filters of this process.
pub struct Filters {
    include: Patterns,
    exclude: Patterns,
    /// `--app-only`: folders whose modules are system code (prefixes ending in `/`).
    system_dirs: Option<Vec<String>>,
}

impl Filters {
    /// Filters from the recorder's settings: pattern lists (one per line), and for
    /// `--app-only` the system folders separated by `:` (empty for the defaults).
    pub fn new(filter: &str, exclude: &str, app_only: bool, system_dirs: &str) -> Result<Filters, String> {
        let dirs = if system_dirs.is_empty() { DEFAULT_SYSTEM_DIRS } else { system_dirs };
        let system_dirs = app_only.then(|| {
            dirs.split(':').filter(|d| !d.is_empty()).map(|d| format!("{}/", d.trim_end_matches('/'))).collect()
        });
        Ok(Filters { include: Patterns::parse(filter)?, exclude: Patterns::parse(exclude)?, system_dirs })
    }

    /// Whether `--app-only` was asked for.
    pub fn app_only(&self) -> bool {
        self.system_dirs.is_some()
    }

    /// Under `--app-only`, whether the module at `path` is system code (not to be hooked).
    /// The dynamic linker and the vDSO are never hooked anyway.
    pub fn is_system(&self, path: &Path) -> bool {
        let Some(dirs) = &self.system_dirs else { return false };
        let s = path.to_string_lossy();
        dirs.iter().any(|d| s.starts_with(d.as_str()))
    }

    /// The filters as they apply to the functions of the module at `path`. Source lines are
    /// read only when a `file:` pattern asks for them.
    pub fn for_module(&self, path: &Path) -> ModuleFilter<'_> {
        let s = path.to_string_lossy();
        let wants_lines = !self.include.files.is_empty() || !self.exclude.files.is_empty();
        ModuleFilter {
            filters: self,
            include_module: path_matches(&self.include.modules, &s),
            exclude_module: path_matches(&self.exclude.modules, &s),
            lines: if wants_lines { fnscope_symbols::SourceLines::load(path).ok() } else { None },
        }
    }
}

/// The filters for one module.
pub struct ModuleFilter<'a> {
    filters: &'a Filters,
    include_module: bool,
    exclude_module: bool,
    lines: Option<fnscope_symbols::SourceLines>,
}

impl ModuleFilter<'_> {
    /// Whether nothing in this module is filtered out by name or file, whatever its functions.
    pub fn keeps_all(&self) -> bool {
        (self.filters.include.is_empty() || self.include_module) && self.filters.exclude.is_empty()
    }

    /// Whether the function named `name` (raw; `None` for none) at link-time `address` is to
    /// be hooked: it matches `--filter` (when given) and does not match `--exclude`.
    pub fn keeps(&self, name: Option<&str>, address: u64) -> bool {
        let inc = &self.filters.include;
        let exc = &self.filters.exclude;
        let mut display = None;
        let mut file = None;
        let mut hit = |p: &Patterns, module_hit: bool| {
            if module_hit {
                return true;
            }
            if !p.names.is_empty() {
                let raw = name.unwrap_or("");
                let shown = display.get_or_insert_with(|| fnscope_symbols::display_name(name, address));
                if p.names.iter().any(|g| g.matches(raw) || g.matches(shown)) {
                    return true;
                }
            }
            if !p.files.is_empty() {
                let src = file.get_or_insert_with(|| {
                    self.lines.as_ref().and_then(|l| l.locate(address)).map(|loc| loc.file).unwrap_or_default()
                });
                if !src.is_empty() && path_matches(&p.files, src) {
                    return true;
                }
            }
            false
        };
        (inc.is_empty() || hit(inc, self.include_module)) && !(hit(exc, self.exclude_module))
    }
}
