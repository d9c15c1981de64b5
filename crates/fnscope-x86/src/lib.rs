//! x86-64 code analysis for inline hooks: which functions can take a jump to a trampoline at
//! their entry, in which form, and the relocation of the instructions that jump displaces.
//!
//! The usual form is a 5-byte `jmp rel32` over the first whole instructions, which run
//! elsewhere (in a trampoline) unchanged in effect; nothing else in the module may branch
//! into the middle of those bytes. A function shorter than that jump, or one that other code
//! branches into, can still be hooked through alignment padding that no code reaches, or
//! through bytes a neighbour's hook leaves dead: see [`HookForm`].

mod generated;
mod padding;
mod retaddr;

use fnscope_abi::skip_reason;
use fnscope_symbols::{strip_version, Function, Inventory};
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, MemoryOperand, Mnemonic, OpKind, Register,
};
pub use fnscope_symbols::parallel_runs;
pub use generated::analyze_code;
use padding::{is_near_branch, is_terminator, Module, RefKind};

/// Bytes of the `jmp rel32` written at a hooked function's entry (or in its island).
pub const JMP_LEN: usize = 5;

/// Bytes of the `jmp rel8` written at the entry of a function hooked through an island.
pub const SHORT_JMP_LEN: usize = 2;

/// Islands one function lends at most: each makes it relocate 5 more bytes of its prologue.
pub const MAX_LENT: usize = 2;

/// Longest possible relocation: that of a function lending [`MAX_LENT`] islands, whole
/// instructions covering its jump and the islands, the last of up to 15 bytes.
pub const MAX_PATCH_LEN: usize = JMP_LEN * (1 + MAX_LENT) - 1 + 15;

/// How a hook's jump reaches the trampoline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookForm {
    /// A `jmp rel32` over the first `relocate_len` (at least 5) bytes, whole instructions.
    Entry,
    /// The function is shorter than 5 bytes and ends with `ret` or `jmp`: the `jmp rel32`
    /// covers all of it (`relocate_len` bytes) and the first bytes of the free padding after
    /// it.
    Padding,
    /// A `jmp rel8` over the first 2 bytes of the entry goes to a `jmp rel32` placed in free
    /// padding `island_offset` bytes away; the whole instructions covering those 2 bytes
    /// (`relocate_len`) are relocated, and the bytes after the first 2 are left as they are.
    Island {
        /// Distance from the entry to the island (the 5-byte jump), in bytes.
        island_offset: i16,
    },
    /// As [`HookForm::Island`], but the island is 5 bytes after the entry jump of the
    /// neighbouring function `donor`, whose hook relocates enough of its prologue that these
    /// are never run. Hook this function only if `donor` is hooked, and write the island only
    /// after the donor's entry jump.
    Borrowed {
        /// Distance from the entry to the island, in bytes.
        island_offset: i16,
        /// Index of the lending function in the inventory's functions.
        donor: usize,
    },
}

/// How to hook one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hook {
    /// Bytes of whole instructions at the entry that run in the trampoline: pass exactly
    /// these to [`relocate`].
    pub relocate_len: u8,
    /// Where the jumps go.
    pub form: HookForm,
}

