//! Source file and line of code addresses, from the DWARF of an ELF file or of its separate
//! debug file (found by build id or `.gnu_debuglink`, as for names).
//!
//! A function's position is where its DWARF subprogram says it is declared
//! (`DW_AT_decl_file`/`DW_AT_decl_line`): the line table at an optimised function's first
//! instruction often points into its body. Code without a subprogram entry (assembly) falls
//! back to the line table.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gimli::{EndianArcSlice, Reader as _, RunTimeEndian, SectionId};
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection};

use crate::{check_header, open_debug_file, SymbolError};

pub(crate) type Reader = EndianArcSlice<RunTimeEndian>;

/// The DWARF of an ELF file, from the file itself or from its separate debug file.
pub(crate) struct FoundDwarf {
    /// The GNU build-id of the ELF file (not of the debug file).
    pub(crate) build_id: Option<Vec<u8>>,
    /// The file the DWARF was read from, and its sections; `None` when neither the file nor
    /// a debug file of its own has line tables.
    pub(crate) dwarf: Option<(PathBuf, gimli::Dwarf<Reader>)>,
}

/// Loads the DWARF of the ELF file at `path`: its own, else its separate debug file's (found
/// by build id or `.gnu_debuglink`, as for names). Errors only when `path` cannot be read or
/// is not x86-64 ELF.
pub(crate) fn load_dwarf(path: &Path) -> Result<FoundDwarf, SymbolError> {
    let file = std::fs::File::open(path).map_err(|source| SymbolError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // SAFETY: private read-only mapping; see `open_debug_file` for files changed meanwhile.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| SymbolError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    check_header(path, &map)?;
    let elf = ElfFile64::<Endianness>::parse(&map[..]).map_err(|e| SymbolError::Parse {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    let build_id = elf.build_id().ok().flatten();
    let dwarf = match dwarf_sections(&elf) {
        Some(d) => Some((path.to_path_buf(), d)),
        None => {
            let link = elf.gnu_debuglink().ok().flatten();
            open_debug_file(path, build_id, link).and_then(|(dpath, dmap)| {
                let delf = ElfFile64::<Endianness>::parse(&dmap[..]).ok()?;
                Some((dpath, dwarf_sections(&delf)?))
            })
        }
    };
    Ok(FoundDwarf {
        build_id: build_id.map(<[u8]>::to_vec),
        dwarf,
    })
}

/// Where a piece of code comes from in the sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLocation {
    /// Path of the source file, as the compiler saw it (joined with the compilation
    /// directory when it was relative).
    pub file: String,
    /// 1-based line number, when the line table gives one.
    pub line: Option<u32>,
}

/// The line tables of one ELF file, if it (or its separate debug file) has any.
pub struct SourceLines {
    ctx: Option<addr2line::Context<Reader>>,
    /// Start address of each subprogram (each range of one in pieces) to its declaration:
    /// an index into `files` and a line.
    decls: HashMap<u64, (u32, u32)>,
    files: Vec<String>,
    dwarf_file: Option<PathBuf>,
    build_id: Option<Vec<u8>>,
}

impl std::fmt::Debug for SourceLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceLines")
            .field("dwarf_file", &self.dwarf_file)
            .field("build_id", &self.build_id)
            .finish_non_exhaustive()
    }
}

impl SourceLines {
    /// Loads the line tables of the ELF file at `path`: from its own DWARF, else from its
    /// separate debug file. A file without line tables (stripped, no debug symbols
    /// installed) is not an error: [`SourceLines::dwarf_file`] is then `None` and lookups
    /// find nothing. Errors only when `path` cannot be read or is not x86-64 ELF.
    pub fn load(path: &Path) -> Result<SourceLines, SymbolError> {
        let found = load_dwarf(path)?;
        let mut lines = SourceLines {
            ctx: None,
            decls: HashMap::new(),
            files: Vec::new(),
            dwarf_file: None,
            build_id: found.build_id,
        };
        if let Some((file, dwarf)) = found.dwarf {
            if lines.read_dwarf(dwarf) {
                lines.dwarf_file = Some(file);
            }
        }
        Ok(lines)
    }

    /// Indexes the subprograms of `dwarf` and keeps its line tables; false if they do not
    /// load.
    fn read_dwarf(&mut self, dwarf: gimli::Dwarf<Reader>) -> bool {
        let mut files: HashMap<String, u32> = HashMap::new();
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            // A unit that does not parse loses its functions' positions, not the others'.
            if let Ok(unit) = dwarf.unit(header) {
                index_unit(&dwarf, &unit, &mut self.decls, &mut files, &mut self.files);
            }
        }
        self.ctx = addr2line::Context::from_dwarf(dwarf).ok();
        self.ctx.is_some()
    }

    /// The file whose line tables are used (the ELF file itself or its separate debug
    /// file); `None` when there are none.
    pub fn dwarf_file(&self) -> Option<&Path> {
        self.dwarf_file.as_deref()
    }

    /// The GNU build-id of the ELF file, if it has one: tells whether the file is still the
    /// one a trace was recorded from.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    /// The source position of the instruction at link-time address `address`, if the line
    /// tables cover it.
    pub fn locate(&self, address: u64) -> Option<SourceLocation> {
        if let Some(&(file, line)) = self.decls.get(&address) {
            return Some(SourceLocation {
                file: self.files[file as usize].clone(),
                line: Some(line).filter(|&l| l > 0),
            });
        }
        let loc = self.ctx.as_ref()?.find_location(address).ok()??;
        Some(SourceLocation {
            file: loc.file?.to_string(),
            line: loc.line.filter(|&l| l > 0),
        })
    }
}

