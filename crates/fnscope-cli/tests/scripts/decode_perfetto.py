"""Decodes Perfetto traces with Perfetto's own compiled schema (PyPI `perfetto`), independently
of fnscope, and prints one JSON object per file: its tracks, its slices (begin order, with
depth on their track and their debug annotations) and every rule of the format it breaks.

Usage: decode_perfetto.py FILE...   (exit 3 when the `perfetto` module is missing)
"""
import json
import sys

try:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError as e:
    print(f"cannot import perfetto's schema ({e}): install it with "
          f"`{sys.executable} -m pip install perfetto protobuf`", file=sys.stderr)
    sys.exit(3)

CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
NEEDS = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
BOOTTIME = 6


def timestamp(p, st, problems, n):
    """The packet's time on BOOTTIME (the trace's clock), per TracePacket.timestamp_clock_id,
    the sequence's TracePacketDefaults and its ClockSnapshots: a sequence-scoped clock (64 to
    127) is related to BOOTTIME by the last snapshot of it on the sequence, and an incremental
    one adds each packet's timestamp to the previous packet's on that clock."""
    clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else st["clock"] if st else BOOTTIME
    if clock == BOOTTIME:
        return p.timestamp
    snap = st["snap"].get(clock) if st else None
    if snap is None or BOOTTIME not in st["snap"]:
        problems.append(f"packet {n}: timestamp on clock {clock} with no snapshot relating it to BOOTTIME")
        return p.timestamp
    if clock in st["incremental"]:
        st["incremental"][clock] += p.timestamp
        value = st["incremental"][clock]
    else:
        value = p.timestamp
    return value - snap + st["snap"][BOOTTIME]


def decode(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    problems = []
    tracks = {}
    slices = []
    open_ = {}
    state = {}  # sequence id -> interned tables, valid once cleared
    for n, p in enumerate(trace.packet):
        seq = p.trusted_packet_sequence_id
        if p.incremental_state_cleared or p.sequence_flags & CLEARED:
            state[seq] = {"names": {}, "ann": {}, "str": {}, "clock": BOOTTIME, "track": None,
                          "snap": {}, "incremental": {}}
        st = state.get(seq)
        if p.HasField("trace_packet_defaults"):
            if st is None:
                problems.append(f"packet {n}: defaults before the incremental state was cleared")
            else:
                d = p.trace_packet_defaults
                if d.HasField("timestamp_clock_id"):
                    st["clock"] = d.timestamp_clock_id
                if d.HasField("track_event_defaults") and d.track_event_defaults.HasField("track_uuid"):
                    st["track"] = d.track_event_defaults.track_uuid
        if p.HasField("clock_snapshot"):
            for c in p.clock_snapshot.clocks:
                if c.clock_id >= 64 and st is None:
                    problems.append(f"packet {n}: a sequence-scoped clock before the state was cleared")
                    continue
                if st is not None:
                    st["snap"][c.clock_id] = c.timestamp
                    if c.is_incremental:
                        st["incremental"][c.clock_id] = c.timestamp
        if p.HasField("interned_data"):
            if st is None:
                problems.append(f"packet {n}: interned data before the incremental state was cleared")
                continue
            d = p.interned_data
            for e in d.event_names:
                st["names"][e.iid] = e.name
            for e in d.debug_annotation_names:
                st["ann"][e.iid] = e.name
            for e in d.debug_annotation_string_values:
                st["str"][e.iid] = e.str.decode()
        if p.HasField("track_descriptor"):
            t = p.track_descriptor
            if t.HasField("thread"):
                tracks[t.uuid] = {"kind": "thread", "pid": t.thread.pid, "tid": t.thread.tid,
                                  "name": t.thread.thread_name, "parent": t.parent_uuid}
            elif t.HasField("process"):
                tracks[t.uuid] = {"kind": "process", "pid": t.process.pid,
                                  "name": t.process.process_name}
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        if e.HasField("name_iid") and not p.sequence_flags & NEEDS:
            problems.append(f"packet {n}: an interned name without SEQ_NEEDS_INCREMENTAL_STATE")
        if st is None:
            problems.append(f"packet {n}: a track event before the incremental state was cleared")
            continue
        track = e.track_uuid if e.HasField("track_uuid") else st["track"]
        if track not in tracks or tracks[track]["kind"] != "thread":
            problems.append(f"packet {n}: track {track} is not a thread track described before")
            continue
        ts = timestamp(p, st, problems, n)
        stack = open_.setdefault(track, [])
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            if e.name_iid not in st["names"]:
                problems.append(f"packet {n}: name iid {e.name_iid} not interned")
            args = {}
            for a in e.debug_annotations:
                name = st["ann"].get(a.name_iid, a.name) if a.HasField("name_iid") else a.name
                if a.HasField("string_value_iid"):
                    if a.string_value_iid not in st["str"]:
                        problems.append(f"packet {n}: string iid {a.string_value_iid} not interned")
                    args[name] = st["str"].get(a.string_value_iid)
                elif a.HasField("string_value"):
                    args[name] = a.string_value
                elif a.HasField("bool_value"):
                    args[name] = a.bool_value
                else:
                    problems.append(f"packet {n}: annotation {name} without a value")
            s = {"track": track, "name": st["names"].get(e.name_iid), "begin": ts,
                 "end": None, "depth": len(stack), "args": args}
            stack.append(s)
            slices.append(s)
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            if not stack:
                problems.append(f"packet {n}: slice end with no slice open on track {track}")
                continue
            s = stack.pop()
            if ts < s["begin"]:
                problems.append(f"packet {n}: slice {s['name']} ends before it begins")
            s["end"] = ts
        else:
            problems.append(f"packet {n}: unexpected event type {e.type}")
    for uuid, stack in open_.items():
        if stack:
            problems.append(f"{len(stack)} slices of track {uuid} never end")
    return {"file": path, "tracks": {str(k): v for k, v in tracks.items()}, "slices": slices,
            "problems": problems}


for path in sys.argv[1:]:
    print(json.dumps(decode(path)))