impl Hook {
    /// `entry`, `padding` or `island`, for listings.
    pub fn form_name(&self) -> &'static str {
        match self.form {
            HookForm::Entry => "entry",
            HookForm::Padding => "padding",
            HookForm::Island { .. } => "island",
            HookForm::Borrowed { .. } => "borrowed",
        }
    }

    /// How the hook is made, in a few words, for listings.
    pub fn describe(&self) -> String {
        match self.form {
            HookForm::Entry => format!("jmp over {} bytes", self.relocate_len),
            HookForm::Padding => {
                let n = JMP_LEN - usize::from(self.relocate_len);
                let s = if n == 1 { "" } else { "s" };
                format!("jmp over the whole function and {n} byte{s} of padding")
            }
            HookForm::Island { island_offset } => {
                format!("jmp rel8 to a jmp in padding at {island_offset:+}")
            }
            HookForm::Borrowed { island_offset, .. } => {
                format!("jmp rel8 to a jmp in a hooked neighbour's moved bytes at {island_offset:+}")
            }
        }
    }

    /// The bytes to write for a function whose entry is at `entry` (run-time address) and
    /// whose trampoline starts at `slot`, each with the [`Stage`] it is written in. `None` if
    /// `slot` is beyond the reach of a `jmp rel32`.
    pub fn patches(&self, entry: u64, slot: u64) -> Option<Vec<Patch>> {
        let mut v = Vec::with_capacity(2);
        self.patches_into(entry, slot, &mut v).then_some(v)
    }

    /// [`Hook::patches`] appended to `out` (nothing appended and `false` when out of reach):
    /// start-up builds tens of thousands, without a vector each.
    pub fn patches_into(&self, entry: u64, slot: u64, out: &mut Vec<Patch>) -> bool {
        let (island_offset, island_stage) = match self.form {
            HookForm::Entry | HookForm::Padding => {
                let Some(jmp) = jmp_rel32(entry, slot) else { return false };
                out.push(Patch::new(entry, &jmp, Stage::Entry));
                return true;
            }
            HookForm::Island { island_offset } => (island_offset, Stage::Island),
            HookForm::Borrowed { island_offset, .. } => (island_offset, Stage::BorrowedIsland),
        };
        let island = entry.wrapping_add_signed(i64::from(island_offset));
        let disp = island.wrapping_sub(entry.wrapping_add(SHORT_JMP_LEN as u64)) as i64;
        let (Ok(disp), Some(jmp)) = (i8::try_from(disp), jmp_rel32(island, slot)) else { return false };
        out.push(Patch::new(island, &jmp, island_stage));
        out.push(Patch::new(entry, &[0xeb, disp as u8], Stage::ShortJump));
        true
    }
}

/// When a patch is written: every patch of a stage before any of the next, and a function's
/// later patches only if its earlier ones (and its donor's entry jump) were written. Thus no
/// `jmp rel8` ever leads to an island not yet written, and no island is written into a
/// neighbour's first bytes while they can still run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// An island in free padding.
    Island,
    /// A `jmp rel32` at a function's entry.
    Entry,
    /// An island in bytes a donor's entry jump made dead.
    BorrowedIsland,
    /// The `jmp rel8` at the entry of a function hooked through an island.
    ShortJump,
}

/// Bytes to write at one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patch {
    /// Where (run-time address).
    pub address: u64,
    /// When.
    pub stage: Stage,
    len: u8,
    bytes: [u8; JMP_LEN],
}

impl Patch {
    fn new(address: u64, bytes: &[u8], stage: Stage) -> Patch {
        let mut b = [0u8; JMP_LEN];
        b[..bytes.len()].copy_from_slice(bytes);
        Patch {
            address,
            stage,
            len: bytes.len() as u8,
            bytes: b,
        }
    }

    /// The bytes (2 or 5).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// What [`analyze`] decided for one function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The function can be hooked.
    Hookable(Hook),
    /// The function must not be hooked.
    Skip {
        /// One of the `fnscope_abi::skip_reason` codes.
        reason: &'static str,
        /// Specifics for the user (which instruction, which branch).
        detail: String,
    },
}

impl Verdict {
    /// The hook if the function is hookable.
    pub fn hook(&self) -> Option<&Hook> {
        match self {
            Verdict::Hookable(h) => Some(h),
            Verdict::Skip { .. } => None,
        }
    }

    /// The bytes to relocate if the function is hookable.
    pub fn relocate_len(&self) -> Option<usize> {
        self.hook().map(|h| usize::from(h.relocate_len))
    }
}

/// What the hook will do with the function's return address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnAddress {
    /// Replaced by the exit stub's address while the function runs (timing mode): functions
    /// that use their return-address slot are skipped.
    Replaced,
    /// Left alone (count mode, pre-hooks).
    Kept,
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

/// Decides, for every function of `inv.functions` (same order), whether and how it can be
/// hooked by a hook that replaces its return address (timing mode); see [`analyze_for`].
pub fn analyze(inv: &Inventory, data: &[u8]) -> Vec<Verdict> {
    analyze_for(inv, data, ReturnAddress::Replaced)
}

