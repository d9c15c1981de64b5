//! Reading `.eh_frame`: which code ranges it describes, and whether the top of the stack holds
//! a return address at a given instruction (the condition for hooking there).

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, EhFrame, EhFrameOffset, EndianSlice,
    LittleEndian, RegisterRule, UnwindContext, UnwindSection, X86_64,
};

type Reader<'a> = EndianSlice<'a, LittleEndian>;

/// Why a place is not a function entry, when the CFA is off at the piece's first instruction.
pub(crate) const CFA_NOT_AT_ENTRY: &str = "CFA is not rsp+8 at the first instruction";
/// Same, for a symbol that sits inside another piece's range.
pub(crate) const CFA_NOT_AT_SYMBOL: &str = "CFA is not rsp+8 at the symbol's address";
pub(crate) const RA_UNDEFINED: &str = "return address is undefined there (outermost frame)";
pub(crate) const RA_ELSEWHERE: &str = "return address is not at CFA-8";
pub(crate) const SIGNAL_FRAME: &str = "signal trampoline";
pub(crate) const CFI_BROKEN: &str = "its call frame information could not be evaluated";

/// One FDE: a piece of code with call frame information.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    pub start: u64,
    pub len: u64,
    /// `Ok` if a return address is on top of the stack at `start`, else why not.
    pub entry: Result<(), &'static str>,
}

/// Where the `.eh_frame` section and its neighbours are loaded (for pc-relative pointers).
pub(crate) struct EhFrameInput<'a> {
    pub data: &'a [u8],
    pub address: u64,
    pub hdr_address: Option<u64>,
    pub text_address: Option<u64>,
    pub got_address: Option<u64>,
}

/// Result of [`scan`].
pub(crate) struct CfiScan {
    /// Pieces sorted by start address.
    pub pieces: Vec<Piece>,
    /// For each queried address that lies strictly inside a piece: the verdict there.
    pub inner: HashMap<u64, Result<(), &'static str>>,
}

/// Parses every FDE. `queries` (sorted, deduplicated) are addresses of symbols; those that fall
/// strictly inside an FDE get the verdict of the CFI row that covers them, because a symbol in
/// the middle of another function's code is an entry only if the stack is call-shaped there.
///
/// A malformed entry ends the walk (the section cannot be resynchronised after it); what was
/// read before it is kept.
///
/// The entries' headers are read in one pass (each one's length leads to the next); parsing
/// and evaluating the FDEs, nearly all the work (20 ms for `cc1plus`'s 49,000), is split over
/// up to `threads` threads.
pub(crate) fn scan(input: &EhFrameInput<'_>, queries: &[u64], threads: usize) -> CfiScan {
    let mut eh_frame = EhFrame::new(input.data, LittleEndian);
    eh_frame.set_address_size(8);
    let mut bases = BaseAddresses::default().set_eh_frame(input.address);
    if let Some(a) = input.hdr_address {
        bases = bases.set_eh_frame_hdr(a);
    }
    if let Some(a) = input.text_address {
        bases = bases.set_text(a);
    }
    if let Some(a) = input.got_address {
        bases = bases.set_got(a);
    }

    let mut partials = Vec::new();
    let mut entries = eh_frame.entries(&bases);
    loop {
        match entries.next() {
            Ok(Some(CieOrFde::Fde(p))) => partials.push(p),
            Ok(Some(CieOrFde::Cie(_))) => continue,
            Ok(None) | Err(_) => break,
        }
    }
    let runs = crate::parallel_runs(partials.len(), threads, |r| {
        vec![scan_fdes(&eh_frame, &bases, &partials[r], queries)]
    });
    let mut pieces = Vec::with_capacity(partials.len());
    let mut inner = HashMap::new();
    // In entry order: where FDEs overlap, a query's verdict is the last one's, as in one pass.
    for (p, i) in runs {
        pieces.extend(p);
        inner.extend(i);
    }
    pieces.sort_unstable_by_key(|p| (p.start, std::cmp::Reverse(p.len)));
    CfiScan { pieces, inner }
}

