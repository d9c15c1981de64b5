//! The hot path: entry and exit stubs in hand-written assembly.
//!
//! A hooked function's first bytes jump to its *slot* in a trampoline area near the module:
//!
//! ```text
//! slot+0   mov [rsp-8], r11              ; the program's r11 (GCC's -fipa-ra may keep it live)
//! slot+5   lea r11, [rip + slot+24]      ; address of the relocated original prologue
//! slot+12  jmp rel32 stub                ; where the stub lies out of reach: jmp rel32 to
//!                                        ; the copy of the stubs in the slot's area
//!                                        ; ([`place_copy`]); without one, to the area
//!                                        ; header's thunk, jmp [rip + entry] (in an area of
//!                                        ; few slots, that jump itself)
//! slot+18  u16 args bits                ; slots of fnscope_entry_args only (args::slot_unit)
//! slot+20  u32 function id
//! slot+24  relocated prologue, then jmp back into the function
//! ```
//!
//! `fnscope_entry` pushes a shadow-stack entry holding the return address, pops that address
//! off the stack and `call`s the function, whose return lands on `fnscope_exit`. That pops
//! the entry, writes one paired [`fnscope_abi::Record`] and returns to the real return
//! address.
//!
//! Rules both stubs follow (why they are safe in any program):
//! - Every general-purpose and vector register the program can see is preserved, including
//!   caller-saved ones: GCC's `-fipa-ra` lets a caller keep values in registers a known callee
//!   does not touch, so "caller-saved" is not a licence to clobber. Only the status flags are
//!   clobbered; no calling convention keeps them live across a call or return.
//! - Spills go below `rsp`. At a function's entry (and after its return) that memory belongs
//!   to the callee, never to the caller's red zone: the `call` itself wrote there. The kernel
//!   puts signal frames 128 bytes further down, so spills survive a signal.
//! - Per-thread state is one `fs`-relative load (initial-exec TLS, the agent is preloaded;
//!   [`specialise_tls`] writes the offset into the code), made before the time stamp.
//! - What a stub costs is the longest chain of dependent loads between two time stamps, not
//!   its number of instructions: `rdtsc` waits for the instructions before it to complete.
//! - Reservations of shadow-stack slots and record slots are single `xadd` instructions (not
//!   `lock`ed: only this thread touches its state, and a signal arrives between instructions),
//!   so a signal handler that calls hooked functions in the middle of a stub takes the next
//!   slot instead of overwriting this one.
//! - A record slot is checked twice after its `xadd`: against the chunk's end, then for the
//!   chunk's sequence number read before the `xadd`. A handler that arrives between the two
//!   and fills the chunk swaps in a new one, and the slot reserved before the swap lies in
//!   the old chunk, or past its end: checked against the new chunk's end alone, it could pass
//!   and be written outside any chunk (a record lost, or another chunk's header overwritten),
//!   or fail and leave a hole in the old chunk. On either failure [`crate::thread::settle_slots`]
//!   says where the slot lies. A swap after both checks is harmless: the old chunk is
//!   published only at the next swap.
//! - In-progress entries: between a stub's reservation and its last store, and between an
//!   exit stub's last read and its pop, a signal handler's hooked calls see the entry below
//!   their own half-written. Its slot word tells them: the entry stub writes it last (after the
//!   return address), the exit stub clears it before the pop, and every other pop clears it
//!   too, so an entry whose slot word is 0 is one a stub is still writing or giving back: not
//!   a gone frame to close (which would pop an entry still in use), not a frame to disarm or
//!   record (its words may be an older call's). [`crate::thread`] keeps that rule.
//! - Anything rare (first call of a thread, full buffer, frames skipped by longjmp or an
//!   exception, noticed at the next entry or exit) goes to Rust code through `SAVE_ALL`/`RESTORE_ALL`, which preserve all
//!   general-purpose registers and xmm0-15 and align the stack; the Rust side makes raw system
//!   calls only, and copies and compares with the agent's own functions ([`crate::mem`]), so
//!   that nothing it calls is hooked, even with libc traced.
//!
//! Thread-state offsets used here are checked against [`crate::thread::ThreadState`] by
//! compile-time assertions there.

use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Offset of the args bits (`crate::args::slot_unit`) in a slot that jumps to
/// `fnscope_entry_args`.
pub const SLOT_UNIT_OFFSET: usize = 18;
/// Offset of the function id within a slot.
pub const SLOT_ID_OFFSET: usize = 20;
/// Offset of the relocated prologue within a slot.
pub const SLOT_CODE_OFFSET: usize = 24;

