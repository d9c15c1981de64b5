use super::*;
use fnscope_abi::{records_per_chunk, DEFAULT_CHUNK_SIZE};
use std::time::Instant;

/// A small xorshift generator: tests must be reproducible without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn ticks(&mut self) -> u64 {
        20 + self.next() % 41
    }
}

/// Records of a recursive fib(n) in post-order, with 20..60 ticks between events.
fn fib_records(n: u32, clock: &mut u64, rng: &mut Rng, depth: u32, out: &mut Vec<Record>) {
    *clock += rng.ticks();
    let t_entry = *clock;
    if n >= 2 {
        fib_records(n - 1, clock, rng, depth + 1, out);
        fib_records(n - 2, clock, rng, depth + 1, out);
    }
    *clock += rng.ticks();
    out.push(Record::new(t_entry, *clock, 0, depth, 0));
}

/// A fresh folder for one test's files.
pub(crate) fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fnscope-format-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const IMAGE: &str = "fnscope-image\t1\npid\t7\nexe\t/bin/fib\narg\tfib\n\
module\t0\t0\t-\t/bin/fib\nfunc\t0\t0\t1000\t40\tfib\n";

fn sample_meta() -> Meta {
    Meta {
        command: vec!["fib".into(), "30".into()],
        cwd: "/tmp".into(),
        start_unix_ns: 1_700_000_000_000_000_000,
        tsc_at_start: 1000,
        host: "box".into(),
        fnscope_version: "0.1.0".into(),
        mode: "time".into(),
        flight: false,
    }
}

fn sample_end() -> EndInfo {
    EndInfo {
        ticks_per_ns: 2.5,
        exit_status: Some(0),
        processes: vec![7],
        ..EndInfo::default()
    }
}

/// Writes a small complete trace and returns its path and the segments written.
fn write_sample(dir: &Path) -> (PathBuf, Vec<ThreadSegment>) {
    write_sample_as(dir, FORMAT_VERSION)
}

/// [`write_sample`] in format `version`, as that version's writer wrote it.
fn write_sample_as(dir: &Path, version: u32) -> (PathBuf, Vec<ThreadSegment>) {
    let path = dir.join(TRACE_FILE);
    let mut w = TraceWriter::create_as(&path, version).unwrap();
    w.write_meta(&sample_meta()).unwrap();
    w.write_image(0, IMAGE).unwrap();
    let mut rng = Rng(99);
    let mut segs = Vec::new();
    for (seq, n) in [8u32, 5, 10].into_iter().enumerate() {
        let mut clock = 5000 * (seq as u64 + 1);
        let mut recs = Vec::new();
        fib_records(n, &mut clock, &mut rng, 0, &mut recs);
        // The middle segment's calls carry data units (arguments, return values) every third.
        let mut data = CallData::default();
        if seq == 1 {
            for (k, r) in recs.iter_mut().enumerate().filter(|(k, _)| k % 3 == 0) {
                r.id_depth |= u64::from(fnscope_abi::REC_FLAG_DATA) << 56;
                data.push(k as u32, &[fnscope_abi::data::header(1, 1, 0, 0, 0), k as u64, u64::MAX - k as u64]);
            }
        }
        let seg = ThreadSegment {
            image_sid: 0,
            pid: 7,
            tid: 7 + seq as u32 % 2,
            seq: seq as u64,
            lost: seq as u64,
            flags: if seq == 2 {
                fnscope_abi::CHUNK_FLAG_LAST
            } else {
                0
            },
            records: recs,
            data,
        };
        w.write_segment(
            seg.image_sid,
            seg.pid,
            seg.tid,
            seg.seq,
            seg.lost,
            seg.flags,
            &seg.records, &seg.data)
        .unwrap();
        segs.push(seg);
    }
    w.write_end(&sample_end()).unwrap();
    w.flush().unwrap();
    assert_eq!(w.bytes_written(), std::fs::metadata(&path).unwrap().len());
    (path, segs)
}

fn read_all(path: &Path) -> Result<(Vec<Chunk>, bool), FormatError> {
    let mut r = TraceReader::open(path)?;
    let mut v = Vec::new();
    while let Some(c) = r.next_chunk()? {
        v.push(c);
    }
    Ok((v, r.truncated()))
}

#[test]
fn round_trip() {
    let dir = tmpdir("rt");
    let (_, segs) = write_sample(&dir);
    let (chunks, truncated) = read_all(&dir).unwrap();
    assert!(!truncated);
    assert_eq!(chunks.len(), 6);
    assert_eq!(chunks[0], Chunk::Meta(sample_meta()));
    match &chunks[1] {
        Chunk::Image { sid: 0, table } => assert_eq!(table.funcs[0].raw_name, "fib"),
        c => panic!("unexpected {c:?}"),
    }
    for (c, s) in chunks[2..5].iter().zip(&segs) {
        assert_eq!(c, &Chunk::Events(s.clone()));
    }
    assert!(!segs[1].data.is_empty());
    assert_eq!(chunks[5], Chunk::End(sample_end()));
}

#[test]
fn skip_events_pass() {
    let dir = tmpdir("skip");
    write_sample(&dir);
    let mut r = TraceReader::open(&dir).unwrap();
    r.set_skip_events(true);
    let mut kinds = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        kinds.push(std::mem::discriminant(&c));
    }
    assert_eq!(kinds.len(), 3);
    assert!(!r.truncated());
}

#[test]
fn truncated_file_yields_complete_chunks() {
    let dir = tmpdir("trunc");
    let (path, _) = write_sample(&dir);
    let full = std::fs::read(&path).unwrap();
    // Without END: truncated although every chunk is whole.
    let (all, _) = read_all(&path).unwrap();
    let end_len = {
        let mut p = Vec::new();
        serde_json::to_writer(&mut p, &sample_end()).unwrap();
        p.len() + CHUNK_HEADER_SIZE as usize
    };
    std::fs::write(&path, &full[..full.len() - end_len]).unwrap();
    let (chunks, truncated) = read_all(&path).unwrap();
    assert!(truncated);
    assert_eq!(chunks.len(), all.len() - 1);
    // Cut inside the last EVENTS chunk.
    std::fs::write(&path, &full[..full.len() - end_len - 5]).unwrap();
    let (chunks, truncated) = read_all(&path).unwrap();
    assert!(truncated);
    assert_eq!(chunks.len(), all.len() - 2);
    // Cut inside a chunk header.
    std::fs::write(&path, &full[..FILE_HEADER_SIZE as usize + 5]).unwrap();
    let (chunks, truncated) = read_all(&path).unwrap();
    assert!(truncated && chunks.is_empty());
}

