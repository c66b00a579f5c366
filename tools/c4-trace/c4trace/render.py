"""Text summary, self-contained HTML report (hand-made SVG plots), JSON and CSV output."""
import csv
import html
import json
import os
import re
import textwrap

from .analysis import human_bytes, human_ns

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#86bcb6"]


def _color(i):
    return PALETTE[i % len(PALETTE)]


def text_summary(rep, top=10):
    out = []
    comms = ", ".join("%s%s (%d/%d ranks)" % (c["tag"], (" '%s'" % c["name"]) if c["name"] else "", c["ranks_found"],
                                              c["nranks"]) for c in rep["comms"])
    out.append("c4-trace: %d events, level %s, %s of activity; communicators: %s" %
               (rep["events"], rep["level"], human_ns(rep["span_ns"]), comms))
    out.append("")
    out.append("%-14s %8s %12s %12s %7s  %s" % ("collective", "count", "bytes/rank", "time/rank", "share",
                                                "algorithms"))
    for r in rep["collectives"]:
        algos = ", ".join("%s %d" % kv for kv in sorted(r["algorithms"].items(), key=lambda kv: -kv[1]))
        out.append("%-14s %8d %12s %12s %6.1f%%  %s" % (r["collective"], r["count"], human_bytes(r["bytes_per_rank"]),
                                                       human_ns(r["time_ns_per_rank"]), 100 * r["time_share"], algos))
    if rep["bandwidth"]:
        out.append("")
        out.append("%-14s %10s %8s %10s %10s %10s %10s" % ("collective", "size", "samples", "algbw p50", "busbw p10",
                                                          "busbw p50", "busbw p90"))
        for r in rep["bandwidth"]:
            out.append("%-14s %10s %8d %10.2f %10.2f %10.2f %10.2f" % (
                r["collective"], human_bytes(r["bucket_bytes"]), r["samples"], r["algbw_p50_GBps"],
                r["busbw_p10_GBps"], r["busbw_p50_GBps"], r["busbw_p90_GBps"]))
        out.append("(GB/s; size = power-of-two bucket; time from the last rank's arrival to the end)")
    if rep["waits"]:
        out.append("")
        out.append("top waits (a rank entered a collective and waited for the last one to arrive):")
        for r in rep["waits"][:top]:
            out.append("  rank %3d waited on rank %3d: %10s in %d ops (max %s)" % (
                r["waiter"], r["waited_on"], human_ns(r["total_ns"]), r["count"], human_ns(r["max_ns"])))
    if rep["step_waits"]:
        out.append("")
        out.append("receive steps blocked on a peer (level step):")
        for r in rep["step_waits"][:top]:
            out.append("  rank %3d <- rank %3d: %10s over %d receives (max %s)" % (
                r["rank"], r["peer"], human_ns(r["blocked_ns"]), r["receives"], human_ns(r["max_ns"])))
    if rep["late"]:
        out.append("")
        out.append("late arrivals (mean time after the first rank arrived; times last to arrive):")
        for r in rep["late"][:top]:
            out.append("  rank %3d: %10s mean, last in %d of %d ops" % (r["rank"], human_ns(r["mean_lateness_ns"]),
                                                                       r["times_last"], r["ops"]))
    if rep["spans"]:
        out.append("")
        out.append("application spans: " + ", ".join("%s x%d (%s)" % (s["name"], s["count"], human_ns(s["total_ns"]))
                                                      for s in rep["spans"]))
    if rep.get("c4p"):
        out.extend(_c4p_text(rep["c4p"], top))
    if rep.get("c4d"):
        out.extend(_c4d_text(rep["c4d"]))
    for e in rep["errors"][:top]:
        out.append("ERROR rank %d: code %d: %s" % (e["rank"], e["code"], e["message"]))
    for n in rep["notes"][:top]:
        out.append("note rank %d: %s" % (n["rank"], n["text"]))
    for w in rep["warnings"]:
        out.append("warning: " + w)
    return "\n".join(out) + "\n"


def _ranks(ranks):
    """[0, 1, 2, 3, 5] -> "0-3,5"."""
    rs = sorted(set(ranks))
    out, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else "%d-%d" % (rs[i], rs[j]))
        i = j + 1
    return ",".join(out)


def _plan_line(p, t0):
    """One re-plan or weight change: "+12.828 s rank 3 -> peer 0: weights 1.00 0.28"."""
    who = "rank %d" % p["rank"] + (" -> peer %d" % p["peer"] if p["peer"] >= 0 else "")
    if p["kind"] == "replan" and p["lane"] >= 0:
        who += " lane %d" % p["lane"]
    return "+%.3f s %s: %s" % ((p["t_ns"] - t0) / 1e9, who, p["text"])


