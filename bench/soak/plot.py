#!/usr/bin/env python3
"""Plots c4-soak's per-rank samples (resident set, live heap, open fds, threads) over time.

Usage: plot.py SOAK.json [-o PREFIX]

Writes PREFIX.png with matplotlib when the interpreter has it, else PREFIX.svg (drawn here, no
dependencies). PREFIX defaults to the JSON file's name without .json. Each panel has one line per
rank process (worker) and a dashed line where the leak check's warm-up ends.
"""
import json
import os
import sys

PANELS = [  # (sample field, title, scale)
    ("rss_kib", "resident set (MiB)", 1 / 1024.0),
    ("heap_kib", "live heap (MiB)", 1 / 1024.0),
    ("fds", "open fds", 1.0),
    ("threads", "threads", 1.0),
]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def series(doc):
    """{field: {worker: ([t], [value])}}"""
    fields = doc["sample_fields"]
    idx = {f: i for i, f in enumerate(fields)}
    out = {f: {} for f, _, _ in PANELS}
    for s in doc["samples"]:
        w = s[idx["worker"]]
        for f, _, scale in PANELS:
            ts, vs = out[f].setdefault(w, ([], []))
            ts.append(s[idx["t_s"]])
            vs.append(s[idx[f]] * scale)
    return out


def title(doc):
    return "c4-soak %s: %.0f s, %d segments, %d calls, %d wrong, seed %s" % (
        doc["result"].upper(), doc["duration_s"], doc["segments"], doc["calls"], doc["wrong"], doc["seed"])


def plot_matplotlib(doc, data, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(10, 2.4 * len(PANELS)), sharex=True)
    warm = doc["leak"]["warmup_s"]
    for ax, (f, name, _) in zip(axes, PANELS):
        for w, (ts, vs) in sorted(data[f].items()):
            ax.plot(ts, vs, lw=1, label="worker %d" % w, color=COLORS[w % len(COLORS)])
        ax.axvline(warm, ls="--", color="gray", lw=0.8)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=7, ncol=4)
    axes[0].set_title(title(doc), fontsize=9)
    axes[-1].set_xlabel("seconds (dashed: end of the warm-up)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_svg(doc, data, path):
    W, H, PAD = 900, 170, 55
    tmax = max([doc["duration_s"]] + [t for f in data.values() for ts, _ in f.values() for t in ts]) or 1
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
             'font-size="11">' % (W, 30 + H * len(PANELS)),
             '<rect width="100%" height="100%" fill="white"/>',
             '<text x="%d" y="18">%s</text>' % (PAD, title(doc))]
    workers = sorted({w for f in data.values() for w in f})
    for i, w in enumerate(workers):
        parts.append('<text x="%d" y="18" fill="%s">worker %d</text>' % (W - 70 * (len(workers) - i), COLORS[w % len(COLORS)], w))
    for p, (f, name, _) in enumerate(PANELS):
        y0 = 30 + p * H
        vals = [v for _, vs in data[f].values() for v in vs] or [0]
        lo, hi = min(0, min(vals)), max(vals) * 1.05  # from zero, so that a flat line looks flat
        if hi - lo < 1e-9:
            hi = lo + 1
        ph = H - 40

        def xy(t, v):
            return PAD + (W - PAD - 10) * t / tmax, y0 + 10 + ph * (1 - (v - lo) / (hi - lo))
        parts.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#ccc"/>' %
                     (PAD, y0 + 10, W - PAD - 10, ph))
        parts.append('<text x="%d" y="%d">%s</text>' % (PAD + 4, y0 + 22, name))
        parts.append('<text x="2" y="%d">%.4g</text>' % (y0 + 18, hi))
        parts.append('<text x="2" y="%d">%.4g</text>' % (y0 + 10 + ph, lo))
        wx, _ = xy(doc["leak"]["warmup_s"], lo)
        parts.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="gray" stroke-dasharray="4"/>' %
                     (wx, wx, y0 + 10, y0 + 10 + ph))
        for w, (ts, vs) in sorted(data[f].items()):
            pts = " ".join("%.1f,%.1f" % xy(t, v) for t, v in zip(ts, vs))
            parts.append('<polyline fill="none" stroke="%s" stroke-width="1" points="%s"/>' %
                         (COLORS[w % len(COLORS)], pts))
    parts.append("</svg>")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    src = args[0]
    prefix = args[args.index("-o") + 1] if "-o" in args else os.path.splitext(src)[0]
    with open(src) as fh:
        doc = json.load(fh)
    data = series(doc)
    try:
        import matplotlib  # noqa: F401
        have_mpl = True
    except ImportError:
        have_mpl = False
    if have_mpl:
        plot_matplotlib(doc, data, prefix + ".png")
        print("plot.py: wrote %s.png" % prefix)
    else:
        plot_svg(doc, data, prefix + ".svg")
        print("plot.py: no matplotlib for %s; wrote %s.svg instead of a PNG" % (sys.executable, prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