/// A trace whose writing failed inside a chunk (a full disk) is cut after its last whole
/// chunk and ended: every whole chunk reads as written, the END chunk says what is missing,
/// and the file is no longer truncated. Cut at a chunk boundary, nothing is lost.
#[test]
fn torn_trace_is_cut_and_ended() {
    let dir = tmpdir("torn");
    let (path, _) = write_sample(&dir);
    let (all, _) = read_all(&path).unwrap();
    let full = std::fs::read(&path).unwrap();
    let offsets = chunk_offsets(&full);
    let (last_events, end_at) = (offsets[offsets.len() - 2], offsets[offsets.len() - 1]);
    let end = EndInfo { write_error: Some("No space left on device".into()), unwritten_calls: 12, ..sample_end() };
    for (cut, whole_chunks) in [(last_events + 20, all.len() - 2), (end_at, all.len() - 1)] {
        std::fs::write(&path, &full[..cut]).unwrap();
        let kept = if cut == end_at { end_at } else { last_events };
        let len = end_torn_trace(&path, |at| {
            assert_eq!(at as usize, kept, "cut at {cut}");
            end.clone()
        })
        .unwrap();
        assert_eq!(len, std::fs::metadata(&path).unwrap().len());
        let (chunks, truncated) = read_all(&path).unwrap();
        assert!(!truncated, "cut at {cut}");
        assert_eq!(&chunks[..whole_chunks], &all[..whole_chunks], "cut at {cut}");
        assert_eq!(chunks.len(), whole_chunks + 1, "cut at {cut}");
        assert!(matches!(&chunks[whole_chunks], Chunk::End(e) if *e == end), "cut at {cut}");
    }
}

#[test]
fn refuses_other_files_and_versions() {
    let dir = tmpdir("refuse");
    let (path, _) = write_sample(&dir);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let e = TraceReader::open(&path).err().unwrap().to_string();
    assert_eq!(
        e,
        format!("trace format version {} is newer than this fnscope (supports {FORMAT_VERSION}): upgrade fnscope", FORMAT_VERSION + 1)
    );
    std::fs::write(&path, b"hello world, not a trace").unwrap();
    let e = TraceReader::open(&path).err().unwrap().to_string();
    assert!(e.contains("is not an fnscope trace"), "{e}");
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        TraceReader::open(&path),
        Err(FormatError::NotATrace { .. })
    ));
    let e = TraceReader::open(&dir.join("missing"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("no trace at") && e.contains("fnscope record"), "{e}");
}

#[test]
fn bad_checksum_names_offset() {
    let dir = tmpdir("crc");
    let (path, _) = write_sample(&dir);
    let mut bytes = std::fs::read(&path).unwrap();
    // First byte of the META payload.
    bytes[FILE_HEADER_SIZE as usize + CHUNK_HEADER_SIZE as usize] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let e = read_all(&path).err().unwrap().to_string();
    assert!(
        e.contains("damaged at byte offset 16: checksum mismatch"),
        "{e}"
    );
}

/// Offsets of the chunk headers of a trace file.
pub(crate) fn chunk_offsets(file: &[u8]) -> Vec<usize> {
    let mut at = FILE_HEADER_SIZE as usize;
    let mut v = Vec::new();
    while at + CHUNK_HEADER_SIZE as usize <= file.len() {
        v.push(at);
        at += CHUNK_HEADER_SIZE as usize + le32(file, at + 4) as usize;
    }
    v
}

/// A changed kind or length is damage, like a changed payload: otherwise a chunk could turn
/// into an unknown (skipped) kind and its records vanish unnoticed.
#[test]
fn checksum_covers_kind_and_length() {
    let dir = tmpdir("kindflip");
    let (path, _) = write_sample(&dir);
    let good = std::fs::read(&path).unwrap();
    for at in chunk_offsets(&good) {
        for (byte, what) in [(0, "kind"), (4, "length")] {
            let mut b = good.clone();
            b[at + byte] ^= if byte == 0 { 0x40 } else { 0x01 };
            std::fs::write(&path, &b).unwrap();
            match read_all(&path) {
                Err(e) => assert!(e.to_string().contains(&format!("damaged at byte offset {at}")), "{what} at {at}: {e}"),
                Ok((_, truncated)) => assert!(truncated && byte == 4, "{what} flipped at {at} went unnoticed"),
            }
        }
    }
}

/// Files of versions 2 and 3 store a leaf's exit after the previous exit (version 4: its
/// entry after it, then its duration); each version's files read back the calls written.
#[test]
fn each_version_reads_its_own_timing() {
    let dir = tmpdir("timing");
    let (path, segs) = write_sample(&dir);
    assert_eq!(events_of(read_all(&path).unwrap().0), segs);
    let new = std::fs::read(&path).unwrap();
    for version in [2, 3] {
        let (old, _) = write_sample_as(&tmpdir(&format!("timing-v{version}")), version);
        assert_eq!(events_of(read_all(&old).unwrap().0), segs, "version {version}");
        // Same calls, other bytes: a file read as the wrong version would be misread.
        let mut relabelled = new.clone();
        relabelled[8..12].copy_from_slice(&version.to_le_bytes());
        std::fs::write(&old, &relabelled).unwrap();
        assert!(read_all(&old).map_or(true, |(c, _)| events_of(c) != segs), "version {version}");
    }
}

/// The thread segments among `chunks`.
fn events_of(chunks: Vec<Chunk>) -> Vec<ThreadSegment> {
    chunks.into_iter().filter_map(|c| match c { Chunk::Events(s) => Some(s), _ => None }).collect()
}

/// Offset and zstd frames (the bytes after the segment header) of each EVENTS chunk of `file`.
fn events_frames(file: &[u8]) -> Vec<(usize, Vec<&[u8]>)> {
    let events = chunk_offsets(file).into_iter().filter(|&at| le32(file, at) == KIND_EVENTS);
    events
        .map(|at| {
            let body = at + CHUNK_HEADER_SIZE as usize;
            let mut rest = &file[body + EVENTS_HEADER_SIZE..body + le32(file, at + 4) as usize];
            let mut frames = Vec::new();
            while !rest.is_empty() {
                let n = zstd::zstd_safe::find_frame_compressed_size(rest).unwrap();
                frames.push(&rest[..n]);
                rest = &rest[n..];
            }
            (at, frames)
        })
        .collect()
}

