//! The function inventory of an x86-64 ELF file: every function fnscope could hook, with its
//! name, address, size, and whether it is a real function entry.
//!
//! Functions come from `.symtab` (or, for a stripped file, the `.symtab` of its separate
//! debug file or of its MiniDebugInfo), `.dynsym`, and every FDE of `.eh_frame`, which also covers stripped static
//! functions. Call frame information decides whether a piece of code is entered by a call:
//! only there does the top of the stack hold a return address that an exit hook may replace.
//!
//! ```no_run
//! let inv = fnscope_symbols::load(std::path::Path::new("/usr/bin/python3.11"))?;
//! for f in inv.functions.iter().filter(|f| f.entry) {
//!     println!("{:#x} {} {}", f.address, f.size, f.display_name());
//! }
//! # Ok::<(), fnscope_symbols::SymbolError>(())
//! ```

pub mod argspec;
mod cfi;
mod debugfile;
mod demangle;
mod lines;
mod minidebuginfo;
pub mod params;

use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{
    Dyn, ElfFile64, FileHeader, ProgramHeader, SectionHeader, Sym, SymbolTable,
};
use object::{Endianness, Object};

pub use demangle::{demangle, strip_version};
pub use lines::{SourceLines, SourceLocation};

/// `Function::not_entry_why` of `.cold` parts.
pub const WHY_COLD: &str = "cold part";
/// `Function::not_entry_why` of the ELF entry point.
pub const WHY_ELF_ENTRY: &str = "ELF entry point (_start)";
/// `Function::not_entry_why` when the call frame information shows that the top of the stack
/// is not a return address at the piece's first instruction.
pub const WHY_CFA: &str = cfi::CFA_NOT_AT_ENTRY;

/// Where a function's name (or, for unnamed pieces, its existence) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SymSource {
    /// The file's own `.symtab`.
    Symtab,
    /// The file's `.dynsym` (exported functions).
    Dynsym,
    /// An `.eh_frame` FDE without any symbol at its start.
    EhFrame,
    /// The `.symtab` of a separate debug file, or of the MiniDebugInfo (`.gnu_debugdata`)
    /// embedded in the file.
    DebugFile,
}

/// One function, or piece of a function, of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// Raw (mangled) symbol name, possibly with an `@VERSION` suffix; `None` for a piece of
    /// code known only from `.eh_frame`.
    pub name: Option<String>,
    /// Link-time virtual address (add the load bias for the run-time address).
    pub address: u64,
    /// Size in bytes (from the symbol, else from the FDE; 0 if neither tells).
    pub size: u64,
    /// Whether the code is entered by a call, with the return address on top of the stack.
    pub entry: bool,
    /// When `entry` is false: why, in a few words.
    pub not_entry_why: Option<&'static str>,
    /// Where the name comes from.
    pub source: SymSource,
    /// Whether `.eh_frame` describes this code. Compilers emit call frame information for
    /// every function they build; code without it was generated or written by hand (V8's
    /// builtins, JIT stubs), and the runtimes that own such code often walk its frames
    /// themselves.
    pub has_cfi: bool,
}

impl Function {
    /// The demangled name, or `sub_<hex address>` for an unnamed piece.
    pub fn display_name(&self) -> String {
        display_name(self.name.as_deref(), self.address)
    }
}

/// A function's name as people read it: `name` (raw) demangled, or `sub_<hex address>` for
/// none.
pub fn display_name(name: Option<&str>, address: u64) -> String {
    match name {
        Some(n) => demangle(n),
        None => format!("sub_{address:x}"),
    }
}

/// An executable section (`SHF_EXECINSTR`, `SHT_PROGBITS`) of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeRange {
    /// Link-time virtual address of the section.
    pub address: u64,
    /// Offset of the section's bytes in the file.
    pub file_offset: u64,
    /// Size in bytes.
    pub size: u64,
}

impl CodeRange {
    /// Whether `address` lies in this range.
    pub fn contains(&self, address: u64) -> bool {
        address >= self.address && address - self.address < self.size
    }
}

