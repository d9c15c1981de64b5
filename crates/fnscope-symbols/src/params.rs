//! Argument and return-value specs of C and C++ functions, from their DWARF: each declared
//! parameter placed where the SysV x86-64 calling convention puts it at entry, in the grammar
//! of [`crate::argspec`].
//!
//! DWARF gives types, not locations (a parameter's `DW_AT_location` says where the compiled
//! body keeps it, often a stack slot of its own), so locations follow from the psABI's
//! classification: integers and pointers in rdi, rsi, rdx, rcx, r8, r9; floats in xmm0-7;
//! small structs by eightbyte; everything else in 8-byte stack slots above the return address.
//! Only units in C-family languages are read: Rust, Go or Fortran functions follow other
//! conventions.
//!
//! One-byte `char` types read as characters (`c`) and pointers to them as strings (`s`),
//! unless a typedef without `char` in its name says the bytes are numbers (`int8_t`,
//! `uint8_t *`). Left out, with their registers or stack slots still counted: structs over
//! 16 bytes, structs holding a long double, unaligned (packed) fields. Left out with every
//! parameter after them (their size or class is not known): vectors, `__float128`,
//! `_Float16`, member pointers, types in other units. Specialised copies (`.constprop`,
//! `.isra`) that list parameters they do not take get no signature.

use std::collections::HashMap;
use std::path::Path;

use gimli::{AttributeValue, Reader as _, UnitOffset};

use crate::argspec::{valid_name, ArgSpec, Item, Loc, RetSpec, Ty, Value};
use crate::lines::{load_dwarf, Reader};
use crate::SymbolError;

type Unit = gimli::Unit<Reader>;
type Entry = gimli::DebuggingInformationEntry<Reader>;
type Off = UnitOffset<usize>;

/// A function's arguments and return value, as specs the agent can capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The parameters that could be placed, in declaration order.
    pub args: ArgSpec,
    /// The return value ([`RetSpec::Raw`] when its type is not understood).
    pub ret: RetSpec,
}

/// Signatures of the functions defined in the DWARF of the ELF file at `path` (or of its
/// separate debug file), by link-time entry address, for the addresses `want` accepts.
///
/// A parameter whose type cannot be placed in registers by field (a struct over 16 bytes, a
/// long double inside a struct) is left out, and later ones are still placed after the stack
/// slots it takes; after one whose size is unknown, the rest are left out. A file without
/// DWARF gives an empty map. Errors only when `path` cannot be read or is not x86-64 ELF.
pub fn signatures(
    path: &Path,
    want: impl Fn(u64) -> bool,
) -> Result<HashMap<u64, Signature>, SymbolError> {
    let mut out = HashMap::new();
    let Some((_, dwarf)) = load_dwarf(path)?.dwarf else {
        return Ok(out);
    };
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        // A unit that does not parse loses its functions' signatures, not the others'.
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let Some(lang) = Lang::of(&unit) else {
            continue;
        };
        let types = Types {
            dwarf: &dwarf,
            unit: &unit,
            lang,
        };
        let mut entries = unit.entries();
        while let Ok(Some(e)) = entries.next_dfs() {
            if e.tag() != gimli::DW_TAG_subprogram {
                continue;
            }
            let Some(address) = entry_address(&dwarf, &unit, e) else {
                continue;
            };
            if out.contains_key(&address) || !want(address) {
                continue;
            }
            if let Some(sig) = types.signature(e) {
                out.insert(address, sig);
            }
        }
    }
    Ok(out)
}

