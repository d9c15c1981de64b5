//! Inventories of programs compiled by gcc at test time, stripped and unstripped.

use std::path::{Path, PathBuf};
use std::process::Command;

use fnscope_symbols::{load, load_bytes, load_bytes_on, Function, SourceLines, SymSource, SymbolError};

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fnscope-symbols-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles the fixture with `extra` flags into `name` (once per name).
fn compile(name: &str, extra: &[&str]) -> PathBuf {
    let out = tmp(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture.c");
    run(Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra));
    out
}

fn named<'a>(fs: &'a [Function], name: &str) -> &'a Function {
    fs.iter()
        .find(|f| f.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{name} not in the inventory"))
}

#[test]
fn unstripped_program() {
    let path = compile("plain", &[]);
    let inv = load(&path).unwrap();
    assert!(inv.has_symtab);
    assert!(inv.is_pie_or_shared);
    assert!(!inv.is_static);
    assert!(inv.build_id.is_some());
    assert!(inv.debug_file.is_none());
    assert!(
        inv.functions
            .windows(2)
            .all(|w| w[0].address < w[1].address),
        "sorted, one per address"
    );

    let hot = named(&inv.functions, "hot");
    assert!(hot.entry && hot.size > 0 && hot.source == SymSource::Symtab);
    let cold = named(&inv.functions, "hot.cold");
    assert!(!cold.entry);
    assert_eq!(cold.not_entry_why, Some(fnscope_symbols::WHY_COLD));
    let start = named(&inv.functions, "_start");
    assert_eq!(start.address, inv.entry_point);
    assert!(!start.entry);
    assert!(named(&inv.functions, "helper").entry);
    assert!(named(&inv.functions, "main").entry);
    // Every function is in code.
    for f in &inv.functions {
        assert!(inv.code_range(f.address).is_some(), "{f:?}");
    }
}

#[test]
fn stripped_program_falls_back_to_eh_frame() {
    let full = compile("for-strip", &[]);
    let stripped = tmp("stripped");
    run(Command::new("strip").arg("-o").arg(&stripped).arg(&full));
    let full_inv = load(&full).unwrap();
    let inv = load(&stripped).unwrap();
    assert!(!inv.has_symtab);
    assert!(inv.debug_file.is_none());

    let hot = named(&full_inv.functions, "hot");
    let piece = inv.function_at(hot.address).expect("hot's FDE");
    assert_eq!(piece.name, None);
    assert_eq!(piece.source, SymSource::EhFrame);
    assert!(piece.entry);
    assert_eq!(piece.display_name(), format!("sub_{:x}", hot.address));

    // The cold part has an FDE of its own whose CFI says the frame is already set up.
    let cold = named(&full_inv.functions, "hot.cold");
    let piece = inv.function_at(cold.address).expect("hot.cold's FDE");
    assert!(!piece.entry);
    assert_eq!(piece.not_entry_why, Some(fnscope_symbols::WHY_CFA));
}

/// Strips `full` into `dir/prog` with a `.gnu_debuglink` to `dir/prog.debug` made from
/// `debug_from`.
fn split_debug(dir: &Path, full: &Path, debug_from: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let debug = dir.join("prog.debug");
    let prog = dir.join("prog");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(full)
        .arg(&debug));
    run(Command::new("strip").arg("-o").arg(&prog).arg(full));
    run(Command::new("objcopy")
        .arg("--add-gnu-debuglink")
        .arg(&debug)
        .arg(&prog));
    if debug_from != full {
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(debug_from)
            .arg(&debug));
    }
    (prog, debug)
}

#[test]
fn separate_debug_file_by_debuglink() {
    // With build ids, they must match; without, the debuglink CRC must.
    for (name, flags) in [
        ("debuglink-id", &[][..]),
        ("debuglink-crc", &["-Wl,--build-id=none"][..]),
    ] {
        let full = compile(name, flags);
        let (prog, debug) = split_debug(&tmp(&format!("{name}-dir")), &full, &full);
        let inv = load(&prog).unwrap();
        assert!(!inv.has_symtab);
        assert_eq!(inv.debug_file.as_deref(), Some(debug.as_path()), "{name}");
        let helper = named(&inv.functions, "helper");
        assert_eq!(helper.source, SymSource::DebugFile);
        assert!(helper.entry);
        assert!(!named(&inv.functions, "hot.cold").entry);
    }
}

#[test]
fn stale_debug_file_is_ignored() {
    for (name, flags) in [
        ("stale-id", &[][..]),
        ("stale-crc", &["-Wl,--build-id=none"][..]),
    ] {
        let full = compile(name, flags);
        let other = compile(&format!("{name}-other"), &[flags, &["-O0"]].concat());
        let (prog, _) = split_debug(&tmp(&format!("{name}-dir")), &full, &other);
        let inv = load(&prog).unwrap();
        assert!(inv.debug_file.is_none(), "{name}");
        assert!(inv
            .functions
            .iter()
            .all(|f| f.source != SymSource::DebugFile));
    }
}

