//! Verdicts and relocation on a program compiled by gcc at test time, and on this test
//! executable itself, whose relocated prologues are run.

use std::path::{Path, PathBuf};
use std::process::Command;

use fnscope_abi::skip_reason;
use fnscope_symbols::Inventory;
use fnscope_x86::{
    analyze, analyze_for, analyze_on, analyze_with_kept_entries, max_relocated_len, moves_as_is, relocate,
    Hook, HookForm, ReturnAddress, Stage, Verdict,
};
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic};

/// Builds the fixture once per test process: tests run in parallel, and one reading the file
/// while another's gcc rewrites it would see a partial ELF.
fn fixture() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_fixture).clone()
}

fn build_fixture() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fnscope-x86-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("fixture");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture.c");
    let r = Command::new("gcc")
        .arg("-O2")
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(
        r.status.success(),
        "gcc failed: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    out
}

/// The fixture's bytes and inventory.
fn fixture_inventory() -> (Vec<u8>, Inventory) {
    let path = fixture();
    let data = std::fs::read(&path).unwrap();
    let inv = fnscope_symbols::load_bytes(&path, &data).unwrap();
    (data, inv)
}

fn verdict_of<'a>(inv: &Inventory, verdicts: &'a [Verdict], name: &str) -> (u64, &'a Verdict) {
    let i = inv
        .functions
        .iter()
        .position(|f| f.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{name} not found"));
    (inv.functions[i].address, &verdicts[i])
}

fn reason(v: &Verdict) -> &'static str {
    match v {
        Verdict::Skip { reason, .. } => reason,
        Verdict::Hookable(_) => "hookable",
    }
}

#[test]
fn verdicts_on_gcc_program() {
    let (data, inv) = fixture_inventory();
    let verdicts = analyze(&inv, &data);
    assert_eq!(verdicts.len(), inv.functions.len());

    let (_, v) = verdict_of(&inv, &verdicts, "normal");
    assert!(v.hook().is_some_and(|h| h.form == HookForm::Entry && h.relocate_len >= 5), "{v:?}");
    let (_, v) = verdict_of(&inv, &verdicts, "noop1");
    assert_eq!(reason(v), skip_reason::TOO_SHORT, "{v:?}");
    let (_, v) = verdict_of(&inv, &verdicts, "hot.cold");
    assert_eq!(reason(v), skip_reason::NOT_ENTRY);
    let (_, v) = verdict_of(&inv, &verdicts, "_start");
    assert_eq!(reason(v), skip_reason::NOT_ENTRY);
    assert!(verdict_of(&inv, &verdicts, "hot").1.hook().is_some());
    assert!(verdict_of(&inv, &verdicts, "main").1.hook().is_some());

    // riprel: `mov rax, [rip+counter]` (7 bytes) moved 1.5 GiB away still reads `counter`.
    let (riprel, v) = verdict_of(&inv, &verdicts, "riprel");
    assert_eq!(v.relocate_len(), Some(7));
    let counter = inv
        .functions
        .iter()
        .find(|f| f.name.as_deref() == Some("counter"));
    assert!(counter.is_none(), "data symbols are not functions");
    let bytes = &inv.code_bytes(&data, riprel).unwrap()[..7];
    let orig = Decoder::with_ip(64, bytes, riprel, DecoderOptions::NONE).decode();
    let target = orig.ip_rel_memory_address();
    for new_addr in [
        riprel + 0x6000_0000,
        riprel.wrapping_sub(0x1000).wrapping_add(0x7fff_0000),
    ] {
        let code = relocate(bytes, riprel, new_addr).unwrap();
        assert!(code.len() <= max_relocated_len(7));
        let mut d = Decoder::with_ip(64, &code, new_addr, DecoderOptions::NONE);
        let moved = d.decode();
        assert_eq!(moved.mnemonic(), Mnemonic::Mov);
        assert_eq!(moved.ip_rel_memory_address(), target);
        let back = d.decode();
        assert_eq!(back.mnemonic(), Mnemonic::Jmp);
        assert_eq!(back.near_branch_target(), riprel + 7);
    }
}