/// The subprogram's entry: `DW_AT_low_pc`, else `DW_AT_entry_pc`, else the first of its
/// ranges (a function split into hot and cold parts lists the part it is entered by first).
fn entry_address(dwarf: &gimli::Dwarf<Reader>, unit: &Unit, e: &Entry) -> Option<u64> {
    let at = |name| {
        e.attr_value(name)
            .and_then(|v| dwarf.attr_address(unit, v).ok().flatten())
    };
    let address = match at(gimli::DW_AT_low_pc).or_else(|| at(gimli::DW_AT_entry_pc)) {
        Some(a) => a,
        None => dwarf.die_ranges(unit, e).ok()?.next().ok()??.begin,
    };
    // Address 0 is a function the linker discarded (its DWARF stays behind).
    (address != 0).then_some(address)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lang {
    C,
    Cpp,
}

impl Lang {
    fn of(unit: &Unit) -> Option<Lang> {
        let root = unit.entry(unit.header.root_offset()).ok()?;
        let AttributeValue::Language(l) = root.attr_value(gimli::DW_AT_language)? else {
            return None;
        };
        match l {
            gimli::DW_LANG_C89
            | gimli::DW_LANG_C
            | gimli::DW_LANG_C99
            | gimli::DW_LANG_C11
            | gimli::DW_LANG_C17
            | gimli::DW_LANG_ObjC => Some(Lang::C),
            gimli::DW_LANG_C_plus_plus
            | gimli::DW_LANG_C_plus_plus_03
            | gimli::DW_LANG_C_plus_plus_11
            | gimli::DW_LANG_C_plus_plus_14
            | gimli::DW_LANG_ObjC_plus_plus => Some(Lang::Cpp),
            _ => None,
        }
    }
}

/// How the psABI classifies one eightbyte of a value passed in registers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Eightbyte {
    Int,
    Sse,
    /// Both eightbytes of a struct that is one long double: returned in st0, passed in memory.
    X87,
}

/// A scalar inside a struct: byte offset in the struct, how it reads, its (flattened) name.
#[derive(Clone, Debug)]
struct Field {
    offset: u64,
    ty: Ty,
    name: Option<String>,
}

/// How a parameter or return type is passed.
#[derive(Debug)]
enum Class {
    /// One scalar: one register or slot (two for 128-bit integers and long doubles).
    Scalar(Ty),
    /// A struct of at most 16 bytes, by eightbyte.
    Regs {
        eightbytes: Vec<Eightbyte>,
        fields: Vec<Field>,
        align: u64,
    },
    /// Copied to the stack (and returned through a hidden pointer).
    Memory { size: u64, align: u64 },
    /// A C++ class that is not trivially copyable: passed as a pointer to a copy, returned
    /// through a hidden pointer.
    ByReference,
    /// Not understood, size unknown.
    Unknown,
}

/// The eightbyte-by-eightbyte view of a struct while its fields are collected.
struct Layout {
    fields: Vec<Field>,
    /// Which eightbytes hold integer-class data (bit-fields included), floats, long doubles.
    int: [bool; 2],
    sse: [bool; 2],
    x87: [bool; 2],
    align: u64,
    unaligned: bool,
}

/// Nesting a type walk follows before giving up: real types are far shallower, and a damaged
/// cycle of references must not loop.
const DEPTH: u32 = 24;

/// Stack slots a spec can name (`stack1000`).
const MAX_SLOT: u16 = 1000;

struct Types<'a> {
    dwarf: &'a gimli::Dwarf<Reader>,
    unit: &'a Unit,
    lang: Lang,
}

fn unit_ref(v: Option<AttributeValue<Reader>>) -> Option<Off> {
    match v? {
        AttributeValue::UnitRef(o) => Some(o),
        _ => None,
    }
}

fn constant(v: Option<AttributeValue<Reader>>) -> Option<u64> {
    let v = v?;
    v.udata_value()
        .or_else(|| v.sdata_value().and_then(|s| u64::try_from(s).ok()))
}

fn flag(e: &Entry, name: gimli::DwAt) -> bool {
    matches!(e.attr_value(name), Some(AttributeValue::Flag(true)))
}

/// `outer_inner` for a field of a nested struct; the field's own name at the top level and
/// inside anonymous members.
fn join(prefix: Option<&str>, name: Option<&str>) -> Option<String> {
    match (prefix, name) {
        (Some(p), Some(n)) => Some(format!("{p}_{n}")),
        (None, n) => n.map(str::to_string),
        (p, None) => p.map(str::to_string),
    }
}

