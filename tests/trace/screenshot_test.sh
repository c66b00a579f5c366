#!/usr/bin/env bash
# The HTML report opens in headless Chromium without console errors and shows its plots: renders a
# report of a synthetic 4-rank trace to a PNG and checks the image is non-trivial and contains the
# plots' bar colour. Exit 77 (skipped) when chromium is not installed.
# Usage: screenshot_test.sh PATH/TO/c4-trace tests/trace
set -euo pipefail
tool=$1
src=$2
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [ -z "$browser" ]; then
  echo "SKIP: chromium is not installed (Debian package chromium; scripts/deps.sh installs it)"
  exit 77
fi
work=$(mktemp -d /tmp/c4trace-shot-XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 - "$tool" "$src" "$work" <<'PY'
import os, sys
tool, src, work = sys.argv[1:4]
sys.argv = ["x", tool]
sys.path.insert(0, src)
import test_c4trace as t
case = t.C4TraceTool("test_report_numbers")
case.dir = work
case.make_run(skews=(0, 1_000_000, 0, 2_000_000))
PY
python3 "$tool" report "$work" -o "$work/report.html" --quiet
"$browser" --headless --disable-gpu --no-sandbox --hide-scrollbars --window-size=1200,4200 \
  --user-data-dir="$work/profile" --enable-logging=stderr --v=0 \
  --screenshot="$work/shot.png" "file://$work/report.html" >"$work/console.log" 2>&1 || {
  cat "$work/console.log"; echo "FAIL: $browser exited with an error"; exit 1; }
if grep -E "Uncaught|SyntaxError|CONSOLE\(.*\).*[Ee]rror|Failed to load" "$work/console.log"; then
  echo "FAIL: the report logged errors in the browser console"; exit 1
fi
python3 - "$work/shot.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), "unexpected PNG format %d/%d" % (depth, ctype)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
nonwhite = bar = 0
colors = set()
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = line
    if y % 2:
        continue
    for x in range(0, w, 2):
        px = tuple(line[x * bpp:x * bpp + 3])
        colors.add(px)
        if px != (255, 255, 255):
            nonwhite += 1
        if abs(px[0] - 0x4e) < 12 and abs(px[1] - 0x79) < 12 and abs(px[2] - 0xa7) < 12:
            bar += 1
print("screenshot %dx%d, %d bytes: %d sampled non-white pixels, %d distinct colours, %d in the plots' bar colour"
      % (w, h, len(data), nonwhite, len(colors), bar))
assert nonwhite > 20000, "the page looks blank"
assert len(colors) > 50, "too few colours for a page with plots"
assert bar > 500, "no plot bars visible"
PY
echo "PASS"