/// Whether every byte of `[from, to)` lies in a run of `nop`/`int3` instructions that starts
/// right after the end of the function before it and belongs to no function.
fn in_padding(inv: &Inventory, data: &[u8], from: u64, to: u64) -> bool {
    let i = inv.functions.partition_point(|f| f.address <= from);
    let Some(before) = i.checked_sub(1).map(|i| &inv.functions[i]) else {
        return false;
    };
    let start = before.address + before.size;
    if start > from || inv.functions.get(i).is_some_and(|next| next.address < to) {
        return false;
    }
    let bytes = inv.code_bytes(data, start).unwrap();
    let mut d = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while d.ip() < to {
        d.decode_out(&mut ins);
        if !matches!(ins.mnemonic(), Mnemonic::Nop | Mnemonic::Int3) {
            return false;
        }
    }
    true
}

#[test]
fn short_functions_use_padding() {
    let (data, inv) = fixture_inventory();
    let verdicts = analyze(&inv, &data);

    let (pad, v) = verdict_of(&inv, &verdicts, "pad_short");
    let h = v.hook().unwrap_or_else(|| panic!("pad_short: {v:?}"));
    assert_eq!((h.form, h.relocate_len), (HookForm::Padding, 4));
    assert!(in_padding(&inv, &data, pad + 4, pad + 5));
    let p = h.patches(pad, pad + 0x1000).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].address, p[0].bytes()), (pad, &[0xe9, 0xfb, 0x0f, 0, 0][..]));

    // Islands: each in free padding within reach of a jmp rel8, written before the jmp rel8.
    for (name, relocate_len) in [("packed_a", 2), ("packed_b", 3), ("loopy", 2)] {
        let (entry, v) = verdict_of(&inv, &verdicts, name);
        let h = v.hook().unwrap_or_else(|| panic!("{name}: {v:?}"));
        let HookForm::Island { island_offset } = h.form else {
            panic!("{name}: {h:?}");
        };
        assert_eq!(h.relocate_len, relocate_len, "{name}");
        let island = entry.wrapping_add_signed(i64::from(island_offset));
        assert!(in_padding(&inv, &data, island, island + 5), "{name}: island {island:#x}");
        let slot = entry + 0x10_0000;
        let p = h.patches(entry, slot).unwrap();
        assert_eq!(p[0].address, island);
        assert_eq!(p[0].bytes(), fnscope_x86::jmp_rel32(island, slot).unwrap());
        assert_eq!(p[1].address, entry);
        let short = Decoder::with_ip(64, p[1].bytes(), entry, DecoderOptions::NONE).decode();
        assert_eq!((short.len(), short.near_branch_target()), (2, island), "{name}");
    }

    // No byte of padding serves two hooks.
    let mut used: Vec<(u64, u64)> = inv
        .functions
        .iter()
        .zip(&verdicts)
        .filter_map(|(f, v)| match v.hook()?.form {
            HookForm::Island { island_offset } => {
                let at = f.address.wrapping_add_signed(i64::from(island_offset));
                Some((at, at + 5))
            }
            HookForm::Padding => Some((f.address, f.address + 5)),
            HookForm::Entry | HookForm::Borrowed { .. } => None,
        })
        .collect();
    used.sort();
    assert!(used.len() >= 4, "{used:x?}");
    assert!(used.windows(2).all(|w| w[0].1 <= w[1].0), "{used:x?}");
}

#[test]
fn short_functions_borrow_from_neighbours() {
    let (data, inv) = fixture_inventory();
    let verdicts = analyze(&inv, &data);
    // dense_big1 starts out of a jmp rel8's reach; dense_big2 right after the short ones.
    let (big2, v) = verdict_of(&inv, &verdicts, "dense_big2");
    let lender = *v.hook().unwrap_or_else(|| panic!("dense_big2: {v:?}"));
    assert_eq!(lender.form, HookForm::Entry);
    // Its jump and two islands take 15 bytes: whole instructions over them, 1+2+3+3+3+2+3.
    assert_eq!(lender.relocate_len, 17);
    let donor_index = inv.functions.iter().position(|f| f.address == big2).unwrap();
    for (name, island) in [("dense_t1", big2 + 5), ("dense_t2", big2 + 10)] {
        let (entry, v) = verdict_of(&inv, &verdicts, name);
        let h = v.hook().unwrap_or_else(|| panic!("{name}: {v:?}"));
        assert_eq!(h.relocate_len, 2, "{name}");
        let HookForm::Borrowed { island_offset, donor } = h.form else {
            panic!("{name}: {h:?}");
        };
        assert_eq!(donor, donor_index, "{name}");
        assert_eq!(entry.wrapping_add_signed(i64::from(island_offset)), island, "{name}");
        let slot = entry + 0x10_0000;
        let p = h.patches(entry, slot).unwrap();
        assert_eq!((p[0].address, p[0].stage), (island, Stage::BorrowedIsland));
        assert_eq!(p[0].bytes(), fnscope_x86::jmp_rel32(island, slot).unwrap());
        assert_eq!((p[1].address, p[1].stage), (entry, Stage::ShortJump));
        let short = Decoder::with_ip(64, p[1].bytes(), entry, DecoderOptions::NONE).decode();
        assert_eq!((short.len(), short.near_branch_target()), (2, island), "{name}");
    }
    // The other neighbour lends nothing and keeps the shortest relocation.
    let (_, v) = verdict_of(&inv, &verdicts, "dense_big1");
    assert_eq!(v.hook().map(|h| (h.form, h.relocate_len)), Some((HookForm::Entry, 6)));
    // A donor's own patch comes before the islands written into its bytes.
    assert!(Stage::Entry < Stage::BorrowedIsland && Stage::BorrowedIsland < Stage::ShortJump);
}

