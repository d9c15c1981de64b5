//! Arguments, return values and injections (`record -A`, `-R`, `--args auto`, `--inject`).
//!
//! Only the functions named get this: their slots jump to `fnscope_entry_args`, whose calls
//! return into `fnscope_exit_args` (see [`crate::stubs`]), so every other function runs the
//! plain stubs at the plain cost. Each such function has a [`Desc`], found by id in a flat
//! table. A call's values wait in a *frame* of its thread's args stack (one 512-byte frame
//! per shadow-stack entry, in private memory) until it returns; its data unit (see
//! `fnscope_abi::data`) then goes into the chunk right before its record, so entry and exit
//! data stay one unit (technique B) whatever the nesting and the threads.
//!
//! The common case, integer arguments and an integer (or no) return value, is copied by the
//! stubs themselves; anything else (strings, floating point, stack arguments, structs, x87,
//! injections) goes through the Rust functions here, which make raw system calls only.

use crate::plan_cache::Analysis;
use crate::thread::{ShadowEntry, ThreadState};
use crate::{stubs, sys};
use core::sync::atomic::{AtomicU64, Ordering};
use fnscope_abi::data::{self, LAYOUT_INT_REGS, LAYOUT_SPEC};
use fnscope_symbols::argspec::{self, ArgSpec, Capture, InjectAction, InjectRule, Loc, RetSpec, When, STRING_BOUND};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Words of one frame.
pub const FRAME_WORDS: usize = 64;
/// Bytes of one frame: 16 times a shadow-stack entry's, which the stubs' `shl 4` relies on.
pub const FRAME_BYTES: usize = FRAME_WORDS * 8;
/// Shadow-stack entries with a frame: calls nested deeper are recorded without their values.
pub const ARGS_DEPTH: usize = 4096;
/// Bytes of a thread's args stack.
pub const ARGS_STACK_BYTES: usize = ARGS_DEPTH * FRAME_BYTES;
/// Flag in `ShadowEntry::id` of calls entered through `fnscope_entry_args`: they return into
/// `fnscope_exit_args`, and closing them as unwound writes their entry data.
pub const ARGS_ENTRY: u64 = 1 << 32;
/// Entry words a spec may take (the rest of a frame is for return words and the header).
const MAX_ENTRY_WORDS: usize = 48;
/// Return words a spec may take.
const MAX_RET_WORDS: usize = FRAME_WORDS - 1 - MAX_ENTRY_WORDS;

const _: () = assert!(FRAME_BYTES == 16 * core::mem::size_of::<ShadowEntry>());
const _: () = assert!(FRAME_WORDS <= data::MAX_WORDS);

/// What is captured for one function. The stubs read the first two fields.
#[repr(C)]
pub struct Desc {
    /// Frame header the entry stub writes when it copies rdi..r9 itself (layout
    /// `LAYOUT_INT_REGS`, never 0); 0 sends the entry to [`fnscope_args_enter`].
    pub fast_header: u64,
    /// When the exit stub writes the unit itself: 1 + its number of return words (0, or 1
    /// for rax); 0 sends the exit to [`fnscope_args_exit`].
    pub fast_ret: u64,
    /// When both stubs take their fast paths without reading this descriptor: the unit's
    /// code ([`fast_unit_code`], never 0); 0 otherwise.
    fast_unit: u64,
    entry: Vec<Capture>,
    ret: Vec<Capture>,
    rules: Vec<u16>,
    /// `args` line of the image table, without the id.
    line: String,
}

/// One injection rule with its counter.
struct Rule {
    rule: InjectRule,
    pattern: glob::Pattern,
    /// Calls that passed the rule's argument conditions so far.
    seen: AtomicU64,
}

struct Pattern {
    glob: glob::Pattern,
    spec: Option<String>,
}

/// The settings, parsed once at start-up.
#[derive(Default)]
pub struct Config {
    args: Vec<Pattern>,
    rets: Vec<Pattern>,
    auto: bool,
    rules: Vec<Rule>,
}

static CONFIG: std::sync::OnceLock<Config> = std::sync::OnceLock::new();

/// Table of `*const Desc` by function id (0: none); read by the stubs.
pub static DESCS: AtomicU64 = AtomicU64::new(0);
const MAX_IDS: usize = 1 << 22;