/// Everything fnscope needs to know about one ELF file to hook its functions.
#[derive(Debug, Clone)]
pub struct Inventory {
    /// The path the inventory was loaded from.
    pub path: PathBuf,
    /// GNU build id, if the file has one.
    pub build_id: Option<Vec<u8>>,
    /// `ET_DYN`: a position-independent executable or a shared library.
    pub is_pie_or_shared: bool,
    /// A statically linked executable: no program interpreter and no `DT_NEEDED`
    /// (`ET_EXEC`, or `ET_DYN` flagged `DF_1_PIE`).
    pub is_static: bool,
    /// `e_entry` (0 if none).
    pub entry_point: u64,
    /// Whether the file has its own `.symtab`; false means it is stripped.
    pub has_symtab: bool,
    /// The separate debug file whose symbols were used, if any (`None` also when the names
    /// come from the embedded MiniDebugInfo).
    pub debug_file: Option<PathBuf>,
    /// Executable sections, sorted by address; each lies within the file and does not wrap
    /// around the address space.
    pub code: Vec<CodeRange>,
    /// Functions sorted by address, one per start address.
    pub functions: Vec<Function>,
    /// Every address range in code that something claims, sorted by start: each symbol
    /// defined in code (of any type, from every symbol table read, before merging; one
    /// without a size claims its first byte) and each FDE. Bytes of code outside all of
    /// them belong to no function: alignment padding, or code nothing describes.
    pub claims: Vec<(u64, u64)>,
}

impl Inventory {
    /// The code range holding `address`.
    pub fn code_range(&self, address: u64) -> Option<&CodeRange> {
        let i = self.code.partition_point(|c| c.address <= address);
        self.code[..i].last().filter(|c| c.contains(address))
    }

    /// The file bytes from `address` to the end of its code range, out of `data` (the file
    /// contents this inventory was loaded from). `None` if `address` is not in code or the
    /// data is shorter than the file was.
    pub fn code_bytes<'a>(&self, data: &'a [u8], address: u64) -> Option<&'a [u8]> {
        let c = self.code_range(address)?;
        let start = c.file_offset.checked_add(address - c.address)?;
        let end = c.file_offset.checked_add(c.size)?;
        data.get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }

    /// The function that starts exactly at `address`.
    pub fn function_at(&self, address: u64) -> Option<&Function> {
        self.functions
            .binary_search_by_key(&address, |f| f.address)
            .ok()
            .map(|i| &self.functions[i])
    }
}

/// Why an inventory could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}; check the path and that you may read the file")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The file is not ELF.
    #[error("{0} is not an ELF file; give the path of an executable or a shared library (not a script or a symlink farm)")]
    NotElf(PathBuf),
    /// The file is ELF, but not 64-bit little-endian x86-64.
    #[error("{path} is built for ELF machine {machine}, not x86-64 (62); fnscope hooks x86-64 code only, so trace an x86-64 build")]
    NotX86_64 {
        /// The file.
        path: PathBuf,
        /// Its `e_machine`.
        machine: u16,
    },
    /// The ELF structures are damaged.
    #[error("{path} is a damaged ELF file ({msg}); check it with `readelf -a`, or rebuild it")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

/// What `record` checks of a program before it starts it, found without listing its
/// functions (a big program's inventory takes a tenth of a second or more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramFacts {
    /// Statically linked: the loader never runs, so `LD_PRELOAD` does nothing.
    pub is_static: bool,
    /// Its local functions have names: a `.symtab`, a separate debug file or MiniDebugInfo.
    pub named: bool,
    /// It has unwind tables (a non-empty `.eh_frame`), whose entries give the starts of
    /// functions that have no name.
    pub unwind: bool,
}

/// [`ProgramFacts`] of the ELF file at `path`.
pub fn program_facts(path: &Path) -> Result<ProgramFacts, SymbolError> {
    let io = |source| SymbolError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: a private read-only mapping; a file changed meanwhile gives wrong facts at
    // worst (as reading it would), and the loader reads it again anyway.
    let data = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    check_header(path, &data)?;
    let elf = ElfFile64::<Endianness>::parse(&data[..]).map_err(|e| SymbolError::Parse { path: path.to_path_buf(), msg: e.to_string() })?;
    let endian = elf.endian();
    let named = !elf.elf_symbol_table().is_empty()
        || elf.elf_section_table().section_by_name(endian, b".gnu_debugdata").is_some()
        || open_debug_file(path, elf.build_id().ok().flatten(), elf.gnu_debuglink().ok().flatten()).is_some();
    let unwind = elf.elf_section_table().section_by_name(endian, b".eh_frame").is_some_and(|(_, sh)| sh.sh_size(endian) > 0);
    Ok(ProgramFacts { is_static: is_static(&elf, &data), named, unwind })
}

