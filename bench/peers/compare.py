#!/usr/bin/env python3
"""Runs c4-perf and its peers (c4-peer-mpi, c4-peer-gloo) with the same nccl-tests flags and
prints their bus bandwidths side by side, with c4/peer ratios and small-size latencies.

    bench/peers/compare.py -C allreduce -np 2 -b 1M -e 64M -f 2 -d float -o sum --peers mpi,gloo
    bench/peers/compare.py -C allgather -np 4 -b 8 -e 1M -f 4 --csv > ag.csv --plot ag.svg

Every flag this script does not define itself is passed unchanged to every benchmark. Standard
library only; any python3 runs it.
"""

import argparse
import csv
import glob
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time

LIBS = {  # name -> (binary, label)
    "c4": ("c4-perf", "c4"),
    "mpi": ("c4-peer-mpi", "MPI"),
    "gloo": ("c4-peer-gloo", "Gloo"),
}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_binary(name, bin_dir):
    """The benchmark binary: --bin-dir, $C4_BIN_DIR, build/bin, the newest build*/bin, then PATH."""
    dirs = [d for d in (bin_dir, os.environ.get("C4_BIN_DIR")) if d]
    dirs.append(os.path.join(REPO, "build", "bin"))
    dirs += sorted(glob.glob(os.path.join(REPO, "build*", "bin")), key=os.path.getmtime, reverse=True)
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def parse_output(text):
    """Rows keyed by (type, redop, root, size) from an nccl-tests table, plus header facts."""
    rows, meta = {}, {"init_ms": None, "avg_busbw": None, "library": None, "wrong": 0, "skipped": []}
    for line in text.splitlines():
        if line.startswith("#"):
            if line.startswith("# Init time:"):
                try:
                    meta["init_ms"] = float(line.split(":", 1)[1].split()[0])
                except (ValueError, IndexError):
                    pass
            elif line.startswith("# Avg bus bandwidth"):
                try:
                    meta["avg_busbw"] = float(line.split(":", 1)[1].split()[0])
                except (ValueError, IndexError):
                    pass
            elif line.startswith("# Library:"):
                meta["library"] = line.split(":", 1)[1].strip()
            elif line.startswith("# skipped"):
                meta["skipped"].append(line[2:])
            continue
        f = line.split()
        if len(f) < 13:
            continue
        try:
            size = int(f[0])
            count = int(f[1])

            def place(i):
                wrong = None if f[i + 3] == "N/A" else float(f[i + 3])
                return {"time": float(f[i]), "algbw": float(f[i + 1]), "busbw": float(f[i + 2]), "wrong": wrong}

            row = {"size": size, "count": count, "type": f[2], "redop": f[3], "root": int(f[4]),
                   "oop": place(5), "ip": place(9)}
        except ValueError:
            continue
        for p in ("oop", "ip"):
            if row[p]["wrong"]:
                meta["wrong"] += 1
        rows[(row["type"], row["redop"], row["root"], size)] = row
    return rows, meta


def run_one(lib, binary, args, index, total, timeout):
    cmd = [binary] + args
    shown = " ".join([os.path.basename(binary)] + args)
    sys.stderr.write("[%d/%d] %-5s %s ... " % (index, total, LIBS[lib][1], shown))
    sys.stderr.flush()
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           universal_newlines=True)
    except subprocess.TimeoutExpired:
        sys.stderr.write("timed out after %.0f s\n" % timeout)
        return None
    rows, meta = parse_output(p.stdout)
    status = "ok" if p.returncode == 0 else "exit %d" % p.returncode
    sys.stderr.write("%s, %d rows, %.1f s%s\n" % (status, len(rows), time.time() - t0,
                                                  ", %d rows with wrong values" % meta["wrong"] if meta["wrong"] else ""))
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        for t in tail:
            sys.stderr.write("    | %s\n" % t)
    meta["returncode"] = p.returncode
    meta["command"] = shown
    return rows, meta


