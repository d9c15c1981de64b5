//! Does a function's code use its own return-address slot (read it, overwrite it, pop it or
//! take its address)? Such code misbehaves when a hook replaces the return address with the
//! exit stub's: `ffi_call_unix64` copies it into a new frame and returns from another stack
//! pointer; `__builtin_return_address(0)` (glibc's `dlsym` looking for its caller) would see
//! the stub.
//!
//! The stack pointer is followed from the entry through straight-line code (pushes, pops,
//! `sub`/`add rsp, imm`, `lea rsp, [rsp+imm]`) and through a frame pointer set by
//! `mov rbp, rsp`. Decoding goes on through conditional branches (their fall-through path
//! keeps the same stack depth) and stops at the first unconditional jump or return, whose
//! successor is reached from elsewhere with a depth this linear walk does not know.

use fnscope_symbols::Function;
use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

/// Instructions looked at when the function's size is unknown.
const UNSIZED_LIMIT: usize = 64;

/// How the code at `f` (whose bytes start `bytes`) uses its return-address slot, in a few
/// words, or `None` if the straight-line walk from the entry finds no such use.
pub(crate) fn use_of_return_address(bytes: &[u8], f: &Function) -> Option<String> {
    let len = if f.size > 0 {
        bytes.len().min(usize::try_from(f.size).unwrap_or(usize::MAX))
    } else {
        bytes.len()
    };
    let mut decoder = Decoder::with_ip(64, &bytes[..len], f.address, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    // Bytes the stack pointer is below its value at the entry (the return-address slot is at
    // `rsp + depth`), and the same for `rbp` once it is a frame pointer.
    let mut depth: Option<i64> = Some(0);
    let mut frame: Option<i64> = None;
    let mut n = 0;
    while decoder.can_decode() && (depth.is_some() || frame.is_some()) {
        n += 1;
        if f.size == 0 && n > UNSIZED_LIMIT {
            break;
        }
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            break;
        }
        let at = instr.ip() - f.address;
        if let Some(how) = slot_access(&instr, depth, frame) {
            return Some(format!("{how} at +{at}"));
        }
        if depth == Some(0) && matches!(instr.mnemonic(), Mnemonic::Pop | Mnemonic::Popfq) {
            return Some(format!("pops its return address at +{at}"));
        }
        track(&instr, &mut depth, &mut frame);
        if matches!(
            instr.flow_control(),
            FlowControl::Return
                | FlowControl::UnconditionalBranch
                | FlowControl::IndirectBranch
                | FlowControl::Exception
                | FlowControl::Interrupt
        ) {
            break;
        }
    }
    None
}

/// The explicit memory operand of `instr`, if it touches the return-address slot.
fn slot_access(instr: &Instruction, depth: Option<i64>, frame: Option<i64>) -> Option<&'static str> {
    if !(0..instr.op_count()).any(|i| instr.op_kind(i) == OpKind::Memory) {
        return None;
    }
    if instr.memory_index() != Register::None {
        return None;
    }
    let disp = instr.memory_displacement64() as i64;
    // Offset of the operand from the slot.
    let rel = match instr.memory_base() {
        Register::RSP => disp - depth?,
        Register::RBP => disp - frame?,
        _ => return None,
    };
    if instr.mnemonic() == Mnemonic::Lea {
        return (rel == 0).then_some("takes the address of its return address");
    }
    let size = instr.memory_size().size() as i64;
    if rel < 8 && rel + size > 0 {
        Some("reads or writes its return address")
    } else {
        None
    }
}

/// Follows `rsp` (`depth`) and `rbp` (`frame`) through `instr`; `None` once unknown.
fn track(instr: &Instruction, depth: &mut Option<i64>, frame: &mut Option<i64>) {
    let op0_reg = if instr.op_count() > 0 && instr.op0_kind() == OpKind::Register {
        instr.op0_register().full_register()
    } else {
        Register::None
    };
    let imm = || match instr.op1_kind() {
        OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate8 | OpKind::Immediate32 => {
            Some(instr.immediate(1) as i64)
        }
        _ => None,
    };
    let simple_mem = |base: Register| {
        instr.op1_kind() == OpKind::Memory
            && instr.memory_base() == base
            && instr.memory_index() == Register::None
    };
    match instr.mnemonic() {
        Mnemonic::Push | Mnemonic::Pushfq | Mnemonic::Pop | Mnemonic::Popfq => {
            let moved = -i64::from(instr.stack_pointer_increment());
            *depth = depth.map(|d| d + moved);
            if instr.mnemonic() == Mnemonic::Pop && op0_reg == Register::RBP {
                *frame = None;
            }
            if instr.mnemonic() == Mnemonic::Pop && op0_reg == Register::RSP {
                *depth = None;
            }
            return;
        }
        Mnemonic::Leave => {
            *depth = frame.map(|fp| fp - 8);
            *frame = None;
            return;
        }
        Mnemonic::Call => return,
        _ => {}
    }
    match (instr.code(), op0_reg) {
        (Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32, Register::RSP) => {
            *depth = depth.zip(imm()).map(|(d, i)| d + i);
        }
        (Code::Add_rm64_imm8 | Code::Add_rm64_imm32, Register::RSP) => {
            *depth = depth.zip(imm()).map(|(d, i)| d - i);
        }
        (Code::Lea_r64_m, Register::RSP) if simple_mem(Register::RSP) => {
            *depth = depth.map(|d| d - instr.memory_displacement64() as i64);
        }
        (Code::Lea_r64_m, Register::RSP) if simple_mem(Register::RBP) => {
            *depth = frame.map(|fp| fp - instr.memory_displacement64() as i64);
        }
        (Code::Mov_r64_rm64 | Code::Mov_rm64_r64, Register::RSP)
            if instr.op1_kind() == OpKind::Register && instr.op1_register() == Register::RBP =>
        {
            *depth = *frame;
        }
        (Code::Mov_r64_rm64 | Code::Mov_rm64_r64, Register::RBP)
            if instr.op1_kind() == OpKind::Register && instr.op1_register() == Register::RSP =>
        {
            *frame = *depth;
        }
        (Code::Lea_r64_m, Register::RBP) if simple_mem(Register::RSP) => {
            *frame = depth.map(|d| d - instr.memory_displacement64() as i64);
        }
        (_, Register::RSP) if writes_op0(instr) => *depth = None,
        (_, Register::RBP) if writes_op0(instr) => *frame = None,
        _ if instr.mnemonic() == Mnemonic::Enter => {
            *depth = None;
            *frame = None;
        }
        // `xchg`/`xadd` also write their second operand.
        _ if matches!(instr.mnemonic(), Mnemonic::Xchg | Mnemonic::Xadd)
            && instr.op1_kind() == OpKind::Register =>
        {
            match instr.op1_register().full_register() {
                Register::RSP => *depth = None,
                Register::RBP => *frame = None,
                _ => {}
            }
        }
        _ => {}
    }
}

/// Whether an instruction with a register first operand writes it (the few that only read
/// it are compares and tests).
fn writes_op0(instr: &Instruction) -> bool {
    !matches!(
        instr.mnemonic(),
        Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Bt | Mnemonic::Push
    )
}