def _c4p_text(c4p, top=10, last=5):
    t0 = c4p["t0_ns"]
    out = ["", "C4P (lane planning, docs/c4p.md):"]
    for p in c4p["plans"]:
        out.append("  %s  (rank%s %s%s)" % (p["text"], "s" if len(p["ranks"]) > 1 else "", _ranks(p["ranks"]),
                                           ", %d communicators" % len(p["comms"]) if len(p["comms"]) > 1 else ""))
    for kind, label, count in (("replan", "re-plans", c4p["replans"]),
                               ("weights", "weight changes", c4p["weight_changes"])):
        evs = [e for e in c4p["events"] if e["kind"] == kind]
        out.append("  %s: %d%s" % (label, count, (", the last %d:" % min(last, len(evs))) if count > last else ""))
        for e in evs[-last:]:
            out.append("    " + _plan_line(e, t0))
    links = c4p["links"]
    if links:
        out.append("  busiest links (GB/s over the %s the lane samples cover, in %s buckets; %d lane samples; "
                   "switch-to-switch links first):" % (human_ns(c4p["sampled_to_ns"] - c4p["sampled_from_ns"]),
                                                       human_ns(c4p["bucket_ns"]), c4p["lane_samples"]))
        for l in links[:top]:
            out.append("    %-24s %-6s mean %8.3f  peak %8.3f  %10s" % (l["link"], "switch" if l["fabric"] else "host",
                                                                       l["mean_GBps"], l["peak_GBps"],
                                                                       human_bytes(l["bytes"])))
        if len(links) > top:
            out.append("    (%d more links: c4-trace report --json or --csv)" % (len(links) - top))
    return out


# ---- C4D: the health checks' diagnoses ----

def _c4d_culprit(rec):
    """"ranks 0-1 (hosts a, b), links 0->1"."""
    c = rec.get("culprit", {})
    ranks, hosts, links = c.get("ranks", []), c.get("hosts", []), c.get("links", [])
    s = ("rank%s %s" % ("s" if len(ranks) > 1 else "", _ranks(ranks))) if ranks else "-"
    if hosts:
        s += " (host%s %s)" % ("s" if len(hosts) > 1 else "", ", ".join(str(h) for h in hosts))
    if links:
        s += ", link%s %s" % ("s" if len(links) > 1 else "", ", ".join("%d->%d" % tuple(l) for l in links))
    return s


def _c4d_conf(rec):
    c = rec.get("confidence")
    return "%.0f%%" % (100 * c) if isinstance(c, (int, float)) else "?"


def _c4d_seen(rec):
    return _ranks(rec.get("seen_by", [])) or "-"


def _c4d_text(recs):
    out = ["", "C4D diagnoses (the health checks; plain words: c4-trace explain):"]
    out.append("  %-24s  %-13s %5s %8s  %-8s %s" % ("time", "class", "conf", "reporter", "seen by", "culprit"))
    for r in recs:
        out.append("  %-24s  %-13s %5s %8s  %-8s %s" % (r.get("time", "?"), r["class"], _c4d_conf(r),
                                                       r.get("reporter", "?"), _c4d_seen(r), _c4d_culprit(r)))
        if r.get("summary"):
            out.append("      " + str(r["summary"]))
    return out


def _c4d_html(recs):
    parts = ['<h2 id="c4d">C4D diagnoses</h2><style>.c4d td{text-align:left}</style>',
             "<p>What c4comm's health checks diagnosed (%d distinct diagnos%s; <code>c4-trace explain</code> says it "
             "in plain words).</p>" % (len(recs), "is" if len(recs) == 1 else "es")]
    parts.append('<div class="c4d">%s</div>' % _table(recs, [
        ("time", lambda r: str(r.get("time", "?"))), ("class", lambda r: r["class"]), ("culprit", _c4d_culprit),
        ("summary", lambda r: str(r.get("summary", ""))), ("confidence", _c4d_conf),
        ("reporter", lambda r: str(r.get("reporter", "?"))), ("seen by", _c4d_seen)]))
    return "".join(parts)


def _c4d_hosts(rec):
    """rank -> host, from "rank N (host H" in the summary and evidence, else the culprit's hosts when they pair up
    with its ranks (one host per rank, in order) or are a single host."""
    c = rec.get("culprit", {})
    ranks, hosts = c.get("ranks", []), [str(h) for h in c.get("hosts", [])]
    m = {}
    for text in (rec.get("summary"), rec.get("evidence")):
        for r, h in re.findall(r"rank (\d+) \(host ([^,;)\s]+)", str(text or "")):
            m.setdefault(int(r), h)
    if len(hosts) == len(ranks):
        for r, h in zip(ranks, hosts):
            m.setdefault(r, h)
    elif len(hosts) == 1:
        for r in ranks:
            m.setdefault(r, hosts[0])
    return {r: h for r, h in m.items() if h and h != "?"}


def _and(items):
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _who(ranks, hosts):
    """"rank 2 (host h3)", "ranks 1 (host a) and 3 (host b)"; many ranks: "ranks 0-7 (hosts a, b)"."""
    if not ranks:
        return "a rank"
    if len(ranks) > 6:
        hs = sorted({hosts[r] for r in ranks if r in hosts})
        return "ranks %s%s" % (_ranks(ranks), " (host%s %s)" % ("s" if len(hs) > 1 else "", ", ".join(hs)) if hs
                               else "")
    parts = ["%d%s" % (r, " (host %s)" % hosts[r] if r in hosts else "") for r in ranks]
    return ("rank%s " % ("s" if len(ranks) > 1 else "")) + _and(parts)


def _hosts_of(ranks, hosts, rec):
    hs = []
    for r in ranks:
        if r in hosts and hosts[r] not in hs:
            hs.append(hosts[r])
    if not hs:
        hs = [str(h) for h in rec.get("culprit", {}).get("hosts", []) if h and h != "?"]
    return hs