#[test]
fn return_address_users_are_skipped_in_timing_mode() {
    let (data, inv) = fixture_inventory();
    let timing = analyze(&inv, &data);
    let kept = analyze_for(&inv, &data, ReturnAddress::Kept);
    for (name, how) in [
        ("ra_entry", "reads or writes its return address at +0"),
        ("ra_frame", "reads or writes its return address at +13"),
        ("ra_pop", "pops its return address at +0"),
        ("caller", "reads or writes its return address at +0"),
    ] {
        let (_, v) = verdict_of(&inv, &timing, name);
        assert_eq!(
            v,
            &Verdict::Skip {
                reason: skip_reason::READS_RETURN_ADDRESS,
                detail: how.to_string()
            },
            "{name}"
        );
        let (_, v) = verdict_of(&inv, &kept, name);
        assert!(v.hook().is_some(), "{name} with the return address kept: {v:?}");
    }
    let (_, v) = verdict_of(&inv, &timing, "args_only");
    assert!(v.hook().is_some(), "args_only: {v:?}");
}

/// libffi's `ffi_call_unix64` (a local symbol, stripped in the package) is the function
/// that starts with `mov r10, [rsp]`: unix64.S copies its return address into the frame it
/// builds for the callee.
#[test]
fn libffi_call_is_skipped() {
    let path = Path::new("/usr/lib/x86_64-linux-gnu/libffi.so.8");
    let data = std::fs::read(path).expect("libffi8 is installed with python3.11");
    let inv = fnscope_symbols::load_bytes(path, &data).unwrap();
    let verdicts = analyze(&inv, &data);
    let copies_return_address = |f: &fnscope_symbols::Function| {
        let Some(bytes) = inv.code_bytes(&data, f.address) else {
            return false;
        };
        let i = Decoder::with_ip(64, bytes, f.address, DecoderOptions::NONE).decode();
        i.mnemonic() == Mnemonic::Mov
            && i.op0_register() == iced_x86::Register::R10
            && i.memory_base() == iced_x86::Register::RSP
            && i.memory_displacement64() == 0
    };
    let calls: Vec<(&fnscope_symbols::Function, &Verdict)> = inv
        .functions
        .iter()
        .zip(&verdicts)
        .filter(|(f, _)| f.entry && copies_return_address(f))
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(reason(calls[0].1), skip_reason::READS_RETURN_ADDRESS, "{calls:?}");
}

#[test]
fn python_share_of_hookable_entries() {
    let path = Path::new("/usr/bin/python3.11");
    if !path.exists() {
        return;
    }
    let data = std::fs::read(path).unwrap();
    let inv = fnscope_symbols::load_bytes(path, &data).unwrap();
    let verdicts = analyze(&inv, &data);
    let entries = inv.functions.iter().filter(|f| f.entry).count();
    let hookable = verdicts.iter().filter(|v| v.hook().is_some()).count();
    let share = hookable as f64 / entries as f64;
    // 98.1% with the 5-byte jump alone; short functions hooked through padding add 0.8%.
    assert!(share >= 0.988, "{hookable} of {entries} entries hookable");
}

