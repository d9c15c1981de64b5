//! The function list of a Windows PDB file (technique C's symbol file): name, relative
//! address, size and source position of every function, the way `fnscope funcs` lists an
//! ELF file's. Listing only: fnscope hooks Linux programs.

use crate::AnalysisError;
use pdb_addr2line::pdb::{self, FallibleIterator, SymbolData, PDB};
use pdb_addr2line::{ContextPdbData, TypeFormatterFlags};
use std::collections::HashMap;
use std::path::Path;

/// One function of a PDB file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PdbFunction {
    /// Position in the listing, by address.
    pub index: usize,
    /// Name: undecorated, with argument types when the PDB has them.
    pub name: String,
    /// Decorated (mangled) name from the public symbols, when there is one.
    pub raw_name: Option<String>,
    /// Relative virtual address: offset from the image base of the `.exe`/`.dll`.
    pub rva: u32,
    /// Size in bytes, when known (functions known only from public symbols end where the
    /// next one starts, which the PDB does not say for the last one of a section).
    pub size: Option<u32>,
    /// Source file of the function's first instruction, when the PDB has line information.
    pub file: Option<String>,
    /// Line of the function's first instruction.
    pub line: Option<u32>,
}

fn pdb_error(path: &Path, e: impl std::fmt::Display) -> AnalysisError {
    AnalysisError::Pdb {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

/// Lists the functions of the PDB file at `path`, sorted by address.
pub fn pdb_functions(path: &Path) -> Result<Vec<PdbFunction>, AnalysisError> {
    let file = std::fs::File::open(path).map_err(|source| {
        AnalysisError::Format(fnscope_format::FormatError::Io {
            action: "open",
            path: path.to_path_buf(),
            source,
        })
    })?;
    let mut pdb = PDB::open(file).map_err(|e| match e {
        pdb::Error::UnrecognizedFileFormat => pdb_error(
            path,
            "not a PDB file (no MSF 7.0 header); give the .pdb that the Microsoft linker wrote \
             next to the .exe or .dll",
        ),
        e => pdb_error(path, e),
    })?;
    let raw_names = public_names(&mut pdb).map_err(|e| pdb_error(path, e))?;
    let data = ContextPdbData::try_from_pdb(pdb).map_err(|e| pdb_error(path, e))?;
    let ctx = data
        .make_context_with_formatter_flags(TypeFormatterFlags::default())
        .map_err(|e| pdb_error(path, e))?;
    let mut out: Vec<PdbFunction> = ctx
        .functions()
        .map(|f| {
            let frames = ctx.find_frames(f.start_rva).ok().flatten();
            // The last frame is the function itself; earlier ones are inlined callees.
            let own = frames.as_ref().and_then(|fr| fr.frames.last());
            let raw_name = raw_names.get(&f.start_rva).cloned();
            let name = match f.name {
                Some(n) if n.starts_with('?') => undecorate(&n),
                Some(n) => n,
                None => raw_name
                    .as_deref()
                    .map_or_else(|| format!("sub_{:x}", f.start_rva), undecorate),
            };
            PdbFunction {
                index: 0,
                name,
                raw_name,
                rva: f.start_rva,
                size: f.end_rva.map(|e| e.saturating_sub(f.start_rva)),
                file: own.and_then(|fr| fr.file.as_deref().map(str::to_string)),
                line: own.and_then(|fr| fr.line),
            }
        })
        .collect();
    out.sort_by_key(|f| f.rva);
    for (i, f) in out.iter_mut().enumerate() {
        f.index = i;
    }
    Ok(out)
}

/// Decorated names of the public function symbols, by relative address.
fn public_names<'s, S: pdb::Source<'s> + 's>(
    pdb: &mut PDB<'s, S>,
) -> Result<HashMap<u32, String>, pdb::Error> {
    let map = pdb.address_map()?;
    let symbols = pdb.global_symbols()?;
    let mut out = HashMap::new();
    let mut it = symbols.iter();
    while let Some(sym) = it.next()? {
        if let Ok(SymbolData::Public(p)) = sym.parse() {
            if let (true, Some(rva)) = (p.function || p.code, p.offset.to_rva(&map)) {
                out.entry(rva.0)
                    .or_insert_with(|| p.name.to_string().into_owned());
            }
        }
    }
    Ok(out)
}

/// An MSVC decorated name (`?name@@...`) undecorated; other names as they are.
fn undecorate(name: &str) -> String {
    if !name.starts_with('?') {
        return name.to_string();
    }
    msvc_demangler::demangle(name, msvc_demangler::DemangleFlags::llvm())
        .unwrap_or_else(|_| name.to_string())
}
