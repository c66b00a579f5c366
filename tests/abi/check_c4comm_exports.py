#!/usr/bin/env python3
"""libc4comm.so exports exactly its public API: the defined dynamic symbols, demangled, must equal
the list in c4comm.exports (one per line). A symbol added to the API is added there on purpose;
anything else that leaks (an internal function, a template instance) fails this test.

    check_c4comm_exports.py <nm> <c++filt> <libc4comm.so> <c4comm.exports>
"""
import subprocess
import sys


def main():
    nm, cxxfilt, lib, listing = sys.argv[1:5]
    out = subprocess.run([nm, "-D", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
    mangled = [line.split()[-1] for line in out.splitlines() if len(line.split()) >= 3]
    names = subprocess.run([cxxfilt], input="\n".join(mangled), check=True, capture_output=True,
                           text=True).stdout.splitlines()
    got = set(n.strip() for n in names if n.strip())
    with open(listing) as f:
        want = set(line.strip() for line in f if line.strip() and not line.startswith("#"))
    extra, missing = sorted(got - want), sorted(want - got)
    for s in extra:
        print("exported but not in the API list: " + s)
    for s in missing:
        print("in the API list but not exported: " + s)
    if extra or missing:
        print("%s: %d exports; %d unexpected, %d missing (update %s only for a deliberate API change)" %
              (lib, len(got), len(extra), len(missing), listing))
        return 1
    print("%s: %d exports, exactly the public API" % (lib, len(got)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