/// Parses `FNSCOPE_ARGS`: lines `A<TAB>PATTERN<TAB>SPEC`, `R<TAB>PATTERN<TAB>SPEC` (SPEC empty:
/// from DWARF), `I<TAB>RULE`, `AUTO`. The recorder checked them; an error here disables the
/// feature with a warning.
pub fn configure(text: &str) -> Result<(), String> {
    let mut c = Config::default();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split('\t').collect();
        let glob = |p: &str| glob::Pattern::new(p).map_err(|e| format!("bad pattern {p:?}: {e}"));
        match f[..] {
            ["A", p, s] => {
                if !s.is_empty() {
                    ArgSpec::parse(s)?;
                }
                c.args.push(Pattern { glob: glob(p)?, spec: (!s.is_empty()).then(|| s.to_string()) })
            }
            ["R", p, s] => {
                if !s.is_empty() {
                    RetSpec::parse(s)?;
                }
                c.rets.push(Pattern { glob: glob(p)?, spec: (!s.is_empty()).then(|| s.to_string()) })
            }
            ["I", r] => {
                let rule = InjectRule::parse(r)?;
                c.rules.push(Rule { pattern: glob(&rule.pattern)?, rule, seen: AtomicU64::new(0) });
            }
            ["AUTO"] => c.auto = true,
            _ => return Err(format!("bad argument setting {line:?}")),
        }
    }
    if c.rules.len() > u16::MAX as usize {
        return Err("too many --inject rules".into());
    }
    let any = c.auto || !c.args.is_empty() || !c.rets.is_empty() || !c.rules.is_empty();
    let _ = CONFIG.set(c);
    if any {
        let t = sys::mmap_anon(MAX_IDS * 8);
        if t.is_null() {
            return Err("no memory for the argument descriptors".into());
        }
        DESCS.store(t as u64, Ordering::Release);
    }
    Ok(())
}

/// Whether any function may record values (threads then get an args stack).
pub fn enabled() -> bool {
    DESCS.load(Ordering::Acquire) != 0
}

/// The image-table lines naming the injection rules (`inject<TAB>index<TAB>text`).
pub fn rule_lines() -> String {
    let Some(c) = CONFIG.get() else { return String::new() };
    c.rules.iter().enumerate().map(|(k, r)| format!("inject\t{k}\t{}\n", describe(&r.rule))).collect()
}

fn describe(r: &InjectRule) -> String {
    let mut s = r.pattern.clone();
    match &r.action {
        InjectAction::Return { value, float, errno } => {
            match float {
                Some(f) => s.push_str(&format!("=ret:{f}")),
                None => s.push_str(&format!("=ret:{}", *value as i64)),
            }
            if let Some(e) = errno {
                s.push_str(&format!(",errno:{e}"));
            }
        }
        InjectAction::Argument { loc, value } => s.push_str(&format!("@{loc}={}", *value as i64)),
    }
    for w in &r.when {
        match w {
            When::Nth(n) => s.push_str(&format!(",when:nth={n}")),
            When::First(n) => s.push_str(&format!(",when:first={n}")),
            When::After(n) => s.push_str(&format!(",when:after={n}")),
            When::Prob(p) => s.push_str(&format!(",when:prob={p},seed:{}", r.seed)),
            When::ArgEq(l, v) => s.push_str(&format!(",when:{l}={}", *v as i64)),
        }
    }
    s
}

/// Whether `g` matches function `i` of `funcs` by its raw or its demangled name.
fn matches(g: &glob::Pattern, funcs: &Analysis, i: usize, shown: &mut Option<String>) -> bool {
    let raw = funcs.name(i).unwrap_or("");
    g.matches(raw) || g.matches(shown.get_or_insert_with(|| fnscope_symbols::display_name(funcs.name(i), funcs.address(i))))
}

