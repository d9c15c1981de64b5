//! Layouts shared by the in-process agent and the recorder.
//!
//! This crate has no dependencies on purpose: the agent links it, and everything the agent
//! links runs inside the traced program.
//!
//! # The shared region
//! The recorder (`fnscope record`) creates a file on `/dev/shm` (or, when that file system has
//! no room for all of it, memory of its own, named by the recorder's `/proc/<pid>/fd/<fd>`
//! link) and passes its path in [`ENV_SHM`]. Every traced process maps it `MAP_SHARED`. It starts with one page holding a
//! [`RegionHeader`], followed by `nchunks` chunks of `chunk_size` bytes. A chunk is a
//! [`ChunkHeader`] followed by [`Record`]s.
//!
//! A thread owns one chunk at a time: it takes a `FREE` chunk with a compare-and-swap to
//! `OWNED`, fills it with records and, when it is full (or the thread ends), stores the record
//! count and sets it `FULL`. The recorder copies `FULL` chunks to the trace file and sets them
//! `FREE` again after zeroing them. When the traced processes are gone the recorder also
//! harvests chunks still `OWNED`: their records are read up to the first all-zero record,
//! which works because the agent writes a record's `id_depth` word (never zero) last.
#![no_std]

/// Path of the shared region: a file on `/dev/shm`, or a `/proc/<pid>/fd/<fd>` link to the
/// recorder's memory file.
pub const ENV_SHM: &str = "FNSCOPE_SHM";
/// Trace directory; the agent writes its image tables into `DIR/images/`.
pub const ENV_DIR: &str = "FNSCOPE_DIR";
/// Comma-separated substrings: shared libraries whose path contains one are hooked too.
pub const ENV_LIBS: &str = "FNSCOPE_LIBS";
/// Set to `1` by the recorder so that the agent reports what it does on stderr.
pub const ENV_VERBOSE: &str = "FNSCOPE_VERBOSE";
/// Set by the user: how the agent writes its jumps into a module's code. `in-place` writes
/// them page by page into the file's mapping; `copy` patches big modules in a copy that
/// replaces the mapping even where the kernel gives no huge pages; unset, the agent decides
/// (see ARCHITECTURE.md, "Patching").
pub const ENV_PATCH: &str = "FNSCOPE_PATCH";

/// Name prefix of the files of patched code the agent keeps in its analysis cache's folder
/// (its `code_cache`); the recorder keeps the newest few.
pub const CODE_CACHE_PREFIX: &str = "code-";

/// `RegionHeader::magic`.
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"FNSCSHM1");
/// Version of the shared-region layout; the agent refuses a region of another version.
pub const REGION_VERSION: u32 = 6;
/// Size of the region header; chunks start at this offset.
pub const REGION_HEADER_SIZE: usize = 4096;
/// Chunk size (header included) of a recording that writes a trace. The recorder's cost per
/// chunk (a zstd frame, a scan of the region, a hand-over) is spread over more calls than
/// with 64 KiB: with arguments recorded (four slots a call), 64 KiB chunks made the recorder
/// the bottleneck of fib-like programs.
pub const DEFAULT_CHUNK_SIZE: u32 = 1 << 18;
/// Chunks of a recording's shared buffer when the user does not size it (`--buffer-mb`): a
/// thread holds one from its first call until it fills it or ends, so this many threads can
/// be alive and making calls at once. The buffer is a sparse file: chunks never taken cost
/// address space only, and a thread's chunk only the pages it writes. With 1,024, a program
/// with 1,500 threads alive at once lost the calls of those that found none free.
pub const DEFAULT_CHUNKS: u32 = 4096;
/// Chunk size of a flight recording: its rings keep whole chunks, so smaller ones keep the
/// last moments of a thread at a finer grain (`--flight=64K` keeps one).
pub const FLIGHT_CHUNK_SIZE: u32 = 1 << 16;

