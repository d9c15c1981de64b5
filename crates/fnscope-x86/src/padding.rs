//! The module-wide view: which code addresses are referenced (branch targets, `lea` of code
//! addresses, RIP-relative data accesses), and which bytes are padding that no code can reach.
//!
//! A byte is free padding when it lies in a run that
//! - belongs to no symbol and no FDE ([`fnscope_symbols::Inventory::claims`]),
//! - starts right after an unconditional `ret`/`jmp` that ends claimed code, so that nothing
//!   falls through into it,
//! - holds only `nop` (any length) and `int3` instructions: what assemblers and linkers put
//!   between functions (gas aligns with multi-byte nops, lld fills with `int3`). Zero bytes are
//!   not taken: in code they are as likely data (a table, a constant) as filler,
//! - and ends before the first byte any instruction of the module refers to.

use fnscope_symbols::Inventory;
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};

/// How an instruction refers to an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefKind {
    /// A direct branch or call lands there.
    Branch,
    /// A `lea` computes the address (a code pointer about to be called or compared).
    Lea,
    /// A RIP-relative memory operand reads or writes there.
    Memory,
}

/// One reference of an instruction to an address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ref {
    pub target: u64,
    pub source: u64,
    pub kind: RefKind,
}

/// A run of free padding, and how much of it has been handed out (from its start).
#[derive(Debug, Clone, Copy)]
struct Run {
    start: u64,
    end: u64,
    next_free: u64,
}

/// References into the first bytes of functions and into unclaimed bytes, and the free
/// padding runs.
pub(crate) struct Module {
    /// Sorted by target.
    refs: Vec<Ref>,
    /// Sorted by start, disjoint.
    runs: Vec<Run>,
}