#[test]
fn damaged_files_do_not_panic() {
    let path = fixture();
    let data = std::fs::read(&path).unwrap();
    let step = (data.len() / 61).max(1);
    for start in (0..data.len()).step_by(step) {
        let mut bad = data.clone();
        for b in bad.iter_mut().skip(start).take(256) {
            *b = b.wrapping_mul(31).wrapping_add(7);
        }
        if let Ok(inv) = fnscope_symbols::load_bytes(&path, &bad) {
            let v = analyze(&inv, &bad);
            assert_eq!(v.len(), inv.functions.len());
            // The inventory may now describe a different file than the bytes: no panic either.
            let _ = analyze(&inv, &data[..data.len() / 2]);
        }
    }
}

// Functions of this test executable whose prologues are relocated and run.
std::arch::global_asm!(
    ".text",
    // Displaced: the RIP-relative load (7 bytes).
    ".globl fnscope_t_rip",
    ".type fnscope_t_rip,@function",
    "fnscope_t_rip:",
    "mov rax, qword ptr [rip + {value}]",
    "add rax, rdi",
    "ret",
    ".size fnscope_t_rip, .-fnscope_t_rip",
    // Displaced: test, short jcc (to a target after the patch), mov (9 bytes).
    ".globl fnscope_t_jcc",
    ".type fnscope_t_jcc,@function",
    "fnscope_t_jcc:",
    "test edi, edi",
    "je 2f",
    "mov eax, 1",
    "ret",
    "2:",
    "mov eax, 2",
    "ret",
    ".size fnscope_t_jcc, .-fnscope_t_jcc",
    // Displaced: push and a call (6 bytes); the call must return to the original `pop`.
    ".globl fnscope_t_call",
    ".type fnscope_t_call,@function",
    "fnscope_t_call:",
    "push rbx",
    "call {inc}",
    "pop rbx",
    "ret",
    ".size fnscope_t_call, .-fnscope_t_call",
    // Displaced: lea of its own address, then a compare (10 bytes).
    ".globl fnscope_t_self",
    ".type fnscope_t_self,@function",
    "fnscope_t_self:",
    "lea rax, [rip + fnscope_t_self]",
    "cmp rdi, rax",
    "sete al",
    "movzx eax, al",
    "ret",
    ".size fnscope_t_self, .-fnscope_t_self",
    // Displaced: the whole function (4 bytes) and one byte of the padding after it.
    ".p2align 4",
    ".globl fnscope_t_short",
    ".type fnscope_t_short,@function",
    "fnscope_t_short:",
    "lea eax, [rdi + 1]",
    "ret",
    ".size fnscope_t_short, .-fnscope_t_short",
    ".p2align 4",
    value = sym FNSCOPE_T_VALUE,
    inc = sym fnscope_t_inc,
);

#[no_mangle]
static FNSCOPE_T_VALUE: u64 = 40;

extern "C" fn fnscope_t_inc(x: u64) -> u64 {
    x + 1
}

extern "C" {
    fn fnscope_t_rip(x: u64) -> u64;
    fn fnscope_t_jcc(x: u64) -> u64;
    fn fnscope_t_call(x: u64) -> u64;
    fn fnscope_t_self(x: u64) -> u64;
    fn fnscope_t_short(x: u64) -> u64;
}

