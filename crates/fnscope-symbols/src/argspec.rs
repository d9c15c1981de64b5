//! What `record -A PATTERN@SPEC` and `-R PATTERN@TYPE` capture, and how captured words read.
//!
//! The agent (at start-up, to build its capture program) and the analysis (to show the values)
//! both parse the same text, so this grammar is the contract between them: the image table
//! carries each function's spec in its canonical form ([`ArgSpec`]'s and [`RetSpec`]'s
//! `Display`), and a call's data unit carries the captured words in the order the spec lists
//! its items (see [`Item::words`]).
//!
//! # Grammar
//! ```text
//! spec   := value ("," value)*
//! value  := item | "{" item ("," item)* "}" [":" NAME]
//! item   := loc ["+" OFFSET] ["/" type] [":" NAME]
//! loc    := "arg" N        N-th integer argument: 1-6 are rdi rsi rdx rcx r8 r9, 7.. the stack
//!                          slots after them (arg7 = stack1), as when every argument is a scalar
//!         | "fparg" N      N-th floating-point argument: xmm(N-1), N = 1-8
//!         | "stack" N      N-th 8-byte slot above the return address at entry
//!         | "rax" | "rdx" | "xmm0" | "xmm1" | "st0"   (return values only)
//! type   := i8 i16 i32 i64 i128 | u8 u16 u32 u64 u128 | x (hex) | p (pointer) | s (C string)
//!         | c (char) | b (bool) | f32 f64 | f80 (x87 long double)
//! ```
//! `OFFSET` selects bytes within the location (fields of a small struct share a register:
//! `{arg1/i32:a,arg1+4/i32:b}`). Without a type an integer location reads as `i64` and a
//! floating-point one as `f64`. `i128`/`u128` take two consecutive locations (`arg1` and
//! `arg2`, `rax` and `rdx`), `f80` two stack slots (or `st0`).
//!
//! A return spec is `void`, a type (its location follows from it: integers, pointers and
//! strings in `rax`, `f32`/`f64` in `xmm0`, `f80` in `st0`, 128-bit integers in `rax:rdx`), or
//! a struct of items with return locations (`{rax/i64:a,xmm0/f64:b}`).

use std::fmt;

/// Bytes copied from a C string argument or return value: longer strings are cut there and
/// shown with `...`.
pub const STRING_BOUND: usize = 64;

/// Status word of a captured string: bytes copied (low 16 bits).
pub const STR_LEN_MASK: u64 = 0xffff;
/// Status word of a captured string: the copy stopped at [`STRING_BOUND`] before a NUL.
pub const STR_TRUNCATED: u64 = 1 << 16;
/// Status word of a captured string: the pointer could not be read (not mapped).
pub const STR_BAD: u64 = 1 << 17;

/// Where a value is at the function's entry or return.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Loc {
    /// Integer argument register 0-5: rdi, rsi, rdx, rcx, r8, r9.
    Int(u8),
    /// Floating-point argument register: xmm0-xmm7 (its low 8 bytes).
    Float(u8),
    /// Stack slot N (from 1) above the return address, at entry.
    Stack(u16),
    /// Return register rax.
    Rax,
    /// Return register rdx.
    Rdx,
    /// Return register xmm0 (low 8 bytes).
    Xmm0,
    /// Return register xmm1 (low 8 bytes).
    Xmm1,
    /// x87 top of stack (long double returns): 10 bytes in two words.
    St0,
}

impl Loc {
    /// Whether the location exists at the function's return (rather than at entry).
    pub fn is_return(self) -> bool {
        matches!(self, Loc::Rax | Loc::Rdx | Loc::Xmm0 | Loc::Xmm1 | Loc::St0)
    }

    /// The location after this one, for values that take two (128-bit integers, `f80` on the
    /// stack).
    pub fn next(self) -> Option<Loc> {
        match self {
            Loc::Int(n) if n < 5 => Some(Loc::Int(n + 1)),
            Loc::Int(5) => Some(Loc::Stack(1)),
            Loc::Stack(n) => Some(Loc::Stack(n + 1)),
            Loc::Rax => Some(Loc::Rdx),
            _ => None,
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Int(n) => write!(f, "arg{}", n + 1),
            Loc::Float(n) => write!(f, "fparg{}", n + 1),
            Loc::Stack(n) => write!(f, "stack{n}"),
            Loc::Rax => f.write_str("rax"),
            Loc::Rdx => f.write_str("rdx"),
            Loc::Xmm0 => f.write_str("xmm0"),
            Loc::Xmm1 => f.write_str("xmm1"),
            Loc::St0 => f.write_str("st0"),
        }
    }
}