global_asm!(
    r#"
    .section .tbss,"awT",@nobits
    .p2align 3
    .globl fnscope_tls
    .hidden fnscope_tls
    .type fnscope_tls,@object
    .size fnscope_tls, 8
fnscope_tls:
    .zero 8

    .text

    .macro SAVE_ALL
    lea rsp, [rsp - 128]
    push rax
    push rcx
    push rdx
    push rsi
    push rdi
    push r8
    push r9
    push r10
    push r11
    push rbp
    mov rbp, rsp
    and rsp, -16
    sub rsp, 256
    movdqu [rsp + 0], xmm0
    movdqu [rsp + 16], xmm1
    movdqu [rsp + 32], xmm2
    movdqu [rsp + 48], xmm3
    movdqu [rsp + 64], xmm4
    movdqu [rsp + 80], xmm5
    movdqu [rsp + 96], xmm6
    movdqu [rsp + 112], xmm7
    movdqu [rsp + 128], xmm8
    movdqu [rsp + 144], xmm9
    movdqu [rsp + 160], xmm10
    movdqu [rsp + 176], xmm11
    movdqu [rsp + 192], xmm12
    movdqu [rsp + 208], xmm13
    movdqu [rsp + 224], xmm14
    movdqu [rsp + 240], xmm15
    .endm

    /* Flag-neutral on purpose: callers test a result before restoring. */
    .macro RESTORE_ALL
    movdqu xmm0, [rsp + 0]
    movdqu xmm1, [rsp + 16]
    movdqu xmm2, [rsp + 32]
    movdqu xmm3, [rsp + 48]
    movdqu xmm4, [rsp + 64]
    movdqu xmm5, [rsp + 80]
    movdqu xmm6, [rsp + 96]
    movdqu xmm7, [rsp + 112]
    movdqu xmm8, [rsp + 128]
    movdqu xmm9, [rsp + 144]
    movdqu xmm10, [rsp + 160]
    movdqu xmm11, [rsp + 176]
    movdqu xmm12, [rsp + 192]
    movdqu xmm13, [rsp + 208]
    movdqu xmm14, [rsp + 224]
    movdqu xmm15, [rsp + 240]
    mov rsp, rbp
    pop rbp
    pop r11
    pop r10
    pop r9
    pop r8
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rax
    lea rsp, [rsp + 128]
    .endm

    /* In SAVE_ALL's frame, the stack pointer from before SAVE_ALL is rbp + 208. */

    /* rax = the time stamp, rdx = the thread state (clobbers rcx). The state's address is
       loaded before the time stamp, in rcx (rdtsc sets rax and rdx): its load then runs
       while the counter is read, off the chain of loads that the next rdtsc waits for. At
       `site` (listed in fnscope_tls_sites), specialise_tls rewrites the two loads into one. */
    .macro STATE_AND_TIME site
\site:
    mov rcx, qword ptr [rip + fnscope_tls@GOTTPOFF]
    mov rcx, qword ptr fs:[rcx]
    rdtsc
    shl rdx, 32
    or rax, rdx
    mov rdx, rcx
    .endm

    /* Exit stubs, rdx = thread state: rcx = the top shadow entry, which must be this call's
       (else to `mismatch`), and its return address put back in the stack slot. The entry's
       words are read at their offsets from the top, so that the top's adjustment stays off
       the chain that the return (and the next rdtsc) waits for. Clobbers rsi. */
    .macro PEEK_ENTRY mismatch
    mov rcx, qword ptr [rdx]
    mov rsi, qword ptr [rcx - 32]
    cmp qword ptr [rcx - 8], rsp
    lea rcx, [rcx - 32]
    jne \mismatch
    mov qword ptr [rsp], rsi
    .endm

    /* Entry stub, rdx = thread state, rcx = the entry reserved: closes the entries below it
       whose frames are gone and starts the entry over if there were any. */
    .macro CLOSE_DEAD_ENTRIES retry, site
    SAVE_ALL
    mov rdi, rdx
    lea rsi, [rbp + 208]
    mov rdx, rcx
\site:
    call qword ptr [rip + fnscope_entry_dead@GOTPCREL]
    test eax, eax
    RESTORE_ALL
    jnz \retry
    .endm

    /* The rare paths of an entry stub whose labels start with .L<p>_ (both entry stubs
       share them): rdx = thread state, rcx = the entry reserved, the program's rax, rdx, rcx
       and r11 and the relocated prologue below the return slot. */
    .macro ENTRY_RARE_PATHS p
.L\p\()_untraced:
    /* Shadow stack at its limit (--depth, or full), or an untraced thread (limit 0): run the
       call unrecorded (its return address stays as it is). At the limit, though, the newest
       entry may be a frame a longjmp or an exception left, whose level this call takes:
       that frame is closed first (as at _dead), and the call traced. */
    cmp qword ptr [rdx + 8], 0
    je .L\p\()_untraced_run
    cmp qword ptr [rcx - 8], rsp
    ja .L\p\()_untraced_run
    CLOSE_DEAD_ENTRIES .L\p\()_retry, .L\p\()_site_dead1
.L\p\()_untraced_run:
    sub qword ptr [rdx], 32
    mov rcx, [rsp - 32]
    mov rdx, [rsp - 24]
    mov rax, [rsp - 16]
    mov r11, [rsp - 8]
    jmp qword ptr [rsp - 40]
.L\p\()_check:
    /* A slot at the caller's that still holds an exit stub is a tail call's. */
    jb .L\p\()_dead
    lea r11, [rip + fnscope_exit]
    cmp qword ptr [rsp], r11
    je .L\p\()_tail
.L\p\()_site_tail:
    lea r11, [rip + fnscope_exit_args]
    cmp qword ptr [rsp], r11
.L\p\()_tail:
    mov r11, [rsp - 40]
    je .L\p\()_store
.L\p\()_dead:
    CLOSE_DEAD_ENTRIES .L\p\()_retry, .L\p\()_site_dead2
    jmp .L\p\()_store
.L\p\()_init:
    SAVE_ALL
.L\p\()_site_init:
    call qword ptr [rip + fnscope_thread_init@GOTPCREL]
    test eax, eax
    RESTORE_ALL
    jnz .L\p\()_retry
    /* Not traced yet (the agent is starting): run the call as it is. */
    mov rcx, [rsp - 32]
    mov rdx, [rsp - 24]
    mov rax, [rsp - 16]
    mov r11, [rsp - 8]
    jmp qword ptr [rsp - 40]
    .endm

    .globl fnscope_entry
    .hidden fnscope_entry
    .type fnscope_entry,@function
    .p2align 4
fnscope_entry:
    /* The slot saved the program's r11 at [rsp-8] and put the relocated prologue in r11. */
    mov [rsp - 16], rax
    mov [rsp - 24], rdx
    mov [rsp - 32], rcx
    mov [rsp - 40], r11
.Lentry_retry:
    STATE_AND_TIME .Ltls_entry
    test rdx, rdx
    jz .Lentry_init
    mov ecx, 32
    xadd qword ptr [rdx], rcx
    cmp rcx, qword ptr [rdx + 8]
    jae .Lentry_untraced
    /* A live caller's return slot lies above ours; an entry whose slot is below ours, or is
       ours, is a frame that a longjmp or an exception left - unless the slot still holds the
       exit stub: then it is a tail call, whose callee reuses its caller's slot. */
    cmp qword ptr [rcx - 8], rsp
    jbe .Lentry_check
.Lentry_store:
    /* The slot word last: it commits the entry (see "In-progress entries" above). */
    mov qword ptr [rcx + 8], rax
    mov eax, dword ptr [r11 - 4]
    mov qword ptr [rcx + 16], rax
    mov rax, qword ptr [rsp]
    mov qword ptr [rcx], rax
    mov qword ptr [rcx + 24], rsp
    mov rcx, [rsp - 32]
    mov rdx, [rsp - 24]
    mov rax, [rsp - 16]
    mov r11, [rsp - 8]
    /* Drop the caller's return address (it is on the shadow stack) and call the function
       from here: the `call` puts fnscope_exit in the very same stack slot, so the stack
       looks as the function expects, and both its `ret` and ours below are predicted by the
       return stack buffer (replacing the return address in place would mispredict both). */
    lea rsp, [rsp + 8]
    call qword ptr [rsp - 48]
    .globl fnscope_exit
    .hidden fnscope_exit
fnscope_exit:
    sub rsp, 8
    mov [rsp - 8], rax
    mov [rsp - 16], rdx
    mov [rsp - 24], rcx
    mov [rsp - 32], rsi
    mov [rsp - 40], r11
.Lexit_retry:
    STATE_AND_TIME .Ltls_exit
    PEEK_ENTRY .Lexit_mismatch
    /* --min-duration: a call shorter than the threshold is not recorded. Without one,
       skip_min_ticks jumps over this from .Lexit_min. */
.Lexit_min:
    mov rsi, rax
    sub rsi, qword ptr [rcx + 8]
.Lsite_min_ticks:
    cmp rsi, qword ptr [rip + {min_ticks}]
    jb .Lexit_pop
.Lexit_reserve:
    /* The chunk's sequence number before the reservation and after the bound check: if a
       signal handler swapped chunks in between, the slot may lie anywhere (module docs). */
    mov r11, qword ptr [rdx + {seq}]
    mov esi, 24
    xadd qword ptr [rdx + 16], rsi
    cmp rsi, qword ptr [rdx + 24]
    jae .Lexit_full
    cmp r11, qword ptr [rdx + {seq}]
    jne .Lexit_full
.Lexit_write:
    mov r11, qword ptr [rcx + 8]
    mov qword ptr [rsi], r11
    mov qword ptr [rsi + 8], rax
    mov rax, rcx
    sub rax, qword ptr [rdx + 32]
    shl rax, 27
    /* The id alone: an args entry (popped here after a mismatch) has more in its word. */
    mov r11d, dword ptr [rcx + 16]
    lea rax, [rax + r11 + 1]
    mov qword ptr [rsi + 16], rax
.Lexit_pop:
    /* Uncommits the entry before giving it back: a free entry's slot word is 0. */
    mov qword ptr [rcx + 24], 0
    sub qword ptr [rdx], 32
.Lexit_leave:
    mov r11, [rsp - 40]
    mov rsi, [rsp - 32]
    mov rcx, [rsp - 24]
    mov rdx, [rsp - 16]
    mov rax, [rsp - 8]
    ret
.Lexit_full:
    SAVE_ALL
    mov rdi, rdx
    mov edx, 24
.Lsite_settle:
    call qword ptr [rip + fnscope_settle@GOTPCREL]
    cmp eax, 1
    RESTORE_ALL
    jb .Lexit_reserve
    ja .Lexit_write
    jmp .Lexit_pop
.Lexit_mismatch:
    SAVE_ALL
    mov rdi, rdx
    lea rsi, [rbp + 208]
.Lsite_mismatch:
    call qword ptr [rip + fnscope_exit_mismatch@GOTPCREL]
    test eax, eax
    RESTORE_ALL
    jz .Lexit_retry
    /* The real return address is back in place and the call was recorded already. */
    jmp .Lexit_leave
    ENTRY_RARE_PATHS entry
    .globl fnscope_entry_end
    .hidden fnscope_entry_end
fnscope_entry_end:
    .size fnscope_entry, . - fnscope_entry


    /* ---- Functions with values to record or injections (see args.rs) ----
       The same protocol as fnscope_entry/fnscope_exit; in addition the entry copies the
       call's values into its frame of the thread's args stack (frame = args_base + 16 x the
       entry's offset in the shadow stack = (entry << 4) + args_delta), and the exit writes
       the frame's data unit into data slots before the record. The slot's args bits go into
       bits 32-47 of the shadow entry's id word: ARGS_ENTRY, then the fast unit code u of a
       call with k integer-register arguments and r (0, 1) return words, u = k | r << 3. Such
       a call reads nothing else: the entry copies rdi.. into the frame (without a header:
       u implies it), and the exit jumps to the writer of its unit, .Lxa_unit_k_r. The others
       (u = 0) read their descriptor, args::DESCS[id], whose first two words are read here
       (fast_header, fast_ret). */

    /* The record of a call with a data unit at [at]: rax = exit time, rcx = its shadow
       entry (clobbered), rdx = thread state. */
    .macro DATA_RECORD at
    mov qword ptr [\at + 8], rax
    mov rax, qword ptr [rcx + 8]
    mov qword ptr [\at], rax
    mov rax, rcx
    sub rax, qword ptr [rdx + 32]
    shl rax, 27
    mov ecx, dword ptr [rcx + 16]
    lea rax, [rax + rcx + 1]
    bts rax, {data_bit}
    mov qword ptr [\at + 16], rax
    .endm

    .globl fnscope_entry_args
    .hidden fnscope_entry_args
    .type fnscope_entry_args,@function
    .p2align 4
fnscope_entry_args:
    mov [rsp - 16], rax
    mov [rsp - 24], rdx
    mov [rsp - 32], rcx
    mov [rsp - 40], r11
.Lea_retry:
    STATE_AND_TIME .Ltls_entry_args
    test rdx, rdx
    jz .Lea_init
    mov ecx, 32
    xadd qword ptr [rdx], rcx
    cmp rcx, qword ptr [rdx + 8]
    jae .Lea_untraced
    cmp qword ptr [rcx - 8], rsp
    jbe .Lea_check
.Lea_store:
    mov qword ptr [rcx + 8], rax
    /* The id word: the slot's id and args bits. r11 (the prologue) is saved at [rsp-40]:
       free from here on. */
    movzx eax, word ptr [r11 - 6]
    mov r11d, dword ptr [r11 - 4]
    shl rax, 32
    or rax, r11
    mov qword ptr [rcx + 16], rax
    mov r11, qword ptr [rsp]
    mov qword ptr [rcx], r11
    mov qword ptr [rcx + 24], rsp
    /* rax = the fast unit code, r11 = this entry's frame. */
    shr rax, 33
    cmp rcx, qword ptr [rdx + {args_limit}]
    jae .Lea_noframe
    mov r11, rcx
    shl r11, 4
    add r11, qword ptr [rdx + {args_delta}]
    test rax, rax
    jz .Lea_desc
.Lea_regs:
    mov qword ptr [r11 + 8], rdi
    mov qword ptr [r11 + 16], rsi
    mov rax, [rsp - 24]
    mov qword ptr [r11 + 24], rax
    mov rax, [rsp - 32]
    mov qword ptr [r11 + 32], rax
    mov qword ptr [r11 + 40], r8
    mov qword ptr [r11 + 48], r9
.Lea_call:
    mov rcx, [rsp - 32]
    mov rdx, [rsp - 24]
    mov rax, [rsp - 16]
    mov r11, [rsp - 8]
    lea rsp, [rsp + 8]
    call qword ptr [rsp - 48]
    .globl fnscope_exit_args
    .hidden fnscope_exit_args
fnscope_exit_args:
    sub rsp, 8
    mov [rsp - 8], rax
    mov [rsp - 16], rdx
    mov [rsp - 24], rcx
    mov [rsp - 32], rsi
    mov [rsp - 40], r11
    mov [rsp - 48], rdi
.Lxa_retry:
    STATE_AND_TIME .Ltls_exit_args
    PEEK_ENTRY .Lxa_mismatch
.Lxa_min:
    mov rsi, rax
    sub rsi, qword ptr [rcx + 8]
    cmp rsi, qword ptr [rip + {min_ticks}]
    jb .Lxa_pop
.Lxa_min_end:
    /* rdi = frame (or the slow path when there is none); a fast unit goes to its writer. */
    cmp rcx, qword ptr [rdx + {args_limit}]
    jae .Lxa_slow
    mov rdi, rcx
    shl rdi, 4
    add rdi, qword ptr [rdx + {args_delta}]
    mov r11, qword ptr [rcx + 16]
    shr r11, 33
    jz .Lxa_desc
    lea rsi, [rip + .Lxa_units]
    movsxd r11, dword ptr [rsi + r11 * 4]
    add r11, rsi
    jmp r11
.Lxa_reserve:
    /* r11 = bytes of the data slots and the record; their words from rdi + 8 on; the exit
       time at [rsp-56], the slots' tag at [rsp-64]. */
    mov rsi, r11
    mov rax, qword ptr [rdx + {seq}]
    xadd qword ptr [rdx + 16], rsi
    add r11, rsi
    cmp r11, qword ptr [rdx + 24]
    ja .Lxa_full
    cmp rax, qword ptr [rdx + {seq}]
    jne .Lxa_full
.Lxa_write:
    /* The record last, then the data slots before it (a reader of a live chunk stops at
       the first slot not yet written, whatever the order). */
    mov rax, [rsp - 56]
    DATA_RECORD r11-24
    mov rcx, [rsp - 64]
    sub r11, 24
    /* Two words and the tag a slot; a unit of an odd count pads its last slot. */
.Lxa_slot:
    mov rax, qword ptr [rdi + 8]
    mov qword ptr [rsi], rax
    mov rax, qword ptr [rdi + 16]
    mov qword ptr [rsi + 8], rax
    mov qword ptr [rsi + 16], rcx
    add rdi, 16
    add rsi, 24
    cmp rsi, r11
    jb .Lxa_slot
    jmp .Lxa_pop
.Lxa_desc:
    /* The frame's header was written by the entry (by Rust for strings, stack arguments,
       ...); the exit copies it with rax when fast_ret says it may: rsi = return words (0,
       1). The reservation below wants r11 = bytes, the words from rdi + 8 on, the exit time
       at [rsp-56] and the slots' tag at [rsp-64]. */
    mov r11d, dword ptr [rcx + 16]
    mov rsi, qword ptr [rip + {descs}]
    mov r11, qword ptr [rsi + r11 * 8]
    mov rsi, qword ptr [r11 + 8]
    sub rsi, 1
    jb .Lxa_slow
    mov [rsp - 56], rax
    movzx eax, word ptr [rdi]
    mov r11, [rsp - 8]
    mov qword ptr [rdi + rax * 8 + 8], r11
    lea r11, [rax + rsi + 1]
    shl rsi, 16
    or qword ptr [rdi], rsi
    mov rax, r11
    shl rax, 32
    mov [rsp - 64], rax
    /* Bytes: (words + 1) / 2 slots and the record; the words from the header on. */
    add r11, 3
    shr r11, 1
    imul r11, r11, 24
    sub rdi, 8
    jmp .Lxa_reserve
.Lxa_pop:
    /* rcx no longer holds the entry here: it is the top one. */
    mov rcx, qword ptr [rdx]
    mov qword ptr [rcx - 8], 0
    sub qword ptr [rdx], 32
.Lxa_leave:
    mov rdi, [rsp - 48]
    mov r11, [rsp - 40]
    mov rsi, [rsp - 32]
    mov rcx, [rsp - 24]
    mov rdx, [rsp - 16]
    mov rax, [rsp - 8]
    ret
.Lxa_full:
    /* The check refused slots [rsi, r11): written where they are after all, or given up,
       and the unit written from Rust (which reserves again), or dropped. */
    SAVE_ALL
    mov rdi, rdx
    mov rdx, r11
    sub rdx, rsi
    call fnscope_settle
    cmp eax, 1
    RESTORE_ALL
    ja .Lxa_write
    je .Lxa_pop
    mov rax, [rsp - 56]
.Lxa_slow:
    SAVE_ALL
    mov rdi, rdx
    mov rsi, rcx
    mov rdx, rax
    mov rcx, rbp
    mov r8, rsp
    lea r9, [rbp + 208]
    call fnscope_args_exit
    RESTORE_ALL
    jmp .Lxa_pop
.Lxa_mismatch:
    SAVE_ALL
    mov rdi, rdx
    lea rsi, [rbp + 208]
    call fnscope_exit_mismatch
    test eax, eax
    RESTORE_ALL
    jz .Lxa_retry
    jmp .Lxa_leave
.Lxa_unit_full:
    /* As .Lxa_full, from a unit writer: r11 = bytes; its write resumes at [rsp-72]. */
    SAVE_ALL
    mov rdi, rdx
    mov rdx, r11
    call fnscope_settle
    cmp eax, 1
    RESTORE_ALL
    mov rax, [rsp - 56]
    jb .Lxa_slow
    je .Lxa_pop
    jmp qword ptr [rsp - 72]

    /* Word i of a fast unit of k entry words and w words in all: rdi = frame, rsi = first
       data slot, rcx = their tag. Slot j holds words 2j and 2j + 1, and its tag goes last:
       a reader of a live chunk takes a slot whose tag is written as complete. A unit of an
       odd count leaves the second word of its last slot as it was (no reader looks at it). */
    .macro UNIT_WORD i, k, w
    .if \i < \k
    mov rax, qword ptr [rdi + 8 + 8 * \i]
    .else
    mov rax, [rsp - 8]
    .endif
    mov qword ptr [rsi + 24 * (\i >> 1) + 8 * (\i & 1)], rax
    .if (\i & 1) == 1 || \i == \w - 1
    mov qword ptr [rsi + 24 * (\i >> 1) + 16], rcx
    .endif
    .endm

    /* The writer of the unit of k entry words and r return words: data slots and record in
       one reservation (as at .Lxa_reserve), with the tag, the size and the words' places
       known here. rax = exit time, rcx = entry, rdx = state, rdi = frame. */
    .macro UNIT_WRITER k, r
.Lxa_unit_\k\()_\r:
    mov [rsp - 56], rax
    mov rax, qword ptr [rdx + {seq}]
    mov esi, ((\k + \r + 1) / 2 + 1) * 24
    xadd qword ptr [rdx + 16], rsi
    lea r11, [rsi + ((\k + \r + 1) / 2 + 1) * 24]
    cmp r11, qword ptr [rdx + 24]
    ja .Lxa_unit_full_\k\()_\r
    cmp rax, qword ptr [rdx + {seq}]
    jne .Lxa_unit_full_\k\()_\r
    mov rax, [rsp - 56]
.Lxa_unit_write_\k\()_\r:
    DATA_RECORD rsi+((\k+\r+1)/2)*24
    movabs rcx, (1 << {implied_bit}) | ((\k + \r) << 32) | (\k << 40) | (\r << 48)
    .irp i, 0, 1, 2, 3, 4, 5, 6
    .if \i < \k + \r
    UNIT_WORD \i, \k, \k+\r
    .endif
    .endr
    jmp .Lxa_pop
.Lxa_unit_full_\k\()_\r:
    /* r11 = bytes, as .Lxa_unit_full wants them. */
    mov r11d, ((\k + \r + 1) / 2 + 1) * 24
    lea rax, [rip + .Lxa_unit_write_\k\()_\r]
    mov [rsp - 72], rax
    jmp .Lxa_unit_full
    .endm

    .irp k, 0, 1, 2, 3, 4, 5, 6
    .irp r, 0, 1
    .if \k + \r > 0
    UNIT_WRITER \k, \r
    .endif
    .endr
    .endr

    /* By fast unit code: its writer's offset from here (codes 0 and 7 never occur). */
    .p2align 2
.Lxa_units:
    .long .Lxa_desc - .Lxa_units
    .irp k, 1, 2, 3, 4, 5, 6
    .long .Lxa_unit_\k\()_0 - .Lxa_units
    .endr
    .long .Lxa_desc - .Lxa_units
    .irp k, 0, 1, 2, 3, 4, 5, 6
    .long .Lxa_unit_\k\()_1 - .Lxa_units
    .endr
.Lea_noframe:
    /* Past the args stack: the call runs with no values recorded, unless its entry goes to
       Rust. */
    test rax, rax
    jnz .Lea_call
    xor r11d, r11d
.Lea_desc:
    /* No fast unit: the descriptor's fast_header says whether the entry copies the integer
       registers itself, under that header; r11 = frame, or 0. */
    mov eax, dword ptr [rcx + 16]
    shl rax, 3
    add rax, qword ptr [rip + {descs}]
    mov rax, qword ptr [rax]
    mov rax, qword ptr [rax]
    test rax, rax
    jz .Lea_rust
    test r11, r11
    jz .Lea_call
    mov qword ptr [r11], rax
    jmp .Lea_regs
.Lea_rust:
    mov rax, r11
.Lea_slow:
    /* rax = frame or 0, rcx = entry, rdx = state. */
    SAVE_ALL
    mov rdi, rdx
    mov rsi, rcx
    mov rdx, rax
    mov rcx, rbp
    mov r8, rsp
    lea r9, [rbp + 208]
    call fnscope_args_enter
    test eax, eax
    RESTORE_ALL
    jz .Lea_call
    /* Injected: the function does not run; the value is in the saved rax. */
    mov rcx, [rsp - 32]
    mov rdx, [rsp - 24]
    mov rax, [rsp - 16]
    mov r11, [rsp - 8]
    ret
    ENTRY_RARE_PATHS ea
    .size fnscope_entry_args, . - fnscope_entry_args

    /* Reader and writer of an initial-exec TLS variable of `width` (dword, qword): the value
       in `ret` (eax, rax), the new one in `arg` (edi, rdi). */
    .macro TLS_ACCESSORS get, set, var, width, ret, arg
    .globl \get
    .hidden \get
    .type \get,@function
\get:
    mov rax, qword ptr [rip + \var@GOTTPOFF]
    mov \ret, \width ptr fs:[rax]
    ret
    .size \get, . - \get

    .globl \set
    .hidden \set
    .type \set,@function
\set:
    mov rax, qword ptr [rip + \var@GOTTPOFF]
    mov \width ptr fs:[rax], \arg
    ret
    .size \set, . - \set
    .endm

    TLS_ACCESSORS fnscope_get_errno, fnscope_set_errno, errno, dword, eax, edi

    /* Copies st0 (10 bytes) to [rdi] without changing the x87 stack. */
    .globl fnscope_read_st0
    .hidden fnscope_read_st0
    .type fnscope_read_st0,@function
fnscope_read_st0:
    fld st(0)
    fstp tbyte ptr [rdi]
    ret
    .size fnscope_read_st0, . - fnscope_read_st0

    /* Pre-hooks on the unwinder: call the Rust handler with the hook kind (the slot's id
       field), the stack pointer at entry and the function's first argument (the exception
       object), then run the original function. */
    .globl fnscope_prehook
    .hidden fnscope_prehook
    .type fnscope_prehook,@function
    .p2align 4
fnscope_prehook:
    mov [rsp - 16], r11
    SAVE_ALL
    mov rdx, rdi
    mov edi, dword ptr [r11 - 4]
    lea rsi, [rbp + 208]
    call fnscope_prehook_handler
    RESTORE_ALL
    mov r11, [rsp - 8]
    jmp qword ptr [rsp - 16]
    .size fnscope_prehook, . - fnscope_prehook

    /* Count mode, first call of a thread: r11 is where the slot resumes (its program r11 is
       still at [rsp-8]); set up the thread's counters, then go back. */
    .globl fnscope_count_init
    .hidden fnscope_count_init
    .type fnscope_count_init,@function
    .p2align 4
fnscope_count_init:
    SAVE_ALL
    call fnscope_count_thread_init
    RESTORE_ALL
    jmp r11
    .size fnscope_count_init, . - fnscope_count_init

    .globl fnscope_tls_offset
    .hidden fnscope_tls_offset
    .type fnscope_tls_offset,@function
fnscope_tls_offset:
    mov rax, qword ptr [rip + fnscope_tls@GOTTPOFF]
    ret
    .size fnscope_tls_offset, . - fnscope_tls_offset

    /* Where the stubs load their thread state's address (see specialise_tls). */
    .pushsection .data.rel.ro.fnscope_tls_sites,"aw",@progbits
    .p2align 3
    .globl fnscope_tls_sites
    .hidden fnscope_tls_sites
    .type fnscope_tls_sites,@object
fnscope_tls_sites:
    .quad .Ltls_entry, .Ltls_exit, .Ltls_entry_args, .Ltls_exit_args
    .size fnscope_tls_sites, . - fnscope_tls_sites

    /* The instructions of fnscope_entry's block that reach out of it (see place_copy). */
    .p2align 3
    .globl fnscope_copy_sites
    .hidden fnscope_copy_sites
    .type fnscope_copy_sites,@object
fnscope_copy_sites:
    .quad .Lentry_site_dead1, .Lentry_site_dead2, .Lentry_site_tail, .Lentry_site_init
    .quad .Lsite_settle, .Lsite_mismatch, .Lsite_min_ticks, .Ltls_entry, .Ltls_exit
    .size fnscope_copy_sites, . - fnscope_copy_sites

    /* The exit stubs' --min-duration checks, each from its start to the instruction after
       it (see skip_min_ticks). */
    .p2align 3
    .globl fnscope_min_sites
    .hidden fnscope_min_sites
    .type fnscope_min_sites,@object
fnscope_min_sites:
    .quad .Lexit_min, .Lexit_reserve, .Lxa_min, .Lxa_min_end
    .size fnscope_min_sites, . - fnscope_min_sites
    .popsection

    TLS_ACCESSORS fnscope_tls_get, fnscope_tls_set, fnscope_tls, qword, rax, rdi

    .globl fnscope_rdtsc
    .hidden fnscope_rdtsc
    .type fnscope_rdtsc,@function
fnscope_rdtsc:
    rdtsc
    shl rdx, 32
    or rax, rdx
    ret
    .size fnscope_rdtsc, . - fnscope_rdtsc
"#,
    min_ticks = sym MIN_TICKS,
    seq = const core::mem::offset_of!(crate::thread::ThreadState, seq),
    args_limit = const core::mem::offset_of!(crate::thread::ThreadState, args_limit),
    args_delta = const core::mem::offset_of!(crate::thread::ThreadState, args_delta),
    data_bit = const 56 + 2,
    descs = sym crate::args::DESCS,
    implied_bit = const fnscope_abi::data::TAG_IMPLIED_HEADER.trailing_zeros(),
);