impl Module {
    /// Decodes all code of `inv` once, in pieces on up to `threads` threads. References are
    /// kept when they land in code, within `near_start` bytes of a function start or outside
    /// every claim.
    pub(crate) fn scan(inv: &Inventory, data: &[u8], near_start: u64, threads: usize) -> Module {
        let owned = coalesce(&inv.claims);
        let owned_starts: Vec<u64> = owned.iter().map(|r| r.0).collect();
        let owned_index = Paged::new(&owned_starts);
        let is_owned = |a: u64| {
            let i = owned_index.count_le(a);
            i > 0 && a < owned[i - 1].1
        };
        // Ends of claimed code followed by unclaimed bytes of the same section.
        let gap_starts: Vec<u64> = owned
            .iter()
            .map(|r| r.1)
            .filter(|&e| inv.code_range(e).is_some_and(|c| c.contains(e - 1)) && !is_owned(e))
            .collect();
        let mut after_terminator = vec![false; gap_starts.len()];
        let starts: Vec<u64> = inv.functions.iter().map(|f| f.address).collect();
        let starts_index = Paged::new(&starts);
        // Only code can hold a patch or padding: references to data (most RIP-relative
        // operands) are dropped first, without the two searches. A big module has millions
        // of references: most data ones lie outside the span of all code, and most branches
        // land in its biggest section, each told by two comparisons.
        let code_lo = inv.code.iter().map(|c| c.address).min().unwrap_or(0);
        let code_hi = inv.code.iter().map(|c| c.address + c.size).max().unwrap_or(0);
        // Only a biggest section no other overlaps answers as `code_range` would.
        let text = inv.code.iter().max_by_key(|c| c.size).filter(|t| {
            inv.code.iter().all(|c| std::ptr::eq(c, *t) || c.address >= t.address + t.size || c.address + c.size <= t.address)
        });
        let interesting = |t: u64| {
            if t < code_lo || t >= code_hi || !(text.is_some_and(|c| c.contains(t)) || inv.code_range(t).is_some()) {
                return false;
            }
            let j = starts_index.count_le(t);
            (j > 0 && t - starts[j - 1] < near_start) || !is_owned(t)
        };
        let pieces = pieces(inv, data, &starts, threads);
        let scan_piece = |&(bytes, base, from, to): &Piece<'_>| {
            scan_piece(bytes, base, from, to, &starts, &gap_starts, &interesting)
        };
        // Each thread sorts the references of its pieces (a big module has millions: sorting
        // them was a tenth of a first analysis, on one processor), and the sorted runs are
        // merged. Within a code range no two references share a source, and the kind breaks
        // ties between overlapping ranges, so the order is that of one sort of all, whatever
        // the threads.
        let by_target = |r: &Ref| (r.target, r.source, r.kind as u8);
        let scan_sorted = |mine: &mut dyn Iterator<Item = (usize, &Piece<'_>)>| {
            let mut refs = Vec::new();
            let mut terms = Vec::new();
            for (i, p) in mine {
                let (r, t) = scan_piece(p);
                refs.extend(r);
                terms.push((i, t));
            }
            refs.sort_unstable_by_key(by_target);
            (refs, terms)
        };
        let mut runs: Vec<Vec<Ref>> = Vec::new();
        let mut terms_of: Vec<Option<Vec<(usize, bool)>>> = vec![None; pieces.len()];
        if threads > 1 && pieces.len() > 1 {
            // Each thread takes every `threads`-th piece.
            std::thread::scope(|sc| {
                let handles: Vec<_> = (0..threads)
                    .filter_map(|t| {
                        let (pieces, scan_sorted) = (&pieces, &scan_sorted);
                        std::thread::Builder::new()
                            .spawn_scoped(sc, move || scan_sorted(&mut pieces.iter().enumerate().skip(t).step_by(threads)))
                            .ok()
                    })
                    .collect();
                for h in handles {
                    // A piece's scan does not panic; if a thread did, or could not be made (a
                    // limit on processes), its pieces are scanned below.
                    if let Ok((refs, terms)) = h.join() {
                        runs.push(refs);
                        for (i, t) in terms {
                            terms_of[i] = Some(t);
                        }
                    }
                }
            });
        }
        let (left, terms) = scan_sorted(&mut pieces.iter().enumerate().filter(|(i, _)| terms_of[*i].is_none()));
        runs.push(left);
        for (i, t) in terms {
            terms_of[i] = Some(t);
        }
        // In piece order, as one pass from start to end would have set them.
        for (g, t) in terms_of.into_iter().flatten().flatten() {
            after_terminator[g] = t;
        }
        let refs = merge_sorted(runs, by_target);
        let mut runs = Vec::new();
        for (&start, _) in gap_starts
            .iter()
            .zip(&after_terminator)
            .filter(|(_, &t)| t)
        {
            let limit = owned
                .get(owned.partition_point(|r| r.0 <= start))
                .map_or(u64::MAX, |r| r.0);
            let first_ref = refs
                .get(refs.partition_point(|r| r.target < start))
                .map_or(u64::MAX, |r| r.target);
            let end = padding_end(inv, data, start, limit.min(first_ref));
            if end > start {
                runs.push(Run {
                    start,
                    end,
                    next_free: start,
                });
            }
        }
        Module { refs, runs }
    }

    /// References that land in `[from, to)`.
    pub(crate) fn refs_into(&self, from: u64, to: u64) -> &[Ref] {
        let a = self.refs.partition_point(|r| r.target < from);
        let b = self.refs.partition_point(|r| r.target < to);
        &self.refs[a..b]
    }

    /// Takes the padding from `at` (the start of a run) up to `to`, if the run reaches it and
    /// none of it is taken yet.
    pub(crate) fn take_after(&mut self, at: u64, to: u64) -> bool {
        let Ok(i) = self.runs.binary_search_by_key(&at, |r| r.start) else {
            return false;
        };
        let run = &mut self.runs[i];
        if run.next_free != run.start || run.end < to {
            return false;
        }
        run.next_free = to;
        true
    }

    /// Takes `len` free bytes whose start lies in `[lo, hi]`, and returns that start.
    pub(crate) fn take_island(&mut self, lo: u64, hi: u64, len: u64) -> Option<u64> {
        let from = self.runs.partition_point(|r| r.end < lo.saturating_add(len));
        for run in &mut self.runs[from..] {
            if run.start > hi {
                break;
            }
            let at = run.next_free.max(lo);
            if at <= hi && at + len <= run.end {
                run.next_free = at + len;
                return Some(at);
            }
        }
        None
    }
}

/// What [`scan_piece`] finds: references, and whether a terminator ends right before each
/// gap (by index in `gap_starts`) the piece's instructions reach.
type Scanned = (Vec<Ref>, Vec<(usize, bool)>);

