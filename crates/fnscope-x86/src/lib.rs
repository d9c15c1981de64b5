//! x86-64 code analysis for inline hooks: which functions can take a 5-byte `jmp rel32` at
//! their entry, and the relocation of the instructions that jump displaces.
//!
//! A function is hookable when the whole instructions covering its first 5 bytes can run
//! elsewhere (in a trampoline) unchanged in effect, and nothing else in the module branches
//! into the middle of those bytes, which the jump overwrites.

use fnscope_abi::skip_reason;
use fnscope_symbols::{strip_version, Function, Inventory};
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, MemoryOperand, Mnemonic, OpKind, Register,
};

/// Bytes of the `jmp rel32` written at a hooked function's entry.
pub const JMP_LEN: usize = 5;

/// Longest possible patch: 4 bytes of whole instructions, then one of up to 15 bytes.
pub const MAX_PATCH_LEN: usize = JMP_LEN - 1 + 15;

/// What [`analyze`] decided for one function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The function can be hooked by overwriting its first `patch_len` bytes (whole
    /// instructions, at least 5) and relocating them into a trampoline.
    Hookable {
        /// Bytes to displace: pass exactly these to [`relocate`].
        patch_len: u8,
    },
    /// The function must not be hooked.
    Skip {
        /// One of the `fnscope_abi::skip_reason` codes.
        reason: &'static str,
        /// Specifics for the user (which instruction, which branch).
        detail: String,
    },
}

impl Verdict {
    /// The patch length if the function is hookable.
    pub fn patch_len(&self) -> Option<usize> {
        match self {
            Verdict::Hookable { patch_len } => Some(usize::from(*patch_len)),
            Verdict::Skip { .. } => None,
        }
    }
}

/// Functions that do not tolerate a replaced return address, with why: they return twice,
/// switch stacks, or are entered without a normal call frame.
const DENYLIST: &[(&str, &str)] = &[
    ("setjmp", "returns twice"),
    ("_setjmp", "returns twice"),
    ("__setjmp", "returns twice"),
    ("sigsetjmp", "returns twice"),
    ("__sigsetjmp", "returns twice"),
    ("vfork", "returns twice on a shared stack"),
    ("__vfork", "returns twice on a shared stack"),
    ("getcontext", "returns twice"),
    ("__getcontext", "returns twice"),
    ("swapcontext", "switches stacks"),
    ("__swapcontext", "switches stacks"),
    ("setcontext", "switches stacks"),
    ("__setcontext", "switches stacks"),
    ("makecontext", "prepares a stack switch"),
    ("__makecontext", "prepares a stack switch"),
    ("__start_context", "runs without a caller"),
    ("clone", "the child returns on a new stack"),
    ("__clone", "the child returns on a new stack"),
    ("__clone3", "the child returns on a new stack"),
    ("__clone_internal", "the child returns on a new stack"),
    (
        "__tls_get_addr",
        "called by TLS code sequences with an unusual stack",
    ),
    ("__restore_rt", "signal return trampoline"),
    ("_start", "program entry, no caller"),
    ("__morestack", "switches stacks"),
];

/// `_dl_runtime_resolve*` and `_dl_runtime_profile*` are entered from PLT stubs with extra
/// words on the stack.
const DENY_PREFIXES: &[(&str, &str)] = &[
    (
        "_dl_runtime_resolve",
        "entered from the PLT with extra words on the stack",
    ),
    (
        "_dl_runtime_profile",
        "entered from the PLT with extra words on the stack",
    ),
];

fn denied(name: &str) -> Option<&'static str> {
    let base = strip_version(name);
    DENYLIST
        .iter()
        .find(|(n, _)| *n == base)
        .or_else(|| DENY_PREFIXES.iter().find(|(p, _)| base.starts_with(p)))
        .map(|(_, why)| *why)
}

fn skip(reason: &'static str, detail: String) -> Verdict {
    Verdict::Skip { reason, detail }
}