/// A query's verdict.
type Answer = (u64, Result<(), &'static str>);

/// The pieces of `partials` (FDEs in entry order), and the verdicts at the queries inside
/// them in the order found.
fn scan_fdes<'a>(
    eh_frame: &EhFrame<Reader<'a>>,
    bases: &BaseAddresses,
    partials: &[gimli::PartialFrameDescriptionEntry<'_, EhFrame<Reader<'a>>, Reader<'a>>],
    queries: &[u64],
) -> (Vec<Piece>, Vec<Answer>) {
    let mut ctx: Box<UnwindContext<usize>> = Box::new(UnwindContext::new());
    let mut cies: HashMap<EhFrameOffset<usize>, CommonInformationEntry<Reader<'_>>> =
        HashMap::new();
    let mut pieces = Vec::with_capacity(partials.len());
    let mut inner = Vec::new();
    for partial in partials {
        let fde = match partial.parse(|section, bases, offset| {
            if let Some(cie) = cies.get(&offset) {
                return Ok(cie.clone());
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(offset, cie.clone());
            Ok(cie)
        }) {
            Ok(f) => f,
            // One bad FDE (e.g. a CIE with an unknown augmentation) does not spoil the others.
            Err(_) => continue,
        };
        let start = fde.initial_address();
        let len = fde.len();
        if len == 0 {
            continue;
        }
        let end = start.saturating_add(len);
        let first_inner = queries.partition_point(|&q| q <= start);
        let inner_queries: &[u64] = {
            let n = queries[first_inner..].partition_point(|&q| q < end);
            &queries[first_inner..first_inner + n]
        };
        let entry = if fde.is_signal_trampoline() {
            inner.extend(inner_queries.iter().map(|&q| (q, Err(SIGNAL_FRAME))));
            Err(SIGNAL_FRAME)
        } else {
            let before = inner.len();
            match evaluate(eh_frame, bases, &mut ctx, &fde, inner_queries, &mut inner) {
                Ok(v) => v,
                Err(_) => {
                    // What the rows said before the error is overridden, as it was in a map.
                    inner.truncate(before);
                    inner.extend(inner_queries.iter().map(|&q| (q, Err(CFI_BROKEN))));
                    Err(CFI_BROKEN)
                }
            }
        };
        pieces.push(Piece { start, len, entry });
    }
    (pieces, inner)
}

/// Verdict at the FDE's first instruction, and at each of `queries` (all inside the FDE).
fn evaluate(
    eh_frame: &EhFrame<Reader<'_>>,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    fde: &gimli::FrameDescriptionEntry<Reader<'_>>,
    queries: &[u64],
    inner: &mut Vec<Answer>,
) -> gimli::Result<Result<(), &'static str>> {
    let mut table = fde.rows(eh_frame, bases, ctx)?;
    let mut first = None;
    let mut q = 0;
    while let Some(row) = table.next_row()? {
        if first.is_none() {
            first = Some(row_verdict(row, CFA_NOT_AT_ENTRY));
        }
        while q < queries.len() && queries[q] < row.start_address() {
            // Rows are contiguous, so this only happens for addresses before the first row.
            inner.push((queries[q], Err(CFI_BROKEN)));
            q += 1;
        }
        while q < queries.len() && row.contains(queries[q]) {
            inner.push((queries[q], row_verdict(row, CFA_NOT_AT_SYMBOL)));
            q += 1;
        }
        if q == queries.len() {
            break;
        }
    }
    inner.extend(queries[q..].iter().map(|&a| (a, Err(CFI_BROKEN))));
    Ok(first.unwrap_or(Err(CFI_BROKEN)))
}

/// A row is call-shaped when CFA = rsp+8 and the return address is saved at CFA-8.
fn row_verdict(
    row: &gimli::UnwindTableRow<usize>,
    cfa_message: &'static str,
) -> Result<(), &'static str> {
    match row.cfa() {
        CfaRule::RegisterAndOffset {
            register,
            offset: 8,
        } if *register == X86_64::RSP => {}
        _ => return Err(cfa_message),
    }
    match row.register(X86_64::RA) {
        // No rule: the x86-64 ABI default, which every compiler's CIE states anyway.
        None | Some(RegisterRule::Offset(-8)) => Ok(()),
        Some(RegisterRule::Undefined) => Err(RA_UNDEFINED),
        Some(_) => Err(RA_ELSEWHERE),
    }
}
