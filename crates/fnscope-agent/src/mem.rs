//! The agent's own `memcpy`, `memmove`, `memset`, `memcmp`, `bcmp` and `strlen`: the compiler
//! calls these for copies, zeroed arrays and comparisons, and without them the agent's code
//! would call the C library's. With libc traced (`--lib libc`) those are hooked: the stubs'
//! slow paths (a record with values, a chunk swap, frames closed after a `longjmp`) would
//! re-enter the stubs through them, and their calls would be recorded as the program's.
//!
//! The symbols are hidden: the link binds the agent's own references to them, and the
//! program never sees them. The direction flag is clear at every call (the ABI's rule, and
//! the kernel clears it for signal handlers), which `rep movsb`/`rep stosb` rely on.

use core::arch::global_asm;

global_asm!(
    r#"
    .text

    /* Copies rdx bytes (w to 2w) as two runs of `w` bytes, the first and the last, which
       overlap unless rdx is 2w, and returns. */
    .macro HEAD_AND_TAIL width, w, first, last
    mov \first, \width ptr [rsi]
    mov \last, \width ptr [rsi + rdx - \w]
    mov \width ptr [rdi], \first
    mov \width ptr [rdi + rdx - \w], \last
    ret
    .endm

    /* Up to 32 bytes, a first and a last run that may overlap (every load before any store):
       most copies are that short (a slot's head, a prologue, a jump), and `rep movsb` has a
       start-up cost of tens of cycles, paid tens of thousands of times at start-up. */
    .globl memcpy
    .hidden memcpy
    .type memcpy,@function
    .p2align 4
memcpy:
    mov rax, rdi
    cmp rdx, 32
    ja .Lmemcpy_long
    cmp rdx, 16
    jae .Lmemcpy_16_32
    cmp rdx, 8
    jae .Lmemcpy_8_15
    cmp rdx, 4
    jae .Lmemcpy_4_7
    test rdx, rdx
    jz .Lmemcpy_done
    /* 1 to 3 bytes: the first, the middle and the last (some the same). */
    movzx ecx, byte ptr [rsi]
    movzx r8d, byte ptr [rsi + rdx - 1]
    mov r9, rdx
    shr r9, 1
    movzx r10d, byte ptr [rsi + r9]
    mov byte ptr [rdi], cl
    mov byte ptr [rdi + r9], r10b
    mov byte ptr [rdi + rdx - 1], r8b
    ret
.Lmemcpy_4_7:
    HEAD_AND_TAIL dword, 4, ecx, r8d
.Lmemcpy_8_15:
    HEAD_AND_TAIL qword, 8, rcx, r8
.Lmemcpy_16_32:
    mov rcx, qword ptr [rsi]
    mov r8, qword ptr [rsi + 8]
    mov r9, qword ptr [rsi + rdx - 16]
    mov r10, qword ptr [rsi + rdx - 8]
    mov qword ptr [rdi], rcx
    mov qword ptr [rdi + 8], r8
    mov qword ptr [rdi + rdx - 16], r9
    mov qword ptr [rdi + rdx - 8], r10
    ret
.Lmemcpy_long:
    mov rcx, rdx
    rep movsb
.Lmemcpy_done:
    ret
    .size memcpy, . - memcpy

    /* Forward unless the destination starts inside the source: then from the end down. */
    .globl memmove
    .hidden memmove
    .type memmove,@function
    .p2align 4
memmove:
    mov rax, rdi
    mov rcx, rdx
    mov r8, rdi
    sub r8, rsi
    cmp r8, rdx
    jb .Lmemmove_down
    rep movsb
    ret
.Lmemmove_down:
    lea rsi, [rsi + rdx - 1]
    lea rdi, [rdi + rdx - 1]
    std
    rep movsb
    cld
    ret
    .size memmove, . - memmove

    .globl memset
    .hidden memset
    .type memset,@function
    .p2align 4
memset:
    mov r8, rdi
    mov eax, esi
    mov rcx, rdx
    rep stosb
    mov rax, r8
    ret
    .size memset, . - memset

    /* Eight bytes at a time; the first pair of words that differ decides, compared as
       big-endian numbers (the first differing byte is then the most significant). */
    .globl memcmp
    .hidden memcmp
    .type memcmp,@function
    .globl bcmp
    .hidden bcmp
    .type bcmp,@function
    .p2align 4
memcmp:
bcmp:
    xor eax, eax
.Lmemcmp_words:
    cmp rdx, 8
    jb .Lmemcmp_bytes
    mov r8, qword ptr [rdi]
    mov r9, qword ptr [rsi]
    cmp r8, r9
    jne .Lmemcmp_differ
    add rdi, 8
    add rsi, 8
    sub rdx, 8
    jmp .Lmemcmp_words
.Lmemcmp_bytes:
    test rdx, rdx
    jz .Lmemcmp_done
    movzx eax, byte ptr [rdi]
    movzx ecx, byte ptr [rsi]
    sub eax, ecx
    jnz .Lmemcmp_done
    inc rdi
    inc rsi
    dec rdx
    jmp .Lmemcmp_bytes
.Lmemcmp_differ:
    bswap r8
    bswap r9
    cmp r8, r9
    sbb eax, eax
    or eax, 1
.Lmemcmp_done:
    ret
    .size memcmp, . - memcmp
    .size bcmp, . - bcmp

    .globl strlen
    .hidden strlen
    .type strlen,@function
    .p2align 4
strlen:
    mov rax, rdi
.Lstrlen_next:
    cmp byte ptr [rax], 0
    je .Lstrlen_end
    inc rax
    jmp .Lstrlen_next
.Lstrlen_end:
    sub rax, rdi
    ret
    .size strlen, . - strlen
"#
);