/// From version 6 an EVENTS chunk holds two zstd frames: the column lengths, shape and ids,
/// then the time columns. Version 5 holds the same bytes in one frame. Both read back the
/// calls written.
#[test]
fn time_columns_have_a_frame_of_their_own_from_version_6() {
    let unzstd = |frame: &[u8]| zstd::bulk::decompress(frame, 1 << 20).unwrap();
    let (v6, segs) = write_sample_as(&tmpdir("frames-v6"), 6);
    let (v5, _) = write_sample_as(&tmpdir("frames-v5"), 5);
    let (six, five) = (std::fs::read(&v6).unwrap(), std::fs::read(&v5).unwrap());
    let (six, five) = (events_frames(&six), events_frames(&five));
    assert_eq!((six.len(), five.len()), (segs.len(), segs.len()));
    for ((_, six), (_, five)) in six.iter().zip(&five) {
        assert_eq!((six.len(), five.len()), (2, 1));
        let (head, times, all) = (unzstd(six[0]), unzstd(six[1]), unzstd(five[0]));
        assert_eq!([&head[..], &times[..]].concat(), all);
        let mut at = 0;
        let lens: Vec<usize> = (0..3).map(|_| events::get_varint(&head, &mut at).unwrap() as usize).collect();
        assert_eq!(head.len(), at + lens[0] + lens[1], "the first frame ends where the exits start");
    }
    // Version 7: the same two frames, the second holding the six time streams.
    let (v7, _) = write_sample_as(&tmpdir("frames-v7"), 7);
    for (_, seven) in events_frames(&std::fs::read(&v7).unwrap()) {
        assert_eq!(seven.len(), 2);
        let (head, times) = (unzstd(seven[0]), unzstd(seven[1]));
        let mut at = 0;
        let lens: Vec<usize> = (0..7).map(|_| events::get_varint(&head, &mut at).unwrap() as usize).collect();
        assert_eq!(head.len(), at + lens[0] + lens[1], "the first frame ends where the time streams start");
        assert!(lens[2..].iter().sum::<usize>() <= times.len());
    }
    for path in [&v5, &v6, &v7] {
        assert_eq!(events_of(read_all(path).unwrap().0), segs, "{}", path.display());
    }
}

/// A version 6 EVENTS chunk whose frames are damaged (with a checksum that matches) is
/// reported as such; frames that are valid but written otherwise (no content size, a
/// skippable frame between) read as any valid frames do.
#[test]
fn damaged_time_frames_are_reported() {
    let dir = tmpdir("frames-damaged");
    let (path, segs) = write_sample_as(&dir, 6);
    let file = std::fs::read(&path).unwrap();
    let (at, frames) = events_frames(&file)[0].clone();
    let (head, times) = (frames[0], frames[1]);
    let payload_at = at + CHUNK_HEADER_SIZE as usize;
    let end = payload_at + le32(&file, at + 4) as usize;
    let try_frames = |frames: &[&[u8]]| {
        let mut payload = file[payload_at..payload_at + EVENTS_HEADER_SIZE].to_vec();
        frames.iter().for_each(|f| payload.extend_from_slice(f));
        let mut damaged = file[..at].to_vec();
        damaged.extend_from_slice(&chunk_head(KIND_EVENTS, payload.len() as u32, &[&payload]));
        damaged.extend_from_slice(&payload);
        damaged.extend_from_slice(&file[end..]);
        std::fs::write(&path, damaged).unwrap();
        read_all(&path).map(|(chunks, _)| events_of(chunks))
    };
    let no_size = {
        let mut c = zstd::bulk::Compressor::new(1).unwrap();
        c.include_contentsize(false).unwrap();
        c.compress(&zstd::bulk::decompress(times, 1 << 20).unwrap()).unwrap()
    };
    assert!(matches!(zstd::zstd_safe::get_frame_content_size(&no_size), Ok(None)));
    let skippable = [0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3];
    assert_eq!(try_frames(&[head, &no_size]).unwrap(), segs);
    assert_eq!(try_frames(&[head, &skippable, times]).unwrap(), segs);
    for (frames, what) in [
        (vec![head, &times[..times.len() - 1]], "a cut time frame"),
        (vec![head], "no time frame"),
        (vec![head, times, b"garbage"], "bytes after the frames"),
        (vec![head, times, times], "a time frame twice"),
    ] {
        let e = try_frames(&frames).unwrap_err().to_string();
        assert!(e.contains(&format!("damaged at byte offset {at}:")), "{what}: {e}");
    }
}

/// Versions this crate cannot write, and RAW chunks in a version without them, are refused.
#[test]
fn writers_of_older_versions_write_only_what_those_read() {
    use std::error::Error;
    let why = |e: FormatError| format!("{e}: {}", e.source().map(|s| s.to_string()).unwrap_or_default());
    let dir = tmpdir("create_as");
    for version in [0, 1, FORMAT_VERSION + 1] {
        let e = why(TraceWriter::create_as(&dir.join("t.fns"), version).err().unwrap());
        assert!(e.contains(&format!("not {version}")), "{e}");
    }
    let mut w = TraceWriter::create_as(&dir.join("v2.fns"), 2).unwrap();
    let e = why(w.write_raw_segment(0, 7, 8, 0, 0, 0, &raw_chunks()[0]).unwrap_err());
    assert!(e.contains("RAW chunks need format version 3"), "{e}");
}

/// A version 3 or 5 file's RAW chunks compact into EVENTS chunks of that version (version 5:
/// one zstd frame each, where version 6 has two).
#[test]
fn compacting_keeps_the_version() {
    for version in [3, 5] {
        let dir = tmpdir(&format!("compactv{version}"));
        let (plain, mixed) = (dir.join("plain.fns"), dir.join("mixed.fns"));
        write_chunks_as(&plain, version, |_| false);
        write_chunks_as(&mixed, version, |seq| seq != 2);
        compact(&mixed, |_, _| {}).unwrap();
        assert_eq!(version_of(&mixed), version);
        assert_eq!(std::fs::read(&mixed).unwrap(), std::fs::read(&plain).unwrap(), "version {version}");
    }
}

