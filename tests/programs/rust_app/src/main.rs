//! Threads, trait objects, recursion, collections and a caught panic: what a Rust program
//! does. Prints results that do not depend on timing, and `count NAME N` lines on stderr
//! for the functions whose calls it counts itself (see tests/programs/counts.h).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

static FIB_CALLS: AtomicU64 = AtomicU64::new(0);
static SHAPE_CALLS: AtomicU64 = AtomicU64::new(0);

trait Shape {
    fn area(&self) -> f64;
}

struct Square(f64);
struct Circle(f64);

impl Shape for Square {
    #[inline(never)]
    fn area(&self) -> f64 {
        SHAPE_CALLS.fetch_add(1, Ordering::Relaxed);
        self.0 * self.0
    }
}

impl Shape for Circle {
    #[inline(never)]
    fn area(&self) -> f64 {
        SHAPE_CALLS.fetch_add(1, Ordering::Relaxed);
        3.0 * self.0 * self.0
    }
}

#[inline(never)]
fn fib(n: u64) -> u64 {
    FIB_CALLS.fetch_add(1, Ordering::Relaxed);
    if n < 2 {
        n
    } else {
        // The XOR with 0 through black_box keeps rustc from turning one call into a loop.
        std::hint::black_box(fib(n - 1)) + fib(n - 2)
    }
}

#[inline(never)]
fn word_counts(text: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for w in text.split_whitespace() {
        *m.entry(w.to_lowercase()).or_insert(0) += 1;
    }
    m
}

#[inline(never)]
fn may_panic(i: u32) -> u32 {
    if i % 4 == 3 {
        panic!("odd one out: {i}");
    }
    i * 2
}

fn main() {
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            thread::spawn(move || {
                let shapes: Vec<Box<dyn Shape + Send>> =
                    (0..100).map(|i| if i % 2 == 0 { Box::new(Square(i as f64)) as Box<dyn Shape + Send> } else { Box::new(Circle(i as f64)) }).collect();
                let total: f64 = shapes.iter().map(|s| s.area()).sum();
                (fib(15 + t), total)
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        let (f, area) = h.join().expect("worker thread");
        println!("thread {t}: fib {f} area {area}");
    }
    let counts = word_counts("the quick brown fox jumps over the lazy dog The End");
    println!("words: {counts:?}");
    std::panic::set_hook(Box::new(|_| {}));
    let mut caught = 0;
    let mut sum = 0;
    for i in 0..8 {
        match std::panic::catch_unwind(|| may_panic(i)) {
            Ok(v) => sum += v,
            Err(_) => caught += 1,
        }
    }
    println!("panics caught {caught}, sum {sum}");
    eprintln!("count rust_app::fib {}", FIB_CALLS.load(Ordering::Relaxed));
    eprintln!("count area {}", SHAPE_CALLS.load(Ordering::Relaxed));
}