def _cap(s):
    return s[:1].upper() + s[1:]


def c4d_explain(rec):
    """One diagnosis in plain words for someone who does not know c4comm: a headline, c4comm's summary and
    evidence, the confidence, who reported and saw it, what to check, and how to go on."""
    kind = rec["class"]
    c = rec.get("culprit", {})
    ranks, links = c.get("ranks", []), [tuple(l) for l in c.get("links", [])]
    hosts = _c4d_hosts(rec)
    who = _who(ranks, hosts)
    hs = _hosts_of(ranks, hosts, rec)
    on_hosts = ("host%s %s" % ("s" if len(hs) > 1 else "", _and(hs))) if hs else "its host"
    seq = rec.get("seq")
    coll = ("collective #%d" % seq) if isinstance(seq, int) else "the collective (or send/receive) the others wait in"
    many = len(ranks) > 1
    they, their, them = ("they", "their", "them") if many else ("it", "its", "it")

    def end(r):
        return "rank %d%s" % (r, " (host %s)" % hosts[r] if r in hosts else "")
    if kind == "dead_rank":
        head = ("%s died: %s process ended or stopped answering, so the other ranks cannot finish their "
                "collectives with %s" % (_cap(who), their, them))
        check = ("the log (stdout/stderr) of %s and the system log of %s (dmesg, journalctl, the job scheduler's "
                 "log): a crash, an out-of-memory kill, a reboot or a node failure" %
                 ("those ranks' processes" if many else "that rank's process", on_hosts))
    elif kind == "noncomm_hang":
        head = "%s never reached %s: the job hangs in your code on %s, not in the network" % (
            _cap(who), coll, "those ranks" if many else "that rank")
        check = ("the stack of the stuck rank%s on %s while it hangs (py-spy dump --pid PID for Python, or gdb -p PID "
                 "-batch -ex 'thread apply all bt'): look for a collective skipped on that rank (a different code "
                 "path), a swallowed exception, a data loader, I/O or a lock that blocks" % ("s" if many else "",
                                                                                          on_hosts))
    elif kind == "comm_hang":
        if links:
            head = "The network between %s stopped moving data" % " and between ".join(
                "%s and %s" % (end(a), end(b)) for a, b in links)
        else:
            head = "The network stopped moving data between %s" % who
        head += ": every rank is inside %s, but no data arrives" % coll
        check = ("the network cards, cables and switch ports of %s: link state and error/drop counters (ip -s link, "
                 "ethtool -S), the switch's port counters and logs, link flaps, a firewall" % on_hosts)
    elif kind == "comm_slow":
        if links:
            head = "The network link%s %s %s slow: %s much less data per second than the other pairs of ranks" % (
                "s" if len(links) > 1 else "", " and ".join("from %s to %s" % (end(a), end(b)) for a, b in links),
                "are" if len(links) > 1 else "is", "they carry" if len(links) > 1 else "it carries")
            check = ("the network cards, cable and switch port of that link (%s): the negotiated speed, error and drop "
                     "counters (ethtool -S, ip -s link), other traffic on that path" % on_hosts)
        else:
            head = ("The node or network card of %s is slow: every connection to or from %s is much slower than "
                    "the others" % (who, them))
            check = ("%s: %s network card (negotiated speed, errors, driver or firmware) and load (other jobs, CPU or "
                     "PCIe saturation)" % (on_hosts, "their" if len(hs) > 1 else "its"))
    elif kind == "noncomm_slow":
        late = c.get("late_ms")
        head = ("%s %s a straggler, arriving%s late at most collectives: the other ranks wait for %s (%s computation "
                "or data loading is slower, not the network)" % (
                    _cap(who), "are" if many else "is", (" %.0f ms" % late) if isinstance(late, (int, float)) else "",
                    them, their))
        check = ("the load of %s: other processes (top, nvidia-smi), CPU or GPU throttling (temperature, clocks, "
                 "power), a slower or shared GPU, and whether %s more work (uneven data shards, longer sequences)" %
                 (on_hosts, "those ranks get" if many else "that rank gets"))
    else:
        head = "%s (%s)" % (_cap(kind.replace("_", " ")), who)
        check = "the evidence above"
    out = [head + "."]
    if rec.get("summary"):
        out.append("What c4comm saw: %s." % str(rec["summary"]).rstrip("."))
    if rec.get("evidence"):
        out.append("Evidence: %s." % str(rec["evidence"]).rstrip("."))
    seen = rec.get("seen_by", [])
    out.append("Confidence: %s (class %s). Diagnosed by rank %s; recorded by %s." % (
        _c4d_conf(rec), kind, rec.get("reporter", "?"),
        ("rank%s %s" % ("s" if len(seen) > 1 else "", _ranks(seen))) if seen else "no rank named"))
    out.append("What to check: %s." % check)
    if kind in ("dead_rank", "noncomm_hang", "comm_hang"):
        out.append("To go on: the surviving ranks can continue with ncclCommShrink, excluding %s (or restart the job "
                   "from its last checkpoint)." % (("rank%s %s" % ("s" if many else "", _and(str(r) for r in ranks)))
                                                   if ranks else "the culprit ranks"))
    elif kind in ("comm_slow", "noncomm_slow"):
        out.append("The job still runs, only slower: nothing has to be stopped.")
    return out