/// Decides, for every function of `inv.functions` (same order), whether and how it can be
/// hooked by a hook that does `ra` with its return address.
///
/// `data` is the file's contents, as given to `fnscope_symbols::load_bytes`. Besides looking
/// at each function's first instructions, this decodes all code of the file once to find
/// direct branches, `lea` address computations and RIP-relative accesses that land inside
/// another function's first bytes or in padding, and the padding no code can reach.
///
/// The [`HookForm::Entry`] form is preferred; a function that cannot take it gets the
/// [`HookForm::Padding`] form if the padding right after it allows, else an island in
/// padding within reach of a `jmp rel8`. Each byte of padding serves one hook.
pub fn analyze_for(inv: &Inventory, data: &[u8], ra: ReturnAddress) -> Vec<Verdict> {
    analyze_on(inv, data, ra, 1)
}

/// [`analyze_for`] on up to `threads` threads: the same verdicts, sooner for a big module.
pub fn analyze_on(inv: &Inventory, data: &[u8], ra: ReturnAddress, threads: usize) -> Vec<Verdict> {
    let module = Module::scan(inv, data, MAX_PATCH_LEN as u64, threads, ra == ReturnAddress::Replaced);
    verdicts_for(inv, data, ra, module, threads)
}

/// [`analyze_on`] in mode `ra`, and for each function at the link-time `entries` the hook
/// its entry can take with its return address kept (`None` if it cannot), decoding the module
/// once: a program whose unwinder gets pre-hooks (return address kept) and whose functions are
/// traced needs both, and a whole second analysis for a handful of pre-hooks took a tenth of
/// a first start-up. A function the whole analysis would make lend islands relocates more
/// bytes there; here it relocates only those its own jump needs.
pub fn analyze_with_kept_entries(inv: &Inventory, data: &[u8], ra: ReturnAddress, threads: usize, entries: &[u64]) -> (Vec<Verdict>, Vec<Option<Hook>>) {
    let module = Module::scan(inv, data, MAX_PATCH_LEN as u64, threads, ra == ReturnAddress::Replaced);
    let kept = entries
        .iter()
        .map(|&a| {
            let f = inv.functions.get(inv.functions.partition_point(|f| f.address < a)).filter(|f| f.address == a)?;
            match local(inv, data, f, ReturnAddress::Kept, None) {
                Local::Open(Open { entry: Ok(len), .. })
                    if branch_into(&module, a, len, len).is_none() && loops_back_to_entry(&module, inv, data, f).is_none() =>
                {
                    Some(Hook { relocate_len: len as u8, form: HookForm::Entry })
                }
                _ => None,
            }
        })
        .collect();
    (verdicts_for(inv, data, ra, module, threads), kept)
}

