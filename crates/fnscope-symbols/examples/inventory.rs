//! Prints a summary of the function inventory of each ELF file given, and how long it took.
//!
//! `cargo run --release -p fnscope-symbols --example inventory -- /usr/bin/python3.11 [-v]`

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

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
        let t = Instant::now();
        let inv = match fnscope_symbols::load_bytes(Path::new(path), &data) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let mut by_source = BTreeMap::new();
        let mut why = BTreeMap::new();
        for f in &inv.functions {
            *by_source.entry(format!("{:?}", f.source)).or_insert(0) += 1;
            if let Some(w) = f.not_entry_why {
                *why.entry(w).or_insert(0) += 1;
            }
        }
        let entries = inv.functions.iter().filter(|f| f.entry).count();
        println!(
            "{path}: {} functions, {entries} entries, {ms:.1} ms; symtab {} debug file {:?} pie/shared {} static {}",
            inv.functions.len(),
            inv.has_symtab,
            inv.debug_file,
            inv.is_pie_or_shared,
            inv.is_static
        );
        println!("  by source {by_source:?}");
        println!("  not entries {why:?}");
        if verbose {
            let mut out = std::io::stdout().lock();
            for f in &inv.functions {
                // Stop quietly when the reader (e.g. `head`) has gone.
                let line = writeln!(
                    out,
                    "  {:#x} {:6} {:5} {:?} {}",
                    f.address,
                    f.size,
                    f.entry,
                    f.source,
                    f.display_name()
                );
                if line.is_err() {
                    return;
                }
            }
        }
    }
}
