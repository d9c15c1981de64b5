//! Prints hookability figures for each ELF file given, with timings.
//!
//! `cargo run --release -p fnscope-x86 --example verdicts -- /usr/bin/python3.11 [-v]`
//! (`-v` lists every skipped function).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use fnscope_x86::Verdict;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let verbose = args.iter().any(|a| a == "-v");
    for path in args.iter().filter(|a| *a != "-v") {
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("{path}: {e}");
                continue;
            }
        };
        let t0 = Instant::now();
        let inv = match fnscope_symbols::load_bytes(Path::new(path), &data) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        let t1 = Instant::now();
        let verdicts = fnscope_x86::analyze(&inv, &data);
        let t2 = Instant::now();
        let entries = inv.functions.iter().filter(|f| f.entry).count();
        let mut hookable = 0;
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        let mut forms: BTreeMap<&str, usize> = BTreeMap::new();
        for (f, v) in inv.functions.iter().zip(&verdicts) {
            match v {
                Verdict::Hookable(h) => {
                    hookable += 1;
                    *forms.entry(h.form_name()).or_default() += 1;
                }
                Verdict::Skip { reason, detail } => {
                    *reasons.entry(reason).or_default() += 1;
                    // Stop quietly when the reader (e.g. `head`) has gone.
                    if verbose
                        && writeln!(
                            std::io::stdout().lock(),
                            "  skip {:#x} {:<18} {:<40} {}",
                            f.address,
                            reason,
                            detail,
                            f.display_name()
                        )
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        println!(
            "{path}: {} functions, {entries} entries, {hookable} hookable ({:.1}% of entries); symbols {:.1} ms, analysis {:.1} ms",
            inv.functions.len(),
            100.0 * hookable as f64 / entries.max(1) as f64,
            (t1 - t0).as_secs_f64() * 1e3,
            (t2 - t1).as_secs_f64() * 1e3,
        );
        println!("  hooked by form: {forms:?}");
        println!("  skipped: {reasons:?}");
    }
}
