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

/// How the code at `f` (whose bytes start `bytes`, up to the end of its code range) uses its
/// return-address slot, in a few words, or `None` if the straight-line walk from the entry
/// finds no such use.
pub(crate) fn use_of_return_address(bytes: &[u8], f: &Function) -> Option<String> {
    let mut walk = Walk::new(f, f.address + bytes.len() as u64);
    let mut decoder = Decoder::with_ip(64, bytes, f.address, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if let Step::Done(how) = walk.step(&instr) {
            return how;
        }
    }
    None
}

/// The walk from one function's entry, fed one instruction at a time: by
/// [`use_of_return_address`], or by the module scan, which decodes the same instructions in
/// passing and so spares a big module's first analysis a second decoding of every entry.
pub(crate) struct Walk {
    address: u64,
    /// The end of the function's bytes (of its code range when its size is unknown).
    end: u64,
    sized: bool,
    /// Instructions fed so far.
    n: usize,
    /// Bytes the stack pointer is below its value at the entry (the return-address slot is at
    /// `rsp + depth`), and the same for `rbp` once it is a frame pointer.
    depth: Option<i64>,
    frame: Option<i64>,
}

/// What a walk says after an instruction.
pub(crate) enum Step {
    /// Feed it the next instruction.
    Go,
    /// The answer of [`use_of_return_address`].
    Done(Option<String>),
}

impl Walk {
    /// A walk from the entry of `f`, whose code range ends at `code_end`.
    pub(crate) fn new(f: &Function, code_end: u64) -> Walk {
        let end = if f.size > 0 { code_end.min(f.address.saturating_add(f.size)) } else { code_end };
        Walk { address: f.address, end, sized: f.size > 0, n: 0, depth: Some(0), frame: None }
    }

    /// Takes `instr`, the next instruction in address order, decoded from the bytes of the
    /// whole code range: one that runs past the function's end stops the walk, as it would
    /// not decode from the function's bytes alone.
    pub(crate) fn step(&mut self, instr: &Instruction) -> Step {
        if self.ends_before(instr.ip()) {
            return Step::Done(None);
        }
        self.n += 1;
        if !self.sized && self.n > UNSIZED_LIMIT || instr.is_invalid() || instr.next_ip() > self.end {
            return Step::Done(None);
        }
        let at = instr.ip() - self.address;
        if let Some(how) = slot_access(instr, self.depth, self.frame) {
            return Step::Done(Some(format!("{how} at +{at}")));
        }
        if self.depth == Some(0) && matches!(instr.mnemonic(), Mnemonic::Pop | Mnemonic::Popfq) {
            return Step::Done(Some(format!("pops its return address at +{at}")));
        }
        track(instr, &mut self.depth, &mut self.frame);
        let ends = matches!(
            instr.flow_control(),
            FlowControl::Return
                | FlowControl::UnconditionalBranch
                | FlowControl::IndirectBranch
                | FlowControl::Exception
                | FlowControl::Interrupt
        );
        if ends || self.depth.is_none() && self.frame.is_none() {
            return Step::Done(None);
        }
        Step::Go
    }

    /// Whether an instruction at `ip` would stop the walk, whatever it is.
    pub(crate) fn ends_before(&self, ip: u64) -> bool {
        ip >= self.end
    }
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
