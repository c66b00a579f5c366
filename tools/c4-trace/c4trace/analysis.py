"""Merging the ranks of a run and computing the report's tables."""
import collections
import itertools
import json
import math
import os

from . import fmt


def busbw_factor(coll, n):
    """nccl-tests' bus-bandwidth factors."""
    name = fmt.coll_name(coll)
    if n <= 1:
        return 1.0
    if name == "AllReduce":
        return 2.0 * (n - 1) / n
    if name in ("AllGather", "ReduceScatter", "AlltoAll", "Gather", "Scatter"):
        return (n - 1) / n
    return 1.0


def size_bucket(nbytes):
    """Power-of-two bucket: the largest 2^k <= nbytes (0 for 0)."""
    return 0 if nbytes <= 0 else 1 << (nbytes.bit_length() - 1)


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.3g %s" % (n, unit))
        n /= 1024.0
    return str(n)


def human_ns(ns):
    if ns < 1e3:
        return "%.0f ns" % ns
    if ns < 1e6:
        return "%.3g us" % (ns / 1e3)
    if ns < 1e9:
        return "%.3g ms" % (ns / 1e6)
    return "%.3g s" % (ns / 1e9)


def percentile(sorted_vals, q):
    if not sorted_vals:
        return 0.0
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


class Comm:
    """The merged ranks of one communicator."""

    def __init__(self, tag):
        self.tag = tag
        self.name = ""
        self.nranks = 0
        self.files = {}  # rank -> TraceFile
        self.events = {}  # rank -> [event tuples]


class Run:
    def __init__(self):
        self.comms = {}  # tag -> Comm
        self.n_events = 0
        self.warnings = []


def load(root, progress=None):
    """Reads every .c4t under root; events converted to ns on rank 0's clock of their communicator."""
    paths = fmt.find_files(root)
    if not paths:
        raise FileNotFoundError("%s: no .c4t trace files" % root)
    files = []
    total = 0
    for p in paths:
        try:
            f = fmt.TraceFile(p)
        except (ValueError, OSError) as e:
            files.append(str(e))  # reported as a warning below
            continue
        files.append(f)
        total += f.n_events
    if not any(isinstance(f, fmt.TraceFile) for f in files):
        raise ValueError("%s: no readable c4comm trace files (%s)" % (root, "; ".join(files[:3])))
    if progress is None:
        progress = total > 200_000 and os.isatty(2)
    return merge(files, progress)


def merge(files, progress=False):
    """The run of `files`: TraceFile objects, or the message of a file that could not be read (a warning)."""
    total = sum(f.n_events for f in files if isinstance(f, fmt.TraceFile))
    bar = fmt.Progress(total, "merging %d files" % len(files), progress)
    run = Run()
    for f in files:
        if isinstance(f, str):
            run.warnings.append("skipped " + f)
            continue
        c = run.comms.setdefault(f.tag, Comm(f.tag))
        c.name = c.name or f.name
        c.nranks = max(c.nranks, f.nranks)
        if f.rank in c.files:
            run.warnings.append("%s: rank %d appears twice (kept %s)" % (f.path, f.rank, c.files[f.rank].path))
            continue
        c.files[f.rank] = f
        ev = f.events()
        c.events[f.rank] = ev
        run.n_events += len(ev)
        if f.dropped:
            run.warnings.append("comm %s rank %d: %d older events were overwritten (raise C4_TRACE_BUFFER)" %
                                (f.tag, f.rank, f.dropped))
        bar.add(f.n_events)
    bar.close()
    for c in run.comms.values():
        # The first 16 missing ranks, without walking all of them (a file may claim 2^31 - 1 ranks).
        missing = list(itertools.islice((r for r in range(c.nranks) if r not in c.files), 16))
        if missing:
            run.warnings.append("comm %s: no file for rank(s) %s" % (c.tag, ",".join(map(str, missing))))
        fill_untimed_ends(c)
    return run