impl Types<'_> {
    fn entry(&self, off: Off) -> Option<Entry> {
        self.unit.entry(off).ok()
    }

    fn name(&self, e: &Entry) -> Option<String> {
        self.string(e.attr_value(gimli::DW_AT_name)?)
    }

    fn string(&self, v: AttributeValue<Reader>) -> Option<String> {
        let s = self.dwarf.attr_string(self.unit, v).ok()?;
        Some(s.to_string_lossy().ok()?.into_owned())
    }

    /// The direct children of the entry at `off`.
    fn children(&self, off: Off) -> Vec<Entry> {
        let mut out = Vec::new();
        let Ok(mut tree) = self.unit.entries_tree(Some(off)) else {
            return out;
        };
        let Ok(root) = tree.root() else {
            return out;
        };
        let mut it = root.children();
        while let Ok(Some(child)) = it.next() {
            out.push(child.entry().clone());
        }
        out
    }

    /// An attribute of `e` or of the entries it completes (`DW_AT_abstract_origin` of an
    /// out-of-line copy, `DW_AT_specification` of a C++ member defined outside its class).
    fn inherited(&self, e: &Entry, name: gimli::DwAt) -> Option<AttributeValue<Reader>> {
        let mut owned;
        let mut e = e;
        for _ in 0..4 {
            if let Some(v) = e.attr_value(name) {
                return Some(v);
            }
            let origin = unit_ref(e.attr_value(gimli::DW_AT_abstract_origin))
                .or_else(|| unit_ref(e.attr_value(gimli::DW_AT_specification)))?;
            owned = self.entry(origin)?;
            e = &owned;
        }
        None
    }

    fn inherited_name(&self, e: &Entry) -> Option<String> {
        self.string(self.inherited(e, gimli::DW_AT_name)?)
    }

    fn params_of(&self, off: Off) -> Vec<Entry> {
        self.children(off)
            .into_iter()
            .filter(|c| c.tag() == gimli::DW_TAG_formal_parameter)
            .collect()
    }

    /// The function's declared parameters. `None` for a compiler's specialised copy of a
    /// function (`.constprop`, `.isra`): it lists the original's parameters, but takes fewer
    /// or others, so no spec would be right.
    fn params(&self, func: &Entry) -> Option<Vec<Entry>> {
        let own = self.params_of(func.offset());
        let Some(origin) = unit_ref(func.attr_value(gimli::DW_AT_abstract_origin)) else {
            return Some(own);
        };
        let theirs = self.params_of(origin);
        // A faithful copy lists the original's parameters in order; a specialised one lists
        // the replaced ones too (with DW_AT_const_value), after those it kept.
        let faithful = own.len() == theirs.len()
            && own.iter().zip(&theirs).all(|(o, t)| {
                unit_ref(o.attr_value(gimli::DW_AT_abstract_origin)).is_none_or(|x| x == t.offset())
                    && o.attr_value(gimli::DW_AT_const_value).is_none()
            });
        faithful.then_some(own)
    }

    fn signature(&self, func: &Entry) -> Option<Signature> {
        // DW_CC_nocall and vendor conventions say calls do not follow the psABI.
        if let Some(AttributeValue::CallingConvention(cc)) =
            func.attr_value(gimli::DW_AT_calling_convention)
        {
            if cc != gimli::DW_CC_normal {
                return None;
            }
        }
        let params = self.params(func)?;
        // Calls to an unprototyped C function promote float arguments to double.
        let promote = self.lang == Lang::C
            && !matches!(
                self.inherited(func, gimli::DW_AT_prototyped),
                Some(AttributeValue::Flag(true))
            );
        let mut at = Slots {
            int: 0,
            sse: 0,
            stack: 1,
        };
        let ret = match unit_ref(self.inherited(func, gimli::DW_AT_type)) {
            None => RetSpec::Void,
            Some(t) => match self.classify(t) {
                Class::Unknown => {
                    return Some(Signature {
                        args: ArgSpec::default(),
                        ret: RetSpec::Raw,
                    })
                }
                Class::Memory { .. } | Class::ByReference => {
                    // The caller's buffer comes in rdi and goes back in rax.
                    at.int = 1;
                    RetSpec::Value(Value::Scalar(Item {
                        loc: Loc::Rax,
                        offset: 0,
                        ty: Ty::Ptr,
                        name: None,
                    }))
                }
                c => return_value(c).map_or(RetSpec::Raw, RetSpec::Value),
            },
        };
        let mut values = Vec::new();
        for p in params {
            let name = self
                .inherited_name(&p)
                .or_else(|| flag(&p, gimli::DW_AT_artificial).then(|| "this".to_string()))
                .filter(|n| valid_name(n));
            let Some(t) = unit_ref(self.inherited(&p, gimli::DW_AT_type)) else {
                break;
            };
            let class = match self.classify(t) {
                Class::Scalar(Ty::F32) if promote => Class::Scalar(Ty::F64),
                c => c,
            };
            match at.place(class, name) {
                Placed::Value(v) => values.push(v),
                Placed::Skipped => {}
                Placed::Lost => break,
            }
        }
        Some(Signature {
            args: ArgSpec { values },
            ret,
        })
    }

    /// Follows typedefs and qualifiers: the type itself, and the name of the outermost
    /// typedef on the way. `None` for void (or a broken reference).
    fn strip(&self, mut off: Off) -> Option<(Entry, Option<String>)> {
        let mut typedef = None;
        for _ in 0..DEPTH {
            let e = self.entry(off)?;
            match e.tag() {
                gimli::DW_TAG_typedef
                | gimli::DW_TAG_const_type
                | gimli::DW_TAG_volatile_type
                | gimli::DW_TAG_restrict_type
                | gimli::DW_TAG_atomic_type => {
                    if e.tag() == gimli::DW_TAG_typedef && typedef.is_none() {
                        typedef = self.name(&e);
                    }
                    off = unit_ref(e.attr_value(gimli::DW_AT_type))?;
                }
                _ => return Some((e, typedef)),
            }
        }
        None
    }

    /// The scalar a type reads as, if it is one (not a struct, array or unknown).
    fn scalar(&self, off: Off, depth: u32) -> Option<Ty> {
        let (e, typedef) = self.strip(off)?;
        let size = constant(e.attr_value(gimli::DW_AT_byte_size));
        match e.tag() {
            gimli::DW_TAG_base_type => {
                let Some(AttributeValue::Encoding(enc)) = e.attr_value(gimli::DW_AT_encoding)
                else {
                    return None;
                };
                let bits = u8::try_from(size? * 8)
                    .ok()
                    .filter(|b| [8, 16, 32, 64, 128].contains(b))?;
                // `uint8_t` and other byte typedefs are numbers; `char` and `gchar` characters.
                let numeric = typedef.is_some_and(|n| !n.contains("char"));
                Some(match enc {
                    gimli::DW_ATE_boolean if bits == 8 => Ty::Bool,
                    gimli::DW_ATE_boolean | gimli::DW_ATE_unsigned | gimli::DW_ATE_UTF => {
                        Ty::Unsigned(bits)
                    }
                    gimli::DW_ATE_signed_char if bits == 8 && !numeric => Ty::Char,
                    gimli::DW_ATE_unsigned_char if bits == 8 && !numeric => Ty::Char,
                    gimli::DW_ATE_signed | gimli::DW_ATE_signed_char => Ty::Signed(bits),
                    gimli::DW_ATE_unsigned_char => Ty::Unsigned(bits),
                    gimli::DW_ATE_float => match bits {
                        32 => Ty::F32,
                        64 => Ty::F64,
                        // __float128 is 16 bytes too, but an SSE value.
                        128 if self.name(&e).as_deref() == Some("long double") => Ty::F80,
                        _ => return None,
                    },
                    _ => return None,
                })
            }
            gimli::DW_TAG_enumeration_type => {
                if let Some(under) = unit_ref(e.attr_value(gimli::DW_AT_type)) {
                    if depth < DEPTH {
                        return self.scalar(under, depth + 1);
                    }
                }
                let bits = u8::try_from(size? * 8)
                    .ok()
                    .filter(|b| [8, 16, 32, 64].contains(b))?;
                let signed = match e.attr_value(gimli::DW_AT_encoding) {
                    Some(AttributeValue::Encoding(enc)) => enc == gimli::DW_ATE_signed,
                    _ => self.children(e.offset()).iter().any(|c| matches!(c.attr_value(gimli::DW_AT_const_value), Some(AttributeValue::Sdata(v)) if v < 0)),
                };
                Some(if signed {
                    Ty::Signed(bits)
                } else {
                    Ty::Unsigned(bits)
                })
            }
            gimli::DW_TAG_pointer_type
            | gimli::DW_TAG_reference_type
            | gimli::DW_TAG_rvalue_reference_type => {
                let to_char = e.tag() == gimli::DW_TAG_pointer_type
                    && unit_ref(e.attr_value(gimli::DW_AT_type)).is_some_and(|t| {
                        depth < DEPTH && self.scalar(t, depth + 1) == Some(Ty::Char)
                    });
                Some(if to_char { Ty::Str } else { Ty::Ptr })
            }
            _ => None,
        }
    }

    fn classify(&self, off: Off) -> Class {
        if let Some(ty) = self.scalar(off, 0) {
            return Class::Scalar(ty);
        }
        let Some((e, _)) = self.strip(off) else {
            return Class::Unknown;
        };
        let aggregate = matches!(
            e.tag(),
            gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type | gimli::DW_TAG_union_type
        ) || matches!(
            e.attr_value(gimli::DW_AT_encoding),
            Some(AttributeValue::Encoding(gimli::DW_ATE_complex_float))
        );
        let Some(size) = constant(e.attr_value(gimli::DW_AT_byte_size)).filter(|&s| s > 0) else {
            return Class::Unknown;
        };
        if !aggregate {
            return Class::Unknown;
        }
        if self.lang == Lang::Cpp && self.nontrivial(&e, 0) {
            return Class::ByReference;
        }
        let Some(align) = self.align(off, 0) else {
            return Class::Unknown;
        };
        if size > 16 {
            return Class::Memory { size, align };
        }
        let mut l = Layout {
            fields: Vec::new(),
            int: [false; 2],
            sse: [false; 2],
            x87: [false; 2],
            align,
            unaligned: false,
        };
        if self.collect(off, 0, None, &mut l, 0).is_none() {
            return Class::Unknown;
        }
        if l.unaligned {
            return Class::Memory { size, align };
        }
        let mut eightbytes = Vec::new();
        for k in 0..size.div_ceil(8) as usize {
            eightbytes.push(match (l.int[k], l.sse[k], l.x87[k]) {
                (false, false, true) => Eightbyte::X87,
                (_, _, true) => return Class::Memory { size, align },
                (true, _, _) => Eightbyte::Int,
                (false, true, _) => Eightbyte::Sse,
                // Padding alone: the psABI's NO_CLASS, which no test here covers.
                (false, false, false) => return Class::Unknown,
            });
        }
        Class::Regs {
            eightbytes,
            fields: l.fields,
            align: l.align,
        }
    }

    /// Adds the scalars of the type at `off`, at `base` bytes into the struct, to `l`.
    fn collect(
        &self,
        off: Off,
        base: u64,
        prefix: Option<&str>,
        l: &mut Layout,
        depth: u32,
    ) -> Option<()> {
        if depth > DEPTH {
            return None;
        }
        if let Some(ty) = self.scalar(off, 0) {
            return self.leaf(base, ty, prefix, l);
        }
        let (e, _) = self.strip(off)?;
        if matches!(
            e.attr_value(gimli::DW_AT_encoding),
            Some(AttributeValue::Encoding(gimli::DW_ATE_complex_float))
        ) {
            let ty = match constant(e.attr_value(gimli::DW_AT_byte_size))? {
                8 => Ty::F32,
                16 => Ty::F64,
                _ => return None,
            };
            let half = ty.size() as u64;
            self.leaf(base, ty, join(prefix, Some("re")).as_deref(), l)?;
            return self.leaf(base + half, ty, join(prefix, Some("im")).as_deref(), l);
        }
        match e.tag() {
            gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type | gimli::DW_TAG_union_type => {
                for m in self.children(e.offset()) {
                    let base_class = m.tag() == gimli::DW_TAG_inheritance;
                    if !(base_class || m.tag() == gimli::DW_TAG_member)
                        || flag(&m, gimli::DW_AT_declaration)
                        || flag(&m, gimli::DW_AT_external)
                    {
                        continue;
                    }
                    // A virtual base's place is computed at run time.
                    let at = match m.attr_value(gimli::DW_AT_data_member_location) {
                        None => 0,
                        v => constant(v)?,
                    };
                    let t = unit_ref(m.attr_value(gimli::DW_AT_type))?;
                    if let Some(bits) = constant(m.attr_value(gimli::DW_AT_bit_size)) {
                        // A bit-field reads as no type of the grammar, but its bytes are integer class.
                        let first =
                            constant(m.attr_value(gimli::DW_AT_data_bit_offset)).unwrap_or(at * 8);
                        for bit in [first, first + bits.max(1) - 1] {
                            l.int[((base * 8 + bit) / 64).min(1) as usize] = true;
                        }
                        continue;
                    }
                    let name = if base_class {
                        prefix.map(str::to_string)
                    } else {
                        join(prefix, self.name(&m).as_deref())
                    };
                    self.collect(t, base + at, name.as_deref(), l, depth + 1)?;
                }
                Some(())
            }
            gimli::DW_TAG_array_type => {
                let elem = unit_ref(e.attr_value(gimli::DW_AT_type))?;
                let stride = self.size(elem)?;
                let mut count = 1u64;
                for r in self
                    .children(e.offset())
                    .iter()
                    .filter(|c| c.tag() == gimli::DW_TAG_subrange_type)
                {
                    let n = match constant(r.attr_value(gimli::DW_AT_count)) {
                        Some(n) => n,
                        // A flexible array member takes no bytes of the struct.
                        None => {
                            constant(r.attr_value(gimli::DW_AT_upper_bound)).map_or(0, |u| u + 1)
                        }
                    };
                    count = count.checked_mul(n)?;
                }
                if count.checked_mul(stride)? > 16 {
                    return None;
                }
                for i in 0..count {
                    let name = prefix.map(|p| format!("{p}_{i}"));
                    self.collect(elem, base + i * stride, name.as_deref(), l, depth + 1)?;
                }
                Some(())
            }
            _ => None,
        }
    }

    fn leaf(&self, offset: u64, ty: Ty, name: Option<&str>, l: &mut Layout) -> Option<()> {
        let (size, class) = match ty {
            Ty::F80 => (16, 2),
            Ty::F32 | Ty::F64 => (ty.size() as u64, 1),
            _ => (ty.size() as u64, 0),
        };
        if !offset.is_multiple_of(size) || offset + size > 16 {
            l.unaligned = true;
            return Some(());
        }
        for k in (offset / 8)..(offset + size).div_ceil(8) {
            let slot = match class {
                0 => &mut l.int,
                1 => &mut l.sse,
                _ => &mut l.x87,
            };
            slot[k as usize] = true;
        }
        l.fields.push(Field {
            offset,
            ty,
            name: name.map(str::to_string).filter(|n| valid_name(n)),
        });
        Some(())
    }

    fn size(&self, off: Off) -> Option<u64> {
        let (e, _) = self.strip(off)?;
        if let Some(s) = constant(e.attr_value(gimli::DW_AT_byte_size)) {
            return Some(s);
        }
        if e.tag() != gimli::DW_TAG_array_type {
            return None;
        }
        let elem = self.size(unit_ref(e.attr_value(gimli::DW_AT_type))?)?;
        let mut n = elem;
        for r in self
            .children(e.offset())
            .iter()
            .filter(|c| c.tag() == gimli::DW_TAG_subrange_type)
        {
            let count = constant(r.attr_value(gimli::DW_AT_count))
                .or_else(|| constant(r.attr_value(gimli::DW_AT_upper_bound)).map(|u| u + 1))?;
            n = n.checked_mul(count)?;
        }
        Some(n)
    }

    /// The type's alignment, for its place on the stack.
    fn align(&self, off: Off, depth: u32) -> Option<u64> {
        if depth > DEPTH {
            return None;
        }
        let (e, _) = self.strip(off)?;
        let own = constant(e.attr_value(gimli::DW_AT_alignment)).unwrap_or(1);
        let natural = match e.tag() {
            gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type | gimli::DW_TAG_union_type => {
                let mut a = 1;
                for m in self.children(e.offset()) {
                    if matches!(m.tag(), gimli::DW_TAG_member | gimli::DW_TAG_inheritance)
                        && !flag(&m, gimli::DW_AT_declaration)
                        && !flag(&m, gimli::DW_AT_external)
                    {
                        a = a.max(
                            self.align(unit_ref(m.attr_value(gimli::DW_AT_type))?, depth + 1)?,
                        );
                    }
                }
                a
            }
            gimli::DW_TAG_array_type => {
                self.align(unit_ref(e.attr_value(gimli::DW_AT_type))?, depth + 1)?
            }
            gimli::DW_TAG_pointer_type
            | gimli::DW_TAG_reference_type
            | gimli::DW_TAG_rvalue_reference_type => 8,
            _ => {
                let s = constant(e.attr_value(gimli::DW_AT_byte_size))?;
                // Complex numbers align as their parts.
                if matches!(
                    e.attr_value(gimli::DW_AT_encoding),
                    Some(AttributeValue::Encoding(gimli::DW_ATE_complex_float))
                ) {
                    s / 2
                } else {
                    s
                }
            }
        };
        Some(own.max(natural).clamp(1, 16))
    }

    /// Whether a C++ class is passed by invisible reference: it has a user-provided copy or
    /// move constructor or destructor, virtual functions or bases, or a member or base that is
    /// such a class.
    fn nontrivial(&self, class: &Entry, depth: u32) -> bool {
        if depth > DEPTH {
            return false;
        }
        let class_name = self.name(class);
        let bare = class_name
            .as_deref()
            .map(|n| n.split('<').next().unwrap_or(n));
        for m in self.children(class.offset()) {
            match m.tag() {
                gimli::DW_TAG_subprogram => {
                    if m.attr_value(gimli::DW_AT_virtuality).is_some_and(|v| {
                        !matches!(v, AttributeValue::Virtuality(gimli::DW_VIRTUALITY_none))
                    }) {
                        return true;
                    }
                    // Implicit members are as trivial as the members and bases they copy,
                    // which are looked at below; defaulted in the class, likewise.
                    let defaulted_here = constant(m.attr_value(gimli::DW_AT_defaulted))
                        == Some(u64::from(gimli::DW_DEFAULTED_in_class.0));
                    if flag(&m, gimli::DW_AT_artificial)
                        || defaulted_here
                        || flag(&m, gimli::DW_AT_deleted)
                    {
                        continue;
                    }
                    let Some(name) = self.name(&m) else {
                        continue;
                    };
                    if name.starts_with('~')
                        || (Some(name.as_str()) == bare && self.copies(&m, class.offset()))
                    {
                        return true;
                    }
                }
                gimli::DW_TAG_inheritance | gimli::DW_TAG_member => {
                    if m.tag() == gimli::DW_TAG_inheritance
                        && m.attr_value(gimli::DW_AT_virtuality).is_some_and(|v| {
                            !matches!(v, AttributeValue::Virtuality(gimli::DW_VIRTUALITY_none))
                        })
                    {
                        return true;
                    }
                    if flag(&m, gimli::DW_AT_declaration) || flag(&m, gimli::DW_AT_external) {
                        continue;
                    }
                    let mut t = unit_ref(m.attr_value(gimli::DW_AT_type));
                    // Arrays of a class copy each element.
                    while let Some((e, _)) = t.and_then(|t| self.strip(t)) {
                        match e.tag() {
                            gimli::DW_TAG_array_type => {
                                t = unit_ref(e.attr_value(gimli::DW_AT_type))
                            }
                            gimli::DW_TAG_structure_type
                            | gimli::DW_TAG_class_type
                            | gimli::DW_TAG_union_type => {
                                if self.nontrivial(&e, depth + 1) {
                                    return true;
                                }
                                break;
                            }
                            _ => break,
                        }
                    }
                }
                _ => {}
            }
        }
        false
    }

    /// Whether constructor `ctor` of `class` is a copy or move constructor: its first
    /// parameter after `this` is a reference to the class.
    fn copies(&self, ctor: &Entry, class: Off) -> bool {
        let Some(first) = self
            .params_of(ctor.offset())
            .into_iter()
            .find(|p| !flag(p, gimli::DW_AT_artificial))
        else {
            return false;
        };
        let Some((r, _)) =
            unit_ref(first.attr_value(gimli::DW_AT_type)).and_then(|t| self.strip(t))
        else {
            return false;
        };
        matches!(
            r.tag(),
            gimli::DW_TAG_reference_type | gimli::DW_TAG_rvalue_reference_type
        ) && unit_ref(r.attr_value(gimli::DW_AT_type))
            .and_then(|t| self.strip(t))
            .is_some_and(|(c, _)| c.offset() == class)
    }
}