/// How a value's bytes read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    /// Signed integer of 8, 16, 32, 64 or 128 bits.
    Signed(u8),
    /// Unsigned integer of 8, 16, 32, 64 or 128 bits.
    Unsigned(u8),
    /// 64-bit integer shown in hexadecimal.
    Hex,
    /// Pointer (hexadecimal, `NULL` for 0).
    Ptr,
    /// Pointer to a NUL-terminated string, copied (up to [`STRING_BOUND`] bytes) when captured.
    Str,
    /// One byte shown as a character.
    Char,
    /// One byte shown as `true`/`false`.
    Bool,
    /// IEEE single.
    F32,
    /// IEEE double.
    F64,
    /// x87 80-bit extended (long double).
    F80,
}

impl Ty {
    fn parse(s: &str) -> Option<Ty> {
        Some(match s {
            "i8" => Ty::Signed(8),
            "i16" => Ty::Signed(16),
            "i32" => Ty::Signed(32),
            "i64" => Ty::Signed(64),
            "i128" => Ty::Signed(128),
            "u8" => Ty::Unsigned(8),
            "u16" => Ty::Unsigned(16),
            "u32" => Ty::Unsigned(32),
            "u64" => Ty::Unsigned(64),
            "u128" => Ty::Unsigned(128),
            "x" => Ty::Hex,
            "p" => Ty::Ptr,
            "s" => Ty::Str,
            "c" => Ty::Char,
            "b" => Ty::Bool,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "f80" => Ty::F80,
            _ => return None,
        })
    }

    /// Bytes the value takes.
    pub fn size(self) -> usize {
        match self {
            Ty::Signed(b) | Ty::Unsigned(b) => b as usize / 8,
            Ty::Char | Ty::Bool => 1,
            Ty::F32 => 4,
            Ty::F80 => 10,
            Ty::Hex | Ty::Ptr | Ty::Str | Ty::F64 => 8,
        }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Signed(b) => write!(f, "i{b}"),
            Ty::Unsigned(b) => write!(f, "u{b}"),
            Ty::Hex => f.write_str("x"),
            Ty::Ptr => f.write_str("p"),
            Ty::Str => f.write_str("s"),
            Ty::Char => f.write_str("c"),
            Ty::Bool => f.write_str("b"),
            Ty::F32 => f.write_str("f32"),
            Ty::F64 => f.write_str("f64"),
            Ty::F80 => f.write_str("f80"),
        }
    }
}

/// One value read from one location (two for 128-bit and `f80` values).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Item {
    /// Where it is.
    pub loc: Loc,
    /// Byte offset within the location (fields of a struct passed in one register).
    pub offset: u8,
    /// How it reads.
    pub ty: Ty,
    /// Its name, when known (DWARF, or `:NAME` in the spec).
    pub name: Option<String>,
}

/// What the agent copies for an item, in this order, into the call's data unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// The 8 bytes of one location: one word.
    Word(Loc),
    /// The 8 bytes of a location and of the next one: two words.
    Pair(Loc, Loc),
    /// The 10 bytes of st0 (without popping it): two words.
    X87,
    /// The pointer in a location (one word), then a status word ([`STR_LEN_MASK`],
    /// [`STR_TRUNCATED`], [`STR_BAD`]), then the bytes copied, 8 to a word (little-endian).
    Str(Loc),
}

impl Item {
    /// What the agent copies for this item.
    pub fn capture(&self) -> Capture {
        match self.ty {
            Ty::Str => Capture::Str(self.loc),
            _ if self.loc == Loc::St0 => Capture::X87,
            Ty::Signed(128) | Ty::Unsigned(128) | Ty::F80 => match self.loc.next() {
                Some(n) => Capture::Pair(self.loc, n),
                None => Capture::Word(self.loc),
            },
            _ => Capture::Word(self.loc),
        }
    }