/// `--min-duration` in time-stamp-counter ticks (0: every call is recorded), read by the exit
/// stub on every return.
pub static MIN_TICKS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// Bytes a copy of the entry and exit stubs ([`place_copy`]) may take.
pub const COPY_ROOM: usize = 4096;

/// Most copies of the stubs a process places (one per big module out of the stubs' reach:
/// the main executable, a library loaded far away).
const MAX_COPIES: usize = 64;

/// The copies' entries, the first [`NCOPIES`] of them set (see [`is_exit`]).
static COPIES: [AtomicU64; MAX_COPIES] = [const { AtomicU64::new(0) }; MAX_COPIES];
static NCOPIES: AtomicUsize = AtomicUsize::new(0);

/// Places a copy of the entry and exit stubs (`fnscope_entry` to `fnscope_entry_end`, their
/// rare paths included) at `to`, and returns its entry: slots near `to` jump to it directly
/// where the agent's library lies out of a jump's reach. A hooked function entered through a
/// copy returns into the copy's exit, which [`is_exit`] knows from then on; any exit stub
/// serves any entry (they share the thread's state), so the Rust side re-arms frames with
/// `fnscope_exit` itself.
///
/// Inside the block every relative reference stays valid as it moves whole; the instructions
/// that reach out of it (listed in `fnscope_copy_sites`) go through words placed after the
/// copy instead, each in an instruction of the same length:
/// - a call to a slow path (`call [rip + f@GOTPCREL]`, which the linker may have made
///   `addr32 call f`) becomes `call [rip + word]`, the word holding the function's address;
/// - `lea r11, [rip + fnscope_exit_args]` becomes `mov r11, [rip + word]`;
/// - the load of [`MIN_TICKS`] (and of the TLS offset from the GOT, if [`specialise_tls`]
///   could not write it in) reads a word holding the value it has now: the copy is made after
///   `--min-duration` is set, once at start-up.
///
/// The table is checked by a test that decodes a copy: nothing in it may reach the original.
/// No decoder runs here: at start-up it would fault in pages of the agent that a warm start
/// never touches (0.6 ms of a warm `git --version`, whose agent start-up takes 2.3-4 ms).
///
/// # Safety
/// `[to, to + COPY_ROOM)` must be writable memory that nothing runs, made executable before
/// any slot jumps there and never unmapped. Calls must not overlap: the agent hooks one
/// module at a time (at start-up, then under the tracer's lock).
pub unsafe fn place_copy(to: u64) -> Result<u64, String> {
    let from = fnscope_entry as *const () as u64;
    let len = (fnscope_entry_end as *const () as u64 - from) as usize;
    let k = NCOPIES.load(Ordering::Acquire);
    if k >= MAX_COPIES {
        return Err(format!("{MAX_COPIES} copies of the stubs are placed already"));
    }
    // SAFETY: the stubs' own code, `len` bytes of the agent's text.
    let code = unsafe { core::slice::from_raw_parts(from as *const u8, len) };
    let mut out = code.to_vec();
    let words_at = len.next_multiple_of(8);
    let mut words: Vec<u64> = Vec::new();
    // SAFETY: a table of addresses in the agent's read-only data.
    let sites = unsafe { core::ptr::addr_of!(fnscope_copy_sites).read() };
    for site in sites {
        let at = site.checked_sub(from).filter(|&a| a as usize + 7 <= len).ok_or("a site of the stubs lies outside their block")? as usize;
        // What `[rip + disp32]` (or `rel32`) ending an `ilen`-byte instruction at `at` reaches.
        let reach = |ilen: usize| {
            let d = i32::from_le_bytes([code[at + ilen - 4], code[at + ilen - 3], code[at + ilen - 2], code[at + ilen - 1]]);
            (site + ilen as u64).wrapping_add(d as i64 as u64)
        };
        // SAFETY (the reads below): each reads where the original instruction reads, a word
        // of the agent's own data (a GOT entry, MIN_TICKS).
        let (ilen, word) = match code[at..at + 3] {
            [0x67, 0xe8, _] => {
                out[at..at + 2].copy_from_slice(&[0xff, 0x15]);
                (6, reach(6))
            }
            [0xff, 0x15, _] => (6, unsafe { (reach(6) as *const u64).read_unaligned() }),
            [0x4c, 0x8d, 0x1d] => {
                out[at + 1] = 0x8b;
                (7, reach(7))
            }
            [0x48, 0x3b, 0x35] | [0x48, 0x8b, 0x0d] => (7, unsafe { (reach(7) as *const u64).read_unaligned() }),
            // A TLS load in the form specialise_tls writes (`mov rcx, fs:[offset]`) or the one
            // a linker makes in an executable (`mov rcx, imm32`): it reaches nothing.
            [0x64, 0x48, 0x8b] | [0x48, 0xc7, 0xc1] => continue,
            _ => return Err(format!("unexpected code at +{at:#x} of the stubs: {:02x?}", &code[at..at + 3])),
        };
        let w = words.iter().position(|&v| v == word).unwrap_or_else(|| {
            words.push(word);
            words.len() - 1
        });
        // Both ends move together: the displacement is the same wherever the copy lies.
        let disp = (words_at + 8 * w) as i64 - (at + ilen) as i64;
        out[at + ilen - 4..at + ilen].copy_from_slice(&(disp as i32).to_le_bytes());
    }
    out.resize(words_at, 0xcc);
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    if out.len() > COPY_ROOM {
        return Err(format!("a copy of the stubs takes {} bytes, more than the {COPY_ROOM} set aside", out.len()));
    }
    // SAFETY: per the caller's guarantee, COPY_ROOM writable bytes at `to`.
    unsafe { core::ptr::copy_nonoverlapping(out.as_ptr(), to as *mut u8, out.len()) };
    COPIES[k].store(to, Ordering::Relaxed);
    NCOPIES.store(k + 1, Ordering::Release);
    Ok(to)
}