/// First page of the shared region.
#[repr(C)]
pub struct RegionHeader {
    /// [`REGION_MAGIC`].
    pub magic: u64,
    /// [`REGION_VERSION`].
    pub version: u32,
    /// Bytes per chunk, header included; a multiple of 4096.
    pub chunk_size: u32,
    /// Number of chunks after the header page.
    pub nchunks: u32,
    /// Next image session id to hand out (each process image that loads the agent takes one).
    pub next_image_sid: u32,
    /// Records dropped because no chunk was free in time, summed over all threads.
    pub lost_records: u64,
    /// Shadow-stack slots ever claimed: slots at this index and above were never used, so
    /// an agent looking for slots of an earlier image of its process stops here, and so does
    /// the recorder looking for open calls of dead threads.
    pub slots_used: u32,
    /// Number of agent instances that initialised (for the summary).
    pub agents: u32,
    /// Process id of the recorder: an agent that finds it gone stops recording (and removes
    /// the region file) instead of waiting for chunks nobody will free.
    pub recorder_pid: u32,
    /// Chunks at and above this index were never taken: the recorder looks at the states of
    /// those below only (each page of the region it reads is a page the kernel allocates).
    /// Raised by an agent before it tries to take a chunk.
    pub chunks_used: u32,
    /// Returns that matched no shadow-stack entry and were resolved by taking the newest one
    /// (code that moves its own return address; see the agent's `fnscope_exit_mismatch`).
    pub unmatched_returns: u64,
    /// Number of shadow-stack slots after the chunks (see [`stack_slot_offset`]).
    pub stack_slots: u32,
    /// Flight recorder: snapshots asked for so far (by `fnscope snapshot`, or by the agent's
    /// handler of the trigger signal); incremented atomically, read by the recorder.
    pub snapshot_requests: u32,
    /// Flight recorder: snapshot requests the recorder has answered (written or refused).
    pub snapshots_answered: u32,
    /// Process images whose agent mapped the region and then gave up setting up (an image
    /// table it could not write: a full disk), so that they ran untraced.
    pub untraced_images: u32,
}

/// Bytes of one shadow-stack slot: a [`SlotHead`] and the thread's state in the first page,
/// then [`SHADOW_ENTRIES`] entries of 32 bytes.
///
/// Threads keep their shadow stacks here, in the shared region, so that the recorder can
/// close the calls of a process that died without closing them itself (SIGKILL, a crash):
/// they are recorded as cut off. A thread that finds no free slot uses private memory.
pub const STACK_SLOT_SIZE: usize = 4096 + SHADOW_ENTRIES * 32;
/// Shadow-stack entries per thread: calls nested deeper than this are not recorded.
pub const SHADOW_ENTRIES: usize = 1 << 16;
/// Slots a recorder makes by default: threads alive at once with recoverable shadow stacks.
pub const DEFAULT_STACK_SLOTS: u32 = 256;
/// Offset of the thread's state (the agent's `ThreadState`) in a slot.
pub const SLOT_STATE_OFFSET: usize = 128;
/// Offsets of the state fields the recorder reads: next free entry and first entry (both as
/// addresses in the agent's process), sequence number of the thread's next chunk.
pub const STATE_SS_TOP: usize = 0;
/// See [`STATE_SS_TOP`].
pub const STATE_SS_BASE: usize = 32;
/// See [`STATE_SS_TOP`].
pub const STATE_SEQ: usize = 64;

/// `SlotHead::state`: nobody uses the slot.
pub const SLOT_FREE: u32 = 0;
/// `SlotHead::state`: a thread of a live process owns it.
pub const SLOT_OWNED: u32 = 1;

/// First bytes of a shadow-stack slot.
#[repr(C)]
pub struct SlotHead {
    /// `SLOT_FREE` or `SLOT_OWNED`; accessed atomically.
    pub state: u32,
    /// Non-zero when the open calls were recorded already (thread or process end, exec):
    /// the recorder must not record them again.
    pub closed: u32,
    /// Image session id, process and thread of the owner.
    pub image_sid: u32,
    /// See `image_sid`.
    pub pid: u32,
    /// See `image_sid`.
    pub tid: u32,
}

/// Byte offset of shadow-stack slot `i` in a region of `nchunks` chunks.
pub const fn stack_slot_offset(chunk_size: u32, nchunks: u32, i: u32) -> usize {
    chunk_offset(chunk_size, nchunks) + i as usize * STACK_SLOT_SIZE
}

/// `ChunkHeader::state`: nobody uses the chunk; it is zeroed.
pub const CHUNK_FREE: u32 = 0;
/// `ChunkHeader::state`: a thread is filling the chunk.
pub const CHUNK_OWNED: u32 = 1;
/// `ChunkHeader::state`: the thread is done with the chunk; `nrec` is valid.
pub const CHUNK_FULL: u32 = 2;
/// `ChunkHeader::state`: the recorder took the chunk with a slot never written, which a
/// stub interrupted by a signal handler may still write: the chunk is never used again.
pub const CHUNK_RETIRED: u32 = 3;

