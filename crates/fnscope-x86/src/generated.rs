//! Hookability of code generated at run time (a JIT's output), which has no ELF file, no
//! symbols and no padding the analysis could prove dead: only the entry form is offered.

use crate::padding::is_near_branch;
use crate::{displace, hookable, retaddr, skip, HookForm, ReturnAddress, Verdict, JMP_LEN, MAX_PATCH_LEN};
use fnscope_abi::skip_reason;
use fnscope_symbols::{Function, SymSource};
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic};

/// Decides whether the generated function whose whole code is `code`, at run-time address
/// `address`, can take a `jmp rel32` at its entry, for a hook that does `ra` with its return
/// address.
///
/// The function's own code is decoded from its start to its end to find branches and `lea`s
/// into the bytes the jump would overwrite; a JIT calls other code only at its entry, so
/// nothing outside the function needs looking at. Bytes that do not decode (data a JIT puts
/// after the code) end the scan: what follows them is not code.
pub fn analyze_code(code: &[u8], address: u64, ra: ReturnAddress) -> Verdict {
    let f = Function {
        name: None,
        address,
        size: code.len() as u64,
        entry: true,
        not_entry_why: None,
        source: SymSource::EhFrame,
        has_cfi: true,
    };
    if code.len() < JMP_LEN {
        return skip(skip_reason::TOO_SHORT, format!("{} bytes", code.len()));
    }
    if ra == ReturnAddress::Replaced {
        if let Some(how) = retaddr::use_of_return_address(code, &f) {
            return skip(skip_reason::READS_RETURN_ADDRESS, how);
        }
    }
    let head = &code[..code.len().min(MAX_PATCH_LEN)];
    let len = match displace(head, &f, JMP_LEN) {
        Ok(d) => d.len,
        Err((reason, detail)) => return skip(reason, detail),
    };
    // Like the module analysis, any target inside the moved instructions is refused, not only
    // inside the overwritten bytes.
    let moved_end = address + len as u64;
    let (inside_lo, inside_hi) = (address + 1, moved_end);
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            break;
        }
        let target = if is_near_branch(&instr) {
            Some(instr.near_branch_target())
        } else if instr.mnemonic() == Mnemonic::Lea && instr.is_ip_rel_memory_operand() {
            Some(instr.ip_rel_memory_address())
        } else {
            None
        };
        let from_moved = instr.ip() >= address && instr.ip() < moved_end;
        if let Some(t) = target.filter(|&t| t >= inside_lo && t < inside_hi && !from_moved) {
            return skip(
                skip_reason::BRANCH_INTO_PATCH,
                format!("branch from {:#x} into +{}", instr.ip(), t - address),
            );
        }
    }
    hookable(len, HookForm::Entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_prologue_takes_an_entry_jump() {
        // sub rsp, 0x18; mov [rsp+8], rbx; ... ret
        let code = [0x48, 0x83, 0xec, 0x18, 0x48, 0x89, 0x5c, 0x24, 0x08, 0x48, 0x83, 0xc4, 0x18, 0xc3];
        match analyze_code(&code, 0x1000, ReturnAddress::Replaced) {
            Verdict::Hookable(h) => assert_eq!((h.relocate_len, h.form), (9, HookForm::Entry)),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_loop_back_into_the_entry_is_refused() {
        // push rbp; mov rbp, rsp; nop; nop; jmp -> +1 (into the overwritten bytes)
        let code = [0x55, 0x48, 0x89, 0xe5, 0x90, 0x90, 0xeb, 0xf9];
        let v = analyze_code(&code, 0x1000, ReturnAddress::Kept);
        assert!(matches!(v, Verdict::Skip { reason, .. } if reason == skip_reason::BRANCH_INTO_PATCH), "{v:?}");
    }

    #[test]
    fn code_shorter_than_the_jump_is_refused() {
        let v = analyze_code(&[0x90, 0xc3], 0x1000, ReturnAddress::Kept);
        assert!(matches!(v, Verdict::Skip { reason, .. } if reason == skip_reason::TOO_SHORT), "{v:?}");
    }
}