/// Whether `v` is the address of an exit stub: the agent's two, or a copy's
/// ([`place_copy`]). The stubs themselves compare a return address with their own exit only;
/// the slow paths they call ask this.
pub fn is_exit(v: u64) -> bool {
    if v == fnscope_exit as *const () as u64 || v == fnscope_exit_args as *const () as u64 {
        return true;
    }
    let exit_offset = fnscope_exit as *const () as u64 - fnscope_entry as *const () as u64;
    let n = NCOPIES.load(Ordering::Acquire).min(MAX_COPIES);
    COPIES[..n].iter().any(|c| c.load(Ordering::Relaxed) + exit_offset == v)
}

extern "C" {
    /// Common entry stub; jumped to from a slot with `r11` = relocated prologue.
    pub fn fnscope_entry();
    /// Exit stub; hooked functions return into it.
    pub fn fnscope_exit();
    /// The end of `fnscope_entry`'s block: both stubs and their rare paths (see [`place_copy`]).
    fn fnscope_entry_end();
    /// Entry stub of functions with values to record or injections (see [`crate::args`]).
    pub fn fnscope_entry_args();
    /// Exit stub of those functions.
    pub fn fnscope_exit_args();
    /// Reads the C library's `errno` of this thread (its initial-exec TLS slot).
    fn fnscope_get_errno() -> i32;
    /// Sets the C library's `errno` of this thread.
    fn fnscope_set_errno(e: i32);
    /// Copies the x87 top of stack (10 bytes) to `out`, leaving the stack as it was.
    fn fnscope_read_st0(out: *mut u8);
    /// Common stub of pre-hooks (see [`crate::unwind`]).
    pub fn fnscope_prehook();
    /// Count mode: sets up a thread's counters, then resumes the slot at `r11`.
    pub fn fnscope_count_init();
    /// Offset of the agent's TLS word from the thread pointer (`fs` base).
    pub fn fnscope_tls_offset() -> u64;
    /// Reads this thread's state pointer.
    pub fn fnscope_tls_get() -> *mut crate::thread::ThreadState;
    /// Sets this thread's state pointer.
    pub fn fnscope_tls_set(state: *mut crate::thread::ThreadState);
    /// Reads the time-stamp counter.
    pub fn fnscope_rdtsc() -> u64;
    /// The instructions of `fnscope_entry`'s block that reach out of it (see [`place_copy`]).
    static fnscope_copy_sites: [u64; 9];
    /// Addresses of the stubs' loads of their thread state's address (see [`specialise_tls`]).
    static fnscope_tls_sites: [u64; 4];
    /// Where the exit stubs' `--min-duration` checks start and end (see [`skip_min_ticks`]).
    static fnscope_min_sites: [u64; 4];
}