/// Decides, for every function of `inv.functions` (same order), whether it can be hooked.
///
/// `data` is the file's contents, as given to `fnscope_symbols::load_bytes`. Besides looking
/// at each function's first instructions, this decodes all code of the file once to find
/// direct branches (and `lea` address computations) that land inside another function's
/// patch.
pub fn analyze(inv: &Inventory, data: &[u8]) -> Vec<Verdict> {
    let mut verdicts: Vec<Verdict> = inv
        .functions
        .iter()
        .map(|f| local_verdict(inv, data, f))
        .collect();
    mark_branches_into_patches(inv, data, &mut verdicts);
    verdicts
}

/// The verdict from the function's own first instructions.
fn local_verdict(inv: &Inventory, data: &[u8], f: &Function) -> Verdict {
    if !f.entry {
        let why = f.not_entry_why.unwrap_or("not a function entry");
        return skip(skip_reason::NOT_ENTRY, why.to_string());
    }
    if let Some(why) = f.name.as_deref().and_then(denied) {
        return skip(skip_reason::DENYLIST, why.to_string());
    }
    if f.size < JMP_LEN as u64 {
        return skip(skip_reason::TOO_SHORT, format!("{} bytes", f.size));
    }
    let Some(bytes) = inv.code_bytes(data, f.address) else {
        return skip(
            skip_reason::NOT_CODE,
            "not in an executable section of the file".to_string(),
        );
    };
    let bytes = &bytes[..bytes.len().min(MAX_PATCH_LEN)];
    let mut decoder = Decoder::with_ip(64, bytes, f.address, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    let mut covered = 0usize;
    let mut boundaries = [0u64; JMP_LEN];
    let mut count = 0;
    let mut branch_targets = [(0u64, 0usize); JMP_LEN];
    let mut nbranch = 0;
    while covered < JMP_LEN {
        if !decoder.can_decode() {
            return skip(
                skip_reason::TOO_SHORT,
                format!("code ends {covered} bytes into the function"),
            );
        }
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return skip(
                skip_reason::UNDECODABLE,
                format!("invalid instruction at +{covered}"),
            );
        }
        let offset = covered;
        covered += instr.len();
        boundaries[count] = instr.ip();
        count += 1;
        if covered as u64 > f.size {
            return skip(
                skip_reason::TOO_SHORT,
                format!(
                    "the first whole instructions take {covered} bytes, the function only {}",
                    f.size
                ),
            );
        }
        match instr.flow_control() {
            // relocate() turns a call that ends the patch into push + jmp, so that it returns
            // to the original code; any other call would return into the trampoline.
            FlowControl::Call | FlowControl::IndirectCall
                if is_call(&instr) && (covered < JMP_LEN || !call_is_movable(&instr)) =>
            {
                return skip(
                    skip_reason::CALL_IN_PATCH,
                    format!("{} at +{offset}", mnemonic(&instr)),
                );
            }
            _ => {}
        }
        if is_near_branch(&instr) {
            branch_targets[nbranch] = (instr.near_branch_target(), offset);
            nbranch += 1;
        }
    }
    let end = f.address + covered as u64;
    if let Some(offset) = rip_relative_into(bytes, f.address, end) {
        return skip(
            skip_reason::UNRELOCATABLE,
            format!("RIP-relative operand at +{offset} refers to the patch itself"),
        );
    }
    // A branch within the displaced bytes is re-targeted to the relocated copy only if it lands
    // on one of the relocated instructions; anywhere else inside would run overwritten bytes.
    for &(t, offset) in &branch_targets[..nbranch] {
        if t > f.address && t < end && !boundaries[..count].contains(&t) {
            return skip(
                skip_reason::UNRELOCATABLE,
                format!(
                    "branch at +{offset} into the middle of an instruction at +{}",
                    t - f.address
                ),
            );
        }
    }
    let patch = &bytes[..covered];
    if let Err(e) = relocate(patch, f.address, f.address) {
        return skip(skip_reason::UNRELOCATABLE, e.to_string());
    }
    Verdict::Hookable {
        patch_len: covered as u8,
    }
}