/// Version 1 files, whose checksums cover the payload only, are still read.
#[test]
fn version_1_files_are_read() {
    let dir = tmpdir("v1");
    let (path, _) = write_sample_as(&dir, 2);
    let (want, _) = read_all(&path).unwrap();
    let mut b = std::fs::read(&path).unwrap();
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    for at in chunk_offsets(&b.clone()) {
        let len = le32(&b, at + 4) as usize;
        let body = at + CHUNK_HEADER_SIZE as usize;
        let crc = crc32fast::hash(&b[body..body + len]);
        b[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(&path, &b).unwrap();
    let (got, truncated) = read_all(&path).unwrap();
    assert!(!truncated);
    assert_eq!(got, want);
    // A version 2 checksum in a version 1 file is a mismatch: the version decides.
    b[8..12].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    assert!(read_all(&path).is_err());
}

#[test]
fn unknown_chunk_kinds_are_skipped() {
    let dir = tmpdir("unknown");
    let (path, _) = write_sample(&dir);
    let mut bytes = std::fs::read(&path).unwrap();
    let payload = b"future";
    let mut extra = Vec::new();
    extra.extend_from_slice(&99u32.to_le_bytes());
    extra.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    extra.extend_from_slice(&chunk_checksum(99, payload).to_le_bytes());
    extra.extend_from_slice(payload);
    let at = FILE_HEADER_SIZE as usize;
    bytes.splice(at..at, extra);
    std::fs::write(&path, &bytes).unwrap();
    let (chunks, truncated) = read_all(&path).unwrap();
    assert_eq!(chunks.len(), 6);
    assert!(!truncated);
}

/// Truncations and byte flips of a valid file must give errors or a clean stop, never a
/// panic; flips inside payloads must be caught by the checksum.
#[test]
fn fuzzed_files_never_panic() {
    let dir = tmpdir("fuzz");
    let (path, _) = write_sample(&dir);
    let good = std::fs::read(&path).unwrap();
    let mut rng = Rng(12345);
    let fuzz = dir.join("fuzz.fns");
    for cut in 0..good.len() {
        std::fs::write(&fuzz, &good[..cut]).unwrap();
        if let Ok((_, truncated)) = read_all(&fuzz) {
            assert!(truncated, "cut at {cut} not reported as truncated");
        }
    }
    for i in 0..3000 {
        let mut b = good.clone();
        for _ in 0..1 + i % 4 {
            let at = (rng.next() as usize) % b.len();
            b[at] ^= 1 << (rng.next() % 8);
        }
        if i % 3 == 0 {
            b.truncate((rng.next() as usize) % b.len());
        }
        std::fs::write(&fuzz, &b).unwrap();
        let _ = read_all(&fuzz);
    }
    // Crafted chunks with valid checksums but hostile contents.
    for payload in [
        vec![0u8; 3],
        vec![0xffu8; 36],
        [
            vec![0u8; 20],
            vec![0xff, 0xff, 0xff, 0xff],
            vec![0u8; 12],
            b"\x28\xb5\x2f\xfd".to_vec(),
        ]
        .concat(),
    ] {
        let mut b = good[..FILE_HEADER_SIZE as usize].to_vec();
        for kind in [KIND_CALLDATA, KIND_EVENTS, KIND_IMAGE, KIND_META, KIND_END] {
            b.extend_from_slice(&kind.to_le_bytes());
            b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            b.extend_from_slice(&chunk_checksum(kind, &payload).to_le_bytes());
            b.extend_from_slice(&payload);
        }
        std::fs::write(&fuzz, &b).unwrap();
        assert!(read_all(&fuzz).is_err());
    }
}

#[test]
fn data_slots_are_split_from_call_records() {
    let data_flag = u64::from(fnscope_abi::REC_FLAG_DATA) << 56;
    let slot = |a: u64, b: u64, n: u64| Record { t_entry: a, t_exit: b, id_depth: fnscope_abi::data::tag(n) };
    let call = |id: u32, data: bool| {
        let mut r = Record::new(10, 20, id, 0, 0);
        if data {
            r.id_depth |= data_flag;
        }
        r
    };
    let raw = [
        slot(1, 2, 3),
        slot(3, 0, 3),
        call(0, true),
        call(1, false),
        // Orphans: a unit whose record never came, and a pad slot at a chunk's end.
        slot(7, 8, 2),
        call(2, false),
        slot(5, 6, 2),
        call(3, true),
        slot(9, 9, 1),
    ];
    let (recs, data) = split_data(&raw);
    assert_eq!(recs.iter().map(Record::id).collect::<Vec<_>>(), [0, 1, 2, 3]);
    let units: Vec<(u32, Vec<u64>)> = data.iter().map(|(r, w)| (r, w.to_vec())).collect();
    assert_eq!(units, [(0, vec![1, 2, 3]), (3, vec![5, 6])]);
}

#[test]
fn implied_headers_are_put_back() {
    use fnscope_abi::data;
    let data_flag = u64::from(fnscope_abi::REC_FLAG_DATA) << 56;
    // Three entry words and a return word in two slots, as the exit stub's fast path writes.
    let tag = 4 << 32 | data::TAG_IMPLIED_HEADER | 3 << 40 | 1 << 48;
    let slot = |a: u64, b: u64, tag: u64| Record { t_entry: a, t_exit: b, id_depth: tag };
    let call = |id: u32| {
        let mut r = Record::new(10, 20, id, 0, 0);
        r.id_depth |= data_flag;
        r
    };
    // Two units of the same tag in a row, then an explicit one, then a cut-short implied one.
    let raw = [slot(1, 2, tag), slot(3, 4, tag), call(0), slot(5, 6, tag), slot(7, 8, tag), call(1), slot(9, 0, data::tag(1)), call(2), slot(1, 1, tag), call(3)];
    let (recs, units) = split_data(&raw);
    assert_eq!(recs.len(), 4);
    let head = data::header(3, 1, data::LAYOUT_INT_REGS, 0, 0);
    assert_eq!(data::implied_header(tag), Some(head));
    assert_eq!(data::implied_header(data::tag(3)), None);
    let units: Vec<(u32, Vec<u64>)> = units.iter().map(|(r, w)| (r, w.to_vec())).collect();
    assert_eq!(units, [(0, vec![head, 1, 2, 3, 4]), (1, vec![head, 5, 6, 7, 8]), (2, vec![9])]);
}

/// Size and speed of the EVENTS encoding on a fib-like trace split into 1 MiB chunks.
#[test]
fn fib_trace_is_compact_and_fast() {
    let mut rng = Rng(7);
    let mut clock = 1u64 << 40;
    let mut recs = Vec::new();
    fib_records(24, &mut clock, &mut rng, 0, &mut recs);
    let per_chunk = records_per_chunk(DEFAULT_CHUNK_SIZE);
    let dir = tmpdir("fib");
    let path = dir.join(TRACE_FILE);
    let mut w = TraceWriter::create(&path).unwrap();
    let before = w.bytes_written();
    let mut worst = std::time::Duration::ZERO;
    for (seq, chunk) in recs.chunks(per_chunk).enumerate() {
        let t = Instant::now();
        w.write_segment(0, 1, 1, seq as u64, 0, 0, chunk, &Default::default()).unwrap();
        if chunk.len() == per_chunk {
            worst = worst.max(t.elapsed());
        }
    }
    let per_record = (w.bytes_written() - before) as f64 / recs.len() as f64;
    drop(w);
    println!(
        "fib(24): {} records, {per_record:.2} bytes/record on disk, worst encode of a full \
         {per_chunk}-record chunk {worst:?}",
        recs.len()
    );
    assert!(per_record <= 4.0, "{per_record} bytes per record");
    if !cfg!(debug_assertions) {
        assert!(worst.as_millis() < 5, "{worst:?}");
    }
    let mut r = TraceReader::open(&path).unwrap();
    let mut back = Vec::new();
    while let Some(Chunk::Events(s)) = r.next_chunk().unwrap() {
        back.extend(s.records);
    }
    assert_eq!(back, recs);
}

#[test]
fn merged_trace_round_trip() {
    let dir = tmpdir("merged");
    let path = dir.join(TRACE_FILE);
    let meta = Meta {
        mode: "merged".into(),
        ..sample_meta()
    };
    let runs = vec![
        RunInfo {
            trace: "a".into(),
            mode: "time".into(),
            ..RunInfo::default()
        },
        RunInfo {
            trace: "b".into(),
            mode: "count".into(),
            ..RunInfo::default()
        },
    ];
    let summary = ModuleSummary {
        path: "/bin/fib".into(),
        build_id: Some("abcd".into()),
        functions: vec![
            FunctionSummary {
                address: 0x1000,
                size: 40,
                name: "fib".into(),
                hooked: true,
                calls: 30,
                calls_min: 10,
                calls_max: 20,
                timed_calls: 20,
                total_ns: 400,
                self_ns: 300,
                min_ns: 5,
                max_ns: 90,
                ..FunctionSummary::default()
            },
            FunctionSummary {
                address: 0x1040,
                size: 3,
                name: "tiny".into(),
                reason: "too-short".into(),
                detail: "3 bytes".into(),
                ..FunctionSummary::default()
            },
        ],
    };
    {
        let mut w = TraceWriter::create(&path).unwrap();
        w.write_merged_meta(&meta, &runs).unwrap();
        w.write_summary(&summary).unwrap();
        w.write_end(&sample_end()).unwrap();
    }
    let mut r = TraceReader::open(&path).unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        chunks.push(c);
    }
    assert!(!r.truncated());
    assert_eq!(r.runs(), &runs[..]);
    assert_eq!(
        chunks,
        vec![
            Chunk::Meta(meta),
            Chunk::Summary(summary),
            Chunk::End(sample_end())
        ]
    );
    // A recorded trace lists no runs.
    let (p, _) = write_sample(&dir);
    let mut r = TraceReader::open(&p).unwrap();
    r.next_chunk().unwrap();
    assert!(r.runs().is_empty());
}

#[test]
fn damaged_summary_is_reported() {
    let dir = tmpdir("badsummary");
    let path = dir.join(TRACE_FILE);
    {
        let mut w = TraceWriter::create(&path).unwrap();
        w.write_meta(&sample_meta()).unwrap();
        // A payload that is no zstd frame, with a correct checksum: only decoding can tell.
        w.payload.extend_from_slice(b"{not zstd}");
        w.chunk(KIND_SUMMARY).unwrap();
    }
    let err = read_all(&path).unwrap_err().to_string();
    assert!(err.contains("SUMMARY"), "{err}");
}

/// The slots of three chunks as the agent writes them: fib records, with two data slots
/// before every third call's record in the middle one (implied header, three words and rax).
fn raw_chunks() -> Vec<Vec<Record>> {
    let tag = 4 << 32 | fnscope_abi::data::TAG_IMPLIED_HEADER | 3 << 40 | 1 << 48;
    let mut rng = Rng(7);
    let mut chunks = Vec::new();
    for seq in 0..3u64 {
        let (mut clock, mut recs) = (1000 * (seq + 1), Vec::new());
        fib_records(7, &mut clock, &mut rng, 0, &mut recs);
        let mut slots = Vec::new();
        for (k, mut r) in recs.into_iter().enumerate() {
            if seq == 1 && k % 3 == 0 {
                r.id_depth |= u64::from(fnscope_abi::REC_FLAG_DATA) << 56;
                slots.push(Record { t_entry: k as u64, t_exit: u64::MAX - k as u64, id_depth: tag });
                slots.push(Record { t_entry: 1 << k, t_exit: 42, id_depth: tag });
            }
            slots.push(r);
        }
        chunks.push(slots);
    }
    chunks
}

/// A trace of [`raw_chunks`], each written RAW when `raw` says so, else split and compressed.
fn write_chunks(path: &Path, raw: impl Fn(usize) -> bool) -> u64 {
    write_chunks_as(path, FORMAT_VERSION, raw)
}

/// [`write_chunks`] in format `version` (3 or later: RAW chunks came with 3).
fn write_chunks_as(path: &Path, version: u32, raw: impl Fn(usize) -> bool) -> u64 {
    let mut w = TraceWriter::create_as(path, version).unwrap();
    w.write_meta(&sample_meta()).unwrap();
    w.write_image(0, IMAGE).unwrap();
    for (seq, slots) in raw_chunks().iter().enumerate() {
        write_slots(&mut w, seq, slots, raw(seq));
    }
    w.write_end(&sample_end()).unwrap();
    w.flush().unwrap();
    assert_eq!(w.bytes_written(), std::fs::metadata(path).unwrap().len());
    w.raw_chunks()
}

/// Writes chunk `seq` of thread 7.8: `slots` as they are (RAW), or split and compressed.
fn write_slots(w: &mut TraceWriter, seq: usize, slots: &[Record], raw: bool) {
    if raw {
        w.write_raw_segment(0, 7, 8, seq as u64, 0, 0, slots).unwrap();
    } else {
        let (recs, data) = split_data(slots);
        w.write_segment(0, 7, 8, seq as u64, 0, 0, &recs, &data).unwrap();
    }
}

fn version_of(path: &Path) -> u32 {
    let b = std::fs::read(path).unwrap();
    u32::from_le_bytes(b[8..12].try_into().unwrap())
}

#[test]
fn raw_chunks_read_as_their_events_and_compact_to_the_same_bytes() {
    let dir = tmpdir("raw");
    let (plain, mixed) = (dir.join("plain.fns"), dir.join("mixed.fns"));
    assert_eq!(write_chunks(&plain, |_| false), 0);
    assert_eq!(write_chunks(&mixed, |seq| seq != 2), 2);
    assert_eq!(version_of(&plain), FORMAT_VERSION);
    assert_eq!(version_of(&mixed), FORMAT_VERSION);
    let (want, _) = read_all(&plain).unwrap();
    let (got, truncated) = read_all(&mixed).unwrap();
    assert!(!truncated);
    assert_eq!(got, want);
    match &got[3] {
        Chunk::Events(s) => assert_eq!(s.data.len(), 14),
        c => panic!("unexpected {c:?}"),
    }
    let mut seen = 0;
    let c = compact(&mixed, |done, total| {
        assert!(done <= total);
        seen = done;
    })
    .unwrap();
    assert_eq!(c.raw_chunks, 2);
    assert_eq!(seen, c.bytes_before);
    assert!(c.bytes_after < c.bytes_before);
    // The same encoder, the same chunks: the file written without RAW chunks, byte for byte.
    assert_eq!(std::fs::read(&mixed).unwrap(), std::fs::read(&plain).unwrap());
    assert!(!dir.join("mixed.fns.compacting").exists());
}

/// Twelve segments of [`raw_chunks`] (four rounds of the three), each written RAW when `raw`
/// says so.
fn write_many_chunks(path: &Path, raw: impl Fn(usize) -> bool) {
    let mut w = TraceWriter::create(path).unwrap();
    w.write_meta(&sample_meta()).unwrap();
    w.write_image(0, IMAGE).unwrap();
    for (seq, slots) in raw_chunks().iter().cycle().take(12).enumerate() {
        if seq == 6 {
            // Another chunk among RAW chunks being encoded: it keeps its place.
            w.write_image(1, IMAGE).unwrap();
        }
        write_slots(&mut w, seq, slots, raw(seq));
    }
    w.write_end(&sample_end()).unwrap();
}

/// However many threads encode and however many chunks they have at once, the compacted file
/// is the one written without RAW chunks, byte for byte.
#[test]
fn compaction_on_several_threads_gives_the_same_bytes() {
    let dir = tmpdir("compactpar");
    let plain = dir.join("plain.fns");
    write_many_chunks(&plain, |_| false);
    let want = std::fs::read(&plain).unwrap();
    for (workers, in_flight) in [(1, 64), (3, 2), (2, 5), (4, 64), (16, 1)] {
        let mixed = dir.join("mixed.fns");
        write_many_chunks(&mixed, |seq| seq % 4 != 1);
        let c = compact::compact_with(&mixed, workers, in_flight, |_, _| {}).unwrap();
        assert_eq!(c.raw_chunks, 9, "{workers} workers, {in_flight} in flight");
        assert_eq!(std::fs::read(&mixed).unwrap(), want, "{workers} workers, {in_flight} in flight");
    }
}

/// Of two damaged RAW chunks, the first in the file is the one reported, whichever thread
/// met its damage first.
#[test]
fn compaction_reports_the_first_damaged_chunk() {
    let dir = tmpdir("compactbad");
    let path = dir.join("bad.fns");
    write_many_chunks(&path, |_| true);
    let mut b = std::fs::read(&path).unwrap();
    let raws: Vec<usize> = chunk_offsets(&b).into_iter().filter(|&at| le32(&b, at) == KIND_RAW).collect();
    assert_eq!(raws.len(), 12);
    for &at in [raws[4], raws[10]].iter() {
        let body = at + CHUNK_HEADER_SIZE as usize;
        let len = le32(&b, at + 4) as usize;
        b[body + 20] ^= 1;
        let crc = chunk_checksum(KIND_RAW, &b[body..body + len]);
        b[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(&path, &b).unwrap();
    for (workers, in_flight) in [(1, 64), (3, 64), (2, 3)] {
        match compact::compact_with(&path, workers, in_flight, |_, _| {}) {
            Err(FormatError::Corrupt { offset, what, .. }) => {
                assert_eq!(offset, raws[4] as u64, "{workers} workers, {in_flight} in flight: {what}");
                assert!(what.contains("slot count"), "{what}");
            }
            r => panic!("{workers} workers, {in_flight} in flight: {r:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), b);
        assert!(!dir.join("bad.fns.compacting").exists());
    }
    // The same file cut short after the damaged chunk: the chunks read before the cut come
    // first, and the damaged one among them is what is reported.
    let cut = dir.join("cut.fns");
    std::fs::write(&cut, &b[..b.len() - 300]).unwrap();
    for (workers, in_flight) in [(1, 1), (2, 64)] {
        match compact::compact_with(&cut, workers, in_flight, |_, _| {}) {
            Err(FormatError::Corrupt { offset, .. }) => assert_eq!(offset, raws[4] as u64, "{workers} workers, {in_flight} in flight"),
            r => panic!("{workers} workers, {in_flight} in flight: {r:?}"),
        }
    }
}

#[test]
fn raw_chunks_cut_short_or_damaged_are_reported() {
    let dir = tmpdir("rawcut");
    let path = dir.join(TRACE_FILE);
    write_chunks(&path, |_| true);
    let whole = std::fs::read(&path).unwrap();
    // A recorder killed in the middle of the last RAW chunk: the chunks before it read.
    let cut = dir.join("cut.fns");
    std::fs::write(&cut, &whole[..whole.len() - 300]).unwrap();
    let (chunks, truncated) = read_all(&cut).unwrap();
    assert!(truncated);
    assert_eq!(chunks.iter().filter(|c| matches!(c, Chunk::Events(_))).count(), 2);
    // A slot count that does not match the length (checksum made right again) is refused.
    let first = (FILE_HEADER_SIZE as usize..whole.len())
        .find(|&at| le32(&whole, at) == KIND_RAW && whole[at + 4..at + 8] != [0; 4])
        .unwrap();
    let mut bad = whole.clone();
    let body = first + CHUNK_HEADER_SIZE as usize;
    let len = le32(&bad, first + 4) as usize;
    bad[body + 20] ^= 1;
    let crc = chunk_checksum(KIND_RAW, &bad[body..body + len]);
    bad[first + 8..first + 12].copy_from_slice(&crc.to_le_bytes());
    let damaged = dir.join("bad.fns");
    std::fs::write(&damaged, &bad).unwrap();
    let err = read_all(&damaged).unwrap_err().to_string();
    assert!(err.contains("slot count"), "{err}");
    // Compaction refuses it too, and leaves the file as it was.
    assert!(compact(&damaged, |_, _| {}).is_err());
    assert_eq!(std::fs::read(&damaged).unwrap(), bad);
    assert!(!dir.join("bad.fns.compacting").exists());
    // And a file cut short: compacting it would quietly drop what follows the cut.
    let e = compact(&cut, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("not compacted"), "{e}");
    assert_eq!(std::fs::read(&cut).unwrap(), &whole[..whole.len() - 300]);
}

/// A table of `n` functions of process `pid`, its module loaded at `bias`.
fn big_image(pid: u32, bias: u64, n: u32) -> String {
    let mut t = format!("fnscope-image\t1\npid\t{pid}\nexe\t/bin/cc1\narg\tcc1\nmodule\t0\t{bias:x}\t-\t/bin/cc1\n");
    for i in 0..n {
        t += &format!("func\t{i}\t0\t{:x}\t{}\tfunction_number_{i}\n", 0x1000 + 64 * i, 20 + i % 40);
    }
    t + "skip\t0\tffff0\t3\ttoo-short\t-\ttiny\n"
}

/// Version 5 stores image tables as a head frame and a body frame, the body frame shared by
/// tables that differ only in their head (processes of one program); version 4 stores the
/// text. Either way the tables read back as written, and a damaged packed table is refused.
#[test]
fn image_tables_are_packed_and_bodies_shared() {
    let dir = tmpdir("images");
    let tables = [(0, big_image(7, 0x5500_0000_0000, 5000)), (1, big_image(8, 0x5600_0000_0000, 5000)), (2, big_image(9, 0, 4000)), (3, IMAGE.replace("func\t0\t0\t1000\t40\tfib\n", ""))];
    let payloads = |version| {
        let path = dir.join(format!("v{version}.fns"));
        let mut w = TraceWriter::create_as(&path, version).unwrap();
        w.write_meta(&sample_meta()).unwrap();
        for (sid, text) in &tables {
            w.write_image(*sid, text).unwrap();
        }
        w.write_end(&sample_end()).unwrap();
        w.flush().unwrap();
        let (chunks, truncated) = read_all(&path).unwrap();
        assert!(!truncated);
        let read: Vec<_> = chunks.into_iter().filter_map(|c| match c { Chunk::Image { sid, table } => Some((sid, table)), _ => None }).collect();
        let want: Vec<_> = tables.iter().map(|(sid, t)| (*sid, ImageTable::parse(*sid, t).unwrap())).collect();
        assert_eq!(read, want, "version {version}");
        let mut r = TraceReader::open(&path).unwrap();
        let mut out = Vec::new();
        while let Some((kind, p)) = r.next_verbatim().unwrap() {
            if kind == KIND_IMAGE {
                out.push(p.to_vec());
            }
        }
        (path, out)
    };
    let (_, plain) = payloads(4);
    for ((_, text), p) in tables.iter().zip(&plain) {
        assert_eq!(&p[4..], text.as_bytes());
    }
    let (path, packed) = payloads(5);
    let body = |p: &[u8]| p[8 + le32(p, 4) as usize..].to_vec();
    assert_eq!(body(&packed[0]), body(&packed[1]), "same body, same frame");
    assert_ne!(body(&packed[0]), body(&packed[2]));
    assert!(packed[0].len() * 4 < tables[0].1.len(), "{} bytes for a table of {}", packed[0].len(), tables[0].1.len());

    // A head length past the chunk's end, then a body frame that does not decode, each in a
    // chunk whose checksum is right.
    let mut short = packed[2].clone();
    short[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut garbled = packed[2].clone();
    let n = garbled.len();
    garbled[n - 40..n - 8].fill(0x55);
    for (p, why) in [(short, "shorter than its head"), (garbled, "does not decompress")] {
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&chunk_head(KIND_IMAGE, p.len() as u32, &[&p]));
        bytes.extend_from_slice(&p);
        let bad = dir.join("bad.fns");
        std::fs::write(&bad, &bytes).unwrap();
        let e = read_all(&bad).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
}

/// Frames kept by a [`FrameStore`], by body; `gets` and `puts` count the calls.
#[derive(Default)]
struct MemoryStore {
    frames: std::sync::Mutex<std::collections::HashMap<Vec<u8>, Vec<u8>>>,
    gets: std::sync::atomic::AtomicUsize,
    puts: std::sync::atomic::AtomicUsize,
    /// Hands out this instead of what it keeps (a damaged store).
    forged: Option<Vec<u8>>,
}

impl FrameStore for std::sync::Arc<MemoryStore> {
    fn get(&self, body: &[u8]) -> Option<Vec<u8>> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.forged.clone().or_else(|| self.frames.lock().unwrap().get(body).cloned())
    }
    fn put(&self, body: &[u8], frame: &[u8]) {
        self.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.frames.lock().unwrap().insert(body.to_vec(), frame.to_vec());
    }
}

/// A body compressed in one recording is taken from the store in the next (same chunk bytes
/// as compressing it again would give); a frame from the store that is not one whole frame
/// of the body's length is not used, and the table is compressed instead. Every trace reads
/// back the tables written.
#[test]
fn image_bodies_come_from_a_frame_store() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tmpdir("frame-store");
    let table = big_image(7, 0x5500_0000_0000, 5000);
    let record = |name: &str, store: Option<std::sync::Arc<MemoryStore>>| {
        let path = dir.join(name);
        let mut w = TraceWriter::create(&path).unwrap();
        if let Some(s) = store {
            w.set_frame_store(Box::new(s));
        }
        w.write_meta(&sample_meta()).unwrap();
        w.write_image(0, &table).unwrap();
        w.write_end(&sample_end()).unwrap();
        w.flush().unwrap();
        let (chunks, truncated) = read_all(&path).unwrap();
        assert!(!truncated);
        let read: Vec<_> = chunks.into_iter().filter_map(|c| match c { Chunk::Image { sid, table } => Some((sid, table)), _ => None }).collect();
        assert_eq!(read, vec![(0, ImageTable::parse(0, &table).unwrap())], "{name}");
        std::fs::read(&path).unwrap()
    };
    let plain = record("plain.fns", None);
    let store = std::sync::Arc::new(MemoryStore::default());
    assert_eq!(record("first.fns", Some(store.clone())), plain);
    assert_eq!((store.gets.load(Relaxed), store.puts.load(Relaxed)), (1, 1), "looked up, then kept");
    assert_eq!(record("second.fns", Some(store.clone())), plain);
    assert_eq!((store.gets.load(Relaxed), store.puts.load(Relaxed)), (2, 1), "taken from the store");

    let frame = store.frames.lock().unwrap().values().next().unwrap().clone();
    let other = zstd::bulk::compress(&table.as_bytes()[..table.len() / 2], 1).unwrap();
    for (forged, why) in [(frame[..frame.len() - 9].to_vec(), "cut short"), (other, "another length")] {
        let bad = std::sync::Arc::new(MemoryStore { forged: Some(forged), ..Default::default() });
        assert_eq!(record("forged.fns", Some(bad.clone())), plain, "{why}");
        assert_eq!(bad.puts.load(Relaxed), 1, "{why}: compressed again");
    }
}

/// Chunks that continue a thread's segment join it (`join_segment`): they read back as one
/// segment holding their records in order, the data units of the later ones at their place
/// among the records; a chunk of another thread, a gap in the sequence numbers, lost records,
/// the [`JOIN_RECORDS`] limit, any other chunk written and `flush` end the segment first; a
/// thread's last chunk joins and ends it. Until then its records are not written.
#[test]
fn continued_chunks_join_one_segment() {
    let dir = tmpdir("join");
    let path = dir.join(TRACE_FILE);
    let mut rng = Rng(7);
    let mut fib = |n: u32, data: bool| {
        let mut clock = 1000;
        let mut recs = Vec::new();
        fib_records(n, &mut clock, &mut rng, 0, &mut recs);
        let mut units = CallData::default();
        if data {
            for (k, r) in recs.iter_mut().enumerate().filter(|(k, _)| k % 5 == 2) {
                r.id_depth |= u64::from(fnscope_abi::REC_FLAG_DATA) << 56;
                units.push(k as u32, &[fnscope_abi::data::header(1, 1, 0, 0, 0), k as u64, 3 * k as u64]);
            }
        }
        (recs, units)
    };
    let seg = |tid: u32, seq: u64, lost: u64, flags: u32, parts: &[&(Vec<Record>, CallData)]| {
        let mut s = ThreadSegment { image_sid: 0, pid: 7, tid, seq, lost, flags, ..Default::default() };
        for (recs, data) in parts {
            for (k, words) in data.iter() {
                s.data.push(s.records.len() as u32 + k, words);
            }
            s.records.extend_from_slice(recs);
        }
        s
    };
    let (a0, a1, a2, a3, a4) = (fib(9, false), fib(7, true), fib(8, false), fib(6, true), fib(10, false));
    let (b0, b1, b2) = (fib(5, false), fib(6, false), fib(4, true));
    let (d0, d2) = (fib(3, false), fib(4, false));
    // Three chunks of 13,529 records: two join, the third would take the segment over the limit.
    let c: Vec<_> = (0..3).map(|_| fib(19, false)).collect();
    assert!(2 * c[0].0.len() <= JOIN_RECORDS && 3 * c[0].0.len() > JOIN_RECORDS);

    let mut w = TraceWriter::create(&path).unwrap();
    w.write_meta(&sample_meta()).unwrap();
    w.write_image(0, IMAGE).unwrap();
    let join = |w: &mut TraceWriter, tid: u32, seq: u64, lost: u64, flags: u32, (recs, data): &(Vec<Record>, CallData)| {
        w.join_segment(0, 7, tid, seq, lost, flags, recs, data).unwrap();
    };
    let before = w.bytes_written();
    join(&mut w, 7, 0, 0, 0, &a0);
    join(&mut w, 7, 1, 0, 0, &a1);
    assert_eq!((w.bytes_written(), w.joined_records()), (before, a0.0.len() + a1.0.len()), "nothing written yet");
    join(&mut w, 8, 0, 0, 0, &b0);
    join(&mut w, 7, 2, 0, 0, &a2);
    join(&mut w, 7, 3, 2, 0, &a3);
    join(&mut w, 7, 4, 0, fnscope_abi::CHUNK_FLAG_LAST, &a4);
    assert_eq!(w.joined_records(), 0, "a thread's last chunk ends its segment");
    join(&mut w, 9, 0, 0, 0, &c[0]);
    join(&mut w, 9, 1, 0, 0, &c[1]);
    assert_eq!(w.joined_records(), 0, "one more chunk would have gone over the limit");
    join(&mut w, 9, 2, 0, 0, &c[2]);
    w.write_raw_segment(0, 7, 8, 1, 0, 0, &b1.0).unwrap();
    join(&mut w, 8, 2, 0, 0, &b2);
    join(&mut w, 10, 0, 0, 0, &d0);
    join(&mut w, 10, 2, 0, 0, &d2);
    w.flush().unwrap();
    assert_eq!(w.joined_records(), 0);
    assert_eq!(w.bytes_written(), std::fs::metadata(&path).unwrap().len(), "flush writes the joined segment");
    w.write_end(&sample_end()).unwrap();
    w.flush().unwrap();

    let want = [
        seg(7, 0, 0, 0, &[&a0, &a1]),
        seg(8, 0, 0, 0, &[&b0]),
        seg(7, 2, 0, 0, &[&a2]),
        seg(7, 3, 2, fnscope_abi::CHUNK_FLAG_LAST, &[&a3, &a4]),
        seg(9, 0, 0, 0, &[&c[0], &c[1]]),
        seg(9, 2, 0, 0, &[&c[2]]),
        seg(8, 1, 0, 0, &[&b1]),
        seg(8, 2, 0, 0, &[&b2]),
        seg(10, 0, 0, 0, &[&d0]),
        seg(10, 2, 0, 0, &[&d2]),
    ];
    let (chunks, truncated) = read_all(&path).unwrap();
    assert!(!truncated);
    let got = events_of(chunks);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((g.tid, g.seq, g.lost, g.flags, g.records.len()), (w.tid, w.seq, w.lost, w.flags, w.records.len()));
        assert_eq!(g, w);
    }
    assert!(!want[0].data.is_empty() && !want[3].data.is_empty());
}

/// Records of random call trees (up to 12 deep, ids 0..37, some with flags, every seventh
/// with a data unit) from `seed`, at least `n` of them.
fn random_calls(seed: u64, n: usize) -> (Vec<Record>, CallData) {
    fn tree(rng: &mut Rng, depth: u32, clock: &mut u64, out: &mut Vec<Record>, data: &mut CallData, budget: &mut usize) {
        *clock += 1 + rng.next() % 50;
        let t_entry = *clock;
        let kids = if depth < 12 && *budget > 0 { rng.next() % 4 } else { 0 };
        for _ in 0..kids {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            tree(rng, depth + 1, clock, out, data, budget);
        }
        *clock += 1 + rng.next() % 80;
        let mut flags = if rng.next().is_multiple_of(13) { 2 } else { 0 };
        if rng.next().is_multiple_of(7) {
            flags |= fnscope_abi::REC_FLAG_DATA;
            data.push(out.len() as u32, &[fnscope_abi::data::header(1, 1, 0, 0, 0), rng.next(), rng.next() % 100]);
        }
        out.push(Record::new(t_entry, *clock, (rng.next() % 37) as u32, depth, flags));
    }
    let mut rng = Rng(seed);
    let (mut out, mut data) = (Vec::new(), CallData::default());
    let mut clock = rng.next() % 1_000_000;
    while out.len() < n {
        tree(&mut rng, 0, &mut clock, &mut out, &mut data, &mut 200);
    }
    (out, data)
}

/// A segment joined from chunks is, byte for byte, the segment of all their records written
/// at once: the encoder carries its state from chunk to chunk and starts afresh for the
/// next segment. Every version, random cuts (empty chunks too), with and without data
/// units, another thread's segment first, the last chunk a thread's last or not.
#[test]
fn joined_chunks_encode_as_one_segment() {
    let dir = tmpdir("join-bytes");
    for version in CHECKSUM_OF_HEAD_SINCE..=FORMAT_VERSION {
        for seed in 1..25u64 {
            let (recs, data) = random_calls(seed * 7919 + u64::from(version), 3000 + (seed as usize * 131) % 5000);
            let data = if seed % 2 == 0 { data } else { CallData::default() };
            let (other, other_data) = random_calls(seed + 5, 777);
            let other_data = if seed % 2 == 0 { other_data } else { CallData::default() };
            let mut rng = Rng(seed + 99);
            let mut cuts = vec![0];
            while cuts[cuts.len() - 1] < recs.len() {
                cuts.push((cuts[cuts.len() - 1] + (rng.next() % 2500) as usize).min(recs.len()));
            }
            let last = if seed % 3 == 0 { fnscope_abi::CHUNK_FLAG_LAST } else { 0 };
            let write = |name: &str, joined: bool| {
                let path = dir.join(name);
                let mut w = TraceWriter::create_as(&path, version).unwrap();
                w.write_meta(&sample_meta()).unwrap();
                if joined {
                    w.join_segment(0, 1, 2, 0, 0, 0, &other, &other_data).unwrap();
                    for (i, c) in cuts.windows(2).enumerate() {
                        let mut d = CallData::default();
                        for (k, words) in data.iter().filter(|&(k, _)| (c[0]..c[1]).contains(&(k as usize))) {
                            d.push(k - c[0] as u32, words);
                        }
                        let flags = if i == cuts.len() - 2 { last } else { 0 };
                        w.join_segment(0, 1, 3, 10 + i as u64, if i == 0 { 5 } else { 0 }, flags, &recs[c[0]..c[1]], &d).unwrap();
                    }
                } else {
                    w.write_segment(0, 1, 2, 0, 0, 0, &other, &other_data).unwrap();
                    w.write_segment(0, 1, 3, 10, 5, last, &recs, &data).unwrap();
                }
                w.write_end(&sample_end()).unwrap();
                w.flush().unwrap();
                drop(w);
                std::fs::read(&path).unwrap()
            };
            assert!(recs.len() <= JOIN_RECORDS);
            let (joined, whole) = (write("joined.fns", true), write("whole.fns", false));
            assert!(joined == whole, "version {version}, seed {seed}: {} bytes joined against {} written at once", joined.len(), whole.len());
        }
    }
}
