//! Copies of a block of hand-written code (the agent's entry and exit stubs) made to run at
//! another address, out of a 32-bit displacement's reach of the code and data the block
//! refers to.
//!
//! A slot can jump to a stub directly only when the stub lies within 2 GiB; the agent's
//! library lies terabytes away from a main executable, so its slots went through a thunk,
//! one taken branch more a call. A copy of the stubs beside the executable's slots takes
//! that branch away. Inside the block every relative reference stays valid as it moves
//! whole; the references that leave it are given a word of their own after the copy:
//! - `call rel32` with an address-size prefix (6 bytes: what a linker makes of `call [rip +
//!   f@GOTPCREL]` for a function of the same library) becomes `call [rip + word]`, the word
//!   holding the function's address; `call [rip + x]` reads its pointer from a word too;
//! - `lea r64, [rip + x]` becomes `mov r64, [rip + word]`, the word holding `x`;
//! - `mov r64, [rip + x]` and `cmp r64, [rip + x]` read a word holding what `x` held when the
//!   copy was made: the block may only read data that no longer changes by then (a GOT
//!   entry, a setting made once at start-up).
//!
//! Anything else that leaves the block (a jump, a 5-byte call, a store) makes the copy fail:
//! the caller keeps using the original.

use iced_x86::{Code, Decoder, DecoderOptions, OpKind};

/// Why a block of code cannot be copied to run elsewhere.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FarCopyError {
    /// The bytes are not whole valid instructions.
    #[error("invalid instruction at +{0:#x} of the block")]
    Undecodable(usize),
    /// A branch out of the block that has no indirect form of the same length.
    #[error("the branch at +{0:#x} leaves the block and has no room to go through a word")]
    Branch(usize),
    /// A RIP-relative operand out of the block in a form that cannot read a word instead.
    #[error("the instruction at +{0:#x} reaches memory outside the block in a form that cannot be redirected")]
    Memory(usize),
    /// `read` had no value for a word the block reads.
    #[error("the word at {addr:#x} that the instruction at +{at:#x} reads is not readable")]
    Unreadable {
        /// The word's address.
        addr: u64,
        /// Offset of the instruction in the block.
        at: usize,
    },
}