/// An executable page within `±1 GiB` of `near`.
fn page_near(near: u64) -> *mut u8 {
    for k in 1..64u64 {
        for hint in [near.wrapping_sub(k << 24), near.wrapping_add(k << 24)] {
            let hint = hint & !0xfff;
            // SAFETY: an anonymous private mapping at a hint address touches no existing memory.
            let p = unsafe {
                libc::mmap(
                    hint as *mut libc::c_void,
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                continue;
            }
            if (p as u64).abs_diff(near) < 1 << 30 {
                return p as *mut u8;
            }
            // SAFETY: unmapping the page just mapped.
            unsafe { libc::munmap(p, 4096) };
        }
    }
    panic!("no free page within 1 GiB of {near:#x}");
}

#[test]
fn relocated_prologues_run() {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let data = std::fs::read(&exe).unwrap();
    let inv = fnscope_symbols::load_bytes(&exe, &data).unwrap();
    let verdicts = analyze(&inv, &data);
    type Case<'a> = (&'a str, unsafe extern "C" fn(u64) -> u64, &'a [(u64, u64)]);
    let cases: [Case<'_>; 5] = [
        ("fnscope_t_short", fnscope_t_short, &[(4, 5)]),
        ("fnscope_t_rip", fnscope_t_rip, &[(2, 42)]),
        ("fnscope_t_jcc", fnscope_t_jcc, &[(0, 2), (5, 1)]),
        ("fnscope_t_call", fnscope_t_call, &[(9, 10)]),
        (
            "fnscope_t_self",
            fnscope_t_self,
            &[
                (
                    fnscope_t_self as unsafe extern "C" fn(u64) -> u64 as usize as u64,
                    1,
                ),
                (0, 0),
            ],
        ),
    ];
    for (name, f, io) in cases {
        let (link_addr, v) = verdict_of(&inv, &verdicts, name);
        let patch_len = v.relocate_len().unwrap_or_else(|| panic!("{name}: {v:?}"));
        let run_addr = f as usize as u64;
        let bytes = &inv.code_bytes(&data, link_addr).unwrap()[..patch_len];
        let page = page_near(run_addr);
        let code = relocate(bytes, run_addr, page as u64).unwrap();
        assert!(code.len() <= max_relocated_len(patch_len) && code.len() <= 4096);
        // SAFETY: `page` is a fresh writable 4 KiB mapping, `code` fits in it; after mprotect
        // it holds the relocated prologue followed by a jump back into `f`, so calling it
        // behaves as calling `f`.
        let tramp: unsafe extern "C" fn(u64) -> u64 = unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), page, code.len());
            assert_eq!(
                libc::mprotect(page.cast(), 4096, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
            std::mem::transmute::<*mut u8, unsafe extern "C" fn(u64) -> u64>(page)
        };
        for &(input, want) in io {
            // SAFETY: see above.
            assert_eq!(unsafe { tramp(input) }, want, "{name}({input})");
            // SAFETY: the original, for comparison.
            assert_eq!(unsafe { f(input) }, want, "{name}({input}) unhooked");
        }
        // SAFETY: unmapping our own page.
        unsafe { libc::munmap(page.cast(), 4096) };
    }
}

/// Hand-made sequences: short branches widened, far targets, the size bound.
#[test]
fn relocation_edge_cases() {
    let orig = 0x7f12_3456_0000u64;
    // jrcxz, loop, jcc: every one short, to targets past the patch.
    let code = [0xe3, 0x10, 0xe2, 0x10, 0x74, 0x10];
    for new_addr in [orig + 0x10_0000, orig - 0x7000_0000, orig + (5 << 30)] {
        let out = relocate(&code, orig, new_addr).unwrap();
        assert!(
            out.len() <= max_relocated_len(code.len()),
            "{} > bound",
            out.len()
        );
        let mut d = Decoder::with_ip(64, &out, new_addr, DecoderOptions::NONE);
        let mut targets = Vec::new();
        let mut i = Instruction::default();
        while d.can_decode() {
            d.decode_out(&mut i);
            if i.is_ip_rel_memory_operand() && i.mnemonic() == Mnemonic::Jmp {
                // Far form: the absolute target is in the 8 bytes the operand points at.
                let off = (i.ip_rel_memory_address() - new_addr) as usize;
                targets.push(u64::from_le_bytes(out[off..off + 8].try_into().unwrap()));
            } else if i.op0_kind() == iced_x86::OpKind::NearBranch64 {
                targets.push(i.near_branch_target());
            }
        }
        for t in [orig + 2 + 0x10, orig + 4 + 0x10, orig + 6 + 0x10, orig + 6] {
            assert!(
                targets.contains(&t),
                "{t:#x} not reached from {new_addr:#x}: {targets:x?}"
            );
        }
    }
    // A RIP-relative operand more than 2 GiB away cannot be re-encoded.
    let mov = [0x48, 0x8b, 0x05, 0, 1, 0, 0];
    let err = relocate(&mov, orig, orig + (3 << 30)).unwrap_err();
    assert!(err.to_string().contains("within 2 GiB"), "{err}");
    // A call in the middle would return into the trampoline.
    assert!(relocate(&[0xe8, 0, 0, 0, 0, 0x90], orig, orig + 4096).is_err());
    // Cut instruction.
    assert!(relocate(&[0x48, 0x8b, 0x05, 0], orig, orig + 4096).is_err());
}