/// A piece of code to decode: the code range's bytes and address, and the piece's bounds (the
/// first a function start or the range's start, the second the next piece's start).
type Piece<'a> = (&'a [u8], u64, u64, u64);

/// Splits the code of `inv` at function starts into pieces of about equal size, a few per
/// thread (pieces of one size can still take different times).
fn pieces<'a>(inv: &Inventory, data: &'a [u8], starts: &[u64], threads: usize) -> Vec<Piece<'a>> {
    let total: u64 = inv.code.iter().map(|r| r.size).sum();
    let target = (total / (4 * threads.max(1) as u64)).max(1 << 16);
    let mut out = Vec::new();
    for range in &inv.code {
        let Some(bytes) = inv.code_bytes(data, range.address) else {
            continue;
        };
        let (base, end) = (range.address, range.address + bytes.len() as u64);
        let mut from = base;
        let first = starts.partition_point(|&s| s <= base);
        for &s in starts[first..].iter().take_while(|&&s| s < end) {
            if s - from >= target {
                out.push((bytes, base, from, s));
                from = s;
            }
        }
        out.push((bytes, base, from, end));
    }
    out
}

/// Decodes `[from, to)` of a code range (`bytes` at `base`), as [`Module::scan`] does all of
/// it: the references kept and, for gaps right after the piece's instructions, whether a
/// terminator ends before them (by index in `gap_starts`).
fn scan_piece(
    bytes: &[u8],
    base: u64,
    from: u64,
    to: u64,
    starts: &[u64],
    gap_starts: &[u64],
    interesting: &dyn Fn(u64) -> bool,
) -> Scanned {
    let (mut refs, mut terms) = (Vec::new(), Vec::new());
    let end = base + bytes.len() as u64;
    let mut instr = Instruction::default();
    let mut decoder = Decoder::with_ip(64, bytes, base, DecoderOptions::NONE);
    reposition(&mut decoder, base, from);
    let mut k = starts.partition_point(|&s| s < from);
    let mut g = gap_starts.partition_point(|&s| s <= from);
    while decoder.can_decode() {
        let ip = decoder.ip();
        if ip >= to {
            break;
        }
        if k < starts.len() && starts[k] <= ip {
            let s = starts[k];
            k += 1;
            if s < ip && s < end {
                // The previous instruction ran over a function start: decode from there.
                reposition(&mut decoder, base, s);
                g = gap_starts.partition_point(|&x| x <= s);
                continue;
            }
        }
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            reposition(&mut decoder, base, ip + 1);
            continue;
        }
        let next = instr.next_ip();
        while g < gap_starts.len() && gap_starts[g] <= next {
            if gap_starts[g] == next {
                terms.push((g, is_terminator(&instr)));
            }
            g += 1;
        }
        let (target, kind) = if is_near_branch(&instr) {
            (instr.near_branch_target(), RefKind::Branch)
        } else if instr.is_ip_rel_memory_operand() {
            let kind = if instr.mnemonic() == Mnemonic::Lea {
                RefKind::Lea
            } else {
                RefKind::Memory
            };
            (instr.ip_rel_memory_address(), kind)
        } else {
            continue;
        };
        if interesting(target) {
            refs.push(Ref {
                target,
                source: ip,
                kind,
            });
        }
    }
    (refs, terms)
}

/// One sorted vector of the sorted `runs` (by `key`).
fn merge_sorted<T: Copy, K: Ord>(mut runs: Vec<Vec<T>>, key: impl Fn(&T) -> K) -> Vec<T> {
    runs.retain(|r| !r.is_empty());
    while runs.len() > 1 {
        let (a, b) = (runs.pop().unwrap_or_default(), runs.pop().unwrap_or_default());
        let mut out = Vec::with_capacity(a.len() + b.len());
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            if key(&a[i]) <= key(&b[j]) {
                out.push(a[i]);
                i += 1;
            } else {
                out.push(b[j]);
                j += 1;
            }
        }
        out.extend_from_slice(&a[i..]);
        out.extend_from_slice(&b[j..]);
        runs.push(out);
    }
    runs.pop().unwrap_or_default()
}