/// How the stubs' loads of their thread state's address are assembled: `mov rcx, [rip +
/// fnscope_tls@GOTTPOFF]` (its 4 displacement bytes, left as 0 here, are not compared), then
/// `mov rcx, fs:[rcx]`.
const TLS_LOAD_GOT: [u8; 11] = [0x48, 0x8b, 0x0d, 0, 0, 0, 0, 0x64, 0x48, 0x8b, 0x09];

/// The first instruction of [`TLS_LOAD_GOT`] as a linker rewrites it in an executable (the
/// agent's crate linked into its tests), where the offset is known: `mov rcx, imm32`.
const TLS_LOAD_LINKED: [u8; 3] = [0x48, 0xc7, 0xc1];

/// What [`specialise_tls`] writes over [`TLS_LOAD_GOT`]: `mov rcx, fs:[offset]` (the offset's
/// 4 bytes at 5..9), then a 2-byte nop.
fn tls_load_inline(offset: i32) -> [u8; 11] {
    let d = offset.to_le_bytes();
    [0x64, 0x48, 0x8b, 0x0c, 0x25, d[0], d[1], d[2], d[3], 0x66, 0x90]
}

/// Rewrites each stub's load of this thread's state, two dependent loads (the TLS offset from
/// the GOT, then the word at `fs:offset`), into one with the offset written in.
///
/// `rdtsc` waits for the instructions before it to complete: the time between two stamps is
/// the longest chain of dependent loads between them, past the 12 or so cycles the counter
/// itself hides (`bench/tools/rdtsc_chain.c`, on the Intel VM: a chain of 4 loads after each
/// of two `rdtsc` adds 1.8 ns, of 8 loads 12 ns, while 8 independent loads add 0.5). Both
/// stubs start their chains with this load; one load less per stub took fib's in-process
/// cost from 22.8 to 20.2-20.9 ns a call.
///
/// The offset is fixed for the process once the agent is loaded (initial-exec TLS), so it is
/// written once, at start-up, before any function is hooked: no thread runs a stub yet. If
/// the code cannot be made writable the stubs keep both loads, which are as correct.
pub fn specialise_tls() -> Result<(), String> {
    // SAFETY: reads the GOT entry the dynamic linker filled before the agent's init ran.
    let offset = unsafe { fnscope_tls_offset() } as i64;
    let offset = i32::try_from(offset).map_err(|_| format!("TLS offset {offset:#x} does not fit 32 bits"))?;
    // SAFETY: a table of four addresses in the agent's read-only data.
    let sites = unsafe { core::ptr::addr_of!(fnscope_tls_sites).read() };
    for &at in &sites {
        // SAFETY: `at` is a label in the agent's text, followed by the 11 bytes of the load.
        let code = unsafe { core::slice::from_raw_parts(at as *const u8, TLS_LOAD_GOT.len()) };
        let two_loads = (code[..3] == TLS_LOAD_GOT[..3] || code[..3] == TLS_LOAD_LINKED) && code[7..] == TLS_LOAD_GOT[7..];
        if !two_loads && code != tls_load_inline(offset) {
            return Err(format!("unexpected code at the TLS load {at:#x}: {code:02x?}"));
        }
    }
    // SAFETY: each site holds the 11 bytes checked above, whole instructions that no thread
    // is running (nothing is hooked yet).
    unsafe { write_stub_code(sites.map(|at| (at, tls_load_inline(offset)))) }
}