#[cfg(test)]
mod tests {
    // Called through pointers the optimiser cannot see through, so that the agent's own
    // definitions run, not code the compiler emitted in their place.
    use core::hint::black_box;

    extern "C" {
        fn memcpy(d: *mut u8, s: *const u8, n: usize) -> *mut u8;
        fn memmove(d: *mut u8, s: *const u8, n: usize) -> *mut u8;
        fn memset(d: *mut u8, c: i32, n: usize) -> *mut u8;
        fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32;
        fn strlen(s: *const u8) -> usize;
    }

    #[test]
    fn copies_and_fills_like_the_c_library() {
        let src: Vec<u8> = (0..200u8).collect();
        for n in (0..=40).chain([63, 64, 65, 200]) {
            let mut dst = vec![0xeeu8; 210];
            // SAFETY: both buffers hold at least n bytes and do not overlap.
            let r = unsafe { black_box(memcpy as unsafe extern "C" fn(*mut u8, *const u8, usize) -> *mut u8)(dst.as_mut_ptr(), src.as_ptr(), n) };
            assert_eq!(r, dst.as_mut_ptr());
            assert_eq!(&dst[..n], &src[..n]);
            assert!(dst[n..].iter().all(|&b| b == 0xee), "memcpy wrote past {n} bytes");
            // SAFETY: dst holds 210 bytes.
            let r = unsafe { black_box(memset as unsafe extern "C" fn(*mut u8, i32, usize) -> *mut u8)(dst.as_mut_ptr(), 0x1ab, n) };
            assert_eq!(r, dst.as_mut_ptr());
            assert!(dst[..n].iter().all(|&b| b == 0xab) && dst[n..].iter().all(|&b| b == 0xee), "memset of {n} bytes");
        }
    }

    #[test]
    fn moves_overlapping_ranges_both_ways() {
        for (from, to, n) in [(0usize, 10usize, 50usize), (10, 0, 50), (5, 6, 1), (6, 5, 40), (3, 3, 20), (0, 60, 0)] {
            let mut buf: Vec<u8> = (0..100u8).collect();
            let mut want = buf.clone();
            want.copy_within(from..from + n, to);
            // SAFETY: both ranges lie inside buf.
            unsafe { black_box(memmove as unsafe extern "C" fn(*mut u8, *const u8, usize) -> *mut u8)(buf.as_mut_ptr().add(to), buf.as_ptr().add(from), n) };
            assert_eq!(buf, want, "memmove {from} -> {to}, {n} bytes");
        }
    }

    #[test]
    fn compares_with_the_sign_of_the_first_difference() {
        let cmp = black_box(memcmp as unsafe extern "C" fn(*const u8, *const u8, usize) -> i32);
        let a: Vec<u8> = (0..40u8).collect();
        for at in [0usize, 3, 7, 8, 15, 39] {
            for (x, y) in [(0u8, 1u8), (1, 0), (0x7f, 0x80), (0x80, 0x7f), (0xff, 0)] {
                let (mut p, mut q) = (a.clone(), a.clone());
                p[at] = x;
                q[at] = y;
                // SAFETY: both hold 40 bytes.
                let got = unsafe { cmp(p.as_ptr(), q.as_ptr(), 40) };
                assert_eq!(got.signum(), (x as i32 - y as i32).signum(), "difference at {at}: {x} vs {y}");
                // SAFETY: as above; only the bytes before the difference are compared.
                assert_eq!(unsafe { cmp(p.as_ptr(), q.as_ptr(), at) }, 0);
            }
        }
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { black_box(strlen as unsafe extern "C" fn(*const u8) -> usize)(c"fnscope".as_ptr().cast()) }, 7);
        // SAFETY: as above.
        assert_eq!(unsafe { strlen(c"".as_ptr().cast()) }, 0);
    }
}