    fn check(&self, ret: bool) -> Result<(), String> {
        if self.loc.is_return() != ret {
            return Err(if ret {
                format!("{} is an argument's location, not a return value's (use rax, rdx, xmm0, xmm1 or st0)", self.loc)
            } else {
                format!("{} is a return value's location, not an argument's (use argN, fpargN or stackN)", self.loc)
            });
        }
        let bytes = match self.capture() {
            Capture::Pair(..) | Capture::X87 => 16,
            _ => 8,
        };
        if self.offset as usize + self.ty.size() > bytes {
            return Err(format!("{}+{}/{} reads past the location's {bytes} bytes", self.loc, self.offset, self.ty));
        }
        if matches!(self.loc, Loc::Float(_) | Loc::Xmm0 | Loc::Xmm1) && matches!(self.ty, Ty::Signed(128) | Ty::Unsigned(128) | Ty::F80 | Ty::Str) {
            return Err(format!("{}/{} does not fit a floating-point register", self.loc, self.ty));
        }
        if self.ty == Ty::F80 && !matches!(self.loc, Loc::St0 | Loc::Stack(_)) {
            return Err("f80 (long double) is passed on the stack and returned in st0".into());
        }
        Ok(())
    }
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.loc)?;
        if self.offset != 0 {
            write!(f, "+{}", self.offset)?;
        }
        write!(f, "/{}", self.ty)?;
        if let Some(n) = &self.name {
            write!(f, ":{n}")?;
        }
        Ok(())
    }
}

/// One argument or return value: a scalar, or a small struct passed in registers by field.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// One item.
    Scalar(Item),
    /// Fields of a struct, each from its register.
    Struct {
        /// The struct's name (parameter name), when known.
        name: Option<String>,
        /// Its fields.
        fields: Vec<Item>,
    },
}

impl Value {
    /// The items whose words the data unit holds, in order.
    pub fn items(&self) -> &[Item] {
        match self {
            Value::Scalar(i) => std::slice::from_ref(i),
            Value::Struct { fields, .. } => fields,
        }
    }

    /// The value's name, when known.
    pub fn name(&self) -> Option<&str> {
        match self {
            Value::Scalar(i) => i.name.as_deref(),
            Value::Struct { name, .. } => name.as_deref(),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Scalar(i) => write!(f, "{i}"),
            Value::Struct { name, fields } => {
                f.write_str("{")?;
                for (k, i) in fields.iter().enumerate() {
                    if k > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{i}")?;
                }
                f.write_str("}")?;
                if let Some(n) = name {
                    write!(f, ":{n}")?;
                }
                Ok(())
            }
        }
    }
}

/// The arguments a function's calls record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ArgSpec {
    /// In the order they are shown.
    pub values: Vec<Value>,
}

/// The return value a function's calls record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RetSpec {
    /// No type known: rax as a signed integer (technique A's raw return value).
    Raw,
    /// The function returns nothing (DWARF says so); rax is still kept for `ret:` in
    /// `function.txt` lines, which shows the raw register as technique A does.
    Void,
    /// A typed value.
    Value(Value),
}

impl RetSpec {
    /// The items whose words the data unit holds, in order.
    pub fn items(&self) -> Vec<Item> {
        match self {
            RetSpec::Raw | RetSpec::Void => vec![Item { loc: Loc::Rax, offset: 0, ty: Ty::Signed(64), name: None }],
            RetSpec::Value(v) => v.items().to_vec(),
        }
    }
}

impl fmt::Display for ArgSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in self.values.iter().enumerate() {
            if k > 0 {
                f.write_str(",")?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}

impl fmt::Display for RetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetSpec::Raw => f.write_str("raw"),
            RetSpec::Void => f.write_str("void"),
            RetSpec::Value(v) => write!(f, "{v}"),
        }
    }
}

fn parse_loc(s: &str) -> Option<Loc> {
    let num = |p: &str| s.strip_prefix(p).and_then(|n| n.parse::<u16>().ok());
    if let Some(n) = num("fparg") {
        return (1..=8).contains(&n).then(|| Loc::Float(n as u8 - 1));
    }
    if let Some(n) = num("arg") {
        return match n {
            1..=6 => Some(Loc::Int(n as u8 - 1)),
            7..=1000 => Some(Loc::Stack(n - 6)),
            _ => None,
        };
    }
    if let Some(n) = num("stack") {
        return (1..=1000).contains(&n).then_some(Loc::Stack(n));
    }
    Some(match s {
        "rax" => Loc::Rax,
        "rdx" => Loc::Rdx,
        "xmm0" => Loc::Xmm0,
        "xmm1" => Loc::Xmm1,
        "st0" => Loc::St0,
        _ => return None,
    })
}