/// Offset of the first instruction in `[start, end)` that accesses memory inside
/// `[start, end)` RIP-relatively: after relocation it would see the trampoline's copy.
/// (`lea` only computes the address, which [`relocate`] keeps.)
fn rip_relative_into(bytes: &[u8], start: u64, end: u64) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() && decoder.ip() < end {
        decoder.decode_out(&mut instr);
        if instr.is_ip_rel_memory_operand() && instr.mnemonic() != Mnemonic::Lea {
            let t = instr.ip_rel_memory_address();
            if t >= start && t < end {
                return Some(instr.ip() - start);
            }
        }
    }
    None
}

/// A real call (iced also files `syscall` and `int n` under call flow, which return to the
/// next instruction without leaving a return address on the stack).
fn is_call(instr: &Instruction) -> bool {
    instr.mnemonic() == Mnemonic::Call
}

/// Whether a call can become `push <return address>; jmp <same target>`: a direct call, or
/// an indirect one whose operand does not depend on `rsp` (which the push moves).
fn call_is_movable(instr: &Instruction) -> bool {
    match instr.code() {
        Code::Call_rel32_64 => true,
        Code::Call_rm64 => {
            if instr.op0_kind() == OpKind::Register {
                instr.op0_register() != Register::RSP
            } else {
                instr.memory_base() != Register::RSP && instr.memory_index() != Register::RSP
            }
        }
        _ => false,
    }
}

fn mnemonic(instr: &Instruction) -> String {
    format!("{:?}", instr.mnemonic()).to_lowercase()
}

fn is_near_branch(instr: &Instruction) -> bool {
    matches!(
        instr.op0_kind(),
        OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
    )
}

/// Decodes all code once and turns hookable functions into `BRANCH_INTO_PATCH` when a direct
/// branch, or a `lea` of a code address, lands strictly inside their patch.
///
/// The sweep is linear within each executable section and resynchronises at every function
/// start and one byte after undecodable bytes, so data or padding between functions cannot
/// hide the instructions that follow.
fn mark_branches_into_patches(inv: &Inventory, data: &[u8], verdicts: &mut [Verdict]) {
    // (start, end of patch, index) of hookable functions, sorted by start.
    let patches: Vec<(u64, u64, usize)> = inv
        .functions
        .iter()
        .zip(verdicts.iter())
        .enumerate()
        .filter_map(|(i, (f, v))| v.patch_len().map(|p| (f.address, f.address + p as u64, i)))
        .collect();
    if patches.is_empty() {
        return;
    }
    let starts: Vec<u64> = inv.functions.iter().map(|f| f.address).collect();
    let mut hits: Vec<(usize, u64, u64, bool)> = Vec::new();
    let mut instr = Instruction::default();
    for range in &inv.code {
        let Some(bytes) = inv.code_bytes(data, range.address) else {
            continue;
        };
        let base = range.address;
        let end = base + bytes.len() as u64;
        let mut decoder = Decoder::with_ip(64, bytes, base, DecoderOptions::NONE);
        let mut k = starts.partition_point(|&s| s < base);
        while decoder.can_decode() {
            let ip = decoder.ip();
            if k < starts.len() && starts[k] <= ip {
                let s = starts[k];
                k += 1;
                if s < ip && s < end {
                    // The previous instruction ran over a function start: decode from there.
                    reposition(&mut decoder, base, s);
                    continue;
                }
            }
            decoder.decode_out(&mut instr);
            if instr.is_invalid() {
                reposition(&mut decoder, base, ip + 1);
                continue;
            }
            let (target, is_lea) = if is_near_branch(&instr) {
                (instr.near_branch_target(), false)
            } else if instr.mnemonic() == Mnemonic::Lea && instr.is_ip_rel_memory_operand() {
                (instr.ip_rel_memory_address(), true)
            } else {
                continue;
            };
            let j = patches.partition_point(|p| p.0 < target);
            if j == 0 {
                continue;
            }
            let (fstart, pend, idx) = patches[j - 1];
            // Branches from inside the patch itself move with it (see `local_verdict`).
            if target < pend && !(ip >= fstart && ip < pend) {
                hits.push((idx, ip, target - fstart, is_lea));
            }
        }
    }
    for (idx, src, into, is_lea) in hits {
        if verdicts[idx].patch_len().is_some() {
            let what = if is_lea {
                "address taken by lea"
            } else {
                "branch"
            };
            verdicts[idx] = skip(
                skip_reason::BRANCH_INTO_PATCH,
                format!("{what} from {src:#x} into +{into}"),
            );
        }
    }
}