/// Descriptors for the planned functions of one module (by function index) that record
/// values or have injections. Specs left to DWARF are read from the module's debug
/// information, only for the functions that need them.
pub fn plan(path: &Path, funcs: &Analysis, planned: &[usize]) -> HashMap<usize, Desc> {
    let mut out = HashMap::new();
    let Some(c) = CONFIG.get() else { return out };
    if !enabled() {
        return out;
    }
    struct Want {
        args: Option<Option<String>>,
        ret: Option<Option<String>>,
        rules: Vec<u16>,
    }
    let mut wants = Vec::new();
    let mut dwarf_for = HashSet::new();
    for &i in planned {
        let mut shown = None;
        let args = c.args.iter().find(|p| matches(&p.glob, funcs, i, &mut shown)).map(|p| p.spec.clone()).or(c.auto.then_some(None));
        let ret = c.rets.iter().find(|p| matches(&p.glob, funcs, i, &mut shown)).map(|p| p.spec.clone()).or(c.auto.then_some(None));
        let rules: Vec<u16> = c.rules.iter().enumerate().filter(|(_, r)| matches(&r.pattern, funcs, i, &mut shown)).map(|(k, _)| k as u16).collect();
        if args.is_none() && ret.is_none() && rules.is_empty() {
            continue;
        }
        if matches!(args, Some(None)) || matches!(ret, Some(None)) || !rules.is_empty() {
            dwarf_for.insert(funcs.address(i));
        }
        wants.push((i, Want { args, ret, rules }));
    }
    if wants.is_empty() {
        return out;
    }
    let sigs = if dwarf_for.is_empty() {
        HashMap::new()
    } else {
        fnscope_symbols::params::signatures(path, |a| dwarf_for.contains(&a)).unwrap_or_default()
    };
    for (i, w) in wants {
        let sig = sigs.get(&funcs.address(i));
        let args = match &w.args {
            Some(Some(s)) => ArgSpec::parse(s).unwrap_or_default(),
            Some(None) => sig.map(|s| s.args.clone()).unwrap_or_default(),
            None => ArgSpec::default(),
        };
        let ret = match &w.ret {
            Some(Some(s)) => Some(RetSpec::parse(s).unwrap_or(RetSpec::Raw)),
            Some(None) => Some(sig.map(|s| s.ret.clone()).unwrap_or(RetSpec::Raw)),
            None => None,
        };
        out.insert(i, desc(args, ret, w.rules));
    }
    out
}

/// Most words a capture takes.
fn max_words(c: &Capture) -> usize {
    match c {
        Capture::Word(_) => 1,
        Capture::Pair(..) | Capture::X87 => 2,
        Capture::Str(_) => 2 + STRING_BOUND / 8,
    }
}

fn desc(mut args: ArgSpec, ret: Option<RetSpec>, rules: Vec<u16>) -> Desc {
    let mut used = 0;
    args.values.retain(|v| {
        used += v.items().iter().map(|i| max_words(&i.capture())).sum::<usize>();
        used <= MAX_ENTRY_WORDS
    });
    let entry: Vec<Capture> = args.items().map(|i| i.capture()).collect();
    let mut ret_caps: Vec<Capture> = ret.as_ref().map(|r| r.items().iter().map(|i| i.capture()).collect()).unwrap_or_default();
    let mut used = 0;
    ret_caps.retain(|c| {
        used += max_words(c);
        used <= MAX_RET_WORDS
    });
    let int_regs = entry.iter().try_fold(0u64, |k, c| match c {
        Capture::Word(Loc::Int(n)) => Some(k.max(*n as u64 + 1)),
        Capture::Pair(Loc::Int(a), Loc::Int(b)) => Some(k.max(*a.max(b) as u64 + 1)),
        _ => None,
    });
    let fast_header = match int_regs {
        Some(k) if rules.is_empty() => data::header(k, 0, LAYOUT_INT_REGS, 0, 0),
        _ => 0,
    };
    let fast_ret = match &ret_caps[..] {
        // A function with injection rules only: the slow exit writes a unit only for the
        // calls a rule changed.
        [] if entry.is_empty() && !rules.is_empty() => 0,
        [] => 1,
        [Capture::Word(Loc::Rax)] => 2,
        _ => 0,
    };
    let fast_unit = match (int_regs, fast_ret) {
        (Some(k), 1 | 2) if fast_header != 0 && k + fast_ret - 1 > 0 => fast_unit_code(k, fast_ret - 1),
        _ => 0,
    };
    let ret_text = ret.map_or("-".to_string(), |r| r.to_string());
    let rules_text = if rules.is_empty() { "-".to_string() } else { rules.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",") };
    let line = format!("{args}\t{ret_text}\t{rules_text}");
    Desc { fast_header, fast_ret, fast_unit, entry, ret: ret_caps, rules, line }
}