/// Size of [`ChunkHeader`]; records start at this offset within a chunk.
pub const CHUNK_HEADER_SIZE: usize = 64;

/// Header of a chunk of records. All fields but `state` are written by the owning thread
/// before it publishes the chunk as `FULL` (release ordering on `state`).
#[repr(C)]
pub struct ChunkHeader {
    /// One of `CHUNK_FREE`, `CHUNK_OWNED`, `CHUNK_FULL`, `CHUNK_RETIRED`; accessed atomically.
    pub state: u32,
    /// Image session id of the writing process image (see `images/<sid>.txt`).
    pub image_sid: u32,
    /// Process id of the writer.
    pub pid: u32,
    /// Thread id (kernel tid) of the writer.
    pub tid: u32,
    /// Sequence number of this chunk within its thread's stream, from 0.
    pub seq: u64,
    /// Number of valid records, set when the chunk becomes `FULL`.
    pub nrec: u32,
    /// `CHUNK_FLAG_*` bits.
    pub flags: u32,
    /// Records this thread had to drop since its previous chunk.
    pub lost: u64,
    /// The thread's name (`comm`, NUL-padded) when it handed the chunk over: the name of a
    /// thread that ends before the recorder could read it from `/proc`.
    pub thread_name: [u8; 16],
    /// Padding up to [`CHUNK_HEADER_SIZE`].
    pub reserved: u64,
}

/// `ChunkHeader::flags`: the thread ended (this is its last chunk).
pub const CHUNK_FLAG_LAST: u32 = 1;
/// `ChunkHeader::flags`: the chunk was harvested from a writer that disappeared (killed,
/// exec'd): `nrec` was found by scanning.
pub const CHUNK_FLAG_ABANDONED: u32 = 2;

/// One call, written when it returns: entry and exit in one unit (technique B), 24 bytes.
///
/// Records of a thread are in the order the calls *returned* (post-order). `depth` is the
/// number of hooked calls of the same thread that were open when this one was entered, so a
/// thread's call tree is rebuilt from the sequence without any matching.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Time-stamp counter at entry.
    pub t_entry: u64,
    /// Time-stamp counter at exit.
    pub t_exit: u64,
    /// `function id + 1` in the low 32 bits (so never zero), then `depth | flags << 24` in the
    /// high 32 bits: see [`Record::id`], [`Record::depth`], [`Record::flags`].
    pub id_depth: u64,
}

/// Size of a [`Record`] in bytes.
pub const RECORD_SIZE: usize = 24;

/// `Record` flag: the call did not return normally; `t_exit` is when the agent noticed it
/// was gone (longjmp, exception, exit while the call was open).
pub const REC_FLAG_UNWOUND: u32 = 1;
/// `Record` flag (with `REC_FLAG_UNWOUND`): the process died with the call open (SIGKILL, a
/// crash); the recorder closed it when it found the process gone, at `t_exit`.
pub const REC_FLAG_CUT: u32 = 2;
/// `Record` flag: the call's data unit (arguments, return value, injection: see
/// [`data`]) is in the data slots just before the record.
pub const REC_FLAG_DATA: u32 = 4;

/// A call's *data unit*: its recorded arguments, return value and the injection made, if any.
///
/// In a chunk, the unit's words go into *data slots* just before the call's record (reserved
/// together with it, so nested calls of signal handlers never come between): each data slot is
/// a [`Record`]-sized triple `{word, word, tag}` whose tag has zero low 32 bits (no call
/// record does: `id + 1` is never 0) and, in its high 32 bits, the number of words in the unit.
/// The unit is `header` then `entry words` then `return words`.
pub mod data {
    /// Header: number of entry words (bits 0-15).
    pub const ENTRY_WORDS_MASK: u64 = 0xffff;
    /// Header: number of return words (bits 16-31).
    pub const RET_SHIFT: u32 = 16;
    /// Header: layout of the entry words (bits 32-39): [`LAYOUT_SPEC`] or [`LAYOUT_INT_REGS`].
    pub const LAYOUT_SHIFT: u32 = 32;
    /// Entry words follow the spec's items in order (`fnscope_symbols::argspec::Capture`).
    pub const LAYOUT_SPEC: u64 = 0;
    /// Entry words are the integer argument registers rdi, rsi, rdx, rcx, r8, r9 (as many as
    /// counted), which the spec's integer items index.
    pub const LAYOUT_INT_REGS: u64 = 1;
    /// Header: injection made on this call (bits 40-47): 0 none, [`INJECT_RETURN`] or
    /// [`INJECT_ARGUMENT`].
    pub const INJECT_SHIFT: u32 = 40;
    /// The function did not run: the rule's value was returned instead.
    pub const INJECT_RETURN: u64 = 1;
    /// An argument was changed before the function ran.
    pub const INJECT_ARGUMENT: u64 = 2;
    /// Header: index of the injection rule (bits 48-63).
    pub const RULE_SHIFT: u32 = 48;
    /// Most words in a unit (the agent's frame size): readers refuse longer ones as damage.
    pub const MAX_WORDS: usize = 64;