pub(crate) fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_item(s: &str) -> Result<Item, String> {
    let (body, name) = match s.split_once(':') {
        Some((b, n)) if valid_name(n) => (b, Some(n.to_string())),
        Some((_, n)) => return Err(format!("bad name `{n}` in `{s}` (letters, digits and _)")),
        None => (s, None),
    };
    let (place, ty) = match body.split_once('/') {
        Some((p, t)) => (p, Some(Ty::parse(t).ok_or_else(|| format!("unknown type `{t}` in `{s}` (i8..i128, u8..u128, x, p, s, c, b, f32, f64, f80)"))?)),
        None => (body, None),
    };
    let (loc, offset) = match place.split_once('+') {
        Some((l, o)) => (l, o.parse::<u8>().map_err(|_| format!("bad offset `{o}` in `{s}`"))?),
        None => (place, 0),
    };
    let loc = parse_loc(loc).ok_or_else(|| format!("unknown location `{loc}` in `{s}` (arg1-6 and beyond, fparg1-8, stackN; rax, rdx, xmm0, xmm1, st0 for return values)"))?;
    let ty = ty.unwrap_or(match loc {
        Loc::Float(_) | Loc::Xmm0 | Loc::Xmm1 => Ty::F64,
        Loc::St0 => Ty::F80,
        _ => Ty::Signed(64),
    });
    Ok(Item { loc, offset, ty, name })
}

/// Splits at commas outside braces.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("unbalanced braces in `{s}`"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced braces in `{s}`"));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_value(s: &str, ret: bool) -> Result<Value, String> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('{') {
        let (inner, name) = match rest.rsplit_once('}') {
            Some((i, "")) => (i, None),
            Some((i, n)) => match n.strip_prefix(':') {
                Some(n) if valid_name(n) => (i, Some(n.to_string())),
                _ => return Err(format!("bad struct name after `}}` in `{s}`")),
            },
            None => return Err(format!("unbalanced braces in `{s}`")),
        };
        let mut fields = Vec::new();
        for f in inner.split(',') {
            let it = parse_item(f.trim())?;
            it.check(ret)?;
            fields.push(it);
        }
        return Ok(Value::Struct { name, fields });
    }
    let it = parse_item(s)?;
    it.check(ret)?;
    Ok(Value::Scalar(it))
}

impl ArgSpec {
    /// Parses an argument spec (see the module's grammar).
    pub fn parse(s: &str) -> Result<ArgSpec, String> {
        if s.trim().is_empty() {
            return Ok(ArgSpec::default());
        }
        let values = split_top(s)?.into_iter().map(|v| parse_value(v, false)).collect::<Result<_, _>>()?;
        Ok(ArgSpec { values })
    }

    /// Each item in data-unit order.
    pub fn items(&self) -> impl Iterator<Item = &Item> {
        self.values.iter().flat_map(|v| v.items())
    }
}

impl RetSpec {
    /// Parses a return spec: `raw`, `void`, a type, or a struct of return locations.
    pub fn parse(s: &str) -> Result<RetSpec, String> {
        let s = s.trim();
        match s {
            "" | "raw" => return Ok(RetSpec::Raw),
            "void" => return Ok(RetSpec::Void),
            _ => {}
        }
        if let Some(ty) = Ty::parse(s) {
            let loc = match ty {
                Ty::F32 | Ty::F64 => Loc::Xmm0,
                Ty::F80 => Loc::St0,
                _ => Loc::Rax,
            };
            return Ok(RetSpec::Value(Value::Scalar(Item { loc, offset: 0, ty, name: None })));
        }
        parse_value(s, true).map(RetSpec::Value)
    }
}