fn reposition(decoder: &mut Decoder<'_>, base: u64, ip: u64) {
    // Positions come from addresses inside the decoder's own slice, so this cannot fail; if it
    // did, the decoder would simply stop at its end.
    if decoder.set_position((ip - base) as usize).is_err() {
        let _ = decoder.set_position(0);
    }
    decoder.set_ip(ip);
}

/// Why [`relocate`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RelocError {
    /// The bytes are not whole valid instructions.
    #[error("invalid instruction at +{offset} of the bytes to relocate; hook only functions that analyze() found hookable")]
    Undecodable {
        /// Offset of the bad instruction.
        offset: usize,
    },
    /// The last instruction runs past the given bytes.
    #[error("the last instruction to relocate runs past the {len} given bytes; pass exactly the patch_len bytes that analyze() gave")]
    PartialInstruction {
        /// Bytes given.
        len: usize,
    },
    /// A call that does not end the bytes, or whose operand depends on `rsp`: it would
    /// return into the trampoline, or call the wrong place.
    #[error("the call at +{offset} cannot be relocated (it must be the last displaced instruction and not use rsp); hook only functions that analyze() found hookable")]
    Call {
        /// Offset of the call.
        offset: usize,
    },
    /// The encoder refused, typically for a RIP-relative operand more than 2 GiB from the new
    /// place.
    #[error("cannot re-encode the displaced instructions at {new_addr:#x}: {msg}; put the trampoline within 2 GiB of the function")]
    Encode {
        /// Where the instructions were to go.
        new_addr: u64,
        /// What the encoder said.
        msg: String,
    },
    /// The output exceeds [`max_relocated_len`] (never expected; the bound is checked so that
    /// trampoline layout cannot overflow).
    #[error(
        "relocated code is {len} bytes, more than the {max} reserved; please report this as a bug"
    )]
    TooLong {
        /// Output size.
        len: usize,
        /// The bound.
        max: usize,
    },
}

/// Original-address tag of the return-address slot that [`relocate`] emits for a call: an
/// address no branch can have as target, so the encoder re-targets only the `push` to it.
const RET_SLOT_IP: u64 = u64::MAX - 7;

