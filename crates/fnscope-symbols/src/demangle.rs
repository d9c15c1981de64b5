//! Turning raw symbol names into what people read.

/// Demangles a raw symbol name (Rust v0/legacy, then Itanium C++).
///
/// A symbol version suffix (`@GLIBC_2.2.5`, `@@GLIBC_2.14`) is dropped first. Rust names lose
/// their hash. Names that are not mangled, or fail to demangle, come back unchanged (without
/// the version suffix).
pub fn demangle(raw: &str) -> String {
    let name = strip_version(raw);
    // Legacy Rust names are valid Itanium names too; rustc-demangle must see them first.
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        // The default options keep cpp_demangle's recursion limits, which stop hostile names
        // from overflowing the stack.
        if let Ok(sym) = cpp_demangle::Symbol::new(name.as_bytes()) {
            if let Ok(s) = sym.demangle() {
                return s;
            }
        }
    }
    name.to_string()
}

/// The name without its ELF symbol version suffix (`memcpy@@GLIBC_2.14` -> `memcpy`).
pub fn strip_version(raw: &str) -> &str {
    match raw.find('@') {
        // A name that *starts* with '@' has no base name to keep.
        Some(i) if i > 0 => &raw[..i],
        _ => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_stripped() {
        assert_eq!(demangle("memcpy@@GLIBC_2.14"), "memcpy");
        assert_eq!(demangle("fopen@GLIBC_2.2.5"), "fopen");
        assert_eq!(strip_version("plain"), "plain");
    }

    #[test]
    fn cpp_and_rust() {
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_5crate4func"), "crate::func");
    }

    #[test]
    fn bad_names_come_back_unchanged() {
        assert_eq!(demangle("_Z"), "_Z");
        assert_eq!(demangle("_ZZZZZZZZZ"), "_ZZZZZZZZZ");
        let deep = format!("_Z{}", "PPPPPPPPPP".repeat(2000));
        assert_eq!(demangle(&deep), deep);
    }
}