def fill_untimed_ends(c):
    """Ops recorded without an end (FLAG_NO_END: one-shot calls) end when the last rank arrived."""
    last = {}  # (coll, seq) -> latest t0 over the ranks
    for evs in c.events.values():
        for e in evs:
            if e[5] == fmt.T_OP and e[11] & fmt.FLAG_NO_END:
                k = (e[6], e[3])
                if e[0] > last.get(k, e[0] - 1):
                    last[k] = e[0]
    if not last:
        return
    for rank, evs in c.events.items():
        c.events[rank] = [e if not (e[5] == fmt.T_OP and e[11] & fmt.FLAG_NO_END) else
                          (e[0], max(e[1], last[(e[6], e[3])])) + tuple(e[2:]) for e in evs]


def analyze(run, top=10):
    """Everything the report shows, as plain data (JSON-ready)."""
    colls = collections.OrderedDict()  # name -> stats
    sizes = collections.defaultdict(lambda: collections.Counter())  # coll -> bucket -> count
    bw = collections.defaultdict(list)  # coll -> [(bytes, algbw GB/s, busbw GB/s)]
    matrix = {}  # tag -> {(src, dst): bytes}
    waits = collections.defaultdict(lambda: [0, 0, 0])  # (tag, waiter, waited_on) -> [total ns, count, max]
    step_waits = collections.defaultdict(lambda: [0, 0, 0])
    late = collections.defaultdict(lambda: [0, 0, 0])  # (tag, rank) -> [times last, total lateness ns, ops]
    errors, notes, spans = [], [], collections.defaultdict(lambda: [0, 0])
    plan_events, lane_samples = [], []  # C4P (T_PLAN)
    c4d, c4d_bad, c4d_cut = [], 0, 0  # C4D records (T_DIAG "C4D {...}"): (record, rank), malformed, cut short
    total_time = 0
    t_min, t_max = None, None
    level = 0
    for c in run.comms.values():
        n = max(c.nranks, 1)
        mat = collections.Counter()
        by_seq = collections.defaultdict(dict)  # (coll, seq) -> rank -> (t0, t1, bytes)
        for rank, evs in c.events.items():
            level = max(level, c.files[rank].level)
            f = c.files[rank]
            paths = {}  # name id -> the links of a lane sample's path
            for e in evs:
                t0, t1, nbytes, seq, peer, typ, coll = e[0], e[1], e[2], e[3], e[4], e[5], e[6]
                if t_min is None or t0 < t_min:
                    t_min = t0
                if t_max is None or t1 > t_max:
                    t_max = t1
                if typ == fmt.T_OP and e[11] & fmt.FLAG_OPEN:
                    # Began and never ended before the file was written: where the rank was (a hang?).
                    notes.append({"comm": c.tag, "rank": rank, "t_ns": t0, "text": "in %s seq %d (%d bytes) when "
                                  "the trace was written: it never ended" % (fmt.coll_name(coll), seq, nbytes)})
                elif typ == fmt.T_OP:
                    name = fmt.coll_name(coll)
                    s = colls.get(name)
                    if s is None:
                        s = colls[name] = {"count": 0, "bytes": 0, "time_ns": 0, "ranks": set(), "algos":
                                           collections.Counter()}
                    s["count"] += 1
                    s["bytes"] += nbytes
                    s["time_ns"] += t1 - t0
                    s["ranks"].add((c.tag, rank))
                    s["algos"][fmt.ALGOS.get(e[9], "algo%d" % e[9])] += 1
                    total_time += t1 - t0
                    sizes[name][size_bucket(nbytes)] += 1
                    if name == "Send":
                        mat[(rank, peer)] += nbytes
                    if name not in ("Send", "Recv"):
                        by_seq[(coll, seq)][rank] = (t0, t1, nbytes)
                    elif nbytes and t1 > t0:
                        bw[name].append((nbytes, nbytes / (t1 - t0), nbytes / (t1 - t0)))
                elif typ == fmt.T_STEP:
                    kind = e[8]
                    if kind == 0 and peer >= 0 and coll not in (8, 9):  # collective sends (p2p counted above)
                        mat[(rank, peer)] += nbytes
                    if kind in (1, 2) and peer >= 0:
                        w = step_waits[(c.tag, rank, peer)]
                        w[0] += t1 - t0
                        w[1] += 1
                        w[2] = max(w[2], t1 - t0)
                elif typ == fmt.T_ERROR:
                    errors.append({"comm": c.tag, "rank": rank, "t_ns": t0, "code": nbytes, "message":
                                   f.name_of(seq)})
                elif typ == fmt.T_DIAG:
                    text = f.name_of(seq)
                    rec, is_c4d = c4d_from_note(text)
                    if rec is not None:  # a C4D diagnosis: its own section, not a note
                        c4d.append((rec, rank))
                        continue
                    if is_c4d:
                        c4d_bad += 1
                        c4d_cut += len(text.encode("utf-8")) >= NAME_MAX
                    notes.append({"comm": c.tag, "rank": rank, "t_ns": t0, "text": text})
                elif typ == fmt.T_SPAN:
                    sp = spans[f.name_of(seq)]
                    sp[0] += 1
                    sp[1] += t1 - t0
                elif typ == fmt.T_PLAN:
                    if e[8] == fmt.PLAN_LANE_SAMPLE:
                        links = paths.get(seq)
                        if links is None:
                            links = paths[seq] = path_links(f.name_of(seq))
                        lane_samples.append((t0, t1, nbytes, links, (c.tag, rank)))
                    else:
                        plan_events.append({"comm": c.tag, "rank": rank, "t_ns": t0, "kind": fmt.plan_kind(e[8]),
                                            "peer": peer, "lane": e[12], "text": f.name_of(seq)})
        matrix[c.tag] = mat
        # Per collective instance: late arrivals and achieved bandwidth.
        for (coll, seq), per in by_seq.items():
            if len(per) < 2 and n > 1:
                continue
            starts = sorted((v[0], r) for r, v in per.items())
            last_t, last_r = starts[-1]
            first_t = starts[0][0]
            end = max(v[1] for v in per.values())
            nbytes = max(v[2] for v in per.values())
            if len(per) > 1:
                if last_t > first_t:  # a tie has no latecomer
                    late[(c.tag, last_r)][0] += 1
                for t, r in starts:
                    x = late[(c.tag, r)]
                    x[1] += t - first_t
                    x[2] += 1
                    if r != last_r and last_t > t:
                        w = waits[(c.tag, r, last_r)]
                        w[0] += last_t - t
                        w[1] += 1
                        w[2] = max(w[2], last_t - t)
            # Time from the last arrival to the end: the transfer itself, as a benchmark sees it.
            dur = end - last_t if len(per) > 1 else end - first_t
            if nbytes and dur > 0:
                alg = nbytes / dur
                bw[fmt.coll_name(coll)].append((nbytes, alg, alg * busbw_factor(coll, n)))

    coll_rows = []
    for name, s in sorted(colls.items(), key=lambda kv: -kv[1]["time_ns"]):
        nr = max(1, len(s["ranks"]))
        coll_rows.append({"collective": name, "count": s["count"] // nr if s["count"] >= nr else s["count"],
                          "calls_all_ranks": s["count"], "bytes_per_rank": s["bytes"] // nr,
                          "time_ns_per_rank": s["time_ns"] // nr,
                          "time_share": (s["time_ns"] / total_time) if total_time else 0.0,
                          "algorithms": dict(s["algos"])})
    size_rows = []
    for name in sorted(sizes):
        for b in sorted(sizes[name]):
            size_rows.append({"collective": name, "bucket_bytes": b, "count": sizes[name][b]})
    bw_rows = []
    for name in sorted(bw):
        by_bucket = collections.defaultdict(list)
        for nbytes, alg, bus in bw[name]:
            by_bucket[size_bucket(nbytes)].append((alg, bus))
        for b in sorted(by_bucket):
            algs = sorted(a for a, _ in by_bucket[b])
            buss = sorted(x for _, x in by_bucket[b])
            bw_rows.append({"collective": name, "bucket_bytes": b, "samples": len(algs),
                            "algbw_p50_GBps": percentile(algs, 0.5), "busbw_p10_GBps": percentile(buss, 0.1),
                            "busbw_p50_GBps": percentile(buss, 0.5), "busbw_p90_GBps": percentile(buss, 0.9)})
    mat_rows = []
    for tag, mat in matrix.items():
        for (s, d), b in sorted(mat.items()):
            mat_rows.append({"comm": tag, "src": s, "dst": d, "bytes": b})
    wait_rows = sorted(({"comm": k[0], "waiter": k[1], "waited_on": k[2], "total_ns": v[0], "count": v[1],
                         "max_ns": v[2]} for k, v in waits.items()), key=lambda r: -r["total_ns"])
    step_wait_rows = sorted(({"comm": k[0], "rank": k[1], "peer": k[2], "blocked_ns": v[0], "receives": v[1],
                              "max_ns": v[2]} for k, v in step_waits.items()), key=lambda r: -r["blocked_ns"])
    late_rows = sorted(({"comm": k[0], "rank": k[1], "times_last": v[0], "ops": v[2],
                         "mean_lateness_ns": (v[1] / v[2]) if v[2] else 0.0} for k, v in late.items()),
                       key=lambda r: (-r["mean_lateness_ns"], -r["times_last"]))
    comms = [{"tag": c.tag, "name": c.name, "nranks": c.nranks, "ranks_found": len(c.files),
              "events": sum(len(v) for v in c.events.values()),
              "clock": {str(r): [{"offset_ns": o, "rtt_ns": rt, "at_ns": a} for o, rt, a in f.clock]
                        for r, f in sorted(c.files.items())}} for c in run.comms.values()]
    rep = {
        "comms": comms, "events": run.n_events, "level": fmt.LEVELS[min(level, 2)],
        "span_ns": (t_max - t_min) if t_min is not None else 0, "t_min_ns": t_min or 0,
        "collectives": coll_rows, "sizes": size_rows, "bandwidth": bw_rows, "traffic": mat_rows,
        "waits": wait_rows[:top * 5], "step_waits": step_wait_rows[:top * 5], "late": late_rows,
        "errors": errors[:100], "notes": notes[:100],
        "spans": [{"name": k, "count": v[0], "total_ns": v[1]} for k, v in sorted(spans.items())],
        "warnings": run.warnings + ([c4d_bad_warning(c4d_bad, c4d_cut, "in the trace")] if c4d_bad else []),
    }
    if c4d:  # only then: reports of runs without C4D diagnoses stay as they were
        rep["c4d"] = dedup_c4d(c4d)
    if plan_events or lane_samples:  # only then: reports of runs without C4P stay as they were
        rep["c4p"] = plan_report(plan_events, lane_samples, t_min, t_max)
    return rep