/// Writes each `(address, code)` into the stubs, the agent's text made writable for it.
///
/// # Safety
/// Each address holds whole instructions of the stubs, at least `N` bytes of them, that no
/// thread runs or can start to run meanwhile (start-up, before anything is hooked).
unsafe fn write_stub_code<const N: usize, const K: usize>(writes: [(u64, [u8; N]); K]) -> Result<(), String> {
    let lo = writes.iter().map(|w| w.0).fold(u64::MAX, u64::min);
    let hi = writes.iter().map(|w| w.0).fold(0, u64::max) + N as u64;
    use crate::hook::{set_prot, PROT_EXEC, PROT_READ, PROT_WRITE};
    set_prot(lo, (hi - lo) as usize, PROT_READ | PROT_WRITE | PROT_EXEC).map_err(|e| format!("cannot make the stubs writable: {e}"))?;
    for (at, code) in writes {
        // SAFETY: the pages were made writable above; the caller vouches for the bytes.
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, N) };
    }
    // The agent's text is read and execute; if this fails the code is only left writable.
    let _ = set_prot(lo, (hi - lo) as usize, PROT_READ | PROT_EXEC);
    Ok(())
}

/// The first instruction of each `--min-duration` check: `mov rsi, rax`.
const MIN_CHECK_START: [u8; 3] = [0x48, 0x89, 0xc6];