fn verdicts_for(inv: &Inventory, data: &[u8], ra: ReturnAddress, mut module: Module, threads: usize) -> Vec<Verdict> {
    let walked = &module.walked;
    let locals: Vec<Local> = parallel_runs(inv.functions.len(), threads, |r| {
        r.map(|i| local(inv, data, &inv.functions[i], ra, walked.get(i).and_then(Option::as_ref))).collect()
    });
    let mut verdicts = Vec::with_capacity(locals.len());
    let mut pending = Vec::new();
    for (i, (f, l)) in inv.functions.iter().zip(&locals).enumerate() {
        let Local::Open(open) = l else {
            if let Local::Final(v) = l {
                verdicts.push(v.clone());
            }
            continue;
        };
        if let Some(detail) = loops_back_to_entry(&module, inv, data, f) {
            verdicts.push(skip(skip_reason::BRANCH_INTO_PATCH, detail));
            continue;
        }
        let v = match &open.entry {
            Ok(len) => match branch_into(&module, f.address, *len, *len) {
                None => hookable(*len, HookForm::Entry),
                Some(detail) => skip(skip_reason::BRANCH_INTO_PATCH, detail),
            },
            Err((reason, detail)) => skip(reason, detail.clone()),
        };
        if v.hook().is_none() && (open.whole.is_some() || open.short.is_some()) {
            pending.push(i);
        }
        verdicts.push(v);
    }
    // Each function's own padding first: an island must not take the bytes right after a
    // short function, which only that function can use.
    for &i in &pending {
        let Local::Open(Open { whole: Some(n), .. }) = locals[i] else {
            continue;
        };
        let f = &inv.functions[i];
        let end = f.address + n as u64;
        if branch_into(&module, f.address, JMP_LEN, n).is_none()
            && module.take_after(end, f.address + JMP_LEN as u64)
        {
            verdicts[i] = hookable(n, HookForm::Padding);
        }
    }
    for &i in &pending {
        let Local::Open(Open { short: Some(n), .. }) = locals[i] else {
            continue;
        };
        if verdicts[i].hook().is_some() {
            continue;
        }
        let f = &inv.functions[i];
        if branch_into(&module, f.address, SHORT_JMP_LEN, n).is_some() {
            continue;
        }
        // A jmp rel8 reaches -128..=127 bytes from its end.
        let from = f.address + SHORT_JMP_LEN as u64;
        let (lo, hi) = (from.saturating_sub(128), from + 127);
        if let Some(at) = module.take_island(lo, hi, JMP_LEN as u64) {
            let island_offset = (at as i64 - f.address as i64) as i16;
            verdicts[i] = hookable(n, HookForm::Island { island_offset });
        }
    }
    // Last, where no padding is near (code laid out without alignment): an island in the
    // first bytes of a neighbour hooked at its entry, which then relocates 5 more bytes for
    // each island it lends; those after its own jump are never run.
    let mut lent = vec![0usize; verdicts.len()];
    for &i in &pending {
        let Local::Open(Open { short: Some(n), .. }) = locals[i] else {
            continue;
        };
        let f = &inv.functions[i];
        if verdicts[i].hook().is_some() || branch_into(&module, f.address, SHORT_JMP_LEN, n).is_some() {
            continue;
        }
        let from = f.address + SHORT_JMP_LEN as u64;
        // Islands within reach of the jmp rel8, in donors starting up to 15 bytes before.
        let (lo, hi) = (from.saturating_sub(128), from + 127);
        let first = inv.functions.partition_point(|g| g.address + ((JMP_LEN * (1 + MAX_LENT)) as u64) < lo);
        let donor = (first..inv.functions.len())
            .take_while(|&d| inv.functions[d].address <= hi)
            .filter(|&d| d != i && lent[d] < MAX_LENT)
            .find_map(|d| {
                let at = inv.functions[d].address + (JMP_LEN * (1 + lent[d])) as u64;
                let reach = at >= lo && at <= hi;
                let len = JMP_LEN * (2 + lent[d]);
                Some((d, at, reach.then(|| donor_len(inv, data, &module, &verdicts[d], d, len))??))
            });
        if let Some((d, at, len)) = donor {
            lent[d] += 1;
            verdicts[d] = hookable(len, HookForm::Entry);
            let island_offset = (at as i64 - f.address as i64) as i16;
            verdicts[i] = hookable(n, HookForm::Borrowed { island_offset, donor: d });
        }
    }
    verdicts
}

/// Bytes function `d` would relocate to lend the bytes before `min_len` to islands: it is
/// hooked at its entry, and its first whole instructions covering `min_len` bytes can move,
/// with no branch from elsewhere into them.
fn donor_len(
    inv: &Inventory,
    data: &[u8],
    module: &Module,
    v: &Verdict,
    d: usize,
    min_len: usize,
) -> Option<usize> {
    if !matches!(v.hook()?.form, HookForm::Entry) {
        return None;
    }
    let f = &inv.functions[d];
    let bytes = inv.code_bytes(data, f.address)?;
    let len = displace(&bytes[..bytes.len().min(MAX_PATCH_LEN)], f, min_len).ok()?.len;
    branch_into(module, f.address, len, len).is_none().then_some(len)
}

fn hookable(relocate_len: usize, form: HookForm) -> Verdict {
    Verdict::Hookable(Hook {
        relocate_len: relocate_len as u8,
        form,
    })
}

