//! Keeping C++ exceptions (and forced unwinds such as `pthread_exit`) working through hooked
//! frames.
//!
//! The unwinder finds each frame's caller from its return address; a hooked frame's return
//! address is `fnscope_exit`, which it cannot unwind. So the unwinder's entry points get a
//! pre-hook that puts the real return addresses back
//! ([`crate::thread::unwind_begins`]); the start of a `catch` block
//! (`__cxa_begin_catch`, or `__rust_panic_cleanup` where Rust's `catch_unwind` takes a panic
//! in) records the frames that are gone and re-arms the live ones
//! ([`crate::thread::unwind_caught`]). A walk that only reads the stack (`_Unwind_Backtrace`,
//! behind glibc's `backtrace` and Rust's `std::backtrace`) gives every hooked frame its return
//! address back until the walk is over ([`crate::thread::backtrace_begins`]): the program's
//! backtraces stay whole, and only the calls that return before the frames are re-armed get
//! late ends (recorded as unwound) instead of exact ones.

use crate::hook::{self, Loaded};
use crate::plan_cache;
use crate::thread;

/// Pre-hook kind: an unwind starts.
const KIND_BEGIN: u32 = 1;
/// Pre-hook kind: an exception is caught.
const KIND_CAUGHT: u32 = 2;
/// Pre-hook kind: Mono starts a stack walk by return address (see [`crate::mono`]).
pub const KIND_WALK: u32 = 3;
/// Pre-hook kind: the unwinder's backtrace starts.
const KIND_BACKTRACE: u32 = 4;

const BEGIN: &[&str] = &["_Unwind_RaiseException", "_Unwind_ForcedUnwind", "_Unwind_Resume_or_Rethrow"];
/// Rust's `catch_unwind` catches without `__cxa_begin_catch`: its landing pad hands the
/// exception to `__rust_panic_cleanup` (through `do_catch`, often inlined), whose stack pointer
/// is then at or just below the catching frame's.
const CAUGHT: &[&str] = &["__cxa_begin_catch", "__rust_panic_cleanup"];
const BACKTRACE: &[&str] = &["_Unwind_Backtrace"];

/// Called by `fnscope_prehook` with the kind, the stack pointer at the hooked function's
/// entry (pointing at its return address) and its first argument: the `_Unwind_Exception`
/// for the unwind and catch hooks (a walk has no use for it).
#[no_mangle]
extern "C" fn fnscope_prehook_handler(kind: u32, rsp: u64, exception: u64) {
    match kind {
        KIND_BEGIN => thread::unwind_begins(rsp, exception),
        KIND_CAUGHT => thread::unwind_caught(rsp + 8, exception),
        KIND_WALK => thread::disarm(),
        KIND_BACKTRACE => thread::backtrace_begins(rsp),
        _ => {}
    }
}

/// The pre-hook kind of the unwinder entry point `name` (a symbol table's spelling), if it
/// is one.
fn kind_of(name: &str) -> Option<u32> {
    // Rust's standard library symbols are v0-mangled from Rust 1.8x on, with the crate's hash
    // in them: `_RNvCs<hash>_7___rustc20___rust_panic_cleanup` (a length, and a `_` before
    // an identifier that starts with one).
    let name = match name.strip_prefix("_RNvCs").and_then(|n| n.split_once("_7___rustc")) {
        Some((_, rest)) => rest.trim_start_matches(|c: char| c.is_ascii_digit()).strip_prefix('_').unwrap_or(rest),
        None => name,
    };
    [(BEGIN, KIND_BEGIN), (CAUGHT, KIND_CAUGHT), (BACKTRACE, KIND_BACKTRACE)]
        .into_iter()
        .find_map(|(names, kind)| names.contains(&name).then_some(kind))
}