/// Registers and stack slots taken so far by the arguments.
struct Slots {
    int: u8,
    sse: u8,
    /// The next free stack slot.
    stack: u16,
}

enum Placed {
    Value(Value),
    /// Not shown, but its registers or slots are accounted for.
    Skipped,
    /// Its size is unknown: no later argument can be placed.
    Lost,
}

impl Slots {
    /// The first of `bytes.div_ceil(8)` stack slots, aligned (slot 1 is 16-aligned at entry:
    /// the call pushed the return address on a 16-aligned stack).
    fn stack(&mut self, bytes: u64, align: u64) -> Option<u16> {
        let mut first = self.stack;
        if align > 8 && first.is_multiple_of(2) {
            first += 1;
        }
        let next = first.checked_add(u16::try_from(bytes.div_ceil(8)).ok()?)?;
        self.stack = next;
        (next - 1 <= MAX_SLOT).then_some(first)
    }

    fn place(&mut self, class: Class, name: Option<String>) -> Placed {
        let scalar = |loc: Option<Loc>, ty, name| match loc {
            Some(loc) => Placed::Value(Value::Scalar(Item {
                loc,
                offset: 0,
                ty,
                name,
            })),
            None => Placed::Lost,
        };
        match class {
            Class::Scalar(ty @ (Ty::F32 | Ty::F64)) => {
                let loc = if self.sse < 8 {
                    self.sse += 1;
                    Some(Loc::Float(self.sse - 1))
                } else {
                    self.stack(8, 8).map(Loc::Stack)
                };
                scalar(loc, ty, name)
            }
            Class::Scalar(Ty::F80) => scalar(self.stack(16, 16).map(Loc::Stack), Ty::F80, name),
            Class::Scalar(ty @ (Ty::Signed(128) | Ty::Unsigned(128))) => {
                // Both halves in registers, or both on the stack.
                let loc = if self.int <= 4 {
                    self.int += 2;
                    Some(Loc::Int(self.int - 2))
                } else {
                    self.stack(16, 16).map(Loc::Stack)
                };
                scalar(loc, ty, name)
            }
            Class::Scalar(ty) => scalar(self.int_or_stack(), ty, name),
            Class::ByReference => scalar(self.int_or_stack(), Ty::Ptr, name),
            Class::Memory { size, align } => match self.stack(size, align) {
                Some(_) => Placed::Skipped,
                None => Placed::Lost,
            },
            Class::Regs {
                eightbytes,
                fields,
                align,
            } => {
                if eightbytes.contains(&Eightbyte::X87) {
                    return match self.stack(16, 16) {
                        Some(_) => Placed::Skipped,
                        None => Placed::Lost,
                    };
                }
                let ints = eightbytes.iter().filter(|&&e| e == Eightbyte::Int).count() as u8;
                let sses = eightbytes.len() as u8 - ints;
                let locs: Vec<Loc> = if self.int + ints <= 6 && self.sse + sses <= 8 {
                    eightbytes
                        .iter()
                        .map(|e| {
                            let r = if *e == Eightbyte::Int {
                                &mut self.int
                            } else {
                                &mut self.sse
                            };
                            *r += 1;
                            if *e == Eightbyte::Int {
                                Loc::Int(*r - 1)
                            } else {
                                Loc::Float(*r - 1)
                            }
                        })
                        .collect()
                } else {
                    let Some(first) = self.stack(eightbytes.len() as u64 * 8, align) else {
                        return Placed::Lost;
                    };
                    (0..eightbytes.len() as u16)
                        .map(|k| Loc::Stack(first + k))
                        .collect()
                };
                struct_value(fields, &locs, name)
            }
            Class::Unknown => Placed::Lost,
        }
    }