/// What a function's own code allows, before the rest of the module is looked at.
enum Local {
    /// Not hookable in any form.
    Final(Verdict),
    /// Hookable if the rest of the module agrees.
    Open(Open),
}

struct Open {
    /// Bytes to relocate for the entry form, or why that form is impossible.
    entry: Result<usize, (&'static str, String)>,
    /// For the padding form: the function's size, when it is shorter than the jump, made of
    /// relocatable whole instructions and ends with `ret` or `jmp`.
    whole: Option<usize>,
    /// For the island form: whole relocatable instructions covering the `jmp rel8`.
    short: Option<usize>,
}

/// The verdict from the function's own instructions. `walked` is the answer of
/// [`retaddr::use_of_return_address`] for `f`, if the module scan found it.
fn local(inv: &Inventory, data: &[u8], f: &Function, ra: ReturnAddress, walked: Option<&Option<String>>) -> Local {
    if !f.entry {
        let why = f.not_entry_why.unwrap_or("not a function entry");
        return Local::Final(skip(skip_reason::NOT_ENTRY, why.to_string()));
    }
    if let Some(why) = f.name.as_deref().and_then(denied) {
        return Local::Final(skip(skip_reason::DENYLIST, why.to_string()));
    }
    let Some(bytes) = inv.code_bytes(data, f.address) else {
        return Local::Final(skip(
            skip_reason::NOT_CODE,
            "not in an executable section of the file".to_string(),
        ));
    };
    if ra == ReturnAddress::Replaced {
        let how = match walked {
            Some(how) => how.clone(),
            None => retaddr::use_of_return_address(bytes, f),
        };
        if let Some(how) = how {
            return Local::Final(skip(skip_reason::READS_RETURN_ADDRESS, how));
        }
    }
    let head = &bytes[..bytes.len().min(MAX_PATCH_LEN)];
    let entry = if f.size < JMP_LEN as u64 {
        Err((skip_reason::TOO_SHORT, format!("{} bytes", f.size)))
    } else {
        displace(head, f, JMP_LEN).map(|d| d.len)
    };
    if let Err((reason, detail)) = &entry {
        if *reason == skip_reason::UNDECODABLE {
            return Local::Final(skip(reason, detail.clone()));
        }
    }
    let whole = (f.size > 0 && f.size < JMP_LEN as u64)
        .then(|| displace(head, f, f.size as usize).ok())
        .flatten()
        .filter(|d| d.ends_with_terminator)
        .map(|d| d.len);
    let short = displace(head, f, SHORT_JMP_LEN).ok().map(|d| d.len);
    Local::Open(Open {
        entry,
        whole,
        short,
    })
}

/// Whole instructions from a function's entry that can move to a trampoline.
struct Displaced {
    len: usize,
    ends_with_terminator: bool,
}

/// The first whole instructions of `f` (whose bytes start `bytes`) covering at least
/// `min_len` bytes, if they lie within the function and can run elsewhere unchanged in effect.
fn displace(
    bytes: &[u8],
    f: &Function,
    min_len: usize,
) -> Result<Displaced, (&'static str, String)> {
    let mut decoder = Decoder::with_ip(64, bytes, f.address, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    let mut covered = 0usize;
    // Whole instructions of at least a byte, fewer than `min_len` bytes in all before the
    // last: at most MAX_PATCH_LEN of them. Arrays, not vectors: this runs for every function
    // of a module on every processor, and allocations contend for the agent's allocator.
    let mut boundaries = [0u64; MAX_PATCH_LEN];
    let mut branch_targets = [(0u64, 0usize); MAX_PATCH_LEN];
    let (mut count, mut branches) = (0, 0);
    // Whether every instruction runs unchanged anywhere: relocation then cannot fail.
    let mut anywhere = true;
    while covered < min_len {
        if count == MAX_PATCH_LEN {
            return Err((skip_reason::TOO_SHORT, format!("more than {MAX_PATCH_LEN} instructions to displace")));
        }
        if !decoder.can_decode() {
            return Err((
                skip_reason::TOO_SHORT,
                format!("code ends {covered} bytes into the function"),
            ));
        }
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return Err((
                skip_reason::UNDECODABLE,
                format!("invalid instruction at +{covered}"),
            ));
        }
        let offset = covered;
        covered += instr.len();
        boundaries[count] = instr.ip();
        count += 1;
        anywhere &= runs_anywhere(&instr);
        if covered as u64 > f.size {
            return Err((
                skip_reason::TOO_SHORT,
                format!(
                    "the first whole instructions take {covered} bytes, the function only {}",
                    f.size
                ),
            ));
        }
        match instr.flow_control() {
            // relocate() turns a call that ends the patch into push + jmp, so that it returns
            // to the original code; any other call would return into the trampoline.
            FlowControl::Call | FlowControl::IndirectCall
                if is_call(&instr) && (covered < min_len || !call_is_movable(&instr)) =>
            {
                return Err((
                    skip_reason::CALL_IN_PATCH,
                    format!("{} at +{offset}", mnemonic(&instr)),
                ));
            }
            _ => {}
        }
        if is_near_branch(&instr) {
            branch_targets[branches] = (instr.near_branch_target(), offset);
            branches += 1;
        }
    }
    let (boundaries, branch_targets) = (&boundaries[..count], &branch_targets[..branches]);
    let end = f.address + covered as u64;
    if let Some(offset) = rip_relative_into(bytes, f.address, end) {
        return Err((
            skip_reason::UNRELOCATABLE,
            format!("RIP-relative operand at +{offset} refers to the patch itself"),
        ));
    }
    // A branch within the displaced bytes is re-targeted to the relocated copy only if it lands
    // on one of the relocated instructions; anywhere else inside would run overwritten bytes.
    for &(t, offset) in branch_targets {
        if t > f.address && t < end && !boundaries.contains(&t) {
            return Err((
                skip_reason::UNRELOCATABLE,
                format!(
                    "branch at +{offset} into the middle of an instruction at +{}",
                    t - f.address
                ),
            ));
        }
    }
    if !anywhere {
        if let Err(e) = relocate(&bytes[..covered], f.address, f.address) {
            return Err((skip_reason::UNRELOCATABLE, e.to_string()));
        }
    }
    Ok(Displaced {
        len: covered,
        ends_with_terminator: is_terminator(&instr),
    })
}

/// Why a hook overwriting `overwritten` bytes at `start` and relocating the first `moved`
/// would break: a direct branch or a `lea` from elsewhere lands strictly inside the
/// overwritten bytes. (Branches from the relocated instructions move with them.)
fn branch_into(module: &Module, start: u64, overwritten: usize, moved: usize) -> Option<String> {
    let moved_end = start + moved as u64;
    module
        .refs_into(start + 1, start + overwritten as u64)
        .iter()
        .find(|r| r.kind != RefKind::Memory && !(r.source >= start && r.source < moved_end))
        .map(|r| {
            let what = if r.kind == RefKind::Lea {
                "address taken by lea"
            } else {
                "branch"
            };
            format!("{what} from {:#x} into +{}", r.source, r.target - start)
        })
}

/// A jump (not a call) from inside function `f` back to its own first byte: a loop gcc makes
/// of `for (;;) g();`. Hooked, every turn would enter the function again without returning
/// (a nested call each time in timing mode, until the shadow stack is full; one more call
/// counted in count mode), so such a function is left alone.
fn loops_back_to_entry(module: &Module, inv: &Inventory, data: &[u8], f: &Function) -> Option<String> {
    let end = f.address.saturating_add(f.size);
    module
        .refs_into(f.address, f.address + 1)
        .iter()
        .filter(|r| r.kind == RefKind::Branch && r.source > f.address && r.source < end)
        .find(|r| {
            let Some(bytes) = inv.code_bytes(data, r.source) else { return false };
            let mut d = Decoder::with_ip(64, bytes, r.source, DecoderOptions::NONE);
            !is_call(&d.decode())
        })
        .map(|r| format!("jump from {:#x} back to the entry (a loop)", r.source))
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
/// followed by a jump back to `orig_addr + code.len()` unless the last one is a `ret` or
/// `jmp`.
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
    // Where each instruction's 32-bit RIP-relative displacement is in `code`, if it has one.
    let mut displacements = Vec::with_capacity(JMP_LEN + 1);
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
        let c = decoder.get_constant_offsets(&instr);
        displacements.push((instr.is_ip_rel_memory_operand() && c.has_displacement() && c.displacement_size() == 4).then(|| offset + c.displacement_offset()));
        instrs.push(instr);
    }
    let back = orig_addr.wrapping_add(code.len() as u64);
    // Most prologues (pushes, `mov rbp, rsp`, `sub rsp`, `endbr64`) do not depend on where
    // they run: their bytes move as they are, and only the jump back is new. This skips the
    // block encoder, which took most of the start-up of a program whose analysis is cached.
    if instrs.iter().all(runs_anywhere) {
        let mut out = code.to_vec();
        if instrs.last().is_some_and(is_terminator) {
            return Ok(out);
        }
        if let Some(jmp) = jmp_rel32(new_addr.wrapping_add(code.len() as u64), back) {
            out.extend_from_slice(&jmp);
            return Ok(out);
        }
    }
    if let Some(out) = moved_with_displacements(code, &instrs, &displacements, orig_addr, new_addr) {
        return Ok(out);
    }
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
    } else if !instrs.last().is_some_and(is_terminator) {
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

/// `code` moved to `new_addr` when its only ties to where it ran are RIP-relative memory
/// operands with 32-bit displacements (a load of a global, a `cmp` with one) and it falls
/// through: the bytes with those displacements aimed at the same targets, and a jump back.
/// `None` otherwise (branches, calls, a `lea` of the displaced bytes themselves, a target out
/// of reach), for the block encoder, which takes a microsecond or so per prologue: the most
/// of a warm start-up for programs with many such prologues.
fn moved_with_displacements(code: &[u8], instrs: &[Instruction], displacements: &[Option<usize>], orig_addr: u64, new_addr: u64) -> Option<Vec<u8>> {
    let back = orig_addr.wrapping_add(code.len() as u64);
    let movable = |(i, d): (&Instruction, &Option<usize>)| {
        i.flow_control() == FlowControl::Next
            && match d {
                Some(_) => !(i.mnemonic() == Mnemonic::Lea && (orig_addr..back).contains(&i.ip_rel_memory_address())),
                None => !i.is_ip_rel_memory_operand(),
            }
    };
    if !instrs.iter().zip(displacements).all(movable) {
        return None;
    }
    let mut out = Vec::with_capacity(code.len() + JMP_LEN);
    out.extend_from_slice(code);
    for (i, d) in instrs.iter().zip(displacements) {
        let Some(at) = *d else { continue };
        let next = new_addr.wrapping_add(i.next_ip().wrapping_sub(orig_addr));
        let disp = i32::try_from(i.ip_rel_memory_address().wrapping_sub(next) as i64).ok()?;
        out[at..at + 4].copy_from_slice(&disp.to_le_bytes());
    }
    out.extend_from_slice(&jmp_rel32(new_addr.wrapping_add(code.len() as u64), back)?);
    Some(out)
}

/// Whether an instruction does the same wherever it is: no RIP-relative operand, no relative
/// branch, no call (which pushes its own address).
fn runs_anywhere(i: &Instruction) -> bool {
    !i.is_ip_rel_memory_operand()
        && matches!(
            i.flow_control(),
            FlowControl::Next
                | FlowControl::Return
                | FlowControl::IndirectBranch
                | FlowControl::Interrupt
                | FlowControl::Exception
        )
}

/// Whether `code` (whole instructions) runs unchanged at any address and then falls through
/// to the next byte: [`relocate`] makes it `code` followed by a `jmp` back. A program whose
/// analysis is cached can then move it by copying, without decoding it again.
pub fn moves_as_is(code: &[u8]) -> bool {
    let mut decoder = Decoder::new(64, code, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() || !runs_anywhere(&instr) || instr.flow_control() != FlowControl::Next {
            return false;
        }
    }
    !code.is_empty()
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
