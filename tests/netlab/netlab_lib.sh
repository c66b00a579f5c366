# Sourced by the netlab test scripts: paths, and entering a fresh fabric.
#   netlab_enter [netlab session options] -- CMD...   re-runs CMD inside a new fabric, or exits 77
#                                                      (skipped, reason on stdout) without root/netns.
here=$(cd "$(dirname "$0")" && pwd)
tools=$(cd "$here/../../tools/netlab" && pwd)
py=/usr/bin/python3
[ -x "$py" ] || py=python3

netlab_enter() {
  "$py" - "$tools" <<'PYEOF' || exit $?
import sys
sys.path.insert(0, sys.argv[1])
import netlab
ok, why = netlab.netns_available()
if not ok:
    print("SKIPPED: " + why)
sys.exit(0 if ok else 77)
PYEOF
  exec "$py" "$tools/netlab" session "$@"
}