    fn int_or_stack(&mut self) -> Option<Loc> {
        if self.int < 6 {
            self.int += 1;
            Some(Loc::Int(self.int - 1))
        } else {
            self.stack(8, 8).map(Loc::Stack)
        }
    }
}

/// Each field from the location of its eightbyte.
fn struct_value(fields: Vec<Field>, locs: &[Loc], name: Option<String>) -> Placed {
    if fields.is_empty() {
        return Placed::Skipped;
    }
    let fields = fields
        .into_iter()
        .map(|f| Item {
            loc: locs[(f.offset / 8) as usize],
            offset: (f.offset % 8) as u8,
            ty: f.ty,
            name: f.name,
        })
        .collect();
    Placed::Value(Value::Struct { name, fields })
}

/// Where a value returned in registers is; `None` when it cannot be shown (a struct of
/// bit-fields only).
fn return_value(class: Class) -> Option<Value> {
    let item = |loc, ty| {
        Value::Scalar(Item {
            loc,
            offset: 0,
            ty,
            name: None,
        })
    };
    match class {
        Class::Scalar(ty @ (Ty::F32 | Ty::F64)) => Some(item(Loc::Xmm0, ty)),
        Class::Scalar(Ty::F80) => Some(item(Loc::St0, Ty::F80)),
        Class::Scalar(ty) => Some(item(Loc::Rax, ty)),
        Class::Regs {
            eightbytes, fields, ..
        } => {
            let (mut ints, mut sses) = (
                [Loc::Rax, Loc::Rdx].into_iter(),
                [Loc::Xmm0, Loc::Xmm1].into_iter(),
            );
            let locs: Vec<Loc> = eightbytes
                .iter()
                .map(|e| match e {
                    Eightbyte::Int => ints.next(),
                    Eightbyte::Sse => sses.next(),
                    Eightbyte::X87 => Some(Loc::St0),
                })
                .collect::<Option<_>>()?;
            match struct_value(fields, &locs, None) {
                Placed::Value(v) => Some(v),
                _ => None,
            }
        }
        Class::Memory { .. } | Class::ByReference | Class::Unknown => None,
    }
}