#[test]
fn minidebuginfo() {
    let full = compile("for-mini", &[]);
    let dir = tmp("mini");
    std::fs::create_dir_all(&dir).unwrap();
    let dbg = dir.join("prog.dbg");
    let mini = dir.join("prog.mini");
    let xz = dir.join("prog.mini.xz");
    let prog = dir.join("prog");
    // As Fedora builds it: the symbol table without debug info, xz-compressed, in a section.
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&dbg));
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(&dbg)
        .arg(&mini));
    let raw = std::fs::read(&mini).unwrap();
    let mut packed = Vec::new();
    lzma_rs::xz_compress(&mut raw.as_slice(), &mut packed).unwrap();
    std::fs::write(&xz, packed).unwrap();
    run(Command::new("strip").arg("-o").arg(&prog).arg(&full));
    run(Command::new("objcopy")
        .arg(format!("--add-section=.gnu_debugdata={}", xz.display()))
        .arg(&prog));

    let inv = load(&prog).unwrap();
    assert!(!inv.has_symtab);
    assert!(inv.debug_file.is_none());
    let helper = named(&inv.functions, "helper");
    assert_eq!(helper.source, SymSource::DebugFile);
    assert!(helper.entry);
    assert!(!named(&inv.functions, "hot.cold").entry);

    // Damaged compressed data: the names are gone, nothing else.
    let mut data = std::fs::read(&prog).unwrap();
    let at = data
        .windows(6)
        .position(|w| w == b"\xfd7zXZ\0")
        .expect("xz magic");
    data[at + 40..at + 80].fill(0x55);
    let inv = load_bytes(&prog, &data).unwrap();
    assert!(inv
        .functions
        .iter()
        .all(|f| f.source == SymSource::EhFrame || f.source == SymSource::Dynsym));
}

#[test]
fn static_program() {
    let path = compile("static", &["-static"]);
    let inv = load(&path).unwrap();
    assert!(inv.is_static);
    assert!(!inv.is_pie_or_shared);
    // glibc's own functions are there too.
    assert!(named(&inv.functions, "hot").entry);
    assert!(inv
        .functions
        .iter()
        .any(|f| f.name.as_deref() == Some("malloc")));
}

#[test]
fn errors_name_the_problem() {
    let not_elf = tmp("not-elf.txt");
    std::fs::write(&not_elf, "#!/bin/sh\necho hi\n").unwrap();
    assert!(matches!(load(&not_elf), Err(SymbolError::NotElf(_))));

    let missing = tmp("does-not-exist");
    let err = load(&missing).unwrap_err();
    assert!(matches!(err, SymbolError::Io { .. }));
    assert!(err.to_string().contains("does-not-exist"));

    let path = compile("for-errors", &[]);
    let mut data = std::fs::read(&path).unwrap();
    data[18] = 183; // EM_AARCH64
    match load_bytes(&path, &data) {
        Err(SymbolError::NotX86_64 { machine, .. }) => assert_eq!(machine, 183),
        other => panic!("{other:?}"),
    }
}

#[test]
fn damaged_files_do_not_panic() {
    let path = compile("for-damage", &[]);
    let data = std::fs::read(&path).unwrap();
    // Cut anywhere: in the headers, the section table, .eh_frame, the symbol tables.
    let step = (data.len() / 97).max(1);
    for len in (0..data.len()).step_by(step).chain([21, 64, 65]) {
        let _ = load_bytes(&path, &data[..len.min(data.len())]);
    }
    // Scribble over every part of the file in turn.
    for start in (0..data.len()).step_by(step) {
        let mut bad = data.clone();
        for b in bad.iter_mut().skip(start).take(64) {
            *b ^= 0xa5;
        }
        let _ = load_bytes(&path, &bad);
    }
}