/// Copies `code` (linked at `from`) to run at `to`: the bytes to place at `to`, the block's
/// own followed (at the next multiple of 8) by the words its references out of the block go
/// through (see the module's documentation). `read(addr)` is the 8 bytes at `addr` that the
/// block reads from memory outside it, as they are now.
pub fn copy_far(code: &[u8], from: u64, to: u64, read: impl Fn(u64) -> Option<u64>) -> Result<Vec<u8>, FarCopyError> {
    let end = from + code.len() as u64;
    let inside = |a: u64| (from..end).contains(&a);
    let words_at = to + code.len().next_multiple_of(8) as u64;
    let mut out = code.to_vec();
    let mut words: Vec<u64> = Vec::new();
    let mut word = |v: u64| -> u64 {
        let k = words.iter().position(|&w| w == v).unwrap_or_else(|| {
            words.push(v);
            words.len() - 1
        });
        words_at + 8 * k as u64
    };
    let mut decoder = Decoder::with_ip(64, code, from, DecoderOptions::NONE);
    while decoder.can_decode() {
        let at = decoder.position();
        let ins = decoder.decode();
        if ins.is_invalid() {
            return Err(FarCopyError::Undecodable(at));
        }
        let len = ins.len();
        // The displacement of `[rip + disp32]` at `disp_at`, made to reach `target` from the copy.
        let point = |out: &mut Vec<u8>, disp_at: usize, target: u64| {
            let next = to + (at + len) as u64;
            let disp = target.wrapping_sub(next) as i64 as i32;
            out[disp_at..disp_at + 4].copy_from_slice(&disp.to_le_bytes());
        };
        let near_branch = matches!(ins.op0_kind(), OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64);
        if near_branch && !inside(ins.near_branch_target()) {
            // `addr32 call rel32`: the same six bytes hold `call [rip + disp32]`.
            if ins.code() == Code::Call_rel32_64 && len == 6 && code[at] == 0x67 && code[at + 1] == 0xe8 {
                let w = word(ins.near_branch_target());
                out[at..at + 2].copy_from_slice(&[0xff, 0x15]);
                point(&mut out, at + 2, w);
                continue;
            }
            return Err(FarCopyError::Branch(at));
        }
        if ins.is_ip_rel_memory_operand() && !inside(ins.ip_rel_memory_address()) {
            let addr = ins.ip_rel_memory_address();
            let offsets = decoder.get_constant_offsets(&ins);
            if offsets.displacement_size() != 4 {
                return Err(FarCopyError::Memory(at));
            }
            let disp_at = at + offsets.displacement_offset();
            let value = match ins.code() {
                Code::Lea_r64_m => {
                    // The ModRM byte comes right before the displacement (no SIB with RIP),
                    // the opcode right before it: 8D (lea) becomes 8B (mov r64, r/m64).
                    if out[disp_at - 2] != 0x8d {
                        return Err(FarCopyError::Memory(at));
                    }
                    out[disp_at - 2] = 0x8b;
                    addr
                }
                Code::Call_rm64 | Code::Mov_r64_rm64 | Code::Cmp_r64_rm64 => read(addr).ok_or(FarCopyError::Unreadable { addr, at })?,
                _ => return Err(FarCopyError::Memory(at)),
            };
            let w = word(value);
            point(&mut out, disp_at, w);
        }
    }
    out.resize(code.len().next_multiple_of(8), 0xcc);
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Instruction};

    fn decode(code: &[u8], ip: u64) -> Vec<Instruction> {
        Decoder::with_ip(64, code, ip, DecoderOptions::NONE).into_iter().collect()
    }

    const FROM: u64 = 0x7f00_0000_1000;
    const TO: u64 = 0x5500_0000_2000;

    /// Every kind of reference: one inside the block (kept), and the four kinds that leave it
    /// (through words), which after the copy reach what they reached before.
    #[test]
    fn references_out_of_the_block_go_through_words() {
        let fn_addr = FROM + 0x10_0000;
        let data = FROM + 0x20_0000;
        let got = FROM + 0x30_0000;
        let mut code = Vec::new();
        // +0: jne to the nop at +39 (inside)
        code.extend_from_slice(&[0x0f, 0x85, 0x21, 0, 0, 0]);
        // +6: addr32 call fn_addr
        code.extend_from_slice(&[0x67, 0xe8]);
        code.extend_from_slice(&((fn_addr as i64 - (FROM + 12) as i64) as i32).to_le_bytes());
        // +12: cmp rsi, [rip + data]
        code.extend_from_slice(&[0x48, 0x3b, 0x35]);
        code.extend_from_slice(&((data as i64 - (FROM + 19) as i64) as i32).to_le_bytes());
        // +19: lea r11, [rip + data + 8]
        code.extend_from_slice(&[0x4c, 0x8d, 0x1d]);
        code.extend_from_slice(&((data as i64 + 8 - (FROM + 26) as i64) as i32).to_le_bytes());
        // +26: call [rip + got]
        code.extend_from_slice(&[0xff, 0x15]);
        code.extend_from_slice(&((got as i64 - (FROM + 32) as i64) as i32).to_le_bytes());
        // +32: lea rcx, [rip - 32] (the block's start: inside)
        code.extend_from_slice(&[0x48, 0x8d, 0x0d]);
        code.extend_from_slice(&(-39i32).to_le_bytes());
        // +39: nop
        code.push(0x90);
        let read = |a: u64| match a {
            a if a == data => Some(77),
            a if a == got => Some(fn_addr + 0x40),
            _ => None,
        };
        let out = copy_far(&code, FROM, TO, read).unwrap();
        let words_at = TO + 40;
        let word = |a: u64| u64::from_le_bytes(out[(a - TO) as usize..][..8].try_into().unwrap());
        let ins = decode(&out[..40], TO);
        assert_eq!(ins.len(), 7);
        assert_eq!((ins[0].code(), ins[0].near_branch_target()), (Code::Jne_rel32_64, TO + 39));
        assert_eq!(ins[1].code(), Code::Call_rm64);
        assert_eq!(word(ins[1].ip_rel_memory_address()), fn_addr);
        assert_eq!((ins[2].code(), ins[2].op0_register()), (Code::Cmp_r64_rm64, iced_x86::Register::RSI));
        assert_eq!(word(ins[2].ip_rel_memory_address()), 77);
        assert_eq!((ins[3].code(), ins[3].op0_register()), (Code::Mov_r64_rm64, iced_x86::Register::R11));
        assert_eq!(word(ins[3].ip_rel_memory_address()), data + 8);
        assert_eq!(ins[4].code(), Code::Call_rm64);
        assert_eq!(word(ins[4].ip_rel_memory_address()), fn_addr + 0x40);
        assert_eq!((ins[5].code(), ins[5].ip_rel_memory_address()), (Code::Lea_r64_m, TO));
        assert_eq!(out.len(), 40 + 4 * 8, "one word per distinct value");
        for i in &ins[1..5] {
            assert!((words_at..words_at + 32).contains(&i.ip_rel_memory_address()));
        }
    }

    /// Branches and stores out of the block, 5-byte calls and unreadable words are refused.
    #[test]
    fn what_cannot_leave_the_block_is_refused() {
        let far = |code: &[u8]| copy_far(code, FROM, TO, |_| None);
        // jmp rel32 out
        assert_eq!(far(&[0xe9, 0, 0, 1, 0]), Err(FarCopyError::Branch(0)));
        // nop; call rel32 out (5 bytes)
        assert_eq!(far(&[0x90, 0xe8, 0, 0, 1, 0]), Err(FarCopyError::Branch(1)));
        // mov [rip + x], rax
        assert_eq!(far(&[0x48, 0x89, 0x05, 0, 0, 1, 0]), Err(FarCopyError::Memory(0)));
        // mov rax, [rip + x] with nothing to read there
        assert_eq!(far(&[0x48, 0x8b, 0x05, 0, 0, 1, 0]), Err(FarCopyError::Unreadable { addr: FROM + 7 + 0x10000, at: 0 }));
        // push es: not an instruction in 64-bit mode
        assert_eq!(far(&[0x06]), Err(FarCopyError::Undecodable(0)));
    }
}