/// Code of the unit of `k` integer-register arguments and `r` return words (rax): `k | r << 3`,
/// never 0 since `k + r > 0`. The exit stub has one writer of the unit for each code.
const fn fast_unit_code(k: u64, r: u64) -> u64 {
    k | r << 3
}

/// The 16 bits an args slot carries ([`crate::stubs::SLOT_UNIT_OFFSET`]), which the entry stub
/// puts in bits 32-47 of the shadow entry's id word: [`ARGS_ENTRY`] and, from bit 33 on, the
/// fast unit code (0: none).
pub fn slot_unit(fast_unit: u64) -> u16 {
    (fast_unit << 1 | 1) as u16
}

/// The fast unit code of a shadow entry's id word (0: none).
fn fast_unit(id: u64) -> u64 {
    id >> 33
}

/// The header of a call's frame: implied by its fast unit (the entry stub then copied the
/// registers without writing one), else the frame's first word.
///
/// # Safety
/// `frame` must be the frame of the shadow entry whose id word is `id`.
unsafe fn frame_head(id: u64, frame: *const u64) -> u64 {
    match fast_unit(id) {
        0 => {
            // SAFETY: per the caller's guarantee.
            unsafe { *frame }
        }
        u => data::header(u & 7, 0, LAYOUT_INT_REGS, 0, 0),
    }
}

/// Registers the descriptor of function `id` (before its jump is written) and returns its
/// image-table line and the args bits of its slot ([`slot_unit`]); `None` when the id is
/// beyond the descriptor table (the function is then traced with the plain stubs).
pub fn register(id: u32, d: Desc) -> Option<(String, u16)> {
    let t = DESCS.load(Ordering::Acquire);
    if t == 0 || id as usize >= MAX_IDS {
        return None;
    }
    let line = format!("args\t{id}\t{}\n", d.line);
    let unit = slot_unit(d.fast_unit);
    let d = Box::into_raw(Box::new(d));
    // SAFETY: inside the table; written once, before any call can reach the id's slot.
    unsafe { *((t as *mut u64).add(id as usize)) = d as u64 };
    Some((line, unit))
}

fn desc_of(id: u32) -> Option<&'static Desc> {
    let t = DESCS.load(Ordering::Acquire);
    if t == 0 || id as usize >= MAX_IDS {
        return None;
    }
    // SAFETY: inside the table; a non-zero entry is a leaked `Desc` that is never freed.
    unsafe {
        let d = *((t as *const u64).add(id as usize)) as *const Desc;
        d.as_ref()
    }
}

/// The frame of the shadow entry at `entry`, if the thread has one for that depth.
///
/// # Safety
/// `st` must be the calling thread's state and `entry` one of its shadow entries.
pub unsafe fn frame_of(st: *const ThreadState, entry: u64) -> Option<*mut u64> {
    // SAFETY: per the caller's guarantee.
    unsafe {
        let base = (*st).args_base;
        let k = ((entry - (*st).ss_base) / 32) as usize;
        (base != 0 && k < ARGS_DEPTH).then(|| (base + (k * FRAME_BYTES) as u64) as *mut u64)
    }
}

/// The program's registers as the stubs saved them.
struct Regs {
    /// `SAVE_ALL`'s frame pointer: rbp; the pushed registers lie above it.
    gpr: u64,
    /// `SAVE_ALL`'s xmm0-15.
    xmm: u64,
    /// The stack pointer at the function's entry (its return-address slot).
    rsp: u64,
}

impl Regs {
    /// Address of the saved integer argument register `n` (0-5). The entry stub keeps the
    /// program's rdx and rcx below the return slot, SAVE_ALL the others.
    fn int(&self, n: u8) -> *mut u64 {
        (match n {
            0 => self.gpr + 40,
            1 => self.gpr + 48,
            2 => self.rsp - 24,
            3 => self.rsp - 32,
            4 => self.gpr + 32,
            _ => self.gpr + 24,
        }) as *mut u64
    }

    fn xmm(&self, n: u8) -> *mut u64 {
        (self.xmm + 16 * n as u64) as *mut u64
    }