    /// Builds a header.
    pub const fn header(entry_words: u64, ret_words: u64, layout: u64, inject: u64, rule: u64) -> u64 {
        entry_words | ret_words << RET_SHIFT | layout << LAYOUT_SHIFT | inject << INJECT_SHIFT | rule << RULE_SHIFT
    }

    /// Whether a slot's third word marks a data slot.
    pub const fn is_data_tag(tag: u64) -> bool {
        tag as u32 == 0 && tag != 0
    }

    /// The tag of the data slots of a unit of `words` words (its header among them).
    pub const fn tag(words: u64) -> u64 {
        words << 32
    }

    /// Tag bit: the unit's header is not in the slots but implied by the tag (layout
    /// [`LAYOUT_INT_REGS`], no injection), with its entry words in bits 40-47 and return words
    /// in bits 48-55. The exit stub's fast path writes such units: one word less per call
    /// (a slot less when it makes the count even).
    pub const TAG_IMPLIED_HEADER: u64 = 1 << 63;

    /// Words in the slots of the unit a tag belongs to (the implied header not counted).
    pub const fn tag_words(tag: u64) -> usize {
        ((tag >> 32) & 0xff) as usize
    }

    /// The header a tag implies, if it does ([`TAG_IMPLIED_HEADER`]).
    pub const fn implied_header(tag: u64) -> Option<u64> {
        if tag & TAG_IMPLIED_HEADER == 0 {
            return None;
        }
        Some(header((tag >> 40) & 0xff, (tag >> 48) & 0xff, LAYOUT_INT_REGS, 0, 0))
    }
}

impl Record {
    /// Builds a record.
    pub fn new(t_entry: u64, t_exit: u64, id: u32, depth: u32, flags: u32) -> Record {
        let hi = (depth & 0x00ff_ffff) | (flags << 24);
        Record { t_entry, t_exit, id_depth: (id as u64 + 1) | ((hi as u64) << 32) }
    }
    /// Whether the slot holds a record (the marker word is written last).
    pub fn is_present(&self) -> bool {
        self.id_depth != 0
    }
    /// Function id: index into the image's function table.
    pub fn id(&self) -> u32 {
        (self.id_depth as u32).wrapping_sub(1)
    }
    /// Nesting depth within the thread (0 = outermost hooked call).
    pub fn depth(&self) -> u32 {
        ((self.id_depth >> 32) as u32) & 0x00ff_ffff
    }
    /// `REC_FLAG_*` bits.
    pub fn flags(&self) -> u32 {
        ((self.id_depth >> 32) as u32) >> 24
    }
    /// Duration in TSC ticks.
    pub fn ticks(&self) -> u64 {
        self.t_exit.wrapping_sub(self.t_entry)
    }
}

/// Byte offset of chunk `i` in the region.
pub const fn chunk_offset(chunk_size: u32, i: u32) -> usize {
    REGION_HEADER_SIZE + i as usize * chunk_size as usize
}

/// Records that fit in a chunk.
pub const fn records_per_chunk(chunk_size: u32) -> usize {
    (chunk_size as usize - CHUNK_HEADER_SIZE) / RECORD_SIZE
}

/// Total size of a region.
pub const fn region_size(chunk_size: u32, nchunks: u32, stack_slots: u32) -> usize {
    stack_slot_offset(chunk_size, nchunks, stack_slots)
}