/// Words a capture adds to a data unit, read from `words` (strings vary in length).
fn take<'a>(cap: Capture, words: &'a [u64], at: &mut usize) -> Option<&'a [u64]> {
    let n = match cap {
        Capture::Word(_) => 1,
        Capture::Pair(..) | Capture::X87 => 2,
        Capture::Str(_) => {
            let status = *words.get(*at + 1)?;
            2 + ((status & STR_LEN_MASK) as usize).div_ceil(8)
        }
    };
    let w = words.get(*at..*at + n)?;
    *at += n;
    Some(w)
}

fn bytes_of(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn le_int(b: &[u8]) -> u128 {
    let mut v = [0u8; 16];
    v[..b.len()].copy_from_slice(b);
    u128::from_le_bytes(v)
}

/// An x87 extended value (10 bytes) as the nearest double.
fn f80_to_f64(b: &[u8]) -> f64 {
    let mant = u64::from_le_bytes(b[0..8].try_into().unwrap());
    let se = u16::from_le_bytes([b[8], b[9]]);
    let sign = if se & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = (se & 0x7fff) as i32;
    if exp == 0x7fff {
        return if mant << 1 == 0 { sign * f64::INFINITY } else { f64::NAN };
    }
    if exp == 0 && mant == 0 {
        return sign * 0.0;
    }
    sign * (mant as f64) * 2f64.powi(exp - 16383 - 63)
}

fn write_str_bytes(out: &mut String, b: &[u8]) {
    out.push('"');
    for &c in b {
        match c {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\t' => out.push_str("\\t"),
            b'\r' => out.push_str("\\r"),
            0x20..=0x7e => out.push(c as char),
            _ => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    out.push('"');
}

fn format_item(it: &Item, w: &[u64], out: &mut String) {
    use std::fmt::Write;
    if let Ty::Str = it.ty {
        let (ptr, status) = (w[0], w[1]);
        if ptr == 0 {
            out.push_str("NULL");
        } else if status & STR_BAD != 0 {
            let _ = write!(out, "<bad {ptr:#x}>");
        } else {
            let len = (status & STR_LEN_MASK) as usize;
            let b = bytes_of(&w[2..]);
            write_str_bytes(out, &b[..len.min(b.len())]);
            if status & STR_TRUNCATED != 0 {
                out.push_str("...");
            }
        }
        return;
    }
    let all = bytes_of(w);
    let off = it.offset as usize;
    let b = &all[off.min(all.len())..(off + it.ty.size()).min(all.len())];
    let v = le_int(b);
    let _ = match it.ty {
        Ty::Signed(bits) => {
            let sh = 128 - bits as u32;
            write!(out, "{}", ((v << sh) as i128) >> sh)
        }
        Ty::Unsigned(_) => write!(out, "{v}"),
        Ty::Hex => write!(out, "{v:#x}"),
        Ty::Ptr if v == 0 => write!(out, "NULL"),
        Ty::Ptr => write!(out, "{v:#x}"),
        Ty::Bool => write!(out, "{}", v != 0),
        Ty::Char => match v as u8 {
            b'\'' => write!(out, "'\\''"),
            c @ 0x20..=0x7e => write!(out, "'{}'", c as char),
            c => write!(out, "'\\x{c:02x}'"),
        },
        Ty::F32 => write!(out, "{}", f32::from_bits(v as u32)),
        Ty::F64 => write!(out, "{}", f64::from_bits(v as u64)),
        Ty::F80 => write!(out, "{}", f80_to_f64(b)),
        Ty::Str => unreachable!("strings are handled above"),
    };
}

/// Formats one value from the words at `at` (moved past them); `None` when the words run out
/// (a damaged or cut data unit).
pub fn format_value(v: &Value, words: &[u64], at: &mut usize) -> Option<String> {
    let mut out = String::new();
    match v {
        Value::Scalar(it) => format_item(it, take(it.capture(), words, at)?, &mut out),
        Value::Struct { fields, .. } => {
            out.push('{');
            for (k, it) in fields.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                if let Some(n) = &it.name {
                    out.push_str(n);
                    out.push('=');
                }
                format_item(it, take(it.capture(), words, at)?, &mut out);
            }
            out.push('}');
        }
    }
    Some(out)
}

/// What an injection rule does to the calls it selects.
#[derive(Clone, Debug, PartialEq)]
pub enum InjectAction {
    /// The function does not run: the caller gets `value` (in rax, and in xmm0 when `float`
    /// is given), and `errno` is set when given.
    Return {
        /// The integer returned (the float's bits for a float value).
        value: u64,
        /// The value as a double, for functions returning floating point.
        float: Option<f64>,
        /// `errno` set before returning.
        errno: Option<i32>,
    },
    /// The argument at `loc` is set to `value` before the function runs.
    Argument {
        /// Which argument: an integer register (`arg1`-`arg6`) or `fparg1`-`fparg8`.
        loc: Loc,
        /// The new value (a double's bits for a floating-point argument).
        value: u64,
    },
}

/// A condition on the calls an injection changes (all of a rule's must hold).
#[derive(Clone, Debug, PartialEq)]
pub enum When {
    /// Every N-th call: the N-th, the 2N-th...
    Nth(u64),
    /// The first N calls.
    First(u64),
    /// Every call after the first N.
    After(u64),
    /// Each call with this probability, drawn from the rule's seed and the call's number
    /// (the same calls on every run with the same seed and call order).
    Prob(f64),
    /// Only calls whose argument at this location (integer register or stack slot) has this
    /// value; calls counted by the other conditions are those that pass this one.
    ArgEq(Loc, u64),
}

/// One `--inject` rule: `FUNC=ret:VALUE[,errno:E][,when:COND]...[,seed:S]` or
/// `FUNC@argN=VALUE[,when:COND]...`.
#[derive(Clone, Debug, PartialEq)]
pub struct InjectRule {
    /// Glob on the function's raw or demangled name.
    pub pattern: String,
    /// What it does.
    pub action: InjectAction,
    /// Which calls (all must hold; none: every call).
    pub when: Vec<When>,
    /// Seed of `when:prob=`.
    pub seed: u64,
}

fn parse_number(s: &str) -> Option<(u64, Option<f64>)> {
    let s = s.trim();
    if s == "NULL" {
        return Some((0, None));
    }
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok().map(|v| (v, None));
    }
    if let Ok(v) = s.parse::<i64>() {
        return Some((v as u64, None));
    }
    if let Ok(v) = s.parse::<u64>() {
        return Some((v, None));
    }
    s.parse::<f64>().ok().filter(|_| s.contains(['.', 'e', 'E']) || s.contains("inf") || s.contains("nan")).map(|f| (f.to_bits(), Some(f)))
}

/// `errno` values by name, for `errno:NAME`.
const ERRNO_NAMES: [(&str, i32); 16] = [
    ("EPERM", 1), ("ENOENT", 2), ("EINTR", 4), ("EIO", 5), ("EBADF", 9), ("EAGAIN", 11), ("ENOMEM", 12),
    ("EACCES", 13), ("EFAULT", 14), ("EBUSY", 16), ("EEXIST", 17), ("ENOTDIR", 20), ("EISDIR", 21),
    ("EINVAL", 22), ("EMFILE", 24), ("ENOSPC", 28),
];

impl InjectRule {
    /// Parses a rule; the error says what is wrong and what the syntax is.
    pub fn parse(text: &str) -> Result<InjectRule, String> {
        const SYNTAX: &str = "FUNC=ret:VALUE[,errno:E][,when:COND][,seed:S] or FUNC@argN=VALUE[,when:COND] (COND: nth=N, first=N, after=N, prob=P, argN=V)";
        let mut parts = text.split(',');
        let head = parts.next().unwrap_or("");
        let (target, value) = head.split_once('=').ok_or_else(|| format!("`{text}`: expected {SYNTAX}"))?;
        let (pattern, arg) = match target.split_once('@') {
            Some((f, a)) => (f, Some(a)),
            None => (target, None),
        };
        if pattern.is_empty() {
            return Err(format!("`{text}`: no function named before `=`; expected {SYNTAX}"));
        }
        let mut errno = None;
        let mut when = Vec::new();
        let mut seed = 1;
        for p in parts {
            let (k, v) = p.split_once(':').ok_or_else(|| format!("`{p}` in `{text}`: expected errno:E, when:COND or seed:S"))?;
            match k {
                "errno" => {
                    let e = ERRNO_NAMES.iter().find(|(n, _)| *n == v).map(|&(_, e)| e).or_else(|| v.parse::<i32>().ok().filter(|&e| e > 0));
                    errno = Some(e.ok_or_else(|| format!("`{v}` in `{text}`: not an errno (a positive number or a name such as ENOENT, EIO, ENOMEM)"))?);
                }
                "seed" => seed = v.parse().map_err(|_| format!("`{v}` in `{text}`: the seed is a whole number"))?,
                "when" => {
                    let (c, n) = v.split_once('=').ok_or_else(|| format!("`{v}` in `{text}`: expected nth=N, first=N, after=N, prob=P or argN=V"))?;
                    let count = || n.parse::<u64>().map_err(|_| format!("`{n}` in `{text}`: expected a whole number"));
                    when.push(match c {
                        "nth" => When::Nth(count()?.max(1)),
                        "first" => When::First(count()?),
                        "after" => When::After(count()?),
                        "prob" => When::Prob(n.parse::<f64>().ok().filter(|p| (0.0..=1.0).contains(p)).ok_or_else(|| format!("`{n}` in `{text}`: the probability is between 0 and 1"))?),
                        _ => {
                            let loc = parse_loc(c).filter(|l| matches!(l, Loc::Int(_) | Loc::Stack(_))).ok_or_else(|| format!("`{c}` in `{text}`: a condition on an argument names an integer argument (arg1, arg2...)"))?;
                            let (v, _) = parse_number(n).ok_or_else(|| format!("`{n}` in `{text}`: not a number"))?;
                            When::ArgEq(loc, v)
                        }
                    });
                }
                _ => return Err(format!("`{k}` in `{text}`: expected errno:E, when:COND or seed:S")),
            }
        }
        let action = match arg {
            None => {
                let v = value.strip_prefix("ret:").ok_or_else(|| format!("`{text}`: expected {SYNTAX}"))?;
                let (value, float) = parse_number(v).ok_or_else(|| format!("`{v}` in `{text}`: not a number (decimal, 0x hex, a float, or NULL)"))?;
                InjectAction::Return { value, float, errno }
            }
            Some(a) => {
                if errno.is_some() {
                    return Err(format!("`{text}`: errno: goes with ret:, not with an argument change"));
                }
                let loc = parse_loc(a).filter(|l| matches!(l, Loc::Int(_) | Loc::Float(_))).ok_or_else(|| format!("`{a}` in `{text}`: an argument change names arg1-arg6 or fparg1-fparg8"))?;
                let (mut v, f) = parse_number(value).ok_or_else(|| format!("`{value}` in `{text}`: not a number"))?;
                if let (Loc::Float(_), None) = (loc, f) {
                    v = (v as i64 as f64).to_bits();
                }
                InjectAction::Argument { loc, value: v }
            }
        };
        Ok(InjectRule { pattern: pattern.to_string(), action, when, seed })
    }
}

/// The `n`-th draw (from 0) of a rule with `seed`, uniform in [0, 1): splitmix64, so that the
/// same calls are chosen on every run.
pub fn draw(seed: u64, n: u64) -> f64 {
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_text_round_trips() {
        for s in [
            "arg1/i32,arg2/s,fparg1/f64",
            "arg1/u8:flags,{arg2/i32:x,arg2+4/i32:y}:pt,stack1/i64,stack3/f80",
            "arg1/i128",
        ] {
            let a = ArgSpec::parse(s).unwrap();
            assert_eq!(a.to_string(), s);
            assert_eq!(ArgSpec::parse(&a.to_string()).unwrap(), a);
        }
        assert_eq!(ArgSpec::parse("arg1,fparg2").unwrap().to_string(), "arg1/i64,fparg2/f64");
        assert_eq!(ArgSpec::parse("arg7").unwrap().values[0].items()[0].loc, Loc::Stack(1));
        for s in ["void", "raw", "{rax/i64:a,xmm0/f64:b}"] {
            assert_eq!(RetSpec::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(RetSpec::parse("f64").unwrap().to_string(), "xmm0/f64");
        assert_eq!(RetSpec::parse("u128").unwrap().items()[0].capture(), Capture::Pair(Loc::Rax, Loc::Rdx));
    }

    #[test]
    fn bad_specs_say_why() {
        for (s, why) in [
            ("arg0", "unknown location"),
            ("arg1/q", "unknown type"),
            ("rax", "return value's location"),
            ("arg1+6/i32", "reads past"),
            ("fparg1/s", "floating-point register"),
            ("{arg1/i32", "unbalanced"),
            ("arg1:na-me", "bad name"),
        ] {
            let e = ArgSpec::parse(s).unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
        assert!(RetSpec::parse("{arg1/i32}").unwrap_err().contains("argument's location"));
    }

    #[test]
    fn values_read_as_their_types() {
        let spec = ArgSpec::parse("arg1/i8,arg2/u16,arg3/x,arg4/s,arg5/s,arg6/s,fparg1/f64,fparg2/f32,arg7/c,{arg8/i32:a,arg8+4/i32:b}").unwrap();
        let mut w = vec![0xff, 0xfffff, 0xabc];
        w.extend([0x1000, 5, u64::from_le_bytes(*b"a\"b\nc\0\0\0")]);
        w.extend([0, 0]);
        w.extend([0x10, STR_BAD]);
        w.extend([1.5f64.to_bits(), 2.25f32.to_bits() as u64, b'z' as u64]);
        // Each field takes its own copy of the register they share.
        w.extend([(7u64 << 32) | (-3i32 as u32 as u64); 2]);
        let mut at = 0;
        let got: Vec<String> = spec.values.iter().map(|v| format_value(v, &w, &mut at).unwrap()).collect();
        assert_eq!(got, ["-1", "65535", "0xabc", "\"a\\\"b\\nc\"", "NULL", "<bad 0x10>", "1.5", "2.25", "'z'", "{a=-3, b=7}"]);
        assert_eq!(at, w.len());
        assert_eq!(format_value(&spec.values[0], &[], &mut 0), None);
        let long = ArgSpec::parse("arg1/s").unwrap();
        let mut w = vec![0x2000, STRING_BOUND as u64 | STR_TRUNCATED];
        w.extend(std::iter::repeat_n(u64::from_le_bytes(*b"xxxxxxxx"), STRING_BOUND / 8));
        let s = format_value(&long.values[0], &w, &mut 0).unwrap();
        assert_eq!(s, format!("\"{}\"...", "x".repeat(STRING_BOUND)));
        // 1.0 as an x87 extended value: exponent 16383, explicit integer bit.
        let ld = RetSpec::parse("f80").unwrap();
        let w = [1u64 << 63, 16383];
        let RetSpec::Value(v) = ld else { panic!() };
        assert_eq!(format_value(&v, &w, &mut 0).unwrap(), "1");
        let big = RetSpec::parse("i128").unwrap();
        let RetSpec::Value(v) = big else { panic!() };
        assert_eq!(format_value(&v, &[u64::MAX, u64::MAX], &mut 0).unwrap(), "-1");
    }

    #[test]
    fn injection_rules_parse() {
        let r = InjectRule::parse("malloc=ret:0,when:nth=100").unwrap();
        assert_eq!(r.pattern, "malloc");
        assert_eq!(r.action, InjectAction::Return { value: 0, float: None, errno: None });
        assert_eq!(r.when, [When::Nth(100)]);
        let r = InjectRule::parse("open=ret:-1,errno:ENOENT,when:first=2,when:arg2=0x41").unwrap();
        assert_eq!(r.action, InjectAction::Return { value: u64::MAX, float: None, errno: Some(2) });
        assert_eq!(r.when, [When::First(2), When::ArgEq(Loc::Int(1), 0x41)]);
        let r = InjectRule::parse("scale@fparg1=2.5,when:prob=0.5,seed:7").unwrap();
        assert_eq!(r.action, InjectAction::Argument { loc: Loc::Float(0), value: 2.5f64.to_bits() });
        assert_eq!((r.seed, &r.when[..]), (7, &[When::Prob(0.5)][..]));
        for (bad, why) in [("malloc", "expected"), ("=ret:0", "no function"), ("f=ret:x", "not a number"), ("f=ret:0,errno:EWHAT", "not an errno"), ("f@arg9=1", "argument change"), ("f=ret:0,when:prob=2", "between 0 and 1"), ("f@arg1=1,errno:5", "goes with ret:")] {
            let e = InjectRule::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let hits = (0..10_000).filter(|&n| draw(7, n) < 0.25).count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
        assert_eq!(draw(7, 5), draw(7, 5));
    }
}
