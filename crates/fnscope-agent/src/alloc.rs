//! The agent's own memory allocator: memory straight from the kernel, never the program's
//! `malloc`.
//!
//! The agent lives in someone else's process. A program may define `malloc` itself (an
//! arena allocator returning 8-byte-aligned blocks, a debugging allocator) and the dynamic
//! linker then binds every `malloc` of the process to it, the agent's included; once its
//! functions are hooked, the agent's own start-up would also run through its hooks. So every
//! allocation of the agent (Rust's `Vec`, `String`, hash maps, inside `std` too) comes from
//! here: anonymous mappings made with raw system calls.
//!
//! Small blocks (up to [`LARGE`], alignment up to a page) are powers of two carved from 1 MiB
//! arenas and recycled through one free list per size. Larger blocks are mappings of their own, resized with `mremap`.
//! From half a huge page up they are whole 2 MiB huge pages where the kernel gives them
//! ([`large_len`]; mapped at a huge page's alignment, though a block `mremap` moves may land
//! off it, and then only its aligned part gets them): start-up fills megabytes of fresh memory (the image table, the
//! plans, the patches), and on a virtual machine a fresh 4 KiB page costs about 2.5 µs, four
//! times what the same bytes cost in a huge page.
//! A spin lock guards the lists: allocation happens at start-up, after `dlopen` and in the
//! `exec` wrappers, never on the stubs' paths or in a signal handler the agent installs, so
//! the lock is never taken re-entrantly.

use crate::sys;
use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicBool, Ordering};

/// Smallest block: 16 bytes, the alignment `malloc` would give.
const MIN_SHIFT: u32 = 4;
/// Blocks above this size get mappings of their own.
const LARGE: usize = 64 << 10;
const CLASSES: usize = (LARGE.trailing_zeros() - MIN_SHIFT + 1) as usize;
const ARENA: usize = 1 << 20;
const PAGE: usize = 4096;

struct Lists {
    /// Head of each size class's free list (the first word of a free block links the next).
    free: [usize; CLASSES],
    /// Unused part of the current arena.
    bump: usize,
    bump_end: usize,
}

/// The allocator the agent registers as Rust's global allocator.
pub struct AgentAlloc {
    lock: AtomicBool,
    lists: core::cell::UnsafeCell<Lists>,
}

// SAFETY: `lists` is only accessed with `lock` held (see `with_lists`).
unsafe impl Sync for AgentAlloc {}

impl AgentAlloc {
    /// An allocator with no memory yet.
    pub const fn new() -> AgentAlloc {
        AgentAlloc {
            lock: AtomicBool::new(false),
            lists: core::cell::UnsafeCell::new(Lists { free: [0; CLASSES], bump: 0, bump_end: 0 }),
        }
    }

    fn with_lists<R>(&self, f: impl FnOnce(&mut Lists) -> R) -> R {
        while self.lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            core::hint::spin_loop();
        }
        // SAFETY: the lock is held, so this is the only reference to the lists.
        let r = f(unsafe { &mut *self.lists.get() });
        self.lock.store(false, Ordering::Release);
        r
    }
}

impl Default for AgentAlloc {
    fn default() -> Self {
        AgentAlloc::new()
    }
}

/// Size class of a small block: blocks of `16 << class` bytes.
fn class_of(layout: &Layout) -> Option<usize> {
    let need = layout.size().max(layout.align()).max(1 << MIN_SHIFT);
    if need > LARGE || layout.align() > PAGE {
        return None;
    }
    Some((need.next_power_of_two().trailing_zeros() - MIN_SHIFT) as usize)
}

fn round_page(n: usize) -> usize {
    (n + PAGE - 1) & !(PAGE - 1)
}

/// A mapping of `size` bytes aligned to `align` (at least a page), or null; of
/// [`large_len`] bytes, in huge pages from [`HUGE`] up.
fn map_large(size: usize, align: usize) -> *mut u8 {
    let len = large_len(size);
    let align = if len >= HUGE { HUGE.max(align) } else { align };
    if align <= PAGE {
        return sys::mmap_anon(len);
    }
    // Over-map, then give back what lies outside the aligned range.
    let p = sys::mmap_anon(len + align);
    if p.is_null() {
        return p;
    }
    let start = (p as usize + align - 1) & !(align - 1);
    let head = start - p as usize;
    if head > 0 {
        sys::munmap(p, head);
    }
    let tail = align - head;
    if tail > 0 {
        sys::munmap((start + len) as *mut u8, tail);
    }
    if len >= HUGE {
        sys::advise_huge_pages(start as u64, len);
    }
    start as *mut u8
}

/// A transparent huge page.
const HUGE: usize = 2 << 20;

/// Length of the mapping of a large block of `size` bytes: whole huge pages from half a huge
/// page up (at most half the memory touched is then waste), else whole pages.
fn large_len(size: usize) -> usize {
    if size >= HUGE / 2 {
        (size + HUGE - 1) & !(HUGE - 1)
    } else {
        round_page(size)
    }
}