/// End of the `nop`/`int3` instructions from `start`, at most `limit`.
fn padding_end(inv: &Inventory, data: &[u8], start: u64, limit: u64) -> u64 {
    let Some(bytes) = inv.code_bytes(data, start) else {
        return start;
    };
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    let mut end = start;
    while end < limit && decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() || !matches!(instr.mnemonic(), Mnemonic::Nop | Mnemonic::Int3) {
            break;
        }
        end = instr.next_ip().min(limit);
    }
    end
}

/// A `ret` or `jmp`: the next byte is not reached from here.
pub(crate) fn is_terminator(instr: &Instruction) -> bool {
    matches!(
        instr.flow_control(),
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
    )
}

pub(crate) fn is_near_branch(instr: &Instruction) -> bool {
    matches!(
        instr.op0_kind(),
        OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
    )
}

/// Sorted addresses with, for each 4 KiB page they span, how many lie below it: a search then
/// bisects one page's few addresses, not all of them. Every reference in a module's code is
/// looked up (millions in a big program), and a bisection of all the functions missed the
/// cache a dozen times each: a seventh of a first analysis.
struct Paged<'a> {
    keys: &'a [u64],
    /// The first page's address.
    lo: u64,
    /// Per page from `lo`: how many keys lie below it. Empty when the keys span too much
    /// address space for a table (plain bisection then).
    below: Vec<u32>,
}

impl<'a> Paged<'a> {
    const SHIFT: u32 = 12;

    fn new(keys: &'a [u64]) -> Paged<'a> {
        let (Some(&first), Some(&last)) = (keys.first(), keys.last()) else {
            return Paged { keys, lo: 0, below: Vec::new() };
        };
        let lo = first >> Self::SHIFT << Self::SHIFT;
        let pages = ((last - lo) >> Self::SHIFT) as usize + 2;
        if pages > 4 * keys.len() + 4096 || keys.len() > u32::MAX as usize {
            return Paged { keys, lo, below: Vec::new() };
        }
        let mut below = Vec::with_capacity(pages);
        let mut j = 0;
        // Page numbers, not addresses: the page after the last may lie past the address space.
        for page in (lo >> Self::SHIFT)..(lo >> Self::SHIFT) + pages as u64 {
            while j < keys.len() && keys[j] >> Self::SHIFT < page {
                j += 1;
            }
            below.push(j as u32);
        }
        Paged { keys, lo, below }
    }

    /// How many keys are at most `t`: `keys.partition_point(|&k| k <= t)`.
    fn count_le(&self, t: u64) -> usize {
        let page = (t.wrapping_sub(self.lo) >> Self::SHIFT) as usize;
        if t < self.lo || page + 1 >= self.below.len() {
            return self.keys.partition_point(|&k| k <= t);
        }
        let (a, b) = (self.below[page] as usize, self.below[page + 1] as usize);
        a + self.keys[a..b].partition_point(|&k| k <= t)
    }
}

/// The union of `claims` (sorted by start) as disjoint sorted ranges.
fn coalesce(claims: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(claims.len());
    for &(a, b) in claims {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn reposition(decoder: &mut Decoder<'_>, base: u64, ip: u64) {
    // Positions come from addresses inside the decoder's own slice, so this cannot fail; if it
    // did, the decoder would simply stop at its end.
    if decoder.set_position((ip - base) as usize).is_err() {
        let _ = decoder.set_position(0);
    }
    decoder.set_ip(ip);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_search_counts_as_bisection_does() {
        let mut keys: Vec<u64> = (0..3000u64).map(|i| 0x40_1000 + i * i % 977 * 37 + i * 91).collect();
        keys.sort_unstable();
        keys.dedup();
        let top = [u64::MAX - 4200, u64::MAX - 10, u64::MAX];
        for keys in [&keys[..], &keys[..1], &[][..], &[5, 1 << 40][..], &top[..]] {
            let paged = Paged::new(keys);
            let probes = keys.iter().flat_map(|&k| [k.wrapping_sub(1), k, k.wrapping_add(1), k.wrapping_add(4096)]).chain([0, 1, u64::MAX]);
            for t in probes {
                assert_eq!(paged.count_le(t), keys.partition_point(|&k| k <= t), "{t:#x}");
            }
        }
    }
}