def merge_runs(runs):
    """Median over repeated runs, per row and per placement (by time; algbw/busbw of that run)."""
    runs = [r for r in runs if r]
    if not runs:
        return None
    if len(runs) == 1:
        return runs[0]
    rows0, meta = runs[0]
    merged = {}
    for key, row in rows0.items():
        out = dict(row)
        for place in ("oop", "ip"):
            samples = sorted((r[0][key][place] for r in runs if key in r[0]), key=lambda x: x["time"])
            med = dict(samples[len(samples) // 2])
            med["wrong"] = max((x["wrong"] or 0) for x in samples) if any(x["wrong"] is not None for x in samples) \
                else None
            out[place] = med
        merged[key] = out
    meta = dict(meta)
    meta["returncode"] = max(r[1]["returncode"] for r in runs)
    meta["repeats"] = len(runs)
    return merged, meta


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def human_size(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d%s" % (n // div, unit)
    return str(n)


def build_records(results, libs):
    """One record per (type, redop, root, size) seen by any library."""
    keys = set()
    for lib in libs:
        if results.get(lib):
            keys.update(results[lib][0].keys())
    recs = []
    for key in sorted(keys, key=lambda k: (k[0], k[1], k[2], k[3])):
        rec = {"type": key[0], "redop": key[1], "root": key[2], "size": key[3]}
        for lib in libs:
            row = results[lib][0].get(key) if results.get(lib) else None
            for p in ("oop", "ip"):
                rec["%s_%s_busbw" % (lib, p)] = row[p]["busbw"] if row else None
                rec["%s_%s_time_us" % (lib, p)] = row[p]["time"] if row else None
                rec["%s_%s_wrong" % (lib, p)] = row[p]["wrong"] if row else None
        for lib in libs:
            if lib == "c4":
                continue
            for p in ("oop", "ip"):
                rec["c4/%s_%s" % (lib, p)] = ratio(rec.get("c4_%s_busbw" % p), rec.get("%s_%s_busbw" % (lib, p)))
        recs.append(rec)
    return recs


def fmt(v, width, prec=2):
    if v is None:
        return "-".rjust(width)
    return ("%.*f" % (prec, v)).rjust(width)


def print_table(recs, libs, results, latency_max, out):
    peers = [l for l in libs if l != "c4"]
    labels = {l: LIBS[l][1] for l in libs}
    for lib in libs:
        if results.get(lib):
            meta = results[lib][1]
            out.write("# %-5s %s | init %s ms | avg busbw %s GB/s%s\n" % (
                labels[lib], meta.get("library") or "?", fmt(meta["init_ms"], 0, 1).strip(),
                fmt(meta["avg_busbw"], 0, 3).strip(),
                " | %d rows with wrong values" % meta["wrong"] if meta["wrong"] else ""))
            for s in meta["skipped"]:
                out.write("#       %s\n" % s)
        else:
            out.write("# %-5s not run\n" % labels[lib])
    groups = {}
    for r in recs:
        groups.setdefault((r["type"], r["redop"], r["root"]), []).append(r)
    for (ty, op, root), rs in groups.items():
        out.write("\n# %s %s root %d: bus bandwidth (GB/s), out-of-place | in-place\n" % (ty, op, root))
        cols = ["%10s" % "size"]
        for p in ("oop", "ip"):
            cols += ["%8s" % labels[l] for l in libs] + ["%8s" % ("c4/" + labels[l]) for l in peers if "c4" in libs]
            if p == "oop":
                cols.append(" |")
        out.write(" ".join(cols) + "\n")
        for r in rs:
            cols = ["%10s" % human_size(r["size"])]
            for p in ("oop", "ip"):
                cols += [fmt(r["%s_%s_busbw" % (l, p)], 8) for l in libs]
                if "c4" in libs:
                    cols += [fmt(r["c4/%s_%s" % (l, p)], 8) for l in peers]
                if p == "oop":
                    cols.append(" |")
            out.write(" ".join(cols) + "\n")
        small = [r for r in rs if r["size"] <= latency_max]
        if small:
            out.write("# latency (us), out-of-place | in-place\n")
            cols = ["%10s" % "size"]
            for p in ("oop", "ip"):
                cols += ["%8s" % labels[l] for l in libs]
                if p == "oop":
                    cols.append(" |")
            out.write(" ".join(cols) + "\n")
            for r in small:
                cols = ["%10s" % human_size(r["size"])]
                for p in ("oop", "ip"):
                    cols += [fmt(r["%s_%s_time_us" % (l, p)], 8) for l in libs]
                    if p == "oop":
                        cols.append(" |")
                out.write(" ".join(cols) + "\n")


def write_svg(path, recs, libs, title):
    """busbw (out-of-place) against size on a log2 x axis, one line per library."""
    first = (recs[0]["type"], recs[0]["redop"], recs[0]["root"]) if recs else None
    recs = [r for r in recs if (r["type"], r["redop"], r["root"]) == first and r["size"] > 0]
    w, h, ml, mr, mt, mb = 760, 440, 70, 130, 40, 60
    colors = {"c4": "#d62728", "mpi": "#1f77b4", "gloo": "#2ca02c"}
    series = {}
    for lib in libs:
        pts = [(r["size"], r["%s_oop_busbw" % lib]) for r in recs if r.get("%s_oop_busbw" % lib) is not None]
        if pts:
            series[lib] = pts
    sizes = [r["size"] for r in recs] or [1, 2]
    xmin, xmax = math.log2(min(sizes)), math.log2(max(sizes))
    if xmax == xmin:
        xmax = xmin + 1
    ymax = max([v for pts in series.values() for _, v in pts] + [1e-9]) * 1.1
    # A round upper bound for the y axis.
    mag = 10 ** math.floor(math.log10(ymax))
    ymax = math.ceil(ymax / mag) * mag

    def x(s):
        return ml + (math.log2(s) - xmin) / (xmax - xmin) * (w - ml - mr)

    def y(v):
        return h - mb - v / ymax * (h - mt - mb)

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="12">' % (w, h), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="15" text-anchor="middle">%s</text>' % (w // 2, escape(title))]
    for i in range(6):
        v = ymax * i / 5
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (ml, y(v), w - mr, y(v)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (ml - 6, y(v) + 4, round(v, 3)))
    for s in sorted(set(sizes)):
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>' % (x(s), mt, x(s), h - mb))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (x(s), h - mb + 16, human_size(s)))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (ml, h - mb, w - mr, h - mb))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (ml, mt, ml, h - mb))
    out.append('<text x="%d" y="%d" text-anchor="middle">message size (bytes, log scale)</text>'
               % ((ml + w - mr) // 2, h - 18))
    out.append('<text x="18" y="%d" text-anchor="middle" transform="rotate(-90 18 %d)">bus bandwidth (GB/s)</text>'
               % ((mt + h - mb) // 2, (mt + h - mb) // 2))
    for i, (lib, pts) in enumerate(series.items()):
        c = colors.get(lib, "#333")
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                   % (c, " ".join("%.1f,%.1f" % (x(s), y(v)) for s, v in pts)))
        for s, v in pts:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (x(s), y(v), c))
        ly = mt + 10 + 20 * i
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                   % (w - mr + 12, ly, w - mr + 36, ly, c))
        out.append('<text x="%d" y="%d">%s</text>' % (w - mr + 42, ly + 4, LIBS[lib][1]))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        epilog="All other flags (-C, -np, -b, -e, -f, -n, -w, -c, -d, -o, -r, -a, ...) go to every benchmark.")
    ap.add_argument("--peers", default="mpi,gloo", help="comma list of peers: mpi,gloo (default both)")
    ap.add_argument("--no-c4", action="store_true", help="run only the peers")
    ap.add_argument("--bin-dir", help="directory with c4-perf and the peers (default: build*/bin, PATH)")
    ap.add_argument("--csv", nargs="?", const="-", metavar="FILE", help="write CSV (to FILE or stdout)")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write JSON (to FILE or stdout)")
    ap.add_argument("--plot", metavar="OUT.svg", help="write an SVG chart of out-of-place busbw vs size")
    ap.add_argument("--latency-max", default="64K", help="largest size shown in the latency rows (default 64K)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark run (default 1800)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the libraries in turn this many times and report each size's median (default 1)")
    opts, bench_args = ap.parse_known_args()

    lat = opts.latency_max.upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(lat[-1:], 1)
    latency_max = int(float(lat.rstrip("KMG")) * mult)

    libs = ([] if opts.no_c4 else ["c4"]) + [p.strip() for p in opts.peers.split(",") if p.strip()]
    for lib in libs:
        if lib not in LIBS:
            ap.error("unknown peer '%s' (known: mpi, gloo)" % lib)
    plan = []
    for lib in libs:
        b = find_binary(LIBS[lib][0], opts.bin_dir)
        if b:
            plan.append((lib, b))
        else:
            sys.stderr.write("warning: %s not found (build it, or pass --bin-dir); skipping %s\n"
                             % (LIBS[lib][0], LIBS[lib][1]))
    if not plan:
        sys.stderr.write("error: no benchmark binary found\n")
        return 1

    # Libraries take turns, so a machine that changes speed over time affects them alike.
    runs = {lib: [] for lib, _ in plan}
    total = len(plan) * max(1, opts.repeat)
    i = 0
    for _ in range(max(1, opts.repeat)):
        for lib, binary in plan:
            i += 1
            args = bench_args
            # The peers run on host memory: so does c4-perf here (it would take device buffers on
            # a GPU host), unless --device was given.
            if lib == "c4" and not any(a == "--device" or a.startswith("--device=") for a in bench_args):
                args = bench_args + ["--device", "0"]
            runs[lib].append(run_one(lib, binary, args, i, total, opts.timeout))
    results = {lib: merge_runs(runs[lib]) for lib, _ in plan}
    ran = [lib for lib, _ in plan if results.get(lib)]
    recs = build_records(results, ran)

    if opts.csv:
        buf = io.StringIO()
        fields = ["type", "redop", "root", "size"] + sorted({k for r in recs for k in r} -
                                                            {"type", "redop", "root", "size"})
        wr = csv.DictWriter(buf, fieldnames=fields)
        wr.writeheader()
        for r in recs:
            wr.writerow({k: ("" if v is None else v) for k, v in r.items()})
        emit(opts.csv, buf.getvalue())
    if opts.json:
        doc = {"args": bench_args,
               "runs": {lib: results[lib][1] for lib in ran},
               "rows": recs}
        emit(opts.json, json.dumps(doc, indent=2) + "\n")
    if opts.plot:
        title = "busbw vs size: " + " ".join(bench_args)
        write_svg(opts.plot, recs, ran, title)
        sys.stderr.write("wrote %s\n" % opts.plot)
    if not (opts.csv == "-" or opts.json == "-"):
        print_table(recs, ran, results, latency_max, sys.stdout)
    failed = any(results[lib][1]["returncode"] != 0 for lib in ran) or len(ran) < len(plan)
    return 1 if failed else 0


def emit(dest, text):
    if dest == "-":
        sys.stdout.write(text)
    else:
        with open(dest, "w") as f:
            f.write(text)
        sys.stderr.write("wrote %s\n" % dest)


if __name__ == "__main__":
    sys.exit(main())