/// Whether the ELF file is statically linked: no interpreter, no needed library, and an
/// executable (or a static PIE).
fn is_static(file: &ElfFile64<'_, Endianness>, data: &[u8]) -> bool {
    let endian = file.endian();
    let mut has_interp = false;
    let mut has_needed = false;
    let mut pie_flag = false;
    for ph in file.elf_program_headers() {
        let t = ph.p_type(endian);
        if t == elf::PT_INTERP {
            has_interp = true;
        } else if t == elf::PT_DYNAMIC {
            if let Ok(Some(dyns)) = ph.dynamic(endian, data) {
                for d in dyns {
                    let tag = d.d_tag(endian);
                    if tag == elf::DT_NEEDED {
                        has_needed = true;
                    } else if tag == elf::DT_FLAGS_1 && d.d_val(endian) & elf::DF_1_PIE.0 != 0 {
                        pie_flag = true;
                    }
                }
            }
        }
    }
    let e_type = file.elf_header().e_type(endian);
    !has_interp && !has_needed && (e_type == elf::ET_EXEC || pie_flag)
}

/// `f` over `0..n` split into one run of indices per thread (up to `threads`; one run when
/// `n` is small), results in order. A run whose thread panicked, or could not be made (a limit
/// on processes), is done again on the calling thread.
pub fn parallel_runs<T: Send>(n: usize, threads: usize, f: impl Fn(std::ops::Range<usize>) -> Vec<T> + Sync) -> Vec<T> {
    if threads < 2 || n <= 1024 {
        return f(0..n);
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|sc| {
        let f = &f;
        let runs: Vec<_> = (0..n)
            .step_by(per)
            .map(|a| {
                let r = a..(a + per).min(n);
                (r.clone(), std::thread::Builder::new().spawn_scoped(sc, move || f(r)).ok())
            })
            .collect();
        runs.into_iter().flat_map(|(r, h)| h.and_then(|h| h.join().ok()).unwrap_or_else(|| f(r))).collect()
    })
}