/// What [`skip_min_ticks`] writes over [`MIN_CHECK_START`]: `jmp rel8` by `d` bytes, then a
/// nop, so that the code still decodes one instruction after the other.
fn min_check_skip(d: u8) -> [u8; 3] {
    [0xeb, d, 0x90]
}

/// Without `--min-duration`, makes each exit stub jump over its check of the call's duration
/// against [`MIN_TICKS`] (a load, a subtraction, a compare with a second load and a branch):
/// every instruction between two time stamps is on the way to the second (see
/// [`specialise_tls`]), and these took 0.35 ns a call of fib in the program (18.77 against
/// 19.15 ns, cheaper in 10 rounds of 11 of `bench/ab.py`). The jump and a nop are written
/// over the check's first instruction; the rest stays, never run, as [`place_copy`] expects
/// it. Called again, it finds the jumps in place and does nothing.
///
/// Called once at start-up, before any function is hooked (no thread runs a stub yet) and
/// before any copy of the stubs is placed. If the code cannot be made writable the checks
/// stay, which are as correct.
pub fn skip_min_ticks() -> Result<(), String> {
    // SAFETY: a table of four addresses in the agent's read-only data.
    let sites = unsafe { core::ptr::addr_of!(fnscope_min_sites).read() };
    let mut jumps = [(0u64, [0u8; 3]); 2];
    for (k, pair) in sites.chunks(2).enumerate() {
        let (at, to) = (pair[0], pair[1]);
        // SAFETY: `at` is a label in the agent's text, followed by the check's instructions.
        let code = unsafe { core::slice::from_raw_parts(at as *const u8, MIN_CHECK_START.len()) };
        let skip = to.checked_sub(at + 2).filter(|&d| to - at > MIN_CHECK_START.len() as u64 && d <= 127);
        match skip {
            Some(d) if code == MIN_CHECK_START => jumps[k] = (at, min_check_skip(d as u8)),
            Some(d) if code == min_check_skip(d as u8) => return Ok(()),
            _ => return Err(format!("unexpected code at the --min-duration check {at:#x}: {code:02x?}")),
        }
    }
    // SAFETY: each address starts the 3-byte instruction checked above, which no thread is
    // running (nothing is hooked yet): `jmp rel8` over the check lands on the instruction
    // after it.
    unsafe { write_stub_code(jumps) }
}

/// This thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: reads the calling thread's errno slot, nothing else.
    unsafe { fnscope_get_errno() }
}

/// Sets this thread's `errno` (an injection's `errno:`, or the program's value put back).
pub fn set_errno(e: i32) {
    // SAFETY: writes the calling thread's errno slot, nothing else.
    unsafe { fnscope_set_errno(e) }
}

/// Copies st0 into `out` (10 bytes) without popping it.
///
/// # Safety
/// `out` must be writable for 10 bytes.
pub unsafe fn read_st0(out: *mut u8) {
    // SAFETY: per the caller's guarantee; the x87 stack is left as it was.
    unsafe { fnscope_read_st0(out) }
}