# ---- C4P: plan events and per-link load over time ----

MIN_BUCKET_NS = 50_000_000
LINK_BUCKETS = 100  # about this many time buckets over the run
PLAN_EVENTS_KEPT = 1000  # re-plans and weight changes each kept in the report (the latest; counts are complete)


def path_links(path):
    """A lane's way "h1p1 -> leaf0 -> spine1 -> leaf1 -> h2p1" -> its directed links [(h1p1, leaf0), ...]."""
    hops = [h.strip() for h in path.split("->")]
    hops = [h for h in hops if h]
    return [(hops[i], hops[i + 1]) for i in range(len(hops) - 1)]


def bucket_width(span_ns, target=LINK_BUCKETS):
    """About span / target, rounded to 1, 2, 2.5 or 5 x 10^k ns, at least MIN_BUCKET_NS."""
    raw = span_ns / float(target)
    if raw <= MIN_BUCKET_NS:
        return MIN_BUCKET_NS
    p = 10.0 ** math.floor(math.log10(raw))
    best = min((m * p for m in (1, 2, 2.5, 5, 10)), key=lambda c: abs(math.log(c / raw)))
    return max(MIN_BUCKET_NS, int(round(best)))


def spread(t0, t1, nbytes, origin, width, n):
    """[(bucket, bytes)]: nbytes spread uniformly over [t0, t1] (all in t0's bucket when t1 <= t0)."""
    def clamp(k):
        return min(max(k, 0), n - 1)
    if t1 <= t0:
        return [(clamp((t0 - origin) // width), float(nbytes))]
    rate = nbytes / float(t1 - t0)
    a, b = t0 - origin, t1 - origin
    out = []
    for k in range(a // width, (b - 1) // width + 1):
        overlap = min(b, (k + 1) * width) - max(a, k * width)
        if overlap > 0:
            out.append((clamp(k), rate * overlap))
    return out


def link_load(samples, origin, end, width):
    """samples: (t0, t1, bytes, links, sender). GB/s per directed link per time bucket [origin + k*width, +width):
    each sample's bytes spread uniformly over its window onto every link of its path, each sender's share divided by
    the part of the bucket within its sampled span (from its first window's start to its last window's end: its
    rebalancer looks at every lane each time and records only lanes that sent something, so a gap inside the span
    is an idle lane, outside it nothing is known), summed over the link's senders; None where a sender of the link
    was not sampled at all (the ends of the run, where the ranks' first and last windows differ).
    -> ({link: [GB/s or None]}, {link: bytes}, number of buckets)"""
    n = max(1, (end - origin) // width + 1)
    span = {}
    for t0, t1, nbytes, links, who in samples:
        a, b = span.get(who, (t0, t1))
        span[who] = (min(a, t0), max(b, t1))
    cover = {}  # sender -> ns of each bucket within its span (none for a sender with instant samples only)
    for who, (a, b) in span.items():
        if b > a:
            cov = [0.0] * n
            for k, x in spread(a, b, b - a, origin, width, n):
                cov[k] += x
            cover[who] = cov
    rates, totals, senders = {}, {}, collections.defaultdict(set)
    for t0, t1, nbytes, links, who in samples:
        if not links or nbytes <= 0:
            continue
        cov = cover.get(who)
        parts = [(k, x / (cov[k] if cov is not None and cov[k] > 0 else width))
                 for k, x in spread(t0, t1, nbytes, origin, width, n)]
        for link in links:
            arr = rates.get(link)
            if arr is None:
                arr = rates[link] = [0.0] * n
                totals[link] = 0
            for k, r in parts:
                arr[k] += r
            totals[link] += nbytes
            senders[link].add(who)
    for link, arr in rates.items():
        covs = [cover[w] for w in senders[link] if w in cover]
        for k in range(n):
            if any(c[k] <= 0 for c in covs):
                arr[k] = None
    return rates, totals, n


def plan_report(plan_events, lane_samples, t_min, t_max):
    """The report's "c4p" part: the plans (once per distinct text), re-plans and weight changes, and the load of
    every directed link per time bucket (GB/s), summed over the ranks (and communicators) that sent over it."""
    plan_events.sort(key=lambda p: (p["t_ns"], p["comm"], p["rank"]))
    plans = collections.OrderedDict()
    for p in plan_events:
        if p["kind"] == "plan":
            x = plans.setdefault(p["text"], {"text": p["text"], "t_ns": p["t_ns"], "ranks": [], "comms": []})
            x["ranks"].append(p["rank"])
            if p["comm"] not in x["comms"]:
                x["comms"].append(p["comm"])
    replans = [p for p in plan_events if p["kind"] == "replan"]
    weights = [p for p in plan_events if p["kind"] == "weights"]
    others = [p for p in plan_events if p["kind"] not in ("plan", "replan", "weights")]
    kept = ([p for p in plan_events if p["kind"] == "plan"] + replans[-PLAN_EVENTS_KEPT:] +
            weights[-PLAN_EVENTS_KEPT:] + others[-PLAN_EVENTS_KEPT:])
    kept.sort(key=lambda p: (p["t_ns"], p["comm"], p["rank"]))
    origin = t_min or 0
    end = max([t_max or 0] + [s[1] for s in lane_samples])
    width = bucket_width(end - origin)
    rates, totals, n = link_load(lane_samples, origin, end, width)
    timed = [s for s in lane_samples if s[3] and s[2] > 0]
    s_from = min((s[0] for s in timed), default=origin)
    s_to = max((s[1] for s in timed), default=origin)
    endpoints = set()  # a path's first and last hops are NIC ports; the hops between them switches
    for s in timed:
        endpoints.add(s[3][0][0])
        endpoints.add(s[3][-1][1])
    links = []
    for (a, b), rate in rates.items():
        total = totals[(a, b)]
        links.append({"link": "%s->%s" % (a, b), "src": a, "dst": b,
                      "fabric": a not in endpoints and b not in endpoints,
                      "bytes": total, "mean_GBps": total / float(s_to - s_from) if s_to > s_from else 0.0,
                      "peak_GBps": max([x for x in rate if x is not None] + [0.0]), "GBps": rate})
    links.sort(key=lambda l: (not l["fabric"], -l["mean_GBps"], -l["peak_GBps"], l["link"]))
    return {"plans": list(plans.values()), "replans": len(replans), "weight_changes": len(weights),
            "events": kept, "lane_samples": len(lane_samples), "sample_bytes": sum(s[2] for s in lane_samples),
            "sampled_from_ns": s_from, "sampled_to_ns": s_to, "t0_ns": origin, "bucket_ns": width, "buckets": n,
            "links": links}


def timeline_sample(run, limit=4000):
    """Op events for the timeline plot: (rank label, t0, t1, coll name), at most `limit` (evenly thinned)."""
    rows = []
    for c in run.comms.values():
        for rank, evs in sorted(c.events.items()):
            label = "r%d" % rank if len(run.comms) == 1 else "%s r%d" % (c.tag[:6], rank)
            for e in evs:
                if e[5] == fmt.T_OP or e[5] == fmt.T_SPAN:
                    rows.append((label, e[0], e[1], fmt.coll_name(e[6]) if e[5] == fmt.T_OP else "span"))
    if len(rows) > limit:
        step = len(rows) / limit
        rows = [rows[int(i * step)] for i in range(limit)]
    return rows


# ---- C4D: the health checks' diagnoses (records in C4_DIAG_FILE and, as notes "C4D {...}", in the trace) ----

C4D_PREFIX = "C4D "
C4D_CLASSES = ("dead_rank", "noncomm_hang", "comm_hang", "comm_slow", "noncomm_slow")
NAME_MAX = 255  # the recorder interns at most this many bytes of a note (libc4comm/trace/recorder.cc)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def parse_c4d(obj):
    """A C4D record (a dict, or its JSON text) checked for the fields c4-trace uses; None when it is not one."""
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except ValueError:
            return None
    if not isinstance(obj, dict) or "c4d" not in obj or not isinstance(obj.get("class"), str):
        return None
    c = obj.get("culprit", {})
    if not isinstance(c, dict):
        return None
    ranks, hosts, links = c.get("ranks", []), c.get("hosts", []), c.get("links", [])
    if not (isinstance(ranks, list) and all(_is_int(r) for r in ranks) and isinstance(hosts, list) and
            isinstance(links, list) and all(isinstance(l, list) and len(l) == 2 and all(_is_int(x) for x in l)
                                            for l in links)):
        return None
    for k in ("rank", "reporter", "seq", "nranks", "time_ns"):
        if k in obj and not _is_int(obj[k]):
            return None
    if "confidence" in obj and not isinstance(obj["confidence"], (int, float)):
        return None
    return obj


def c4d_key(rec):
    """What makes two records the same diagnosis: (comm, class, reporter, culprit ranks, links, seq)."""
    c = rec.get("culprit", {})
    return (str(rec.get("comm", "")), rec["class"], rec.get("reporter"), tuple(sorted(c.get("ranks", []))),
            tuple(sorted(tuple(l) for l in c.get("links", []))), rec.get("seq"))


def c4d_time(rec):
    """Sort key: time_ns (CLOCK_REALTIME), then the ISO time text; records without either last."""
    t = rec.get("time_ns")
    return (t if _is_int(t) else float("inf"), str(rec.get("time", "")))


def dedup_c4d(records):
    """records: [(record, rank that holds it or None)] -> the distinct diagnoses, sorted by time: each the earliest
    copy (every rank that made or learned a diagnosis writes it with its own "rank"), plus "seen_by", the ranks that
    recorded it."""
    merged = collections.OrderedDict()
    for rec, holder in records:
        k = c4d_key(rec)
        m = merged.get(k)
        if m is None:
            m = merged[k] = [rec, set()]
        elif c4d_time(rec) < c4d_time(m[0]):
            m[0] = rec
        who = rec.get("rank", holder)
        if _is_int(who):
            m[1].add(who)
    out = []
    for rec, seen in merged.values():
        r = dict(rec)
        r["seen_by"] = sorted(seen)
        out.append(r)
    out.sort(key=c4d_time)
    return out


def c4d_from_note(text):
    """A trace note's text -> (record or None, is C4D): "C4D {...}" is a record; a malformed one is (None, True)."""
    if not text.startswith(C4D_PREFIX):
        return None, False
    return parse_c4d(text[len(C4D_PREFIX):]), True


def c4d_bad_warning(n, cut, where):
    """The warning for n malformed records of which cut were cut at the name table's limit."""
    w = "%d malformed C4D record(s) %s ignored" % (n, where)
    if cut:
        w += (" (%d cut at %d bytes by the trace's name table; C4_DIAG_FILE holds whole records)" % (cut, NAME_MAX))
    return w


def c4d_from_trace(f):
    """A TraceFile's C4D records: ([(record, rank)], malformed, cut)."""
    out, bad, cut = [], 0, 0
    for e in f.events():
        if e[5] != fmt.T_DIAG:
            continue
        text = f.name_of(e[3])
        rec, is_c4d = c4d_from_note(text)
        if rec is not None:
            out.append((rec, f.rank))
        elif is_c4d:
            bad += 1
            cut += len(text.encode("utf-8")) >= NAME_MAX
    return out, bad, cut


def c4d_from_jsonl(path):
    """A JSON Lines file's records (C4_DIAG_FILE): ([(record, None)], [line numbers of malformed lines])."""
    out, bad = [], []
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            rec = parse_c4d(line)
            if rec is None:
                bad.append(i)
            else:
                out.append((rec, None))
    return out, bad


def _is_trace(path):
    if path.endswith(".c4t"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(fmt.MAGIC)) == fmt.MAGIC
    except OSError:
        return False


def load_c4d(paths):
    """C4D records from trace files (.c4t), JSON Lines files and directories holding either (searched recursively:
    *.c4t, *.jsonl) -> (deduplicated records sorted by time, number of records read, warnings). A path that does not
    exist raises FileNotFoundError."""
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError("%s: no such file or directory" % p)
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for d, _, names in os.walk(p):
                found.extend(os.path.join(d, n) for n in names if n.endswith(".c4t") or n.endswith(".jsonl"))
            if not found:
                files.append((p, None))  # a warning below
            files.extend((x, x.endswith(".c4t")) for x in sorted(found))
        else:
            files.append((p, _is_trace(p)))
    records, warnings = [], []
    bad_trace = cut_trace = 0
    for p, trace in files:
        if trace is None:
            warnings.append("%s: no .c4t or .jsonl files" % p)
            continue
        try:
            if trace:
                recs, bad, cut = c4d_from_trace(fmt.TraceFile(p))
                bad_trace += bad
                cut_trace += cut
            else:
                recs, bad_lines = c4d_from_jsonl(p)
                if bad_lines:
                    warnings.append("%s: %d malformed line(s) ignored (line %s)" % (
                        p, len(bad_lines), ", ".join(str(i) for i in bad_lines[:5]) +
                        (", ..." if len(bad_lines) > 5 else "")))
        except (OSError, ValueError) as e:
            warnings.append("skipped %s" % e)
            continue
        records.extend(recs)
    if bad_trace:
        warnings.append(c4d_bad_warning(bad_trace, cut_trace, "in the trace"))
    return dedup_c4d(records), len(records), warnings
