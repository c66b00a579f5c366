#!/usr/bin/env python3
"""Tests of tools/c4-trace on synthetic traces written in the library's file format: the report's
numbers, JSON/CSV/HTML/Chrome outputs, clock alignment with skewed ranks, bad input, and a
1-million-event merge (its time is printed, not asserted). Usage: test_c4trace.py PATH/TO/c4-trace"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import unittest

TOOL = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../tools/c4-trace/c4-trace")
sys.path.insert(0, os.path.dirname(os.path.realpath(TOOL)))
from c4trace import analysis, fmt  # noqa: E402

TPN = 2.5  # synthetic ticks per ns


def write_trace(path, rank, nranks, events, skew_ns=0, offset_est=None, rtt=2000, tag="feedfacecafebeef", names=b"\0",
                total=None, level=1):
    """events: (t0_ns, t1_ns, bytes, seq, peer, type, coll, dtype, redop, algo, lane, flags) on the TRUE clock; the
    file stores ticks of a clock running skew_ns ahead, and records offset_est (default -skew) as measured."""
    base = 1_000_000_000  # the true clock at time 0 of the run
    an0 = base + skew_ns
    at0 = 10_000
    if offset_est is None:
        offset_est = -skew_ns
    end_ns = base + max([e[1] for e in events] + [0]) + skew_ns + 100_000_000
    recs = b"".join(fmt.EVENT.pack(at0 + int((base + e[0] + skew_ns - an0) * TPN), at0 + int((base + e[1] + skew_ns - an0) * TPN),
                                   *e[2:12], 0) for e in events)
    n = len(events)
    hdr = fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, fmt.HEADER.size, fmt.EVENT.size, rank, nranks, 4242 + rank, level, 0,
                          0, n, 0, total if total is not None else n, at0, an0, at0 + int((end_ns - an0) * TPN), end_ns,
                          TPN, 0, offset_est if rank else 0, rtt if rank else 0, an0, 0, 0, 0, 1, len(names),
                          tag.encode(), b"train", b"host%d" % rank, b"shm,tcp")
    with open(path, "wb") as f:
        f.write(hdr + recs + names)


def op(t0, dur, nbytes, seq, coll=0, algo=0, peer=-1):
    return (t0, t0 + dur, nbytes, seq, peer, fmt.T_OP, coll, 7, 0, algo, 0, 0)


def load_json(path):
    with open(path) as f:
        return json.load(f)


def read_text(path):
    with open(path) as f:
        return f.read()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def run_tool(*args):
    p = subprocess.run([sys.executable, TOOL] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


class C4TraceTool(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="c4trace-tool-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def make_run(self, skews=(0, 0, 0, 0)):
        """4 ranks, 10 AllReduces of 1 MiB (rank 3 always 50 us late) and 5 AllGathers of 4 KiB; sends at step
        level from every rank to its ring neighbour."""
        n = len(skews)
        for r in range(n):
            evs = []
            t = 0
            seq = 0
            for i in range(10):
                late = 50_000 if r == 3 else 0
                evs.append(op(t + late, 200_000 - late, 1 << 20, seq))
                evs.append((t + 60_000, t + 150_000, 1 << 19, seq, (r + 1) % n, fmt.T_STEP, 0, 7, 0, 0, 0, 0))
                t += 300_000
                seq += 1
            for i in range(5):
                evs.append(op(t, 20_000, 4096 * n, seq, coll=1, algo=0xfd))
                t += 30_000
                seq += 1
            write_trace(os.path.join(self.dir, "feedfacecafebeef.r%d.c4t" % r), r, n, evs, skew_ns=skews[r], level=2)

    def test_report_numbers(self):
        self.make_run()
        out = os.path.join(self.dir, "rep.html")
        rc, so, se = run_tool("report", self.dir, "-o", out, "--json", "--csv")
        self.assertEqual(rc, 0, se)
        rep = load_json(os.path.join(self.dir, "rep.json"))
        colls = {c["collective"]: c for c in rep["collectives"]}
        self.assertEqual(colls["AllReduce"]["count"], 10)
        self.assertEqual(colls["AllGather"]["count"], 5)
        self.assertEqual(colls["AllReduce"]["bytes_per_rank"], 10 << 20)
        self.assertEqual(colls["AllGather"]["algorithms"], {"oneshot": 20})
        share = colls["AllReduce"]["time_share"] + colls["AllGather"]["time_share"]
        self.assertAlmostEqual(share, 1.0, places=6)
        # Rank 3 is last every time: every other rank waited on it 50 us per AllReduce.
        top = rep["waits"][0]
        self.assertEqual(top["waited_on"], 3)
        self.assertEqual(top["count"], 10)
        self.assertAlmostEqual(top["total_ns"], 10 * 50_000, delta=10 * 10)
        self.assertEqual(rep["late"][0]["rank"], 3)
        self.assertEqual(rep["late"][0]["times_last"], 10)
        # Bandwidth: 1 MiB in 150 us after the last arrival; busbw = algbw * 2 * 3 / 4.
        bw = [b for b in rep["bandwidth"] if b["collective"] == "AllReduce"][0]
        alg = (1 << 20) / 150_000
        self.assertAlmostEqual(bw["algbw_p50_GBps"], alg, delta=alg * 0.01)
        self.assertAlmostEqual(bw["busbw_p50_GBps"], alg * 1.5, delta=alg * 0.015)
        sizes = {(s["collective"], s["bucket_bytes"]): s["count"] for s in rep["sizes"]}
        self.assertEqual(sizes[("AllReduce", 1 << 20)], 40)
        self.assertEqual(sizes[("AllGather", 16384)], 20)
        mat = {(m["src"], m["dst"]): m["bytes"] for m in rep["traffic"]}
        self.assertEqual(mat, {(r, (r + 1) % 4): 10 << 19 for r in range(4)})
        self.assertEqual(rep["step_waits"], [])
        for name in ("collectives", "sizes", "bandwidth", "traffic", "waits", "late"):
            self.assertTrue(os.path.getsize(os.path.join(self.dir, "rep-csv", name + ".csv")) > 0, name)
        html = read_text(out)
        self.assertIn("<svg", html)
        self.assertEqual(html.count("<svg"), html.count("</svg>"))
        self.assertNotIn("http://", html.replace('xmlns="http://www.w3.org/2000/svg"', ""))
        self.assertNotIn("<script", html)
        self.assertIn("AllReduce", so)

    def test_untimed_one_shot_calls_end_at_the_last_arrival(self):
        # One-shot calls carry no end (FLAG_NO_END): every rank's end is the latest arrival.
        for r in range(3):
            evs = [(10_000 * k + 1_000 * r, 10_000 * k + 1_000 * r, 64, k, -1, fmt.T_OP, 0, 7, 0, 0xfd, 0,
                    fmt.FLAG_NO_END) for k in range(4)]
            write_trace(os.path.join(self.dir, "t.r%d.c4t" % r), r, 3, evs)
        run = analysis.load(self.dir, progress=False)
        c = next(iter(run.comms.values()))
        for r in range(3):
            for k, e in enumerate(c.events[r]):
                self.assertAlmostEqual(e[1], c.events[2][k][0], delta=2)  # rank 2 arrives last
                self.assertLessEqual(e[0], e[1])
        rep = analysis.analyze(run)
        self.assertEqual(rep["late"][0]["rank"], 2)
        colls = {x["collective"]: x for x in rep["collectives"]}
        self.assertAlmostEqual(colls["AllReduce"]["time_share"], 1.0, places=6)  # the calls have a duration

    def test_skewed_clocks_are_aligned(self):
        self.make_run(skews=(0, 3_000_000_000, -7_000_000_000, 123_456_789))
        rc, so, se = run_tool("report", self.dir, "-o", os.path.join(self.dir, "r.html"), "--json", "--quiet")
        self.assertEqual(rc, 0, se)
        rep = load_json(os.path.join(self.dir, "r.json"))
        self.assertLess(rep["span_ns"], 10_000_000)  # 3.7 ms of activity, not seconds
        self.assertEqual(rep["waits"][0]["waited_on"], 3)
        self.assertAlmostEqual(rep["waits"][0]["total_ns"], 10 * 50_000, delta=10 * 10)
        # A wrong offset estimate (as if the skew were unknown) shows up as a seconds-long span.
        self.tearDown()
        self.setUp()
        evs = [op(0, 1000, 8, 0)]
        write_trace(os.path.join(self.dir, "a.r0.c4t"), 0, 2, evs)
        write_trace(os.path.join(self.dir, "a.r1.c4t"), 1, 2, evs, skew_ns=2_000_000_000, offset_est=0)
        rc, so, se = run_tool("report", self.dir, "-o", os.path.join(self.dir, "r.html"), "--json", "--quiet")
        rep = load_json(os.path.join(self.dir, "r.json"))
        self.assertGreater(rep["span_ns"], 1_000_000_000)

    def test_chrome_and_binary_export(self):
        self.make_run()
        out = os.path.join(self.dir, "t.json")
        rc, so, se = run_tool("export", self.dir, "-o", out)
        self.assertEqual(rc, 0, se)
        tr = load_json(out)["traceEvents"]
        ops = [e for e in tr if e.get("cat") == "op"]
        self.assertEqual(len(ops), 4 * 15)
        self.assertEqual({e["pid"] for e in ops}, {0, 1, 2, 3})
        steps = [e for e in tr if e.get("cat") == "step"]
        self.assertEqual(len(steps), 40)
        names = {e["args"]["name"] for e in tr if e.get("name") == "thread_name"}
        self.assertIn("shm to peer 1", names)
        binp = os.path.join(self.dir, "t.c4m")
        rc, so, se = run_tool("export", self.dir, "-o", binp)
        self.assertEqual(rc, 0, se)
        data = read_bytes(binp)
        magic, ver, rb, n = struct.unpack_from("<8sIIQ", data)
        self.assertEqual((magic, ver, rb, n), (b"C4MERGE\0", 1, 48, 4 * 25))
        self.assertEqual(len(data), 24 + 48 * n)

    def test_errors_spans_and_dropped_events(self):
        names = b"\0bucket 7\0connection reset by rank 1\0"
        evs = [op(0, 1000, 8, 0), (100, 900, 0, 1, -1, fmt.T_SPAN, 0, 0, 0, 0xff, 0, 0),
               (2000, 2000, 6, 10, -1, fmt.T_ERROR, 0, 0, 0, 0xff, 0, 0)]
        write_trace(os.path.join(self.dir, "b.r0.c4t"), 0, 2, evs, names=names, total=1000)
        rc, so, se = run_tool("summary", self.dir)
        self.assertEqual(rc, 0, se)
        self.assertIn("bucket 7 x1", so)
        self.assertIn("ERROR rank 0: code 6: connection reset by rank 1", so)
        self.assertIn("997 older events were overwritten", so)
        self.assertIn("no file for rank(s) 1", so)

    def test_bad_input(self):
        rc, so, se = run_tool("summary", os.path.join(self.dir, "missing"))
        self.assertEqual(rc, 2)
        self.assertIn("no such trace directory", se)
        write_bytes(os.path.join(self.dir, "junk.r0.c4t"), b"x" * 400)
        rc, so, se = run_tool("summary", self.dir)
        self.assertEqual(rc, 2)  # nothing readable is left
        self.assertIn("no readable", se)

    def test_one_million_events(self):
        n, per = 8, 125_000
        for r in range(n):
            evs = [op(i * 10_000 + (r * 37 % 500), 5_000, 1 << (i % 20 + 3), i, coll=i % 3) for i in range(per)]
            write_trace(os.path.join(self.dir, "big.r%d.c4t" % r), r, n, evs, skew_ns=r * 1_000_000)
        t = time.time()
        rc, so, se = run_tool("report", self.dir, "-o", os.path.join(self.dir, "big.html"), "--json", "--quiet",
                              "--progress")
        dt = time.time() - t
        self.assertEqual(rc, 0, se)
        self.assertIn("100%", se)  # the progress bar ran to the end
        rep = load_json(os.path.join(self.dir, "big.json"))
        self.assertEqual(rep["events"], n * per)
        print("\n1,000,000 events (8 ranks): merged and reported in %.2f s with %s" % (dt, sys.executable))


if __name__ == "__main__":
    unittest.main(verbosity=2)