    /// The value of an entry location.
    ///
    /// # Safety
    /// The saved registers and the caller's stack must be readable.
    unsafe fn entry(&self, l: Loc) -> u64 {
        // SAFETY: per the caller's guarantee; stack arguments lie in the caller's frame.
        unsafe {
            match l {
                Loc::Int(n) => *self.int(n),
                Loc::Float(n) => *self.xmm(n),
                Loc::Stack(n) => {
                    // A slot far up the stack may lie past its end: read without faulting.
                    let mut b = [0u8; 8];
                    sys::read_own_memory(self.rsp + 8 * n as u64, &mut b);
                    u64::from_le_bytes(b)
                }
                _ => 0,
            }
        }
    }

    /// The value of a return location; at the exit stub rax and rdx lie below its stack
    /// pointer (`rsp` here).
    ///
    /// # Safety
    /// The saved registers must be readable.
    unsafe fn ret(&self, l: Loc) -> u64 {
        // SAFETY: per the caller's guarantee.
        unsafe {
            match l {
                Loc::Rax => *((self.rsp - 8) as *const u64),
                Loc::Rdx => *((self.rsp - 16) as *const u64),
                Loc::Xmm0 => *self.xmm(0),
                Loc::Xmm1 => *self.xmm(1),
                _ => 0,
            }
        }
    }
}

/// Copies up to [`STRING_BOUND`] bytes of the C string at `ptr` into `out` (after its status
/// word), through `process_vm_readv` on this process: an unmapped pointer reads as bad
/// instead of faulting. Returns the words written.
fn copy_string(ptr: u64, out: &mut [u64]) -> usize {
    if ptr == 0 {
        out[0] = 0;
        return 1;
    }
    // One byte past the bound tells a string of exactly the bound from a longer one.
    let mut buf = [0u8; STRING_BOUND + 1];
    let mut got = 0usize;
    // Page by page: a string that ends just before an unmapped page is still read whole.
    while got < buf.len() {
        let at = ptr + got as u64;
        let page_left = 4096 - (at & 4095) as usize;
        let n = page_left.min(buf.len() - got);
        let read = sys::read_own_memory(at, &mut buf[got..got + n]);
        if let Some(z) = buf[got..got + read].iter().position(|&b| b == 0) {
            return finish_string(&buf, got + z, (got + z) as u64, out);
        }
        got += read;
        if read < n {
            if got == 0 {
                return finish_string(&buf, 0, argspec::STR_BAD, out);
            }
            break;
        }
    }
    let len = got.min(STRING_BOUND);
    finish_string(&buf, len, len as u64 | argspec::STR_TRUNCATED, out)
}

/// Writes the status word and the bytes; returns the words written.
fn finish_string(buf: &[u8], len: usize, status: u64, out: &mut [u64]) -> usize {
    out[0] = status;
    let words = len.div_ceil(8);
    for (k, w) in out[1..1 + words].iter_mut().enumerate() {
        let mut b = [0u8; 8];
        let end = (k * 8 + 8).min(len);
        b[..end - k * 8].copy_from_slice(&buf[k * 8..end]);
        *w = u64::from_le_bytes(b);
    }
    1 + words
}

/// Captures entry words in spec order into `out`; returns how many.
///
/// # Safety
/// As [`Regs::entry`].
unsafe fn capture_entry(d: &Desc, r: &Regs, out: &mut [u64]) -> usize {
    let mut n = 0;
    // SAFETY: per the caller's guarantee.
    unsafe {
        for c in &d.entry {
            match *c {
                Capture::Word(l) => {
                    out[n] = r.entry(l);
                    n += 1;
                }
                Capture::Pair(a, b) => {
                    out[n] = r.entry(a);
                    out[n + 1] = r.entry(b);
                    n += 2;
                }
                Capture::X87 => {
                    out[n] = 0;
                    out[n + 1] = 0;
                    n += 2;
                }
                Capture::Str(l) => {
                    let p = r.entry(l);
                    out[n] = p;
                    n += 1 + copy_string(p, &mut out[n + 1..]);
                }
            }
        }
    }
    n
}