#[test]
fn jmp_rel32_range() {
    assert_eq!(
        fnscope_x86::jmp_rel32(0x1000, 0x1005),
        Some([0xe9, 0, 0, 0, 0])
    );
    assert_eq!(
        fnscope_x86::jmp_rel32(0x1005, 0x1000),
        Some([0xe9, 0xf6, 0xff, 0xff, 0xff])
    );
    assert_eq!(
        fnscope_x86::jmp_rel32(0, 0x8000_0004),
        Some([0xe9, 0xff, 0xff, 0xff, 0x7f])
    );
    assert_eq!(fnscope_x86::jmp_rel32(0, 0x8000_0005), None);
    assert_eq!(
        fnscope_x86::jmp_rel32(0x7fff_fffb, 0),
        Some([0xe9, 0, 0, 0, 0x80])
    );
    assert_eq!(fnscope_x86::jmp_rel32(0x7fff_fffc, 0), None);
    assert_eq!(
        fnscope_x86::jmp_rel32(u64::MAX - 4, 0x10),
        Some([0xe9, 0x10, 0, 0, 0])
    );
}

/// Every function found hookable in system binaries relocates 1.5 GiB away, within the
/// announced size bound, into code that decodes to the same kinds of instructions.
#[test]
fn system_functions_relocate() {
    for p in [
        "/usr/bin/python3.11",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/bin/git",
    ] {
        let path = Path::new(p);
        if !path.exists() {
            continue;
        }
        let data = std::fs::read(path).unwrap();
        let inv = fnscope_symbols::load_bytes(path, &data).unwrap();
        let verdicts = analyze(&inv, &data);
        let mut n = 0;
        for (f, v) in inv.functions.iter().zip(&verdicts) {
            let Some(len) = v.relocate_len() else { continue };
            let bytes = &inv.code_bytes(&data, f.address).unwrap()[..len];
            for new_addr in [f.address + (3 << 29), f.address.wrapping_sub(3 << 29)] {
                let out = relocate(bytes, f.address, new_addr).unwrap_or_else(|e| {
                    panic!("{p}: {} at {:#x}: {e}", f.display_name(), f.address)
                });
                assert!(
                    out.len() <= max_relocated_len(len),
                    "{p}: {}",
                    f.display_name()
                );
            }
            n += 1;
        }
        assert!(n > 1000, "{p}: only {n} hookable");
    }
}

/// The analysis on several threads (the module decoded in pieces) gives the verdicts of the
/// plain one, and so do the kept entries made along with it; prologues that move as they are relocate to their own
/// bytes and a jump back.
#[test]
fn threads_and_modes_agree() {
    for p in ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/git"] {
        let path = Path::new(p);
        if !path.exists() {
            continue;
        }
        let data = std::fs::read(path).unwrap();
        let inv = fnscope_symbols::load_bytes(path, &data).unwrap();
        let replaced = analyze_for(&inv, &data, ReturnAddress::Replaced);
        let kept = analyze_for(&inv, &data, ReturnAddress::Kept);
        let same = |a: &[Verdict], b: &[Verdict]| format!("{a:?}") == format!("{b:?}");
        assert!(same(&replaced, &analyze_on(&inv, &data, ReturnAddress::Replaced, 3)), "{p}: threads");
        assert!(same(&kept, &analyze_on(&inv, &data, ReturnAddress::Kept, 3)), "{p}: threads, kept");
        // Every function's kept entry hook, against the whole analysis with return addresses
        // kept: the same functions take one, relocating as much, except donors of islands
        // there, which relocate more.
        let donors: std::collections::HashSet<usize> = kept
            .iter()
            .filter_map(|v| match v {
                Verdict::Hookable(Hook { form: HookForm::Borrowed { donor, .. }, .. }) => Some(*donor),
                _ => None,
            })
            .collect();
        let addresses: Vec<u64> = inv.functions.iter().map(|f| f.address).collect();
        for threads in [1, 3] {
            let (r, entries) = analyze_with_kept_entries(&inv, &data, ReturnAddress::Replaced, threads, &addresses);
            assert!(same(&replaced, &r), "{p}: {threads} threads");
            for (i, ((f, e), k)) in inv.functions.iter().zip(&entries).zip(&kept).enumerate() {
                match (e, k) {
                    (None, Verdict::Hookable(Hook { form: HookForm::Entry, .. })) => panic!("{p}: {} lost its kept entry hook", f.display_name()),
                    (None, _) => {}
                    (Some(h), Verdict::Hookable(w @ Hook { form: HookForm::Entry, .. })) => {
                        let len_ok = h.relocate_len == w.relocate_len || (donors.contains(&i) && h.relocate_len < w.relocate_len);
                        assert!(h.form == HookForm::Entry && len_ok && usize::from(h.relocate_len) >= 5, "{p}: {}: {h:?} vs {w:?}", f.display_name())
                    }
                    (Some(h), _) => panic!("{p}: {} got {h:?}, the whole analysis {k:?}", f.display_name()),
                }
            }
        }
        let mut as_is = 0;
        for (f, v) in inv.functions.iter().zip(&replaced) {
            let Some(len) = v.relocate_len() else { continue };
            let bytes = &inv.code_bytes(&data, f.address).unwrap()[..len];
            if moves_as_is(bytes) {
                let new_addr = f.address + (3 << 29);
                let out = relocate(bytes, f.address, new_addr).unwrap();
                assert_eq!(&out[..len], bytes, "{p}: {}", f.display_name());
                assert_eq!(out.len(), len + 5, "{p}: {}", f.display_name());
                as_is += 1;
            }
        }
        assert!(as_is > 100, "{p}: only {as_is} prologues move as they are");
    }
}