// SAFETY: blocks handed out are disjoint (a block is on a free list or in use, never both;
// arenas and large mappings are fresh anonymous memory), each is at least `layout.size()`
// bytes and aligned to `layout.align()` (a small block is aligned to the smaller of its
// power-of-two size and a page, both at least the alignment; a large one is page aligned or
// over-mapped to fit).
unsafe impl GlobalAlloc for AgentAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = class_of(&layout) else { return map_large(layout.size(), layout.align()) };
        let size = 1usize << (class as u32 + MIN_SHIFT);
        self.with_lists(|l| {
            let head = l.free[class];
            if head != 0 {
                // SAFETY: a free block's first word links the next free block of its class.
                l.free[class] = unsafe { *(head as *const usize) };
                return head as *mut u8;
            }
            // Small layouts ask for at most a page of alignment, and no more than their class
            // size: aligning each block to the smaller of the two is enough.
            let step = size.min(PAGE);
            let mut start = (l.bump + step - 1) & !(step - 1);
            if l.bump == 0 || start + size > l.bump_end {
                let arena = sys::mmap_anon(ARENA);
                if arena.is_null() {
                    return core::ptr::null_mut();
                }
                start = arena as usize;
                l.bump_end = start + ARENA;
            }
            l.bump = start + size;
            start as *mut u8
        })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match class_of(&layout) {
            None => sys::munmap(ptr, large_len(layout.size())),
            Some(class) => self.with_lists(|l| {
                // SAFETY: the block is ours again and at least 16 bytes long.
                unsafe { *(ptr as *mut usize) = l.free[class] };
                l.free[class] = ptr as usize;
            }),
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old_large = class_of(&layout).is_none();
        // SAFETY: `new_size` is non-zero and, rounded to the alignment, fits isize (the
        // caller's contract for realloc).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let new_large = class_of(&new_layout).is_none();
        if old_large && new_large && layout.align() <= PAGE {
            // Page-aligned mappings grow or shrink in place or move without copying.
            let p = sys::mremap(ptr, large_len(layout.size()), large_len(new_size));
            if !p.is_null() {
                if large_len(new_size) >= HUGE {
                    sys::advise_huge_pages(p as u64, large_len(new_size));
                }
                return p;
            }
        }
        if !old_large && !new_large && class_of(&layout) == class_of(&new_layout) {
            return ptr;
        }
        // SAFETY: a fresh block for the new layout; the old one is valid for its own size.
        unsafe {
            let p = self.alloc(new_layout);
            if !p.is_null() {
                core::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_disjoint_and_reused() {
        let a = AgentAlloc::new();
        let mut blocks = Vec::new();
        for (size, align) in [(1, 1), (8, 8), (24, 8), (100, 16), (4096, 64), (70_000, 8), (10, 8192), (200_000, 65536), (HUGE / 2, 8), (3 * HUGE + 5, 4096)] {
            let l = Layout::from_size_align(size, align).unwrap();
            // SAFETY: valid non-zero layouts; every block is written within its size.
            let p = unsafe { a.alloc(l) };
            assert!(!p.is_null(), "{size}/{align}");
            let align = if size >= HUGE / 2 { HUGE } else { align.max(16) };
            assert_eq!(p as usize % align, 0, "{size}/{align} misaligned: {p:p}");
            unsafe { core::ptr::write_bytes(p, 0xab, size) };
            blocks.push((p, l));
        }
        for (i, &(p, l)) in blocks.iter().enumerate() {
            for &(q, m) in &blocks[i + 1..] {
                let (p0, p1, q0, q1) = (p as usize, p as usize + l.size(), q as usize, q as usize + m.size());
                assert!(p1 <= q0 || q1 <= p0, "blocks overlap");
            }
        }
        let (p, l) = blocks[3];
        // SAFETY: freeing a block of this allocator with its layout, then allocating the
        // same class again.
        unsafe {
            a.dealloc(p, l);
            assert_eq!(a.alloc(l), p, "a freed block is reused first");
        }
    }

    #[test]
    fn realloc_keeps_contents_across_classes_and_mappings() {
        let a = AgentAlloc::new();
        let mut l = Layout::from_size_align(10, 8).unwrap();
        // SAFETY: every access stays within the current size of the block.
        unsafe {
            let mut p = a.alloc(l);
            for i in 0..10 {
                *p.add(i) = i as u8;
            }
            // Into huge pages and out: whole pages, huge pages, more of them, fewer, a class.
            let neighbour = a.alloc(Layout::from_size_align(HUGE, 8).unwrap());
            core::ptr::write_bytes(neighbour, 9, HUGE);
            for new in [100, 5000, 100_000, HUGE / 2 + 1, 3_000_000, 5 * HUGE + 3, 2 * HUGE, 50] {
                p = a.realloc(p, l, new);
                assert!(!p.is_null());
                for i in 0..10 {
                    assert_eq!(*p.add(i), i as u8, "byte {i} after growing to {new}");
                }
                core::ptr::write_bytes(p.add(10), 7, new - 10);
                l = Layout::from_size_align(new, 8).unwrap();
            }
            a.dealloc(p, l);
            assert!((0..HUGE).all(|i| *neighbour.add(i) == 9), "the neighbour block kept its bytes");
        }
    }
}
