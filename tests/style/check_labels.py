#!/usr/bin/env python3
"""Every ctest test carries a label (ctest -L <suite> selects it), and the quick label holds some.

Usage: check_labels.py CTEST BUILD_DIR
"""
import json
import subprocess
import sys


def main():
    ctest, build = sys.argv[1], sys.argv[2]
    out = subprocess.run([ctest, "-N", "--show-only=json-v1"], cwd=build, capture_output=True, text=True, check=True)
    tests = json.loads(out.stdout)["tests"]
    unlabelled, quick = [], 0
    for t in tests:
        labels = [p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"]
        flat = [x for v in labels for x in (v if isinstance(v, list) else [v])]
        if not flat:
            unlabelled.append(t["name"])
        quick += any("quick" in x for x in flat)
    if unlabelled:
        print("check_labels: %d of %d tests have no ctest label (give their suite one in its CMakeLists.txt):"
              % (len(unlabelled), len(tests)))
        for n in unlabelled[:30]:
            print("  " + n)
        return 1
    if quick == 0:
        print("check_labels: no test has the label quick")
        return 1
    print("check_labels: %d tests, every one labelled; %d quick" % (len(tests), quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