/// Re-encodes the whole instructions in `code` (found at `orig_addr`) to run at `new_addr`,
/// followed by a jump back to `orig_addr + code.len()`.
///
/// RIP-relative operands and relative branches keep their absolute targets; a branch to one
/// of the relocated instructions goes to its copy. A call, allowed only as the last
/// instruction, becomes `push <orig_addr + code.len()>; jmp <target>` so that it returns to
/// the original code (no jump back is needed then). Short branches are widened, and branches
/// that cannot reach their target with a 32-bit displacement become `jmp [rip+x]` with an
/// absolute address. A RIP-relative memory operand more than 2 GiB from `new_addr` is an
/// error. The output is never longer than [`max_relocated_len`]`(code.len())`.
pub fn relocate(code: &[u8], orig_addr: u64, new_addr: u64) -> Result<Vec<u8>, RelocError> {
    let mut decoder = Decoder::with_ip(64, code, orig_addr, DecoderOptions::NONE);
    let mut instrs = Vec::with_capacity(JMP_LEN + 1);
    while decoder.can_decode() {
        let offset = decoder.position();
        let instr = decoder.decode();
        if instr.is_invalid() {
            return Err(
                if decoder.last_error() == iced_x86::DecoderError::NoMoreBytes {
                    RelocError::PartialInstruction { len: code.len() }
                } else {
                    RelocError::Undecodable { offset }
                },
            );
        }
        instrs.push(instr);
    }
    let back = orig_addr.wrapping_add(code.len() as u64);
    let encode_err = |e: iced_x86::IcedError| RelocError::Encode {
        new_addr,
        msg: e.to_string(),
    };
    for instr in instrs.iter_mut() {
        if instr.mnemonic() == Mnemonic::Lea && instr.is_ip_rel_memory_operand() {
            // The encoder would point a `lea` of one of the relocated instructions at its copy,
            // but the code wants the original address (typically the function's own, to
            // compare with a pointer), so load it as a constant instead.
            let target = instr.ip_rel_memory_address();
            if target >= orig_addr && target < back {
                let reg = instr.op0_register();
                let mut mov = match instr.code() {
                    Code::Lea_r64_m => Instruction::with2(Code::Mov_r64_imm64, reg, target),
                    Code::Lea_r32_m => Instruction::with2(Code::Mov_r32_imm32, reg, target as u32),
                    _ => Instruction::with2(Code::Mov_r16_imm16, reg, target as u16 as u32),
                }
                .map_err(encode_err)?;
                mov.set_ip(instr.ip());
                *instr = mov;
            }
        }
    }
    if let Some(i) = instrs.iter().position(is_call) {
        if i + 1 != instrs.len() || !call_is_movable(&instrs[i]) {
            return Err(RelocError::Call {
                offset: (instrs[i].ip() - orig_addr) as usize,
            });
        }
        // The call becomes `push [rip+ret]; jmp target; ret: dq back`, so that the callee
        // returns to the original code after the patch, where unwinders find the function's
        // own call frame information.
        let call = instrs[i];
        let mut push = Instruction::with1(
            Code::Push_rm64,
            MemoryOperand::with_base_displ(Register::RIP, RET_SLOT_IP as i64),
        )
        .map_err(encode_err)?;
        push.set_ip(call.ip());
        let mut jmp = if call.code() == Code::Call_rel32_64 {
            Instruction::with_branch(Code::Jmp_rel32_64, call.near_branch_target())
                .map_err(encode_err)?
        } else {
            let mut j = call;
            j.set_code(Code::Jmp_rm64);
            j
        };
        // IP 0 keeps it out of the encoder's table of branch targets.
        jmp.set_ip(0);
        let mut slot = Instruction::with_declare_qword_1(back);
        slot.set_ip(RET_SLOT_IP);
        instrs[i] = push;
        instrs.push(jmp);
        instrs.push(slot);
    } else {
        let mut jmp = Instruction::with_branch(Code::Jmp_rel32_64, back).map_err(encode_err)?;
        // Not `back`: the encoder would take the jump for a branch target at that IP and
        // aim it at itself.
        jmp.set_ip(0);
        instrs.push(jmp);
    }
    let block = InstructionBlock::new(&instrs, new_addr);
    let out = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map_err(encode_err)?
        .code_buffer;
    let max = max_relocated_len(code.len());
    if out.len() > max {
        return Err(RelocError::TooLong {
            len: out.len(),
            max,
        });
    }
    Ok(out)
}

/// Upper bound of [`relocate`]'s output for `patch_len` displaced bytes, for laying out
/// trampolines before relocating: `10 * patch_len + 16`.
///
/// Only relative branches grow (each at least 2 bytes long): the worst, a 2-byte `loop` or
/// `jrcxz` to a far target, becomes `loop; jmp short; jmp [rip]` plus an 8-byte address, 18
/// bytes, so 9 bytes per displaced byte suffice; the jump back takes 14 bytes at most.
pub fn max_relocated_len(patch_len: usize) -> usize {
    10 * patch_len + 16
}

/// The 5-byte `jmp rel32` placed at `from` that jumps to `to`, or `None` if `to` is beyond
/// the reach of a 32-bit displacement.
pub fn jmp_rel32(from: u64, to: u64) -> Option<[u8; 5]> {
    let disp = i32::try_from(to.wrapping_sub(from.wrapping_add(5)) as i64).ok()?;
    let d = disp.to_le_bytes();
    Some([0xe9, d[0], d[1], d[2], d[3]])
}