/// Captures return words in spec order; returns how many.
///
/// # Safety
/// As [`Regs::ret`].
unsafe fn capture_ret(d: &Desc, r: &Regs, out: &mut [u64]) -> usize {
    let mut n = 0;
    // SAFETY: per the caller's guarantee.
    unsafe {
        for c in &d.ret {
            match *c {
                Capture::Word(l) => {
                    out[n] = r.ret(l);
                    n += 1;
                }
                Capture::Pair(a, b) => {
                    out[n] = r.ret(a);
                    out[n + 1] = r.ret(b);
                    n += 2;
                }
                Capture::X87 => {
                    let mut t = [0u64; 2];
                    stubs::read_st0(t.as_mut_ptr() as *mut u8);
                    out[n] = t[0];
                    out[n + 1] = t[1] & 0xffff;
                    n += 2;
                }
                Capture::Str(l) => {
                    let p = r.ret(l);
                    out[n] = p;
                    n += 1 + copy_string(p, &mut out[n + 1..]);
                }
            }
        }
    }
    n
}

/// The injection rule of `d` that changes this call, if one does (each rule's counter moves
/// only for calls that pass its argument conditions).
///
/// # Safety
/// As [`Regs::entry`].
unsafe fn choose(d: &Desc, r: &Regs) -> Option<u16> {
    let c = CONFIG.get()?;
    'rules: for &k in &d.rules {
        let rule = &c.rules[k as usize];
        for w in &rule.rule.when {
            // SAFETY: per the caller's guarantee.
            if let When::ArgEq(l, v) = *w {
                if unsafe { r.entry(l) } != v {
                    continue 'rules;
                }
            }
        }
        let n = rule.seen.fetch_add(1, Ordering::Relaxed) + 1;
        let hit = rule.rule.when.iter().all(|w| match *w {
            When::Nth(m) => n % m == 0,
            When::First(m) => n <= m,
            When::After(m) => n > m,
            When::Prob(p) => argspec::draw(rule.rule.seed, n - 1) < p,
            When::ArgEq(..) => true,
        });
        if hit {
            return Some(k);
        }
    }
    None
}

/// Slow entry of a function with values to capture or injection rules: `entry` is its shadow
/// entry (pushed), `frame` its frame or null, `gpr`/`xmm` the registers SAVE_ALL saved, `rsp`
/// the function's return slot. Returns 1 when an injection returned a value instead of
/// running the function: the call is recorded and popped, the value is in the saved rax
/// (and xmm0), and the stub returns to the caller.
#[no_mangle]
extern "C" fn fnscope_args_enter(st: *mut ThreadState, entry: u64, frame: *mut u64, gpr: u64, xmm: u64, rsp: u64) -> u32 {
    let r = Regs { gpr, xmm, rsp };
    // SAFETY: the entry stub passes this thread's state, its new shadow entry, its frame (or
    // null) and the addresses of the registers it saved; the frame is FRAME_WORDS long.
    unsafe {
        let e = &*(entry as *const ShadowEntry);
        let Some(d) = desc_of(e.id as u32) else { return 0 };
        let mut inject = (0, 0);
        if let Some(k) = choose(d, &r) {
            let c = CONFIG.get().expect("rules come from the config");
            match c.rules[k as usize].rule.action {
                InjectAction::Argument { loc, value } => {
                    match loc {
                        Loc::Int(n) => *r.int(n) = value,
                        Loc::Float(n) => *r.xmm(n) = value,
                        _ => {}
                    }
                    inject = (data::INJECT_ARGUMENT, k);
                }
                InjectAction::Return { value, float, errno } => {
                    let mut words = [0u64; FRAME_WORDS];
                    let n = capture_entry(d, &r, &mut words[1..]);
                    let rw = injected_ret(d, value, float, &mut words[1 + n..]);
                    words[0] = data::header(n as u64, rw as u64, LAYOUT_SPEC, data::INJECT_RETURN, k as u64);
                    *((rsp - 16) as *mut u64) = value;
                    if let Some(f) = float {
                        *r.xmm(0) = f.to_bits();
                    }
                    if let Some(e) = errno {
                        stubs::set_errno(e);
                    }
                    let now = stubs::tsc();
                    let depth = ((entry - (*st).ss_base) / 32) as u32;
                    let rec = fnscope_abi::Record::new(e.t_entry, now, e.id as u32, depth, 0);
                    crate::thread::emit_unit(st, rec, &words[..1 + n + rw]);
                    crate::thread::lower_top(st, entry);
                    return 1;
                }
            }
        }
        if frame.is_null() {
            return 0;
        }
        let words = core::slice::from_raw_parts_mut(frame, FRAME_WORDS);
        let n = capture_entry(d, &r, &mut words[1..]);
        words[0] = data::header(n as u64, 0, LAYOUT_SPEC, inject.0, inject.1 as u64);
    }
    0
}

