#!/usr/bin/env python3
"""Fuzz target: the c4-trace reader (tools/c4-trace/c4trace) under atheris, libFuzzer for Python.

One input is the content of one .c4t file. It is read by fmt.TraceFile, merged (analysis.merge, what analysis.load
does with the files it read), analysed (analysis.analyze, timeline_sample) and searched for C4D records
(analysis.c4d_from_trace): all of it must succeed, or the file be rejected with fmt.TraceFormatError. Any other
exception, a hang (-timeout) or memory without bound (-rss_limit_mb) is a crash.

  trace_fuzz.py [libFuzzer flags] CORPUS_DIR...   (scripts/fuzz.sh runs it in build-fuzz/venv; docs/fuzzing.md)
  trace_fuzz.py --seeds DIR                       writes the seed corpus: valid files of versions 1 and 2
"""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "tools", "c4-trace"))


def seeds(out):
    """Valid trace files: version 2 with every event type (a C4D record and a C4P lane sample among the notes),
    and version 1."""
    from c4trace import fmt  # noqa: E402 (the seeds need no instrumentation)
    os.makedirs(out, exist_ok=True)
    names = b"\0" + b"tcp: rank 1 closed\0" + b'C4D {"c4d":1,"class":"dead_rank","reporter":0,"seq":3,' \
        b'"culprit":{"ranks":[1],"hosts":["n1"],"links":[[0,1]]},"time_ns":5}\0' + b"h0p0 -> leaf0 -> h1p0\0" + \
        b"span\0"
    off_err, off_c4d = 1, 1 + len(b"tcp: rank 1 closed\0")
    off_path = names.index(b"h0p0")
    off_span = names.index(b"span\0")
    ev = []
    t = 1_000_000
    for seq in range(4):  # AllReduce ops with their steps
        ev.append((t, t + 50_000, 4096, seq, -1, fmt.T_OP, 0, 7, 0, 0, 0, 0, 0))
        ev.append((t + 1000, t + 20_000, 2048, seq, 1, fmt.T_STEP, 0, 7, 0, 0, 1, 0, 1))
        ev.append((t + 21_000, t + 40_000, 2048, seq, 1, fmt.T_STEP, 0, 7, 2, 0, fmt.LANE_STRIPED, 0, 1))
        t += 100_000
    ev.append((t, t + 10, 0, 9, 1, fmt.T_OP, 8, 0, 0, 0xfe, 0, 0, 1))  # Send
    ev.append((t, t, 0, 4, -1, fmt.T_OP, 1, 7, 0, 0xfd, 0, fmt.FLAG_NO_END, 0))  # one-shot, no end
    ev.append((t, t, 0, 5, -1, fmt.T_OP, 0, 7, 0, 0, 0, fmt.FLAG_OPEN, 0))  # never ended
    ev.append((t, t, 6, off_err, 1, fmt.T_ERROR, 0, 0, 0, 0, 0, 0, 0))
    ev.append((t, t, 0, off_c4d, -1, fmt.T_DIAG, 0, 0, 0, 0, 0, 0, 0))
    ev.append((t, t + 5000, 0, off_span, -1, fmt.T_SPAN, 0, 0, 0, 0, 0, 0, 0))
    ev.append((t, t + 60_000_000, 1 << 20, off_path, 1, fmt.T_PLAN, 0, 0, fmt.PLAN_LANE_SAMPLE, 0, 0, 0, 1))
    ev.append((t, t, 0, off_path, 1, fmt.T_PLAN, 0, 0, fmt.PLAN_PLAN, 0, 1, 0, 1))
    for version, name in ((2, "v2-all-events"), (1, "v1-ops")):
        evs = ev if version == 2 else ev[:6]
        nm = names if version == 2 else b"\0"
        hdr = fmt.HEADER.pack(fmt.MAGIC, version, fmt.HEADER.size, fmt.EVENT.size, 0, 2, 1234, 2, 0,
                              0, len(evs), 0, len(evs), 1000, 1000, 100_001_000, 100_001_000, 1.0, 1_700_000_000 * 10**9,
                              0, 500, 0, 10, 400, 100_000_000, 2, len(nm), b"0123456789abcdef", b"world", b"node0",
                              b"shm,tcp" if version == 2 else b"")
        body = b"".join(fmt.EVENT.pack(*e) for e in evs)
        with open(os.path.join(out, name), "wb") as f:
            f.write(hdr + body + nm)
    # Rank 1 of the same run, one clock sample, a TSC-like clock.
    hdr = fmt.HEADER.pack(fmt.MAGIC, 2, fmt.HEADER.size, fmt.EVENT.size, 1, 2, 1235, 1, 1, 0, 2, 0, 5, 3000, 1000,
                          3000, 1000, 2.5, 0, -700, 300, 0, 0, 0, 0, 1, 1, b"0123456789abcdef", b"world", b"node1",
                          b"tcp")
    body = b"".join(fmt.EVENT.pack(*e) for e in ev[:2])
    with open(os.path.join(out, "v2-rank1-one-sample"), "wb") as f:
        f.write(hdr + body + b"\0")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        seeds(sys.argv[2])
        return
    import atheris  # noqa: E402
    with atheris.instrument_imports():
        from c4trace import analysis, fmt  # noqa: E402

    def one(data):
        try:
            f = fmt.TraceFile("fuzz.c4t", bytes(data))
        except fmt.TraceFormatError as e:
            assert "\n" not in str(e), "a multi-line error: %r" % str(e)
            return
        run = analysis.merge([f])
        analysis.analyze(run, 10)
        analysis.timeline_sample(run)
        analysis.c4d_from_trace(f)

    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
