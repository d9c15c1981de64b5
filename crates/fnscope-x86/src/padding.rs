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

use crate::retaddr::{Step, Walk};
use fnscope_symbols::{Function, Inventory};
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

/// References into the first bytes of functions and into unclaimed bytes (which ones:
/// [`Module::scan`]), and the free padding runs.
pub(crate) struct Module {
    /// Sorted by target.
    refs: Vec<Ref>,
    /// Sorted by start, disjoint.
    runs: Vec<Run>,
    /// For each function (same order as `inv.functions`), what the walk of
    /// [`crate::retaddr::use_of_return_address`] from its entry found, if the scan could walk
    /// it in passing; empty when not asked for.
    pub(crate) walked: Vec<Option<Option<String>>>,
}

impl Module {
    /// Decodes all code of `inv` once, in pieces on up to `threads` threads. References are
    /// kept when they land in code, within `near_start` bytes after a function start (at the
    /// start itself only when another function starts less than `near_start` bytes before)
    /// or outside every claim. With `walk`, each function's use of its return address is
    /// looked for in passing (see [`Module::walked`]).
    pub(crate) fn scan(inv: &Inventory, data: &[u8], near_start: u64, threads: usize, walk: bool) -> Module {
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
            // Most references are calls to a function's start, which no patch but an earlier
            // function's can cover, and which no padding can follow (a function start is
            // claimed): those are dropped, sparing the sort millions of them.
            let j = starts_index.count_le(t);
            let near = |k: usize| k > 0 && t - starts[k - 1] < near_start;
            (near(j) && (t != starts[j - 1] || near(j - 1))) || !is_owned(t)
        };
        let pieces = pieces(inv, data, &starts, threads);
        // A walk needs a function's bytes from the one code range that holds it, as
        // `Inventory::code_bytes` gives them: with overlapping sections, the scan's range
        // might not be that one.
        let disjoint = inv.code.windows(2).all(|w| w[0].address + w[0].size <= w[1].address);
        let walk_of = (walk && disjoint).then_some(inv.functions.as_slice());
        let scan_piece = |&(bytes, base, from, to): &Piece<'_>| {
            scan_piece(bytes, base, from, to, &starts, &gap_starts, &interesting, walk_of)
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
            let mut walks = Vec::new();
            for (i, p) in mine {
                let s = scan_piece(p);
                refs.extend(s.refs);
                terms.push((i, s.terms));
                walks.extend(s.walked);
            }
            refs.sort_unstable_by_key(by_target);
            (refs, terms, walks)
        };
        let mut walked: Vec<Option<Option<String>>> = Vec::new();
        if walk_of.is_some() {
            walked.resize(inv.functions.len(), None);
        }
        let mut keep_walks = |walks: Vec<(usize, Option<String>)>| {
            for (i, how) in walks {
                walked[i] = Some(how);
            }
        };
        let mut runs: Vec<Vec<Ref>> = Vec::new();
        let mut terms_of: Vec<Option<Vec<(usize, bool)>>> = vec![None; pieces.len()];
        if threads > 1 && pieces.len() > 1 {
            // Each thread takes the next piece nobody took: pieces of one size can take quite
            // different times, and a fixed share left one thread working alone for a tenth of
            // the scan.
            let next = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|sc| {
                let handles: Vec<_> = (0..threads)
                    .filter_map(|_| {
                        let (pieces, scan_sorted, next) = (&pieces, &scan_sorted, &next);
                        let mut mine = std::iter::from_fn(move || {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            pieces.get(i).map(|p| (i, p))
                        });
                        std::thread::Builder::new().spawn_scoped(sc, move || scan_sorted(&mut mine)).ok()
                    })
                    .collect();
                for h in handles {
                    // A piece's scan does not panic; if a thread did, or could not be made (a
                    // limit on processes), its pieces are scanned below.
                    if let Ok((refs, terms, walks)) = h.join() {
                        runs.push(refs);
                        for (i, t) in terms {
                            terms_of[i] = Some(t);
                        }
                        keep_walks(walks);
                    }
                }
            });
        }
        let (left, terms, walks) = scan_sorted(&mut pieces.iter().enumerate().filter(|(i, _)| terms_of[*i].is_none()));
        runs.push(left);
        keep_walks(walks);
        for (i, t) in terms {
            terms_of[i] = Some(t);
        }
        // In piece order, as one pass from start to end would have set them.
        for (g, t) in terms_of.into_iter().flatten().flatten() {
            after_terminator[g] = t;
        }
        let refs = merge_sorted(runs, by_target);
        let gaps: Vec<(u64, u64)> = gap_starts
            .iter()
            .zip(&after_terminator)
            .filter(|(_, &t)| t)
            .map(|(&start, _)| {
                let limit = owned
                    .get(owned.partition_point(|r| r.0 <= start))
                    .map_or(u64::MAX, |r| r.0);
                let first_ref = refs
                    .get(refs.partition_point(|r| r.target < start))
                    .map_or(u64::MAX, |r| r.target);
                (start, limit.min(first_ref))
            })
            .collect();
        let runs = crate::parallel_runs(gaps.len(), threads, |r| {
            gaps[r]
                .iter()
                .filter_map(|&(start, limit)| {
                    let end = padding_end(inv, data, start, limit);
                    (end > start).then_some(Run { start, end, next_free: start })
                })
                .collect()
        });
        Module { refs, runs, walked }
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