/// Reads the file at `path` and builds its inventory.
pub fn load(path: &Path) -> Result<Inventory, SymbolError> {
    let data = std::fs::read(path).map_err(|source| SymbolError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    load_bytes(path, &data)
}

/// Builds the inventory of the ELF file whose contents are `data`; `path` names it in errors
/// and is where `.gnu_debuglink` is resolved from.
pub fn load_bytes(path: &Path, data: &[u8]) -> Result<Inventory, SymbolError> {
    load_bytes_on(path, data, 1)
}

/// [`load_bytes`] on up to `threads` threads: the same inventory, sooner for a module with
/// tens of thousands of FDEs.
pub fn load_bytes_on(path: &Path, data: &[u8], threads: usize) -> Result<Inventory, SymbolError> {
    check_header(path, data)?;
    let parse_err = |e: object::read::Error| SymbolError::Parse {
        path: path.to_path_buf(),
        msg: e.to_string(),
    };
    let file = ElfFile64::<Endianness>::parse(data).map_err(parse_err)?;
    let endian = file.endian();
    let header = file.elf_header();
    let e_type = header.e_type(endian);
    let entry_point = header.e_entry(endian);

    let code = code_ranges(&file, data);

    let is_static = is_static(&file, data);

    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
    let symtab = file.elf_symbol_table();
    let has_symtab = !symtab.is_empty();

    let mut cands = Vec::new();
    collect_symbols(symtab, endian, SymSource::Symtab, &code, &mut cands);
    collect_symbols(
        file.elf_dynamic_symbol_table(),
        endian,
        SymSource::Dynsym,
        &code,
        &mut cands,
    );

    let mut debug_file = None;
    if !has_symtab {
        let link = file.gnu_debuglink().ok().flatten();
        let before = cands.len();
        if let Some(dpath) = read_debug_file(path, build_id.as_deref(), link, &code, &mut cands) {
            if cands.len() > before {
                debug_file = Some(dpath);
            }
        }
    }

    if !has_symtab && debug_file.is_none() {
        // MiniDebugInfo: an xz-compressed ELF file in `.gnu_debugdata` whose `.symtab` names
        // the local functions (Fedora and derivatives ship binaries so).
        let sections = file.elf_section_table();
        let mini = sections
            .section_by_name(endian, b".gnu_debugdata")
            .and_then(|(_, sh)| sh.data(endian, data).ok())
            .and_then(minidebuginfo::decompress);
        if let Some(elf) = mini {
            if let Ok(mfile) = ElfFile64::<Endianness>::parse(elf.as_slice()) {
                collect_symbols(
                    mfile.elf_symbol_table(),
                    mfile.endian(),
                    SymSource::DebugFile,
                    &code,
                    &mut cands,
                );
            }
        }
    }

    let mut queries: Vec<u64> = cands.iter().map(|c| c.address).collect();
    queries.sort_unstable();
    queries.dedup();
    let mut scan = match eh_frame_input(&file, data) {
        Some(input) => cfi::scan(&input, &queries, threads),
        None => cfi::CfiScan {
            pieces: Vec::new(),
            inner: Default::default(),
        },
    };
    let mut claims = other_symbol_claims(&file, &code);
    claims.extend(cands.iter().map(|c| (c.address, c.address.saturating_add(c.size.max(1)))));
    claims.extend(scan.pieces.iter().map(|p| (p.start, p.start.saturating_add(p.len.max(1)))));
    claims.sort_unstable();
    claims.dedup();

    // PLT stubs have FDEs but are not functions of this file: calls through them belong to
    // the library that defines the target.
    let plt = plt_ranges(&file);
    scan.pieces
        .retain(|p| !plt.iter().any(|&(a, n)| p.start.wrapping_sub(a) < n));

    let functions = merge(cands, &scan, entry_point);
    Ok(Inventory {
        path: path.to_path_buf(),
        build_id,
        is_pie_or_shared: e_type == elf::ET_DYN,
        is_static,
        entry_point,
        has_symtab,
        debug_file,
        code,
        functions,
        claims,
    })
}

/// Ranges of the symbols in code that are not functions (`STT_NOTYPE` labels of hand-written
/// assembly, `STT_OBJECT` data placed in code): such bytes may be entered or read although
/// no function owns them.
fn other_symbol_claims(file: &ElfFile64<'_, Endianness>, code: &[CodeRange]) -> Vec<(u64, u64)> {
    let endian = file.endian();
    let mut out = Vec::new();
    for table in [file.elf_symbol_table(), file.elf_dynamic_symbol_table()] {
        for sym in table.iter() {
            let t = sym.st_type();
            if matches!(t, elf::STT_FUNC | elf::STT_GNU_IFUNC | elf::STT_SECTION | elf::STT_FILE) {
                continue;
            }
            let shndx = sym.st_shndx(endian);
            if shndx == elf::SHN_UNDEF || shndx == elf::SHN_ABS {
                continue;
            }
            let address = sym.st_value(endian);
            if in_code(code, address) {
                out.push((address, address.saturating_add(sym.st_size(endian).max(1))));
            }
        }
    }
    out
}

/// Rejects what is not 64-bit little-endian x86-64 ELF before the parser sees it, so that the
/// user gets the specific reason.
fn check_header(path: &Path, data: &[u8]) -> Result<(), SymbolError> {
    if data.len() < 20 || &data[..4] != b"\x7fELF" {
        return Err(SymbolError::NotElf(path.to_path_buf()));
    }
    // e_machine is at offset 18 in both classes, in the file's byte order.
    let m = [data[18], data[19]];
    let machine = if data[5] == elf::ELFDATA2MSB.0 {
        u16::from_be_bytes(m)
    } else {
        u16::from_le_bytes(m)
    };
    if data[4] != elf::ELFCLASS64.0 || data[5] != elf::ELFDATA2LSB.0 || machine != elf::EM_X86_64.0
    {
        return Err(SymbolError::NotX86_64 {
            path: path.to_path_buf(),
            machine,
        });
    }
    Ok(())
}

/// The executable `PROGBITS` sections whose bytes are all in the file, sorted by address.
fn code_ranges(file: &ElfFile64<'_, Endianness>, data: &[u8]) -> Vec<CodeRange> {
    let endian = file.endian();
    let mut code: Vec<CodeRange> = file
        .elf_section_table()
        .iter()
        .filter(|sh| {
            let flags = sh.sh_flags(endian).0;
            sh.sh_type(endian) == elf::SHT_PROGBITS
                && flags & elf::SHF_EXECINSTR.0 != 0
                && flags & elf::SHF_ALLOC.0 != 0
        })
        .map(|sh| CodeRange {
            address: sh.sh_addr(endian),
            file_offset: sh.sh_offset(endian),
            size: sh.sh_size(endian),
        })
        // Ranges that wrap around the address space cannot be real; dropping them lets users
        // add sizes to addresses without overflow checks.
        .filter(|c| {
            c.size > 0
                && c.address.checked_add(c.size).is_some()
                && c.file_offset
                    .checked_add(c.size)
                    .is_some_and(|end| end <= data.len() as u64)
        })
        .collect();
    code.sort_unstable_by_key(|c| c.address);
    code
}

/// `(address, size)` of the PLT sections (`.plt`, `.plt.sec`, `.plt.got`, `.iplt`).
fn plt_ranges(file: &ElfFile64<'_, Endianness>) -> Vec<(u64, u64)> {
    let endian = file.endian();
    let sections = file.elf_section_table();
    sections
        .iter()
        .filter(|sh| {
            sections
                .section_name(endian, sh)
                .is_ok_and(|n| n == b".plt" || n.starts_with(b".plt.") || n == b".iplt")
        })
        .map(|sh| (sh.sh_addr(endian), sh.sh_size(endian)))
        .collect()
}

fn in_code(code: &[CodeRange], address: u64) -> bool {
    let i = code.partition_point(|c| c.address <= address);
    code[..i].last().is_some_and(|c| c.contains(address))
}

/// A function symbol before merging.
struct Cand {
    address: u64,
    size: u64,
    name: String,
    source: SymSource,
    /// 0 global, 1 weak, 2 local (or anything else).
    bind: u8,
}

impl Cand {
    /// Smaller is a better name for the address.
    fn rank(&self) -> (u8, u8, usize, usize) {
        let src = match self.source {
            SymSource::Symtab | SymSource::DebugFile => 0,
            SymSource::Dynsym => 1,
            SymSource::EhFrame => 2,
        };
        let underscores = self.name.bytes().take_while(|&b| b == b'_').count();
        (src, self.bind, underscores, self.name.len())
    }
}

/// Function symbols (`STT_FUNC`, `STT_GNU_IFUNC`) defined in code.
fn collect_symbols(
    table: &SymbolTable<'_, elf::FileHeader64<Endianness>>,
    endian: Endianness,
    source: SymSource,
    code: &[CodeRange],
    out: &mut Vec<Cand>,
) {
    for sym in table.iter() {
        let t = sym.st_type();
        if t != elf::STT_FUNC && t != elf::STT_GNU_IFUNC {
            continue;
        }
        let shndx = sym.st_shndx(endian);
        // Undefined functions of a non-PIE executable have their PLT stub as value.
        if shndx == elf::SHN_UNDEF || shndx == elf::SHN_ABS {
            continue;
        }
        let address = sym.st_value(endian);
        if address == 0 || !in_code(code, address) {
            continue;
        }
        let name = match table.symbol_name(endian, sym) {
            Ok(n) if !n.is_empty() => String::from_utf8_lossy(n).into_owned(),
            _ => continue,
        };
        let bind = match sym.st_bind() {
            elf::STB_GLOBAL => 0,
            elf::STB_WEAK => 1,
            _ => 2,
        };
        out.push(Cand {
            address,
            size: sym.st_size(endian),
            name,
            source,
            bind,
        });
    }
}

/// Takes the function symbols of the first matching separate debug file and returns its path.
fn read_debug_file(
    path: &Path,
    build_id: Option<&[u8]>,
    link: Option<(&[u8], u32)>,
    code: &[CodeRange],
    out: &mut Vec<Cand>,
) -> Option<PathBuf> {
    let (cand, map) = open_debug_file(path, build_id, link)?;
    let dfile = ElfFile64::<Endianness>::parse(&map[..]).ok()?;
    collect_symbols(
        dfile.elf_symbol_table(),
        dfile.endian(),
        SymSource::DebugFile,
        code,
        out,
    );
    Some(cand)
}

/// The first separate debug file of `path` that belongs to it, mapped. A candidate must
/// carry the same build id, or (if either file has none) match the `.gnu_debuglink` CRC: a
/// stale debug file would give wrong names and lines.
///
/// The file is mapped, not read: debug files can be hundreds of MB of DWARF, of which only
/// parts are needed.
pub(crate) fn open_debug_file(
    path: &Path,
    build_id: Option<&[u8]>,
    link: Option<(&[u8], u32)>,
) -> Option<(PathBuf, memmap2::Mmap)> {
    for cand in debugfile::candidates(path, build_id, link.map(|l| l.0)) {
        let Ok(f) = std::fs::File::open(&cand) else {
            continue;
        };
        // SAFETY: the mapping is private and read-only. Debug files are installed once and not
        // rewritten in place; if one were truncated meanwhile, reading would fault.
        let Ok(map) = (unsafe { memmap2::Mmap::map(&f) }) else {
            continue;
        };
        let Ok(dfile) = ElfFile64::<Endianness>::parse(&map[..]) else {
            continue;
        };
        let their_id = dfile.build_id().ok().flatten();
        let ok = match (build_id, their_id) {
            (Some(a), Some(b)) => a == b,
            _ => link.is_some_and(|(_, crc)| debugfile::crc32_of_file(&cand).ok() == Some(crc)),
        };
        if ok {
            return Some((cand, map));
        }
    }
    None
}

fn eh_frame_input<'a>(
    file: &ElfFile64<'a, Endianness>,
    data: &'a [u8],
) -> Option<cfi::EhFrameInput<'a>> {
    let endian = file.endian();
    let sections = file.elf_section_table();
    let find = |name: &[u8]| sections.section_by_name(endian, name).map(|(_, sh)| sh);
    let eh = find(b".eh_frame")?;
    if eh.sh_type(endian) != elf::SHT_PROGBITS {
        return None;
    }
    let bytes = eh.data(endian, data).ok()?;
    Some(cfi::EhFrameInput {
        data: bytes,
        address: eh.sh_addr(endian),
        hdr_address: find(b".eh_frame_hdr").map(|s| s.sh_addr(endian)),
        text_address: find(b".text").map(|s| s.sh_addr(endian)),
        got_address: find(b".got").map(|s| s.sh_addr(endian)),
    })
}