/// Image tables: `DIR/images/<sid>.txt`, written by the agent once per process image.
///
/// A UTF-8 text file, one item per line, fields separated by a tab:
/// ```text
/// fnscope-image<TAB>1
/// pid<TAB><pid>
/// exe<TAB><path of the executable>
/// arg<TAB><one argument of the command line>           (one line per argument)
/// module<TAB><midx><TAB><load bias hex><TAB><build-id hex or -><TAB><path>
/// func<TAB><id><TAB><midx><TAB><address hex><TAB><size><TAB><raw name>
/// skip<TAB><midx><TAB><address hex><TAB><size><TAB><reason code><TAB><detail><TAB><raw name>
/// unhooked<TAB><id><TAB><reason>
/// system<TAB><path>                                       (--app-only: a module not hooked)
/// ```
/// `address` is the link-time virtual address in the module's ELF file (add the load bias for
/// the run-time address). `func` lines list hooked functions; `id` is what records carry.
/// `skip` lines list functions that were not hooked, with one of the [`skip_reason`] codes.
/// The table is written before any function is patched, so that every id a record can carry
/// is named; `unhooked` lines, appended afterwards, list `func` entries whose jump could not
/// be written after all (their calls are missing from the trace). `system` lines name modules
/// that `--app-only` treated as system code and left alone.
pub mod image {
    /// First line's keyword.
    pub const MAGIC: &str = "fnscope-image";
    /// Version written in the first line.
    pub const VERSION: u32 = 1;
}

/// Reason codes of `skip` lines, stable strings that `info` groups by.
pub mod skip_reason {
    /// The function is smaller than the 5-byte jump.
    pub const TOO_SHORT: &str = "too-short";
    /// An instruction in the bytes to overwrite cannot be moved (detail says which).
    pub const UNRELOCATABLE: &str = "unrelocatable";
    /// A branch elsewhere lands inside the bytes to overwrite (detail: from where).
    pub const BRANCH_INTO_PATCH: &str = "branch-into-patch";
    /// A call inside the bytes to overwrite: its return address would point into the
    /// trampoline, where no unwinder could follow.
    pub const CALL_IN_PATCH: &str = "call-in-patch";
    /// Not a function entry: the top of the stack is not a return address there (a `.cold`
    /// part, `_start`, …).
    pub const NOT_ENTRY: &str = "not-entry";
    /// Known not to tolerate a hook: returns twice, switches stacks, is copied elsewhere at run
    /// time (V8's embedded builtins), …
    pub const DENYLIST: &str = "denylist";
    /// The function reads, overwrites, pops or takes the address of its own return-address
    /// slot (hand-written assembly that returns from another stack pointer, code using
    /// `__builtin_return_address(0)`): a hook that replaces the return address would change
    /// what it does. Timing mode only; count mode leaves the return address alone.
    pub const READS_RETURN_ADDRESS: &str = "reads-return-address";
    /// The bytes could not be decoded as instructions.
    pub const UNDECODABLE: &str = "undecodable";
    /// No trampoline memory within ±2 GiB of the function.
    pub const NO_TRAMPOLINE: &str = "no-trampoline";
    /// The function is in a section that is not executable code (or overlaps another one).
    pub const NOT_CODE: &str = "not-code";
    /// Chosen for hooking, but its jump could not be written (the code could not be made
    /// writable): an `unhooked` line of the image table.
    pub const PATCH_FAILED: &str = "patch-failed";
    /// Timing mode only: the module has call frame information but not for this code, which
    /// was generated or written by hand (V8's builtins, for one). Its runtime may walk such
    /// frames itself and fail on a return address changed to fnscope's exit stub; count mode
    /// hooks it.
    pub const NO_CFI: &str = "no-cfi";
    /// Timing mode only: the module belongs to a runtime that walks its own native stacks
    /// (HotSpot's `libjvm.so`) and crashes on a return address changed to fnscope's exit
    /// stub; count mode hooks it.
    pub const STACK_WALKER: &str = "stack-walker";
    /// Left out by the record-time filters (`--filter`, `--exclude`).
    pub const FILTERED: &str = "filtered";
}

