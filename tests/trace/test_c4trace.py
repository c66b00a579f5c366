#!/usr/bin/env python3
"""Tests of tools/c4-trace on synthetic traces written in the library's file format: the report's
numbers, JSON/CSV/HTML/Chrome outputs, clock alignment with skewed ranks, bad input, and a
1-million-event merge (its time is printed, not asserted). Usage: test_c4trace.py PATH/TO/c4-trace"""
import csv
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


def names_table(*texts):
    """A trace file's name table holding texts: (bytes, {text: its name id})."""
    data, ids = b"\0", {}
    for t in texts:
        ids[t] = len(data)
        data += t.encode() + b"\0"
    return data, ids


def plan_ev(kind, t0, name_id, t1=None, nbytes=0, peer=-1, lane=0):
    """A C4P event (T_PLAN, Event::redop = kind, one of fmt.PLAN_*) in write_trace's layout."""
    return (t0, t0 if t1 is None else t1, nbytes, name_id, peer, fmt.T_PLAN, 0, 0, kind, 0xff, lane, 0)


def c4d_record(kind, rank, reporter=0, ranks=(2,), hosts=("h3",), links=(), seq=5, time_ns=1_795_949_400_123_000_000,
               summary="rank 2 died (process gone)",
               evidence="rank 2 (host h3, pid 4711): its side-channel link closed",
               confidence=0.95, comm="feedfacecafebeef", nranks=4, late_ms=None):
    """A C4D record as the library writes it (C4_DIAG_FILE, or the trace after "C4D "): `rank` wrote this copy."""
    culprit = {"hosts": list(hosts), "links": [list(l) for l in links], "ranks": list(ranks)}
    if late_ms is not None:
        culprit["late_ms"] = late_ms
    r = {"c4d": 1, "class": kind, "comm": comm, "confidence": confidence, "culprit": culprit, "evidence": evidence,
         "nranks": nranks, "rank": rank, "reporter": reporter, "summary": summary,
         "time": "2026-11-25T10:50:00.%03dZ" % ((time_ns // 1_000_000) % 1000), "time_ns": time_ns}
    if seq is not None:
        r["seq"] = seq
    return r


def diag_ev(t0, name_id):
    """A note (T_DIAG) naming its text by name id, in write_trace's layout."""
    return (t0, t0, 0, name_id, -1, fmt.T_DIAG, 0, 0, 0, 0xff, 0, 0)


def words(text):
    """text with every run of white space one blank (explain wraps its lines)."""
    return " ".join(text.split())


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

    PLAN = ("C4P c4p over /tmp/x/topo.json: 2 connection(s) x 2 lane(s) for ring AllReduce of 67108864 B; most "
            "loaded link leaf0->spine1")
    PATH_A = "h0p0 -> leaf0 -> spine1 -> leaf1 -> h1p0"  # rank 0, lane 0 to rank 1
    PATH_C = "h0p1 -> leaf0 -> spine0 -> leaf1 -> h1p1"  # rank 0, lane 1 to rank 1
    PATH_D = "h2p0 -> leaf0 -> spine1 -> leaf1 -> h1p0"  # rank 1 (on host h2 here), lane 0 to rank 0's h1p0
    PATH_E = "h2p1 -> leaf0 -> h0p1"  # rank 1, lane 1 to rank 0
    REPLAN = "lane 1 (%s) moved to a spare path as lane 2 (h0p1 -> leaf0 -> spine1 -> leaf1 -> h1p1)" % PATH_C

    def make_c4p_run(self):
        """2 ranks (rank 1's clock 3 s ahead, as measured): the plan on both; rank 0 sends 100 MB on PATH_A in
        [0, 1 s], 50 MB in [1, 2 s] and 40 MB on PATH_C in [0, 2 s], changes weights at 1 s and moves lane 1 at
        1.5 s; rank 1 sends 300 MB on PATH_D (sharing leaf0->spine1->leaf1->h1p0 with PATH_A) in [0.5, 1.5 s] and
        20 MB on PATH_E in [0, 2 s], and changes weights at 1.2 s."""
        s = 1_000_000_000
        names, ids = names_table(self.PLAN, self.PATH_A, self.PATH_C, "weights 1.00 0.50", self.REPLAN)
        evs = [plan_ev(fmt.PLAN_PLAN, 0, ids[self.PLAN]), op(1000, 2 * s - 2000, 64 << 20, 0),
               plan_ev(fmt.PLAN_LANE_SAMPLE, 0, ids[self.PATH_A], s, 100_000_000, peer=1, lane=0),
               plan_ev(fmt.PLAN_LANE_SAMPLE, 0, ids[self.PATH_C], 2 * s, 40_000_000, peer=1, lane=1),
               plan_ev(fmt.PLAN_WEIGHTS, s, ids["weights 1.00 0.50"], peer=1),
               plan_ev(fmt.PLAN_LANE_SAMPLE, s, ids[self.PATH_A], 2 * s, 50_000_000, peer=1, lane=0),
               plan_ev(fmt.PLAN_REPLAN, s + s // 2, ids[self.REPLAN], peer=1, lane=2)]
        write_trace(os.path.join(self.dir, "c4pc4pc4pc4pc4p0.r0.c4t"), 0, 2, evs, names=names, tag="c4pc4pc4pc4pc4p0")
        names, ids = names_table(self.PLAN, self.PATH_D, self.PATH_E, "weights 0.90 1.00")
        evs = [plan_ev(fmt.PLAN_PLAN, 0, ids[self.PLAN]), op(2000, 2 * s - 2000, 64 << 20, 0),
               plan_ev(fmt.PLAN_LANE_SAMPLE, 0, ids[self.PATH_E], 2 * s, 20_000_000, peer=0, lane=1),
               plan_ev(fmt.PLAN_LANE_SAMPLE, s // 2, ids[self.PATH_D], s + s // 2, 300_000_000, peer=0, lane=0),
               plan_ev(fmt.PLAN_WEIGHTS, s + s // 5, ids["weights 0.90 1.00"], peer=0)]
        write_trace(os.path.join(self.dir, "c4pc4pc4pc4pc4p0.r1.c4t"), 1, 2, evs, names=names, tag="c4pc4pc4pc4pc4p0",
                    skew_ns=3_000_000_000)

    def test_c4p_link_load_and_plan_events(self):
        self.make_c4p_run()
        out = os.path.join(self.dir, "rep.html")
        rc, so, se = run_tool("report", self.dir, "-o", out, "--json", "--csv")
        self.assertEqual(rc, 0, se)
        c4p = load_json(os.path.join(self.dir, "rep.json"))["c4p"]
        # 2 s of run: 50 ms buckets (the minimum), from the run's first event (t = 0) to its last (t = 2 s).
        self.assertEqual(c4p["bucket_ns"], 50_000_000)
        self.assertEqual(c4p["buckets"], 41)
        self.assertEqual(c4p["lane_samples"], 5)
        self.assertEqual(c4p["sample_bytes"], 510_000_000)
        links = {l["link"]: l for l in c4p["links"]}
        self.assertEqual(set(links), {"h0p0->leaf0", "leaf0->spine1", "spine1->leaf1", "leaf1->h1p0", "h0p1->leaf0",
                                      "leaf0->spine0", "spine0->leaf1", "leaf1->h1p1", "h2p0->leaf0", "h2p1->leaf0",
                                      "leaf0->h0p1"})
        # Switch-to-switch links first, each group by mean load.
        self.assertEqual([l["link"] for l in c4p["links"]][:4], ["leaf0->spine1", "spine1->leaf1", "leaf0->spine0",
                                                                 "spine0->leaf1"])
        self.assertEqual({k for k, l in links.items() if l["fabric"]}, {"leaf0->spine1", "spine1->leaf1",
                                                                         "leaf0->spine0", "spine0->leaf1"})

        def expect(name, pieces):
            """pieces: (first bucket, last bucket + 1, GB/s), 0 elsewhere, None (null) in the last bucket, [2, 2.05 s),
            which no rank's samples cover."""
            want = [0.0] * 40 + [None]
            for a, b, v in pieces:
                for k in range(a, b):
                    want[k] += v
            got = links[name]["GBps"]
            self.assertEqual(len(got), 41, name)
            for k in range(41):
                if want[k] is None:
                    self.assertIsNone(got[k], "%s bucket %d: %r" % (name, k, got))
                else:
                    self.assertAlmostEqual(got[k], want[k], places=9, msg="%s bucket %d: %r" % (name, k, got))
        # 100 MB over [0, 1 s] is 0.1 GB/s on each of PATH_A's 4 links, then 50 MB over [1, 2 s] 0.05 GB/s; rank 1's
        # 300 MB over [0.5, 1.5 s] (0.3 GB/s) adds up with them on the 3 links the paths share.
        a_only = [(0, 20, 0.1), (20, 40, 0.05)]
        expect("h0p0->leaf0", a_only)
        for name in ("leaf0->spine1", "spine1->leaf1", "leaf1->h1p0"):
            expect(name, a_only + [(10, 30, 0.3)])
        expect("h2p0->leaf0", [(10, 30, 0.3)])
        expect("leaf0->h0p1", [(0, 40, 0.01)])
        for name in ("h0p1->leaf0", "leaf0->spine0", "spine0->leaf1", "leaf1->h1p1"):
            expect(name, [(0, 40, 0.02)])
        self.assertAlmostEqual(links["leaf0->spine1"]["mean_GBps"], 0.225, places=7)  # 450 MB in the 2 s sampled
        self.assertAlmostEqual(links["leaf0->spine1"]["peak_GBps"], 0.4, places=7)
        self.assertEqual(links["leaf0->spine1"]["bytes"], 450_000_000)
        self.assertAlmostEqual(links["h2p0->leaf0"]["mean_GBps"], 0.15, places=7)
        # Plan events: the plan once for both ranks, a re-plan, two weight changes, on the aligned clock.
        self.assertEqual(c4p["plans"], [{"text": self.PLAN, "t_ns": c4p["plans"][0]["t_ns"], "ranks": [0, 1],
                                         "comms": ["c4pc4pc4pc4pc4p0"]}])
        self.assertEqual((c4p["replans"], c4p["weight_changes"]), (1, 2))
        evs = [(e["kind"], e["rank"], e["peer"], e["text"]) for e in c4p["events"]]
        self.assertEqual(evs[2:], [("weights", 0, 1, "weights 1.00 0.50"), ("weights", 1, 0, "weights 0.90 1.00"),
                                   ("replan", 0, 1, self.REPLAN)])
        self.assertEqual(c4p["events"][-1]["lane"], 2)
        self.assertAlmostEqual((c4p["events"][3]["t_ns"] - c4p["t0_ns"]) / 1e9, 1.2, places=6)  # rank 1, skew undone
        # The text summary.
        self.assertIn("\nC4P (lane planning", so)
        self.assertEqual(so.count(self.PLAN), 1)
        self.assertIn(self.PLAN + "  (ranks 0-1)", so)
        self.assertIn("  re-plans: 1\n    +1.500 s rank 0 -> peer 1 lane 2: " + self.REPLAN + "\n", so)
        self.assertIn("  weight changes: 2\n    +1.000 s rank 0 -> peer 1: weights 1.00 0.50\n"
                      "    +1.200 s rank 1 -> peer 0: weights 0.90 1.00\n", so)
        self.assertRegex(so, r"\n    leaf0->spine1 +switch mean +0\.225  peak +0\.400 ")
        self.assertRegex(so, r"\n    h2p0->leaf0 +host +mean +0\.150  peak +0\.300 ")
        # The HTML report: the section, one line per group of links with the same load (5), the marks, the table.
        html = read_text(out)
        self.assertIn("<h2 id=\"c4p\">C4P: per-link load over time</h2>", html)
        self.assertEqual(html.count("<svg"), html.count("</svg>"))
        self.assertEqual(html.count('class="c4p-link"'), 5)
        self.assertEqual(html.count('class="c4p-replan"'), 1)
        self.assertEqual(html.count('class="c4p-weights"'), 2)
        self.assertIn("leaf0->spine1, spine1->leaf1 (+1 alike)", html.replace("&gt;", ">"))
        self.assertIn(self.REPLAN.replace(">", "&gt;"), html)
        self.assertNotIn("<script", html)
        # CSV: GB/s per link and bucket; the plan events.
        with open(os.path.join(self.dir, "rep-csv", "c4p_link_load.csv")) as f:
            rows = list(csv.reader(f))
        self.assertEqual(rows[0][:3], ["t_s", "leaf0->spine1", "spine1->leaf1"])
        self.assertEqual(len(rows), 42)
        self.assertEqual(rows[11][0], "0.5")
        self.assertAlmostEqual(float(rows[11][1]), 0.4, places=5)
        self.assertEqual(rows[41][1], "")  # [2, 2.05 s): not sampled
        with open(os.path.join(self.dir, "rep-csv", "c4p_events.csv")) as f:
            self.assertEqual([r[3] for r in csv.reader(f)], ["event", "plan", "plan", "weights", "weights", "replan"])
        # Chrome export: a slice per lane sample, the plan events as instants.
        rc, so, se = run_tool("export", self.dir, "-o", os.path.join(self.dir, "t.json"))
        self.assertEqual(rc, 0, se)
        tr = [e for e in load_json(os.path.join(self.dir, "t.json"))["traceEvents"] if e.get("cat") == "c4p"]
        samples = [e for e in tr if e["ph"] == "X"]
        self.assertEqual(len(samples), 5)
        self.assertIn(self.PATH_D, [e["args"]["path"] for e in samples])
        self.assertEqual(sorted(e["name"] for e in tr if e["ph"] == "i"),
                         ["C4P plan", "C4P plan", "C4P replan", "C4P weights", "C4P weights"])

    def test_c4p_buckets(self):
        self.assertEqual(analysis.bucket_width(2_000_000_000), 50_000_000)
        self.assertEqual(analysis.bucket_width(26_100_000_000), 250_000_000)
        self.assertEqual(analysis.bucket_width(180_000_000_000), 2_000_000_000)
        self.assertEqual(analysis.path_links("a -> b -> c"), [("a", "b"), ("b", "c")])
        self.assertEqual(analysis.path_links("a"), [])
        # An instant sample counts in its bucket; a window is spread by its overlap with each bucket.
        self.assertEqual(analysis.spread(120, 120, 10, 0, 100, 5), [(1, 10.0)])
        self.assertEqual(analysis.spread(50, 250, 200, 0, 100, 5), [(0, 50.0), (1, 100.0), (2, 50.0)])
        self.assertEqual(analysis.spread(100, 200, 100, 0, 100, 5), [(1, 100.0)])
        # Each sender's bytes in a bucket over the part of the bucket its sampled span covers; None where a sender of
        # the link was not sampled. r0 covers [0, 100), r1 [50, 150); r2 has only an instant sample (at 120).
        ab, bc, cd = ("a", "b"), ("b", "c"), ("c", "d")
        rates, totals, n = analysis.link_load([(0, 100, 100, [ab], "r0"), (50, 150, 100, [ab, bc], "r1"),
                                               (0, 100, 30, [cd], "r0"), (120, 120, 40, [bc], "r2")], 0, 150, 100)
        self.assertEqual(n, 2)
        self.assertEqual(rates, {ab: [1.0 + 1.0, None], bc: [1.0, 1.0 + 0.4], cd: [0.3, None]})
        self.assertEqual(totals, {ab: 200, bc: 140, cd: 30})
        rates, totals, n = analysis.link_load([(0, 100, 100, [ab], "r0"), (100, 200, 50, [bc], "r1")], 0, 300, 100)
        self.assertEqual(rates, {ab: [1.0, None, None, None], bc: [None, 0.5, None, None]})

    def test_no_c4p_section_without_plan_events(self):
        self.make_run()
        out = os.path.join(self.dir, "rep.html")
        rc, so, se = run_tool("report", self.dir, "-o", out, "--json", "--csv")
        self.assertEqual(rc, 0, se)
        self.assertNotIn("C4P", so)
        self.assertNotIn("C4P", read_text(out))
        self.assertNotIn("c4p", load_json(os.path.join(self.dir, "rep.json")))
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, "rep-csv"))),
                         sorted(n + ".csv" for n in ("collectives", "sizes", "bandwidth", "traffic", "waits",
                                                     "step_waits", "late")))

    def test_bad_input(self):
        rc, so, se = run_tool("summary", os.path.join(self.dir, "missing"))
        self.assertEqual(rc, 2)
        self.assertIn("no such trace directory", se)
        write_bytes(os.path.join(self.dir, "junk.r0.c4t"), b"x" * 400)
        rc, so, se = run_tool("summary", self.dir)
        self.assertEqual(rc, 2)  # nothing readable is left
        self.assertIn("no readable", se)

    def test_malformed_headers_are_trace_format_errors(self):
        # What fuzzing the reader turned up (tests/fuzz/trace_fuzz.py, docs/fuzzing.md): each is rejected with
        # fmt.TraceFormatError, a ValueError c4-trace prints in one line, or read; never another exception or a hang.
        path = os.path.join(self.dir, "t.r0.c4t")
        write_trace(path, 0, 2, [op(0, 1000, 64, 0)])
        good = read_bytes(path)
        fields = list(fmt.HEADER.unpack_from(good, 0))

        def with_fields(**kw):
            names = ["magic", "version", "hbytes", "ebytes", "rank", "nranks", "pid", "level", "reason", "first_index",
                     "n_events", "valid_from", "total_events", "at0", "an0", "at1", "an1", "tpn"]
            f = list(fields)
            for k, v in kw.items():
                f[names.index(k)] = v
            return fmt.HEADER.pack(*f) + good[fmt.HEADER.size:]

        # A clock of 5e-324 ticks/ns made times infinite: OverflowError.
        with self.assertRaises(fmt.TraceFormatError):
            fmt.TraceFile(path, with_fields(tpn=5e-324, an1=fields[14]))
        with self.assertRaises(fmt.TraceFormatError):
            fmt.TraceFile(path, with_fields(rank=2))
        with self.assertRaises(fmt.TraceFormatError):
            fmt.TraceFile(path, with_fields(n_events=1 << 60))
        with self.assertRaises(fmt.TraceFormatError):
            fmt.TraceFile(path, good[:100])
        # 2^31 - 1 ranks: load walked every missing one (a hang); now it names the first 16.
        write_bytes(path, with_fields(nranks=2**31 - 1))
        start = time.time()
        run = analysis.load(self.dir)
        self.assertLess(time.time() - start, 5)
        self.assertTrue(any("no file for rank(s) 1,2,3" in w for w in run.warnings), run.warnings)

    DEAD = dict(kind="dead_rank", reporter=0, ranks=[2], hosts=["h3"])
    STRAGGLER = dict(kind="noncomm_slow", reporter=0, ranks=[3], hosts=["h4"], seq=40, late_ms=250.4, confidence=0.9,
                     summary="rank 3 (host h4) is a straggler: it arrived last at 12 of the last 12 collectives",
                     evidence="collectives seq 29..40; arrival times from the heartbeats; threshold 100 ms")

    def write_diag_lines(self, path, lines):
        with open(path, "w") as f:
            f.write("".join(l + "\n" for l in lines))

    def test_c4d_explain_json_lines(self):
        # The dead rank's diagnosis as ranks 0 (its reporter), 1 and 3 wrote it, a little later each; a straggler found
        # earlier by rank 0 alone; malformed lines between them.
        t = 1_795_949_400_123_000_000
        dead = [json.dumps(c4d_record(rank=r, time_ns=t + k * 1_000_000, **self.DEAD)) for k, r in enumerate((0, 1, 3))]
        slow = json.dumps(c4d_record(rank=0, time_ns=t - 60_000_000_000, **self.STRAGGLER))
        bad = ["{not json", '{"c4d": 1}', '{"foo": 1}', json.dumps(c4d_record(rank=1, ranks=["2"], kind="dead_rank"))]
        path = os.path.join(self.dir, "diag.jsonl")
        self.write_diag_lines(path, [dead[1], bad[0], slow, "", dead[2], bad[1], dead[0], bad[2], bad[3]])
        rc, so, se = run_tool("explain", path)
        self.assertEqual(rc, 0, se)
        self.assertIn("4 malformed line(s) ignored (line 2, 6, 8, 9)", se)
        text = words(so)
        self.assertTrue(text.startswith("2 C4D diagnoses (from 4 records"), so)
        self.assertEqual(so.count("Rank 2 (host h3) died"), 1)  # deduplicated
        self.assertIn("Diagnosed by rank 0; recorded by ranks 0-1,3.", text)
        self.assertIn("Confidence: 95% (class dead_rank)", text)
        self.assertIn("What c4comm saw: rank 2 died (process gone).", text)
        self.assertIn("Evidence: rank 2 (host h3, pid 4711): its side-channel link closed.", text)
        self.assertIn("system log of host h3", text)
        self.assertIn("ncclCommShrink, excluding rank 2 ", text)
        self.assertIn("Rank 3 (host h4) is a straggler, arriving 250 ms late", text)
        self.assertIn("the load of host h4", text)
        self.assertLess(so.index("straggler"), so.index("died"))  # by time
        self.assertNotIn("ncclCommShrink, excluding rank 3", text)  # a straggler is no reason to shrink
        rc, so, se = run_tool("explain", path, "--json")
        self.assertEqual(rc, 0, se)
        recs = json.loads(so)
        self.assertEqual([r["class"] for r in recs], ["noncomm_slow", "dead_rank"])
        self.assertEqual(recs[1]["seen_by"], [0, 1, 3])
        self.assertEqual((recs[1]["time_ns"], recs[1]["rank"]), (t, 0))  # the earliest copy
        self.assertEqual(recs[0]["seen_by"], [0])
        # One file per rank in a directory (C4_DIAG_FILE=dir/diag.r%r.jsonl): the same two diagnoses.
        d = os.path.join(self.dir, "diag")
        os.mkdir(d)
        for k, r in enumerate((0, 1, 3)):
            self.write_diag_lines(os.path.join(d, "diag.r%d.jsonl" % r), [dead[k]] + ([slow] if r == 0 else []))
        rc, so2, se = run_tool("explain", d, "--json")
        self.assertEqual(rc, 0, se)
        self.assertEqual(json.loads(so2), recs)
        self.assertEqual(se, "")
        # The same diagnosis about another collective, or from another reporter, is another diagnosis.
        other = [c4d_record(rank=1, seq=6, **self.DEAD), c4d_record(rank=1, **dict(self.DEAD, reporter=1))]
        self.write_diag_lines(os.path.join(d, "diag.r1.jsonl"), [dead[1]] + [json.dumps(r) for r in other])
        rc, so, se = run_tool("explain", d, "--json")
        self.assertEqual(len(json.loads(so)), 4)

    def test_c4d_in_trace(self):
        # 3 ranks recorded the same comm_hang (rank 1 diagnosed it) as notes "C4D {...}" (longer than 256 bytes),
        # next to a plain note; rank 0 also a malformed record and one cut at the name table's 255 bytes.
        t = 1_795_949_400_000_000_000
        hang = dict(kind="comm_hang", reporter=1, ranks=[0, 1], hosts=["host0", "host1"], links=[[0, 1]], seq=7,
                    nranks=3, confidence=0.9, summary="every rank entered AllReduce seq 7 count 1024 float sum, and no "
                    "data moves on the link between rank 0 (host host0) and rank 1 (host host1)",
                    evidence="this rank (1) waits in AllReduce seq 7 count 1024 float sum on rank 0; rank 0: in "
                    "collective seq 7 for 12.0 s, stalled 12.0 s waiting on rank 1; connection to rank 0: 2 lanes; "
                    "lane 0 10.0.0.2:5000 -> 10.0.0.1:6000 has data in flight")
        cut = ("C4D " + json.dumps(c4d_record(rank=0, **self.DEAD)))[:255]
        for r in range(3):
            rec = "C4D " + json.dumps(c4d_record(rank=r, time_ns=t + r * 1000, **hang))
            self.assertGreater(len(rec), 300)
            texts = [rec, "hello from rank %d" % r] + (["C4D {broken", cut] if r == 0 else [])
            names, ids = names_table(*texts)
            evs = [op(0, 1000, 64, 0), op(2000, 1000, 64, 1)] + [diag_ev(5000 + k, ids[x]) for k, x in enumerate(texts)]
            write_trace(os.path.join(self.dir, "feedfacecafebeef.r%d.c4t" % r), r, 3, evs, names=names)
        rc, so, se = run_tool("explain", self.dir)
        self.assertEqual(rc, 0, se)
        text = words(so)
        self.assertTrue(text.startswith("1 C4D diagnosis (from 3 records"), so)
        self.assertIn("The network between rank 0 (host host0) and rank 1 (host host1) stopped moving data: every "
                      "rank is inside collective #7", text)
        self.assertIn("Diagnosed by rank 1; recorded by ranks 0-2.", text)
        self.assertIn("has data in flight.", text)  # the whole evidence, past the first 256 bytes
        self.assertIn("switch ports of hosts host0 and host1", text)
        self.assertIn("excluding ranks 0 and 1", text)
        self.assertIn("2 malformed C4D record(s) in the trace ignored (1 cut at 255 bytes", se)
        # The trace and a C4_DIAG_FILE of the same run: still one diagnosis, seen by every rank that wrote it.
        path = os.path.join(self.dir, "diag.jsonl")
        self.write_diag_lines(path, [json.dumps(c4d_record(rank=r, time_ns=t + r, **hang)) for r in (1, 2)])
        rc, so, se = run_tool("explain", os.path.join(self.dir, "feedfacecafebeef.r0.c4t"), path, "--json")
        self.assertEqual(rc, 0, se)
        recs = json.loads(so)
        self.assertEqual(len(recs), 1)
        self.assertEqual((recs[0]["seen_by"], recs[0]["time_ns"]), ([0, 1, 2], t))
        # summary and report: a C4D section; the records are no notes; the malformed ones stay notes, with a warning.
        os.remove(path)
        out = os.path.join(self.dir, "rep.html")
        rc, so, se = run_tool("report", self.dir, "-o", out, "--json")
        self.assertEqual(rc, 0, se)
        self.assertIn("\nC4D diagnoses (the health checks", so)
        self.assertRegex(so, r"\n  2026-11-25T10:50:00\.000Z +comm_hang +90% +1  0-2 +ranks 0-1 "
                             r"\(hosts host0, host1\), link 0->1\n      every rank entered AllReduce seq 7")
        self.assertIn("note rank 0: hello from rank 0", so)
        self.assertIn("note rank 0: C4D {broken", so)
        self.assertNotIn("note rank 1: C4D", so)
        self.assertIn("warning: 2 malformed C4D record(s) in the trace ignored", so)
        rep = load_json(os.path.join(self.dir, "rep.json"))
        self.assertEqual(len(rep["c4d"]), 1)
        self.assertEqual(rep["c4d"][0]["seen_by"], [0, 1, 2])
        self.assertEqual(rep["c4d"][0]["culprit"]["links"], [[0, 1]])
        self.assertEqual(len(rep["notes"]), 5)  # 3 plain notes, 2 malformed records
        html = read_text(out)
        self.assertIn('<h2 id="c4d">C4D diagnoses</h2>', html)
        self.assertIn("<td>comm_hang</td>", html)
        self.assertIn("<td>ranks 0-1 (hosts host0, host1), link 0-&gt;1</td>", html)
        self.assertIn("<td>90%</td><td>1</td><td>0-2</td>", html)
        self.assertEqual(html.count("<svg"), html.count("</svg>"))
        # Chrome export: each rank's copy an instant named after its class, with the record.
        rc, so, se = run_tool("export", self.dir, "-o", os.path.join(self.dir, "t.json"))
        self.assertEqual(rc, 0, se)
        tr = [e for e in load_json(os.path.join(self.dir, "t.json"))["traceEvents"] if e.get("cat") == "c4d"]
        self.assertEqual([(e["name"], e["pid"], e["args"]["rank"]) for e in tr],
                         [("C4D comm_hang", r, r) for r in range(3)])

    def test_no_c4d_section_without_records(self):
        self.make_run()
        out = os.path.join(self.dir, "rep.html")
        rc, so, se = run_tool("report", self.dir, "-o", out, "--json")
        self.assertEqual(rc, 0, se)
        self.assertNotIn("C4D", so)
        self.assertNotIn("C4D", read_text(out))
        self.assertNotIn("c4d", load_json(os.path.join(self.dir, "rep.json")))
        rc, so, se = run_tool("explain", self.dir)
        self.assertEqual((rc, so), (0, "no C4D diagnoses\n"), se)
        rc, so, se = run_tool("explain", self.dir, "--json")
        self.assertEqual((rc, json.loads(so)), (0, []), se)
        empty = os.path.join(self.dir, "empty.jsonl")
        self.write_diag_lines(empty, [])
        rc, so, se = run_tool("explain", empty)
        self.assertEqual((rc, so, se), (0, "no C4D diagnoses\n", ""))

    def test_c4d_explain_missing_path(self):
        path = os.path.join(self.dir, "diag.jsonl")
        self.write_diag_lines(path, [json.dumps(c4d_record(rank=0, **self.DEAD))])
        for args in ([os.path.join(self.dir, "missing")], [path, os.path.join(self.dir, "missing.jsonl")]):
            rc, so, se = run_tool("explain", *args)
            self.assertEqual(rc, 2, args)
            self.assertEqual(so, "")
            self.assertIn("missing", se)
            self.assertIn("no such file or directory", se)

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