/// A damaged `.eh_frame` read on 3 threads gives what one thread gives, without panicking:
/// scribbled over in turn at 48 points spread over the section, and cut short (its size halved
/// in the section table). The file is this test's own program: most damaged files must still
/// have more than 1,024 functions with CFI, which only the split path (FDEs parsed on several
/// threads above 1,024) reads on 3 threads, and most must read differently from the whole
/// file, so that the comparison is not of two undamaged reads.
#[test]
fn damaged_eh_frame_same_on_threads() {
    use object::{Object, ObjectSection};
    let path = std::env::current_exe().unwrap();
    let data = std::fs::read(&path).unwrap();
    let (start, size, index) = {
        let file = object::File::parse(&*data).unwrap();
        let sec = file.section_by_name(".eh_frame").expect("an .eh_frame");
        let (a, n) = sec.file_range().expect("a file range for .eh_frame");
        (a as usize, n as usize, sec.index().0)
    };
    const POINTS: usize = 48;
    let whole = load_bytes_on(&path, &data, 1).unwrap();
    let (mut split, mut changed) = (0, 0);
    let mut same = |bytes: &[u8], what: &str| match (load_bytes_on(&path, bytes, 1), load_bytes_on(&path, bytes, 3)) {
        (Ok(a), Ok(b)) => {
            assert!(a.functions == b.functions && a.claims == b.claims, "{what}");
            split += (a.functions.iter().filter(|f| f.has_cfi).count() > 1024) as usize;
            changed += (a.functions != whole.functions || a.claims != whole.claims) as usize;
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}"),
        (a, b) => panic!("{what}: one thread {:?}, three {:?}", a.err(), b.err()),
    };
    for k in 0..POINTS {
        let at = start + size * k / POINTS;
        let mut bad = data.clone();
        for b in &mut bad[at..(at + 16).min(start + size)] {
            *b ^= 0x5a;
        }
        same(&bad, &format!("16 bytes scribbled at {at:#x}"));
    }
    // sh_size, 32 bytes into the section's Elf64_Shdr of a little-endian ELF64 file.
    assert!(data[4] == 2 && data[5] == 1, "a little-endian ELF64 file");
    let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().unwrap()) as usize;
    let shentsize = u16::from_le_bytes(data[0x3a..0x3c].try_into().unwrap()) as usize;
    let at = shoff + index * shentsize + 32;
    let mut cut = data.clone();
    cut[at..at + 8].copy_from_slice(&(size as u64 / 2).to_le_bytes());
    same(&cut, "half of .eh_frame");
    // Most, in both builds: which scribbles change what is read depends on how the test
    // program was compiled (12 points were too few for a release build: 8 of 13 changed).
    let most = POINTS / 2 + 1;
    assert!(split >= most && changed >= most, "of {} damaged files, {split} took the split path and {changed} read differently", POINTS + 1);
}

/// The inventories of system binaries, where they are present: thousands of entries, one
/// function per address, and the same on 3 threads (FDEs read in parallel) as on one.
#[test]
fn system_binaries() {
    for p in [
        "/usr/bin/python3.11",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/bin/git",
    ] {
        let path = Path::new(p);
        if !path.exists() {
            continue;
        }
        let inv = load(path).unwrap();
        let entries = inv.functions.iter().filter(|f| f.entry).count();
        assert!(entries > 1000, "{p}: {entries} entries");
        assert!(inv
            .functions
            .windows(2)
            .all(|w| w[0].address < w[1].address));
        let on3 = load_bytes_on(path, &std::fs::read(path).unwrap(), 3).unwrap();
        assert!(on3.functions == inv.functions && on3.claims == inv.claims, "{p}: 3 threads");
    }
}

// Source lines (lines.rs).

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture.c")
}

/// 1-based line of the fixture where `needle` first appears.
fn line_of(needle: &str) -> u32 {
    let src = std::fs::read_to_string(fixture()).unwrap();
    let i = src
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the fixture"));
    i as u32 + 1
}

fn address_of(path: &Path, name: &str) -> u64 {
    named(&load(path).unwrap().functions, name).address
}

/// Where the functions of the fixture start: the line of their opening brace's
/// declaration, in fixture.c.
fn check_lines(lines: &SourceLines, addresses_from: &Path) {
    for (name, decl) in [
        ("hot", "int hot(const int *v"),
        ("helper", "static __attribute__((noinline)) int helper"),
        ("main", "int main(int argc"),
    ] {
        let loc = lines
            .locate(address_of(addresses_from, name))
            .unwrap_or_else(|| panic!("no source position for {name}"));
        assert!(loc.file.ends_with("tests/fixture.c"), "{name}: {loc:?}");
        assert_eq!(loc.line, Some(line_of(decl)), "{name}");
    }
}

#[test]
fn lines_from_the_file_itself() {
    let prog = compile("lines-plain", &[]);
    let lines = SourceLines::load(&prog).unwrap();
    assert_eq!(lines.dwarf_file(), Some(prog.as_path()));
    assert_eq!(lines.build_id(), load(&prog).unwrap().build_id.as_deref());
    check_lines(&lines, &prog);
    // Outside any code: nothing, not a wrong file.
    assert_eq!(lines.locate(0), None);
}

#[test]
fn lines_from_the_separate_debug_file() {
    let full = compile("lines-split-full", &[]);
    let (prog, debug) = split_debug(&tmp("lines-split"), &full, &full);
    let lines = SourceLines::load(&prog).unwrap();
    assert_eq!(lines.dwarf_file(), Some(debug.as_path()));
    check_lines(&lines, &full);

    // Without the debug file there are no lines, and that is not an error.
    std::fs::remove_file(&debug).unwrap();
    let lines = SourceLines::load(&prog).unwrap();
    assert_eq!(lines.dwarf_file(), None);
    assert!(lines.build_id().is_some());
    assert_eq!(lines.locate(address_of(&full, "main")), None);
}

#[test]
fn bad_files_are_errors_not_panics() {
    let text = tmp("not-elf-lines.txt");
    std::fs::write(&text, "hello").unwrap();
    let e = SourceLines::load(&text).unwrap_err().to_string();
    assert!(e.contains("not an ELF file"), "{e}");
    let e = SourceLines::load(&tmp("missing")).unwrap_err().to_string();
    assert!(e.contains("cannot read"), "{e}");
}