fn is_cold(name: &str) -> bool {
    // One search settles almost every name (a program has tens of thousands, C++ ones long).
    if !name.contains(".cold") {
        return false;
    }
    let n = strip_version(name);
    n.ends_with(".cold") || n.contains(".cold.")
}

/// One function per start address: the best symbol name, the symbol's size (else the FDE's),
/// and the entry verdict.
fn merge(mut cands: Vec<Cand>, scan: &cfi::CfiScan, entry_point: u64) -> Vec<Function> {
    cands.sort_unstable_by(|a, b| {
        a.address
            .cmp(&b.address)
            .then_with(|| a.rank().cmp(&b.rank()))
            .then_with(|| a.name.cmp(&b.name))
    });
    let pieces = &scan.pieces;
    let mut out = Vec::with_capacity(pieces.len() + cands.len() / 2);
    let (mut ci, mut pi) = (0, 0);
    while ci < cands.len() || pi < pieces.len() {
        let address = match (cands.get(ci), pieces.get(pi)) {
            (Some(c), Some(p)) => c.address.min(p.start),
            (Some(c), None) => c.address,
            (None, Some(p)) => p.start,
            (None, None) => break,
        };
        let group_end = ci + cands[ci..].partition_point(|c| c.address == address);
        let group = &mut cands[ci..group_end];
        ci = group_end;
        let piece = pieces.get(pi).filter(|p| p.start == address);
        while pieces.get(pi).is_some_and(|p| p.start == address) {
            pi += 1;
        }

        let size = group
            .first()
            .map(|c| c.size)
            .filter(|&s| s > 0)
            .or_else(|| group.iter().map(|c| c.size).max().filter(|&s| s > 0))
            .or(piece.map(|p| p.len))
            .unwrap_or(0);
        let verdict = if group.iter().any(|c| is_cold(&c.name)) {
            Err(WHY_COLD)
        } else if entry_point != 0 && address == entry_point {
            Err(WHY_ELF_ENTRY)
        } else if let Some(p) = piece {
            p.entry
        } else {
            scan.inner.get(&address).copied().unwrap_or(Ok(()))
        };
        let (name, source) = match group.first_mut() {
            Some(c) => (Some(std::mem::take(&mut c.name)), c.source),
            None => (None, SymSource::EhFrame),
        };
        out.push(Function {
            name,
            address,
            size,
            entry: verdict.is_ok(),
            not_entry_why: verdict.err(),
            source,
            has_cfi: piece.is_some() || scan.inner.contains_key(&address),
        });
    }
    out
}