/// The unwinder entry points a module defines for itself. A program (or a library) linked
/// with `-static-libgcc -static-libstdc++` throws through its own copy of the unwinder, whose
/// symbols are local: `dlsym` cannot see them, but the symbol table the module is traced by
/// names them. The analysis read for this is kept for tracing the module next.
fn own_copies(main: &Loaded) -> Vec<(u64, u32)> {
    let ra = fnscope_x86::ReturnAddress::Replaced;
    let a = match plan_cache::analyse(&main.path, ra) {
        Ok(a) => a,
        // Tracing the executable will fail the same way, and say so.
        Err(_) => return Vec::new(),
    };
    let found = (0..a.count())
        .filter_map(|i| Some((main.bias + a.address(i), kind_of(a.name(i)?)?)))
        .collect();
    plan_cache::keep_spare(&main.path, ra, a);
    found
}

/// A library about to be traced (`--lib`, here at start-up or loaded later): pre-hooks the
/// unwinder entry points it defines for itself, which [`install`] did not see (`known`: the
/// addresses pre-hooked already). Its exceptions would otherwise meet hooked frames'
/// return addresses in its own unwinder. Returns the addresses hooked.
pub fn install_own(obj: &Loaded, known: &[u64]) -> Vec<u64> {
    let mine: Vec<(u64, u32)> = own_copies(obj).into_iter().filter(|(a, _)| !known.contains(a)).collect();
    if mine.is_empty() {
        return Vec::new();
    }
    match hook::prehook(obj, &mine, true) {
        Ok(_) => mine.iter().map(|t| t.0).collect(),
        Err(e) => {
            crate::warn(&format!("cannot hook the unwinder in {}: {e}", obj.path.display()));
            Vec::new()
        }
    }
}

/// Hooks the unwinder entry points and `__cxa_begin_catch` wherever they are defined among
/// the loaded objects: those the dynamic linker finds, and the main executable's own copies.
/// Returns how many were hooked and their addresses.
pub fn install(objs: &[Loaded]) -> (usize, Vec<u64>) {
    let mut n = 0;
    let mut targets: Vec<(u64, u32)> = match objs.first() {
        Some(main) if !hook::never_hook(&main.path, main) => own_copies(main),
        _ => Vec::new(),
    };
    for (names, kind) in [(BEGIN, KIND_BEGIN), (CAUGHT, KIND_CAUGHT), (BACKTRACE, KIND_BACKTRACE)] {
        for name in names {
            let c = std::ffi::CString::new(*name).expect("static name without NUL");
            // SAFETY: dlsym with RTLD_DEFAULT and a valid C string only looks a symbol up.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
            if !p.is_null() {
                targets.push((p as u64, kind));
            }
        }
    }
    targets.sort();
    targets.dedup_by_key(|t| t.0);
    for (i, obj) in objs.iter().enumerate() {
        let mine: Vec<(u64, u32)> = targets.iter().copied().filter(|&(a, _)| a >= obj.lo && a < obj.hi).collect();
        if mine.is_empty() {
            continue;
        }
        // The main executable is traced as well (timing mode: the unwinder needs no help in
        // count mode).
        match hook::prehook(obj, &mine, i == 0) {
            Ok(k) => n += k,
            Err(e) => crate::warn(&format!("cannot hook the unwinder in {}: {e}", obj.path.display())),
        }
    }
    (n, targets.iter().map(|t| t.0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_are_known_by_their_symbol_names() {
        assert_eq!(kind_of("_Unwind_RaiseException"), Some(KIND_BEGIN));
        assert_eq!(kind_of("__cxa_begin_catch"), Some(KIND_CAUGHT));
        assert_eq!(kind_of("__rust_panic_cleanup"), Some(KIND_CAUGHT));
        assert_eq!(kind_of("_RNvCsfLfy6EI15iL_7___rustc20___rust_panic_cleanup"), Some(KIND_CAUGHT));
        assert_eq!(kind_of("_RNvCsfLfy6EI15iL_7___rustc18___rust_start_panic"), None);
        assert_eq!(kind_of("_Unwind_Backtrace"), Some(KIND_BACKTRACE));
        assert_eq!(kind_of("main"), None);
    }
}