def explain_text(recs, n_records, width=100):
    """c4-trace explain: every diagnosis in plain words, in the order they were made."""
    if not recs:
        return "no C4D diagnoses\n"
    out = ["%d C4D diagnos%s (from %d record%s; c4comm's health checks, one line of JSON each):" % (
        len(recs), "is" if len(recs) == 1 else "es", n_records, "" if n_records == 1 else "s")]
    for i, r in enumerate(recs, 1):
        out.append("")
        where = "communicator %s" % r.get("comm", "?")
        if isinstance(r.get("nranks"), int):
            where += " of %d ranks" % r["nranks"]
        out.append("%d. %s  %s" % (i, r.get("time", "?"), where))
        for line in c4d_explain(r):
            out.extend(textwrap.wrap(line, width, initial_indent="   ", subsequent_indent="     ",
                                     break_on_hyphens=False, break_long_words=False))
    return "\n".join(out) + "\n"


# ---- SVG ----

def _svg(w, h, body, title):
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" '
            'aria-label="%s"><rect width="100%%" height="100%%" fill="#fff"/>%s</svg>' %
            (w, h, w, h, html.escape(title), body))


def _text(x, y, s, anchor="start", size=11, extra=""):
    return '<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" %s>%s</text>' % (x, y, size, anchor, extra,
                                                                                     html.escape(str(s)))


def bar_chart(labels, values, fmt_value, title, w=640):
    """Horizontal bars."""
    if not labels:
        return ""
    bh, left, right = 22, 130, 110
    h = 30 + bh * len(labels)
    vmax = max(values) or 1
    body = [_text(8, 16, title, size=13, extra='font-weight="bold"')]
    for i, (lab, v) in enumerate(zip(labels, values)):
        y = 26 + i * bh
        bw = (w - left - right) * v / vmax
        body.append(_text(left - 6, y + 14, lab, "end"))
        body.append('<rect class="bar" x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s: %s</title></rect>'
                    % (left, y + 2, max(bw, 1), bh - 6, _color(i), html.escape(lab), html.escape(fmt_value(v))))
        body.append(_text(left + bw + 6, y + 14, fmt_value(v)))
    return _svg(w, h, "".join(body), title)


def grouped_histogram(series, title, w=720):
    """series: {name: {bucket: count}} -> one row of bars per name over the shared buckets."""
    buckets = sorted({b for s in series.values() for b in s})
    if not buckets:
        return ""
    names = sorted(series)
    rowh, left, top = 70, 130, 30
    h = top + rowh * len(names) + 30
    colw = (w - left - 20) / len(buckets)
    body = [_text(8, 16, title, size=13, extra='font-weight="bold"')]
    for i, name in enumerate(names):
        y0 = top + i * rowh
        cmax = max(series[name].values()) or 1
        body.append(_text(left - 6, y0 + rowh / 2, name, "end"))
        body.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>' % (left, y0 + rowh - 8, w - 20,
                                                                            y0 + rowh - 8))
        for j, b in enumerate(buckets):
            c = series[name].get(b, 0)
            if not c:
                continue
            bh = (rowh - 14) * c / cmax
            body.append('<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %d'
                        '</title></rect>' % (left + j * colw + 1, y0 + rowh - 8 - bh, max(colw - 2, 1), bh, _color(i),
                                             html.escape(name), human_bytes(b), c))
    for j, b in enumerate(buckets):
        if len(buckets) <= 16 or j % 2 == 0:
            body.append(_text(left + (j + 0.5) * colw, h - 10, human_bytes(b), "middle", 9))
    return _svg(w, h, "".join(body), title)


def bandwidth_plot(rows, title, w=720):
    """busbw p10-p90 ranges and p50 markers per (collective, size bucket), log-x in size."""
    if not rows:
        return ""
    import math
    names = sorted({r["collective"] for r in rows})
    xs = [math.log2(max(r["bucket_bytes"], 1)) for r in rows]
    xmin, xmax = min(xs), max(xs) + 1
    ymax = max(r["busbw_p90_GBps"] for r in rows) * 1.1 or 1
    left, top, bottom, h = 60, 30, 40, 320
    pw, ph = w - left - 150, h - top - bottom

    def X(v):
        return left + pw * (v - xmin) / max(xmax - xmin, 1)

    def Y(v):
        return top + ph * (1 - v / ymax)
    body = [_text(8, 16, title, size=13, extra='font-weight="bold"'),
            '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>' % (left, top, pw, ph)]
    for k in range(5):
        v = ymax * k / 4
        body.append(_text(left - 4, Y(v) + 4, "%.3g" % v, "end", 9))
    for k in range(int(xmin), int(xmax) + 1, max(1, int((xmax - xmin) / 10))):
        body.append(_text(X(k), top + ph + 14, human_bytes(1 << k), "middle", 9))
    body.append(_text(left + pw / 2, h - 6, "message size", "middle", 10))
    body.append(_text(12, top + ph / 2, "busbw GB/s", "middle", 10, 'transform="rotate(-90 12 %d)"' % (top + ph / 2)))
    for i, name in enumerate(names):
        col = _color(i)
        pts = []
        for r, x in zip(rows, xs):
            if r["collective"] != name:
                continue
            cx = X(x + 0.5) + (i - len(names) / 2) * 3
            body.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3" opacity="0.5"/>'
                        % (cx, Y(r["busbw_p10_GBps"]), cx, Y(r["busbw_p90_GBps"]), col))
            body.append('<circle class="pt" cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s %s: busbw p50 %.2f GB/s '
                        '(%d samples)</title></circle>' % (cx, Y(r["busbw_p50_GBps"]), col, html.escape(name),
                                                           human_bytes(r["bucket_bytes"]), r["busbw_p50_GBps"],
                                                           r["samples"]))
            pts.append("%.1f,%.1f" % (cx, Y(r["busbw_p50_GBps"])))
        if len(pts) > 1:
            body.append('<polyline points="%s" fill="none" stroke="%s"/>' % (" ".join(pts), col))
        body.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>' % (left + pw + 12, top + i * 16, col))
        body.append(_text(left + pw + 26, top + i * 16 + 9, name, size=10))
    return _svg(w, h, "".join(body), title)