/// Sections that neither line lookups nor signatures read: left empty so that big location
/// lists and macro tables are not copied.
fn unused(id: SectionId) -> bool {
    matches!(
        id,
        SectionId::DebugLoc
            | SectionId::DebugLocLists
            | SectionId::DebugMacinfo
            | SectionId::DebugMacro
            | SectionId::DebugTypes
            | SectionId::DebugPubNames
            | SectionId::DebugPubTypes
            | SectionId::DebugFrame
            | SectionId::EhFrame
            | SectionId::EhFrameHdr
    )
}

/// The DWARF sections of `elf`, or `None` if it has no line tables.
fn dwarf_sections(elf: &ElfFile64<'_, Endianness>) -> Option<gimli::Dwarf<Reader>> {
    elf.section_by_name(".debug_line")?;
    elf.section_by_name(".debug_info")?;
    let endian = if elf.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let load = |id: SectionId| -> Result<Reader, gimli::Error> {
        let data: Arc<[u8]> = match elf.section_by_name(id.name()) {
            Some(s) if !unused(id) => match s.uncompressed_data() {
                Ok(d) => Arc::from(&*d),
                // A section that does not decompress is treated as absent: lookups in it
                // find nothing instead of failing the whole listing.
                Err(_) => Arc::from(&[][..]),
            },
            _ => Arc::from(&[][..]),
        };
        Ok(EndianArcSlice::new(data, endian))
    };
    gimli::Dwarf::load(load).ok()
}

/// The declaration (file index in `names`, line) of a subprogram DIE, following
/// `DW_AT_abstract_origin`/`DW_AT_specification` within the unit (out-of-line copies of
/// inline functions and C++ member definitions carry their position there).
fn declaration(
    dwarf: &gimli::Dwarf<Reader>,
    unit: &gimli::Unit<Reader>,
    entry: &gimli::DebuggingInformationEntry<Reader>,
    files: &mut HashMap<String, u32>,
    names: &mut Vec<String>,
) -> Option<(u32, u32)> {
    let mut owned;
    let mut e = entry;
    // Origins can chain (specification of an abstract origin); a few hops are plenty and
    // keep a damaged, cyclic chain from looping.
    for _ in 0..4 {
        if let Some(gimli::AttributeValue::FileIndex(fi)) = e.attr_value(gimli::DW_AT_decl_file) {
            let line = match e.attr_value(gimli::DW_AT_decl_line) {
                Some(gimli::AttributeValue::Udata(l)) => u32::try_from(l).unwrap_or(0),
                _ => 0,
            };
            let name = file_name(dwarf, unit, fi)?;
            let next = names.len() as u32;
            let idx = *files.entry(name).or_insert_with_key(|n| {
                names.push(n.clone());
                next
            });
            return Some((idx, line));
        }
        let origin = e
            .attr_value(gimli::DW_AT_abstract_origin)
            .or_else(|| e.attr_value(gimli::DW_AT_specification))?;
        let gimli::AttributeValue::UnitRef(off) = origin else {
            return None;
        };
        owned = unit.entry(off).ok()?;
        e = &owned;
    }
    None
}

/// Path of file `index` of the unit's line program: joined with its directory and the
/// compilation directory when relative.
fn file_name(
    dwarf: &gimli::Dwarf<Reader>,
    unit: &gimli::Unit<Reader>,
    index: u64,
) -> Option<String> {
    let header = unit.line_program.as_ref()?.header();
    let file = header.file(index)?;
    let text = |v| -> Option<String> {
        let r = dwarf.attr_string(unit, v).ok()?;
        Some(r.to_string_lossy().ok()?.into_owned())
    };
    let mut path = PathBuf::new();
    if let Some(dir) = &unit.comp_dir {
        path.push(dir.to_string_lossy().ok()?.as_ref());
    }
    if let Some(dir) = file.directory(header).and_then(text) {
        path.push(dir);
    }
    path.push(text(file.path_name())?);
    // `dir/./file` and `dir/file` are one file: drop the `.` components.
    let clean: PathBuf = path
        .components()
        .filter(|c| *c != std::path::Component::CurDir)
        .collect();
    Some(clean.to_string_lossy().into_owned())
}

/// Adds the declaration of every subprogram of `unit` that has code, at each of its
/// ranges' starts.
fn index_unit(
    dwarf: &gimli::Dwarf<Reader>,
    unit: &gimli::Unit<Reader>,
    decls: &mut HashMap<u64, (u32, u32)>,
    files: &mut HashMap<String, u32>,
    names: &mut Vec<String>,
) {
    let mut entries = unit.entries();
    while let Ok(Some(entry)) = entries.next_dfs() {
        if entry.tag() != gimli::DW_TAG_subprogram {
            continue;
        }
        let mut starts = Vec::new();
        match entry.attr_value(gimli::DW_AT_low_pc) {
            Some(v) => starts.extend(dwarf.attr_address(unit, v).ok().flatten()),
            None => {
                if let Ok(mut ranges) = dwarf.die_ranges(unit, entry) {
                    while let Ok(Some(r)) = ranges.next() {
                        starts.push(r.begin);
                    }
                }
            }
        }
        if starts.iter().all(|&a| a == 0) {
            continue;
        }
        if let Some(decl) = declaration(dwarf, unit, entry, files, names) {
            for a in starts.into_iter().filter(|&a| a != 0) {
                decls.entry(a).or_insert(decl);
            }
        }
    }
}