/// Record-time filters: function patterns, one per line; only functions matching one are
/// hooked. A pattern is a glob on the raw or demangled name, `@GLOB` on the module's file name,
/// or `file:GLOB` on the function's source file (from DWARF, where the module has it).
pub const ENV_FILTER: &str = "FNSCOPE_FILTER";
/// Record-time filters: function patterns (as [`ENV_FILTER`]) of functions not to hook.
pub const ENV_EXCLUDE: &str = "FNSCOPE_EXCLUDE";
/// Set to `1` for `--app-only`: modules under the system folders are not hooked.
pub const ENV_APP_ONLY: &str = "FNSCOPE_APP_ONLY";
/// The system folders of `--app-only`, separated by `:`.
pub const ENV_SYSTEM_DIRS: &str = "FNSCOPE_SYSTEM_DIRS";
/// `--depth N`: only the N outermost hooked levels of each thread are recorded.
pub const ENV_DEPTH: &str = "FNSCOPE_DEPTH";
/// `--min-duration`: calls shorter than this many time-stamp-counter ticks are not recorded.
pub const ENV_MIN_TICKS: &str = "FNSCOPE_MIN_TICKS";
/// Flight recorder's signal trigger: the agent asks for a snapshot when the process gets this
/// signal number (only if the program has not set a disposition of its own for it).
pub const ENV_TRIGGER_SIGNAL: &str = "FNSCOPE_TRIGGER_SIGNAL";
/// Arguments, return values and injections to record (`record -A`, `-R`, `--args auto`,
/// `--inject`): lines `A<TAB>PATTERN<TAB>SPEC`, `R<TAB>PATTERN<TAB>SPEC`, `I<TAB>RULE`, `AUTO`.
pub const ENV_ARGS: &str = "FNSCOPE_ARGS";

/// Folder for the agent's cache of module analyses (absent: no cache).
pub const ENV_CACHE: &str = "FNSCOPE_CACHE";

/// Selects count mode when set to `count` (the default is timing).
pub const ENV_MODE: &str = "FNSCOPE_MODE";
/// Set to `1` when the programs the traced one runs with `exec` must not be traced: the
/// agent then removes itself from the environment they inherit.
pub const ENV_NO_FOLLOW: &str = "FNSCOPE_NO_FOLLOW";

/// Count mode: `DIR/counts/<sid>.bin`, one file per process image, mapped `MAP_SHARED` by
/// the agent so that the counts survive the program being killed.
///
/// A [`counts::CountsHeader`] page, then `nblocks` blocks of `block_size` bytes: a
/// [`counts::BlockHeader`] and `capacity` u64 counters, one per function id. Each live thread
/// owns a block and increments its counters without atomics (no cache line is shared between
/// threads); when a thread ends its counts are added atomically into block 0, which holds the
/// threads that have ended, and its block is freed for reuse.
pub mod counts {
    /// `CountsHeader::magic`.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"FNSCCNT1");
    /// Size of the header; block 0 starts here.
    pub const HEADER_SIZE: usize = 4096;
    /// Size of a block header; counters follow it.
    pub const BLOCK_HEADER_SIZE: usize = 64;
    /// `BlockHeader::state`: unused.
    pub const BLOCK_FREE: u32 = 0;
    /// `BlockHeader::state`: owned by a live thread.
    pub const BLOCK_LIVE: u32 = 1;
    /// `BlockHeader::state`: the sum of ended threads (block 0).
    pub const BLOCK_ENDED: u32 = 2;

    /// First page of a counts file.
    #[repr(C)]
    pub struct CountsHeader {
        /// [`MAGIC`].
        pub magic: u64,
        /// Counters per block: function ids `0..capacity` can be counted.
        pub capacity: u32,
        /// Number of blocks.
        pub nblocks: u32,
        /// Bytes per block, header included.
        pub block_size: u32,
        /// Function ids in use (grows when libraries are loaded with `dlopen`).
        pub nfuncs: u32,
        /// Threads that found no free block; their calls were not counted.
        pub threads_lost: u32,
        /// One past the highest block ever taken: readers need not look further (the rest
        /// of the file is a hole, and reading it would only make zero pages).
        pub blocks_used: u32,
    }

    /// Header of one block.
    #[repr(C)]
    pub struct BlockHeader {
        /// `BLOCK_FREE`, `BLOCK_LIVE` or `BLOCK_ENDED`; accessed atomically.
        pub state: u32,
        /// Process id of the owner.
        pub pid: u32,
        /// Thread id of the owner (0 in block 0).
        pub tid: u32,
    }

    /// Byte offset of block `i`.
    pub const fn block_offset(block_size: u32, i: u32) -> usize {
        HEADER_SIZE + i as usize * block_size as usize
    }
}