/// Reads the time-stamp counter.
#[inline]
pub fn tsc() -> u64 {
    // SAFETY: `fnscope_rdtsc` only executes rdtsc; it touches no memory.
    unsafe { fnscope_rdtsc() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Register};

    /// Held by the tests that write into the stubs: each makes their pages writable, then
    /// read-only again, which faults another test's write in between (a test run with four
    /// threads crashed 12 times in 200). The agent does it once, before any thread runs.
    static PATCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn decode(code: &[u8]) -> Vec<Instruction> {
        Decoder::with_ip(64, code, 0x1000, DecoderOptions::NONE).into_iter().collect()
    }

    /// The bytes [`specialise_tls`] looks for and writes are the instructions they stand for:
    /// both forms load `rcx` with the thread's state word, in the same 11 bytes.
    #[test]
    fn tls_loads_are_the_instructions_they_stand_for() {
        let mut got = TLS_LOAD_GOT;
        got[3..7].copy_from_slice(&0x1234i32.to_le_bytes());
        let g = decode(&got);
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].code(), g[0].op0_register(), g[0].memory_base()), (Code::Mov_r64_rm64, Register::RCX, Register::RIP));
        assert_eq!(g[0].memory_displacement64(), 0x1000 + 7 + 0x1234);
        assert_eq!((g[1].code(), g[1].op0_register(), g[1].memory_base(), g[1].segment_prefix()), (Code::Mov_r64_rm64, Register::RCX, Register::RCX, Register::FS));
        let mut linked = TLS_LOAD_GOT;
        linked[..3].copy_from_slice(&TLS_LOAD_LINKED);
        linked[3..7].copy_from_slice(&(-0x70i32).to_le_bytes());
        let l = decode(&linked);
        assert_eq!((l[0].code(), l[0].op0_register(), l[0].immediate32to64()), (Code::Mov_rm64_imm32, Register::RCX, -0x70));
        assert_eq!(l[1], g[1]);
        for offset in [-0x60, -0x7fff_fff0, 0x10] {
            let i = decode(&tls_load_inline(offset));
            assert_eq!(i.len(), 2, "{offset:#x}");
            assert_eq!((i[0].code(), i[0].op0_register(), i[0].memory_base(), i[0].segment_prefix()), (Code::Mov_r64_rm64, Register::RCX, Register::None, Register::FS));
            assert_eq!(i[0].memory_displacement64(), offset as i64 as u64);
            assert_eq!(i[1].code(), Code::Nopw);
        }
    }

    /// In this test process too, the stubs' four loads become the inline form with this
    /// process's offset, and a second call finds them done.
    #[test]
    fn stubs_get_the_offset_written_in() {
        let _patching = PATCHING.lock().unwrap_or_else(|e| e.into_inner());
        specialise_tls().unwrap();
        specialise_tls().unwrap();
        // SAFETY: as in `specialise_tls`.
        let (offset, sites) = unsafe { (fnscope_tls_offset() as i64 as i32, core::ptr::addr_of!(fnscope_tls_sites).read()) };
        for at in sites {
            // SAFETY: as in `specialise_tls`.
            let code = unsafe { core::slice::from_raw_parts(at as *const u8, TLS_LOAD_GOT.len()) };
            assert_eq!(code, tls_load_inline(offset));
        }
    }

    /// A copy of the stubs placed far from the agent refers to nothing of the original: its
    /// branches stay inside it, and what it reads outside itself (the slow paths' functions,
    /// `fnscope_exit_args`, MIN_TICKS) it reads from its own words, which hold what the
    /// original reaches. Every other instruction is the original's.
    #[test]
    fn a_copy_of_the_stubs_reaches_what_the_original_reaches() {
        extern "C" {
            fn fnscope_entry_dead();
            fn fnscope_thread_init();
            fn fnscope_settle();
            fn fnscope_exit_mismatch();
        }
        let _patching = PATCHING.lock().unwrap_or_else(|e| e.into_inner());
        specialise_tls().unwrap();
        // As the agent sets up without --min-duration: the checks jumped over.
        skip_min_ticks().unwrap();
        skip_min_ticks().unwrap();
        // SAFETY: a table of four addresses in the agent's text.
        let min_sites = unsafe { core::ptr::addr_of!(fnscope_min_sites).read() };
        for pair in min_sites.chunks(2) {
            // SAFETY: the check's first instruction, 3 bytes of the agent's text.
            let code = unsafe { core::slice::from_raw_parts(pair[0] as *const u8, 3) };
            let first: Vec<Instruction> = Decoder::with_ip(64, code, pair[0], DecoderOptions::NONE).into_iter().collect();
            assert_eq!(first.iter().map(|i| i.code()).collect::<Vec<_>>(), [Code::Jmp_rel8_64, Code::Nopd]);
            assert_eq!(first[0].near_branch_target(), pair[1]);
        }
        let from = fnscope_entry as *const () as u64;
        let len = (fnscope_entry_end as *const () as u64 - from) as usize;
        let mut room = vec![0u8; COPY_ROOM];
        let to = room.as_mut_ptr() as u64;
        // SAFETY: COPY_ROOM writable bytes that nothing runs (the copy is only decoded).
        let entry = unsafe { place_copy(to) }.unwrap();
        assert_eq!(entry, to);
        // SAFETY: the stubs' own code.
        let orig: Vec<Instruction> = Decoder::with_ip(64, unsafe { core::slice::from_raw_parts(from as *const u8, len) }, from, DecoderOptions::NONE).into_iter().collect();
        let copy: Vec<Instruction> = Decoder::with_ip(64, &room[..len], to, DecoderOptions::NONE).into_iter().collect();
        assert_eq!(orig.len(), copy.len());
        let word = |a: u64| {
            assert!(a >= to + len as u64 && a + 8 <= to + COPY_ROOM as u64, "{a:#x} is not one of the copy's words");
            u64::from_le_bytes(room[(a - to) as usize..][..8].try_into().unwrap())
        };
        let funcs = [fnscope_entry_dead as *const () as u64, fnscope_thread_init as *const () as u64, fnscope_settle as *const () as u64, fnscope_exit_mismatch as *const () as u64];
        let mut redirected = Vec::new();
        for (o, c) in orig.iter().zip(&copy) {
            let at = o.ip() - from;
            assert_eq!(c.ip() - to, at);
            let inside = |a: u64, base: u64| (base..base + len as u64).contains(&a);
            if o.is_ip_rel_memory_operand() && !inside(o.ip_rel_memory_address(), from) || o.op0_kind() == iced_x86::OpKind::NearBranch64 && !inside(o.near_branch_target(), from) {
                let w = word(c.ip_rel_memory_address());
                match (o.code(), c.code()) {
                    (Code::Call_rel32_64, Code::Call_rm64) => assert!(funcs.contains(&w) && w == o.near_branch_target(), "+{at:#x}"),
                    (Code::Call_rm64, Code::Call_rm64) => assert!(funcs.contains(&w), "+{at:#x}"),
                    (Code::Lea_r64_m, Code::Mov_r64_rm64) => assert_eq!((w, c.op0_register()), (fnscope_exit_args as *const () as u64, o.op0_register())),
                    (Code::Cmp_r64_rm64, Code::Cmp_r64_rm64) => assert_eq!(o.ip_rel_memory_address(), MIN_TICKS.as_ptr() as u64, "+{at:#x}"),
                    other => panic!("+{at:#x}: {other:?} leaves the block"),
                }
                redirected.push(o.code());
                continue;
            }
            assert_eq!((o.code(), o.len()), (c.code(), c.len()), "+{at:#x}");
            if o.op0_kind() == iced_x86::OpKind::NearBranch64 {
                assert_eq!(c.near_branch_target() - to, o.near_branch_target() - from, "+{at:#x}");
            }
            if o.is_ip_rel_memory_operand() {
                assert_eq!(c.ip_rel_memory_address() - to, o.ip_rel_memory_address() - from, "+{at:#x}");
            }
        }
        // Four slow paths (two calls to one of them), the tail call's test, --min-duration.
        assert_eq!(redirected.len(), 7, "{redirected:?}");
        let exit = to + (fnscope_exit as *const () as u64 - from);
        assert!(is_exit(exit) && is_exit(fnscope_exit as *const () as u64) && is_exit(fnscope_exit_args as *const () as u64));
        assert!(!is_exit(to) && !is_exit(exit + 1));
    }
}