/// What [`scan_piece`] finds.
struct Scanned {
    refs: Vec<Ref>,
    /// Whether a terminator ends right before each gap (by index in `gap_starts`) the piece's
    /// instructions reach.
    terms: Vec<(usize, bool)>,
    /// The walks from function entries (by index in `starts`) that ended within the piece.
    walked: Vec<(usize, Option<String>)>,
}

/// A piece of code to decode: the code range's bytes and address, and the piece's bounds (the
/// first a function start or the range's start, the second the next piece's start).
type Piece<'a> = (&'a [u8], u64, u64, u64);

/// Splits the code of `inv` at function starts into pieces of about equal size, eight per
/// thread, taken in turn by whichever thread is free.
fn pieces<'a>(inv: &Inventory, data: &'a [u8], starts: &[u64], threads: usize) -> Vec<Piece<'a>> {
    let total: u64 = inv.code.iter().map(|r| r.size).sum();
    let target = (total / (8 * threads.max(1) as u64)).max(1 << 16);
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
/// it. With `walk_of` (the functions whose addresses are `starts`), a function's walk starts
/// when the decoding reaches its entry and ends with the answer it gives, or unanswered when
/// another entry or the piece's end comes first, or the decoding starts again elsewhere:
/// the instructions after are not those its own decoding would see.
#[allow(clippy::too_many_arguments)]
fn scan_piece(
    bytes: &[u8],
    base: u64,
    from: u64,
    to: u64,
    starts: &[u64],
    gap_starts: &[u64],
    interesting: &dyn Fn(u64) -> bool,
    walk_of: Option<&[Function]>,
) -> Scanned {
    let (mut refs, mut terms, mut walked) = (Vec::new(), Vec::new(), Vec::new());
    let mut walk: Option<(usize, Walk)> = None;
    let end = base + bytes.len() as u64;
    let mut instr = Instruction::default();
    let mut decoder = Decoder::with_ip(64, bytes, base, DecoderOptions::NONE);
    reposition(&mut decoder, base, from);
    let mut k = starts.partition_point(|&s| s < from);
    let mut g = gap_starts.partition_point(|&s| s <= from);
    // A walk cut short by what comes at `ip` gives its answer if it would have stopped there
    // anyway, and none otherwise.
    let cut = |walk: &mut Option<(usize, Walk)>, walked: &mut Vec<(usize, Option<String>)>, ip: u64| {
        if let Some((i, w)) = walk.take() {
            if w.ends_before(ip) {
                walked.push((i, None));
            }
        }
    };
    while decoder.can_decode() {
        let ip = decoder.ip();
        if ip >= to {
            break;
        }
        if k < starts.len() && starts[k] <= ip {
            let s = starts[k];
            k += 1;
            cut(&mut walk, &mut walked, s);
            if s < ip && s < end {
                // The previous instruction ran over a function start: decode from there. The
                // function's walk is not started (its own decoding answers for it): `k` has
                // moved past its start already.
                reposition(&mut decoder, base, s);
                g = gap_starts.partition_point(|&x| x <= s);
                continue;
            }
            if let Some(functions) = walk_of {
                walk = Some((k - 1, Walk::new(&functions[k - 1], end)));
            }
        }
        decoder.decode_out(&mut instr);
        if let Some((i, w)) = &mut walk {
            if let Step::Done(how) = w.step(&instr) {
                walked.push((*i, how));
                walk = None;
            }
        }
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
    cut(&mut walk, &mut walked, decoder.ip());
    Scanned { refs, terms, walked }
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

    /// The walks the scan makes in passing answer as a function's own walk does, on every
    /// function of real programs and on 1 or 3 threads, and they answer for most functions
    /// (else the first analysis decodes most entries twice again). This test's own program
    /// is always there; the C library, git and the C++ compiler where they are.
    #[test]
    fn walks_in_the_scan_answer_as_their_own() {
        let compiler = std::process::Command::new("g++").arg("-print-prog-name=cc1plus").output();
        let compiler = compiler.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
        let me = std::env::current_exe().unwrap();
        let mut uses = 0;
        for p in [me.to_str().unwrap(), "/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/git", compiler.as_str()] {
            let path = std::path::Path::new(p);
            if p.is_empty() || !path.exists() {
                continue;
            }
            let data = std::fs::read(path).unwrap();
            let inv = fnscope_symbols::load_bytes(path, &data).unwrap();
            for threads in [1, 3] {
                let module = Module::scan(&inv, &data, crate::MAX_PATCH_LEN as u64, threads, true);
                assert_eq!(module.walked.len(), inv.functions.len());
                let mut answered = 0;
                for (f, w) in inv.functions.iter().zip(&module.walked) {
                    let Some(how) = w else { continue };
                    let bytes = inv.code_bytes(&data, f.address).unwrap();
                    assert_eq!(how, &crate::retaddr::use_of_return_address(bytes, f), "{p}: {}", f.display_name());
                    answered += 1;
                    uses += how.is_some() as usize;
                }
                let n = inv.functions.len();
                assert!(answered * 10 > n * 9, "{p}: {answered} of {n} walked in the scan");
                assert!(Module::scan(&inv, &data, crate::MAX_PATCH_LEN as u64, threads, false).walked.is_empty());
            }
        }
        // The C library has functions that use their return-address slot (`dlsym` reads it).
        let libc = std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6").exists();
        assert!(!libc || uses > 0, "no use of a return address found, not even in the C library");
    }

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