/// The return words a function's return spec asks for, when an injection returned `value`
/// (and `float`, in xmm0) instead of running it; returns how many.
fn injected_ret(d: &Desc, value: u64, float: Option<f64>, out: &mut [u64]) -> usize {
    let mut n = 0;
    for c in &d.ret {
        match *c {
            Capture::Word(Loc::Xmm0) => {
                out[n] = float.map_or(value, f64::to_bits);
                n += 1;
            }
            Capture::Word(Loc::Rax) => {
                out[n] = value;
                n += 1;
            }
            Capture::Word(_) => {
                out[n] = 0;
                n += 1;
            }
            Capture::Pair(..) => {
                // rdx:rax as the 128-bit sign extension of the value.
                out[n] = value;
                out[n + 1] = if (value as i64) < 0 { u64::MAX } else { 0 };
                n += 2;
            }
            Capture::X87 => {
                out[n] = 0;
                out[n + 1] = 0;
                n += 2;
            }
            Capture::Str(_) => {
                out[n] = value;
                n += 1 + copy_string(value, &mut out[n + 1..]);
            }
        }
    }
    n
}

/// Slow exit of a function with values to capture: writes its data unit and record. `entry`
/// is its shadow entry (the stub pops it afterwards), `rsp` the exit stub's stack pointer
/// (rax and rdx lie below it).
#[no_mangle]
extern "C" fn fnscope_args_exit(st: *mut ThreadState, entry: u64, t_exit: u64, gpr: u64, xmm: u64, rsp: u64) {
    let r = Regs { gpr, xmm, rsp };
    // SAFETY: the exit stub passes this thread's state, the shadow entry of the call
    // returning and the addresses of the registers it saved.
    unsafe {
        let e = &*(entry as *const ShadowEntry);
        let depth = ((entry - (*st).ss_base) / 32) as u32;
        let rec = fnscope_abi::Record::new(e.t_entry, t_exit, e.id as u32, depth, 0);
        let (Some(d), Some(frame)) = (desc_of(e.id as u32), frame_of(st, entry)) else {
            crate::thread::emit_unit(st, rec, &[]);
            return;
        };
        let mut words = [0u64; FRAME_WORDS];
        let head = frame_head(e.id, frame);
        let n_entry = ((head & data::ENTRY_WORDS_MASK) as usize).min(FRAME_WORDS - 1);
        words[..1 + n_entry].copy_from_slice(core::slice::from_raw_parts(frame, 1 + n_entry));
        let n_ret = capture_ret(d, &r, &mut words[1 + n_entry..]);
        words[0] = head | (n_ret as u64) << data::RET_SHIFT;
        // A function with injection rules only has a unit when a rule changed the call.
        let empty = n_entry + n_ret == 0 && (head >> data::INJECT_SHIFT) & 0xff == 0;
        let n = if empty { 0 } else { 1 + n_entry + n_ret };
        crate::thread::emit_unit(st, rec, &words[..n]);
    }
}

/// The data unit of a call closed without returning (unwound, cut at exit): its entry words,
/// if it has any. `entry` is its shadow entry.
///
/// # Safety
/// `st` must be the calling thread's state and `entry` one of its shadow entries.
pub unsafe fn entry_unit(st: *const ThreadState, entry: u64, out: &mut [u64; FRAME_WORDS]) -> usize {
    // SAFETY: per the caller's guarantee.
    unsafe {
        let e = &*(entry as *const ShadowEntry);
        if e.id & ARGS_ENTRY == 0 {
            return 0;
        }
        let Some(frame) = frame_of(st, entry) else { return 0 };
        let head = frame_head(e.id, frame);
        let n = ((head & data::ENTRY_WORDS_MASK) as usize).min(FRAME_WORDS - 1);
        out[..1 + n].copy_from_slice(core::slice::from_raw_parts(frame, 1 + n));
        out[0] = head & !(0xffff << data::RET_SHIFT);
        1 + n
    }
}