def heatmap(rows, title, w=520):
    """Traffic matrix of one communicator: rows[] = {src, dst, bytes}."""
    if not rows:
        return ""
    n = max(max(r["src"], r["dst"]) for r in rows) + 1
    if n > 128:
        return ""
    cell = max(4, min(40, (w - 80) // n))
    left, top = 50, 40
    h = top + cell * n + 30
    w = left + cell * n + 30
    vmax = max(r["bytes"] for r in rows) or 1
    body = [_text(8, 16, title, size=13, extra='font-weight="bold"'),
            _text(left + cell * n / 2, 32, "receiver", "middle", 10),
            _text(12, top + cell * n / 2, "sender", "middle", 10, 'transform="rotate(-90 12 %d)"' %
                  (top + cell * n / 2))]
    for r in rows:
        a = r["bytes"] / vmax
        body.append('<rect class="cell" x="%d" y="%d" width="%d" height="%d" fill="rgb(%d,%d,%d)"><title>rank %d -> '
                    'rank %d: %s</title></rect>' % (left + r["dst"] * cell, top + r["src"] * cell, cell, cell,
                                                    int(255 - 200 * a), int(255 - 120 * a), 255, r["src"], r["dst"],
                                                    human_bytes(r["bytes"])))
    if n <= 32:
        for i in range(n):
            body.append(_text(left - 4, top + i * cell + cell / 2 + 4, i, "end", 9))
            body.append(_text(left + i * cell + cell / 2, top + cell * n + 12, i, "middle", 9))
    return _svg(w, h, "".join(body), title)


def timeline(samples, t0, title, w=960):
    if not samples:
        return ""
    labels = sorted({s[0] for s in samples}, key=lambda s: (len(s), s))
    names = sorted({s[3] for s in samples})
    tmax = max(s[2] for s in samples) - t0 or 1
    rowh, left, top = 18, 90, 30
    h = top + rowh * len(labels) + 40 + 16 * ((len(names) + 5) // 6)
    pw = w - left - 20
    idx = {l: i for i, l in enumerate(labels)}
    cidx = {n: i for i, n in enumerate(names)}
    body = [_text(8, 16, title, size=13, extra='font-weight="bold"')]
    for l, i in idx.items():
        body.append(_text(left - 6, top + i * rowh + 13, l, "end", 10))
    for lab, a, b, name in samples:
        x = left + pw * (a - t0) / tmax
        ww = max(pw * (b - a) / tmax, 0.6)
        body.append('<rect class="op" x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s %s: %s</title>'
                    '</rect>' % (x, top + idx[lab] * rowh + 2, ww, rowh - 4, _color(cidx[name]), lab,
                                 html.escape(name), human_ns(b - a)))
    y = top + rowh * len(labels) + 12
    for k in range(6):
        body.append(_text(left + pw * k / 5, y, human_ns(tmax * k / 5), "middle", 9))
    for i, name in enumerate(names):
        xx, yy = left + (i % 6) * 130, y + 14 + 16 * (i // 6)
        body.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>' % (xx, yy, _color(i)))
        body.append(_text(xx + 14, yy + 9, name, size=10))
    return _svg(w, h, "".join(body), title)


def _nice_step(span, nticks=6):
    """A tick step of 1, 2, 2.5 or 5 x 10^k giving about nticks ticks over span."""
    import math
    raw = span / float(nticks) if span > 0 else 1.0
    p = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * p >= raw * 0.999:
            return m * p
    return 10 * p


def plot_links(links, limit=12, same=0.005):
    """The lines of the load plot: groups of links, switch-to-switch links first (what C4P steers), then host links,
    each by mean load; at most `limit` groups, none that never reached 1% of the busiest link's peak. Links whose
    load differs by at most `same` x that peak in every bucket both have (the same flows cross them) share a line,
    the first one's."""
    peak = max([l["peak_GBps"] for l in links] + [0.0])
    tol = same * peak
    cand = [l for l in links if l["peak_GBps"] > 0 and l["peak_GBps"] >= 0.01 * peak]
    cand.sort(key=lambda l: (not l["fabric"], -l["mean_GBps"], -l["peak_GBps"], l["link"]))
    groups = []
    for l in cand:
        for g in groups:
            r = g[0]
            if abs(r["mean_GBps"] - l["mean_GBps"]) <= tol and abs(r["peak_GBps"] - l["peak_GBps"]) <= tol and \
                    all(x is None or y is None or abs(x - y) <= tol for x, y in zip(r["GBps"], l["GBps"])):
                g.append(l)
                break
        else:
            if len(groups) < limit:
                groups.append([l])
    return groups


def _group_label(g):
    names = [l["link"] for l in g]
    if len(names) <= 2:
        return ", ".join(names)
    return "%s, %s (+%d alike)" % (names[0], names[1], len(names) - 2)


def link_load_plot(c4p, title, w=960, limit=12):
    """GB/s per directed link over time (a line per link or group of links with the same load, through the middle
    of each time bucket), with the re-plans (red) and weight changes (grey) marked on the time axis."""
    groups = plot_links(c4p["links"], limit)
    if not groups:
        return ""
    width, n, t0 = c4p["bucket_ns"], c4p["buckets"], c4p["t0_ns"]
    tspan = n * width / 1e9
    top_peak = max(g[0]["peak_GBps"] for g in groups)
    ystep = _nice_step(top_peak, 5)
    ymax = ystep * max(1, int(top_peak / ystep + 0.999))
    left, top, ph, right = 60, 50, 300, 20
    pw = w - left - right
    cols = 2
    rows = (len(groups) + cols - 1) // cols
    legend_y = top + ph + 48
    h = legend_y + 16 * rows + 28

    def X(t_s):
        return left + pw * t_s / tspan

    def Y(v):
        return top + ph * (1 - v / ymax)
    shown = sum(len(g) for g in groups)
    body = [_text(8, 16, title, size=13, extra='font-weight="bold"'),
            _text(8, 32, "%d of %d links (links with the same load share a line); bucket %s; switch-to-switch links "
                  "solid, host links dashed" % (shown, len(c4p["links"]), human_ns(width)), size=10,
                  extra='fill="#555"'),
            '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>' % (left, top, pw, ph)]
    k = 0
    while k * ystep <= ymax * 1.0001:
        v = k * ystep
        body.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>' % (left + 1, Y(v), left + pw - 1, Y(v)))
        body.append(_text(left - 4, Y(v) + 4, "%g" % round(v, 9), "end", 9))
        k += 1
    xstep = _nice_step(tspan, 12)
    k = 0
    while k * xstep <= tspan * 1.0001:
        body.append(_text(X(k * xstep), top + ph + 14, "%g" % round(k * xstep, 9), "middle", 9))
        k += 1
    body.append(_text(left + pw / 2, top + ph + 32, "time since the run's first event (s)", "middle", 10))
    body.append(_text(14, top + ph / 2, "GB/s", "middle", 10, 'transform="rotate(-90 14 %d)"' % (top + ph / 2)))
    # Re-plans and weight changes: a mark above the plot and a faint line through it.
    for e in c4p["events"]:
        if e["kind"] not in ("replan", "weights"):
            continue
        x = X((e["t_ns"] - t0) / 1e9)
        tip = html.escape(_plan_line(e, t0))
        if e["kind"] == "replan":
            body.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d62728" opacity="0.6"/>' %
                        (x, top, x, top + ph))
            body.append('<path class="c4p-replan" d="M%.1f %d l-5 -9 h10 z" fill="#d62728"><title>%s</title></path>' %
                        (x, top - 2, tip))
        else:
            body.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" stroke-dasharray="2,3" '
                        'opacity="0.7"/>' % (x, top, x, top + ph))
            body.append('<circle class="c4p-weights" cx="%.1f" cy="%d" r="3" fill="#777"><title>%s</title></circle>' %
                        (x, top - 6, tip))
    body.append('<path d="M%d %d l-5 -9 h10 z" fill="#d62728"/>' % (w - 200, 40))
    body.append(_text(w - 190, 39, "re-plan", size=10))
    body.append('<circle cx="%d" cy="%d" r="3" fill="#777"/>' % (w - 130, 35))
    body.append(_text(w - 122, 39, "weight change", size=10))
    lines, legend = [], []
    for i, g in enumerate(groups):
        col = _color(i)
        l = g[0]
        d, gap = [], True  # a break where a sender of the link was not sampled
        for j, v in enumerate(l["GBps"]):
            if v is None:
                gap = True
                continue
            d.append("%s%.1f %.1f" % ("M" if gap else "L", X((j + 0.5) * width / 1e9), Y(v)))
            gap = False
        dash = "" if l["fabric"] else ' stroke-dasharray="6,3"'
        tip = html.escape("%s: mean %.3f GB/s, peak %.3f GB/s" % (", ".join(x["link"] for x in g), l["mean_GBps"],
                                                                  l["peak_GBps"]))
        lines.append('<path class="c4p-link" d="%s" fill="none" stroke="%s" stroke-width="%s"%s>'
                     '<title>%s</title></path>' % (" ".join(d), col, "2" if l["fabric"] else "1.5", dash, tip))
        lx, ly = left + (i // rows) * (pw // cols), legend_y + 16 * (i % rows)
        legend.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (lx, ly, lx + 22, ly,
                                                                                                 col, dash))
        legend.append('<text x="%d" y="%d" font-size="10">%s<title>%s</title></text>' % (
            lx + 28, ly + 4, html.escape("%s: mean %.3g, peak %.3g GB/s" % (_group_label(g), l["mean_GBps"],
                                                                          l["peak_GBps"])), tip))
    body.extend(reversed(lines))  # the first (busiest switch-to-switch) links on top
    body.extend(legend)
    return _svg(w, h, "".join(body), title)


def _c4p_html(rep, limit=300):
    c4p = rep["c4p"]
    t0 = c4p["t0_ns"]
    multi = len(rep["comms"]) > 1
    parts = ['<h2 id="c4p">C4P: per-link load over time</h2><style>.c4p-events td:last-child{text-align:left}'
             '.c4p-events td{white-space:nowrap}.c4p-events td:last-child{white-space:normal}</style>']
    parts.append("<p>What each lane sent between two looks of the rebalancer (%d lane samples, %s), spread evenly over "
                 "its window onto every directed link of its path and summed over the ranks: GB/s per link over "
                 "time.</p>" % (c4p["lane_samples"], html.escape(human_bytes(c4p["sample_bytes"]))))
    parts.append('<div class="plot">%s</div>' % link_load_plot(c4p, "GB/s per link (the busiest, switch-to-switch "
                                                                   "links first)"))
    parts.append(_table(c4p["links"][:50], [("link", lambda r: r["link"]),
                                            ("kind", lambda r: "switch" if r["fabric"] else "host"),
                                            ("mean GB/s", lambda r: "%.3f" % r["mean_GBps"]),
                                            ("peak GB/s", lambda r: "%.3f" % r["peak_GBps"]),
                                            ("bytes", lambda r: human_bytes(r["bytes"]))]))
    rows = [{"t_ns": p["t_ns"], "who": _ranks(p["ranks"]),
             "kind": "plan", "peer": -1, "lane": -1, "text": p["text"]} for p in c4p["plans"]]
    for e in c4p["events"]:
        if e["kind"] != "plan":
            rows.append({"t_ns": e["t_ns"], "who": ("%s r%d" % (e["comm"][:6], e["rank"])) if multi else
                         str(e["rank"]), "kind": e["kind"], "peer": e["peer"],
                         "lane": e["lane"] if e["kind"] == "replan" else -1, "text": e["text"]})
    rows.sort(key=lambda r: r["t_ns"])
    parts.append("<h3>Plan events</h3><p>%d plan(s), %d re-plan(s), %d weight change(s)%s</p>" % (
        len(c4p["plans"]), c4p["replans"], c4p["weight_changes"],
        "; the first %d shown" % limit if len(rows) > limit else ""))
    parts.append('<div class="c4p-events">%s</div>' % _table(
        rows[:limit], [("time (s)", lambda r: "%.3f" % ((r["t_ns"] - t0) / 1e9)), ("rank", lambda r: r["who"]),
                       ("event", lambda r: r["kind"]), ("peer", lambda r: str(r["peer"]) if r["peer"] >= 0 else ""),
                       ("lane", lambda r: str(r["lane"]) if r["lane"] >= 0 else ""), ("text", lambda r: r["text"])]))
    return "".join(parts)


def _table(rows, cols):
    if not rows:
        return "<p><i>none</i></p>"
    head = "".join("<th>%s</th>" % html.escape(c[0]) for c in cols)
    body = []
    for r in rows:
        body.append("<tr>" + "".join("<td>%s</td>" % html.escape(c[1](r)) for c in cols) + "</tr>")
    return "<table><tr>%s</tr>%s</table>" % (head, "".join(body))


def html_report(rep, samples, top=10):
    parts = []
    sizes = {}
    for r in rep["sizes"]:
        sizes.setdefault(r["collective"], {})[r["bucket_bytes"]] = r["count"]
    colls = rep["collectives"]
    if rep.get("c4d"):  # first: when the health checks found something, it is what the reader wants to see
        parts.append(_c4d_html(rep["c4d"]))
    parts.append("<h2>Collectives</h2>")
    parts.append(_table(colls, [("collective", lambda r: r["collective"]), ("count", lambda r: str(r["count"])),
                                ("bytes / rank", lambda r: human_bytes(r["bytes_per_rank"])),
                                ("time / rank", lambda r: human_ns(r["time_ns_per_rank"])),
                                ("time share", lambda r: "%.1f%%" % (100 * r["time_share"])),
                                ("algorithms", lambda r: ", ".join("%s %d" % kv for kv in r["algorithms"].items()))]))
    parts.append('<div class="plot">%s</div>' % bar_chart([r["collective"] for r in colls],
                                                          [100 * r["time_share"] for r in colls],
                                                          lambda v: "%.1f%%" % v, "Share of time in collectives"))
    parts.append("<h2>Message sizes</h2>")
    parts.append('<div class="plot">%s</div>' % grouped_histogram(sizes, "Calls per message size (all ranks)"))
    parts.append("<h2>Achieved bandwidth</h2>")
    parts.append('<div class="plot">%s</div>' % bandwidth_plot(rep["bandwidth"], "busbw p10..p90 and median"))
    parts.append(_table(rep["bandwidth"], [("collective", lambda r: r["collective"]),
                                           ("size", lambda r: human_bytes(r["bucket_bytes"])),
                                           ("samples", lambda r: str(r["samples"])),
                                           ("algbw p50", lambda r: "%.2f" % r["algbw_p50_GBps"]),
                                           ("busbw p10", lambda r: "%.2f" % r["busbw_p10_GBps"]),
                                           ("busbw p50", lambda r: "%.2f" % r["busbw_p50_GBps"]),
                                           ("busbw p90", lambda r: "%.2f" % r["busbw_p90_GBps"])]))
    parts.append("<h2>Traffic matrix</h2>")
    by_comm = {}
    for r in rep["traffic"]:
        by_comm.setdefault(r["comm"], []).append(r)
    if not by_comm:
        parts.append("<p><i>no per-peer data: collectives' peer traffic is recorded at C4_TRACE=step; "
                     "point-to-point sends at every level</i></p>")
    for tag, rows in list(by_comm.items())[:4]:
        parts.append('<div class="plot">%s</div>' % heatmap(rows, "bytes sent, communicator %s" % tag))
    parts.append("<h2>Waits</h2>")
    parts.append(_table(rep["waits"][:top], [("waiter", lambda r: str(r["waiter"])),
                                             ("waited on", lambda r: str(r["waited_on"])),
                                             ("total", lambda r: human_ns(r["total_ns"])),
                                             ("ops", lambda r: str(r["count"])), ("max", lambda r: human_ns(r["max_ns"]))]))
    if rep["step_waits"]:
        parts.append("<h3>Receive steps blocked on a peer</h3>")
        parts.append(_table(rep["step_waits"][:top], [("rank", lambda r: str(r["rank"])),
                                                      ("peer", lambda r: str(r["peer"])),
                                                      ("blocked", lambda r: human_ns(r["blocked_ns"])),
                                                      ("receives", lambda r: str(r["receives"])),
                                                      ("max", lambda r: human_ns(r["max_ns"]))]))
    parts.append("<h2>Late arrivals</h2>")
    late = rep["late"][:32]
    parts.append('<div class="plot">%s</div>' % bar_chart(["rank %d" % r["rank"] for r in late],
                                                          [r["mean_lateness_ns"] for r in late], human_ns,
                                                          "Mean time after the first rank arrived"))
    parts.append("<h2>Timeline</h2>")
    parts.append('<div class="plot">%s</div>' % timeline(samples, rep["t_min_ns"], "Operations per rank "
                                                         "(aligned clocks; thinned to %d ops)" % len(samples)))
    if rep.get("c4p"):
        parts.append(_c4p_html(rep))
    if rep["errors"] or rep["notes"] or rep["warnings"]:
        parts.append("<h2>Errors, notes, warnings</h2><ul>")
        for e in rep["errors"]:
            parts.append("<li>ERROR rank %d: code %d: %s</li>" % (e["rank"], e["code"], html.escape(e["message"])))
        for n in rep["notes"]:
            parts.append("<li>note rank %d: %s</li>" % (n["rank"], html.escape(n["text"])))
        for w in rep["warnings"]:
            parts.append("<li>%s</li>" % html.escape(w))
        parts.append("</ul>")
    summary = html.escape(text_summary(rep, top))
    style = ("body{font-family:sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse;margin:8px 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}th{background:#f3f3f3}"
             "pre{background:#f7f7f7;padding:8px;font-size:12px;overflow-x:auto}.plot{margin:12px 0}")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>c4-trace report</title><style>%s</style>"
            "</head><body><h1>c4comm trace report</h1><pre id=\"summary\">%s</pre>%s</body></html>\n" %
            (style, summary, "".join(parts)))


def write_json(rep, path):
    with open(path, "w") as f:
        json.dump(rep, f, indent=1, default=list)


CSV_TABLES = ["collectives", "sizes", "bandwidth", "traffic", "waits", "step_waits", "late"]


def write_csv(rep, directory):
    os.makedirs(directory, exist_ok=True)
    written = []
    for name in CSV_TABLES:
        rows = rep[name]
        path = os.path.join(directory, name + ".csv")
        with open(path, "w", newline="") as f:
            if rows:
                fields = list(rows[0].keys())
                w = csv.DictWriter(f, fieldnames=fields)
                w.writeheader()
                for r in rows:
                    w.writerow({k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in r.items()})
        written.append(path)
    if rep.get("c4p"):
        written.extend(_c4p_csv(rep["c4p"], directory))
    return written


def _c4p_csv(c4p, directory):
    """c4p_link_load.csv: GB/s per link (columns) per time bucket (rows; t_s = the bucket's start after the run's
    first event; empty where a sender of the link was not sampled); c4p_events.csv: the plan events."""
    links = c4p["links"]
    path = os.path.join(directory, "c4p_link_load.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s"] + [l["link"] for l in links])
        for k in range(c4p["buckets"]):
            w.writerow(["%.6g" % (k * c4p["bucket_ns"] / 1e9)] +
                       ["" if l["GBps"][k] is None else "%.6g" % l["GBps"][k] for l in links])
    epath = os.path.join(directory, "c4p_events.csv")
    with open(epath, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "comm", "rank", "event", "peer", "lane", "text"])
        for e in c4p["events"]:
            w.writerow(["%.9f" % ((e["t_ns"] - c4p["t0_ns"]) / 1e9), e["comm"], e["rank"], e["kind"], e["peer"],
                        e["lane"], e["text"]])
    return [path, epath]