/// Prologues whose only ties to their address are RIP-relative operands keep their length
/// when moved, and every instruction of the copy reads or writes the very address the original
/// did, and then jumps back; a `lea` of the displaced bytes themselves still becomes a constant.
#[test]
fn rip_relative_prologues_move_with_their_displacements() {
    let mut moved = 0;
    for p in ["/usr/bin/python3.11", "/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/git"] {
        let path = Path::new(p);
        if !path.exists() {
            continue;
        }
        let data = std::fs::read(path).unwrap();
        let inv = fnscope_symbols::load_bytes(path, &data).unwrap();
        for (f, v) in inv.functions.iter().zip(analyze(&inv, &data)) {
            let Some(len) = v.relocate_len() else { continue };
            let bytes = &inv.code_bytes(&data, f.address).unwrap()[..len];
            let decode = |b: &[u8], ip: u64| {
                let mut d = Decoder::with_ip(64, b, ip, DecoderOptions::NONE);
                let mut v = Vec::new();
                while d.can_decode() {
                    v.push(d.decode());
                }
                v
            };
            let orig = decode(bytes, f.address);
            let plain = orig.iter().all(|i| i.flow_control() == iced_x86::FlowControl::Next);
            let self_lea = orig.iter().any(|i| {
                i.mnemonic() == Mnemonic::Lea && i.is_ip_rel_memory_operand() && (f.address..f.address + len as u64).contains(&i.ip_rel_memory_address())
            });
            if !plain || self_lea || !orig.iter().any(|i| i.is_ip_rel_memory_operand()) {
                continue;
            }
            for new_addr in [f.address + (3 << 29), f.address.wrapping_sub(3 << 29)] {
                let out = relocate(bytes, f.address, new_addr).unwrap();
                assert_eq!(out.len(), len + 5, "{p}: {} keeps its length", f.display_name());
                let copy = decode(&out[..len], new_addr);
                assert_eq!(copy.len(), orig.len());
                for (a, b) in orig.iter().zip(&copy) {
                    assert_eq!(a.code(), b.code(), "{p}: {}", f.display_name());
                    if a.is_ip_rel_memory_operand() {
                        assert_eq!(a.ip_rel_memory_address(), b.ip_rel_memory_address(), "{p}: {}", f.display_name());
                    }
                }
                let back = decode(&out[len..], new_addr + len as u64);
                assert_eq!(back[0].near_branch_target(), f.address + len as u64);
            }
            moved += 1;
        }
    }
    assert!(moved > 100, "only {moved} prologues with RIP-relative operands");
    // `lea rax, [rip - 7]` (its own address) loads the original address as a constant.
    let orig = 0x7f12_3456_0000u64;
    let out = relocate(&[0x48, 0x8d, 0x05, 0xf9, 0xff, 0xff, 0xff], orig, orig + 4096).unwrap();
    let i = Decoder::with_ip(64, &out, orig + 4096, DecoderOptions::NONE).decode();
    assert_eq!((i.mnemonic(), i.immediate(1)), (Mnemonic::Mov, orig));
}
