#!/usr/bin/python3
"""netlab fabric tests: real namespaces, veths, tc and TCP traffic (root needed; exit 77 = skipped).

  test_netlab.py SUITE          runs one suite: lifecycle, connectivity, ecmp, rate, link
  test_netlab.py --inner CASE   a scenario run by `netlab session ... -- test_netlab.py --inner CASE`
                                (inside a fabric: NETLAB_NAME and NETLAB_TOPO are set)

Throughput bounds are deliberately generous (links at 200 mbit; "half" is 0.35-0.65 of the rate, "full"
above 0.75) and every measurement is printed, so a failure shows the numbers.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(REPO, "tools", "netlab")
NETLAB = os.path.join(TOOLS, "netlab")
NETLOAD = os.path.join(TOOLS, "netload.py")
PY = sys.executable or "/usr/bin/python3"
sys.path.insert(0, TOOLS)
import netlab  # noqa: E402

SKIP = 77
RATE = 200 * 10**6
_seq = [0]


def uname(tag):
    """A fabric name unique to this process (tests may run concurrently)."""
    _seq[0] += 1
    return "t%s%d_%d" % (tag, os.getpid(), _seq[0])


def nl(*args, timeout=60, **kw):
    """Runs the netlab command line; returns CompletedProcess (text)."""
    return subprocess.run([NETLAB, "-q"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, **kw)


def leftovers(name, extra_paths=()):
    """What fabric name left behind: namespaces, state directory, files."""
    pat = netlab._fabric_netns_re(name)
    left = [ns for ns in netlab.list_netns() if pat.fullmatch(ns)]
    left += [p for p in [netlab.state_dir(name)] + list(extra_paths) if os.path.exists(p)]
    return left


def root_links():
    out = subprocess.run(["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


# ---------------------------------------------------------------------------------------------------
# helpers for scenarios inside a fabric


class Fabric:
    """The fabric a scenario runs in (from NETLAB_NAME / NETLAB_TOPO)."""

    def __init__(self):
        self.name = os.environ["NETLAB_NAME"]
        self.topo = netlab.load_topology(os.environ["NETLAB_TOPO"])
        assert os.environ.get("C4_TOPO_FILE") == os.environ["NETLAB_TOPO"]
        self.procs = []

    def addr(self, host, port=0):
        return self.topo["hosts"][host]["ports"][port]["addr"]

    def argv(self, host, *args):
        return [NETLAB, "run", self.name, "h%d" % host, "--", PY, NETLOAD] + list(args)

    def load(self, host, *args, timeout=60):
        """Runs netload in a host to completion; returns (exit status, parsed last JSON line)."""
        cp = subprocess.run(self.argv(host, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=timeout)
        lines = [l for l in cp.stdout.splitlines() if l.strip()]
        if cp.stderr.strip():
            print(cp.stderr.strip(), file=sys.stderr)
        return cp.returncode, (json.loads(lines[-1]) if lines else None)

    def start(self, host, *args):
        """Starts netload in a host; returns the process (stdout piped)."""
        p = subprocess.Popen(self.argv(host, *args), stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def serve(self, host, port):
        p = self.start(host, "serve", "--listen", "0.0.0.0:%d" % port, "--max-time", "60")
        line = p.stdout.readline()
        assert "listening" in line, "serve in h%d did not start: %r" % (host, line)
        return p

    def spine_bytes(self):
        """{spine name: bytes sent by all its interfaces}."""
        return {s["name"]: sum(c["tx_bytes"] for c in netlab.iface_counters(s["netns"]).values())
                for s in self.topo["spines"]}

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()


def wait_listening(fab, host, port, timeout=10.0):
    """Waits until something listens on port inside a host."""
    ns = fab.topo["hosts"][host]["netns"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn", "sport = :%d" % port],
                             stdout=subprocess.PIPE, text=True).stdout
        if out.strip():
            return
        time.sleep(0.05)
    raise AssertionError("nothing listens on h%d:%d" % (host, port))


class Sink:
    """A sink in a host whose per-interval byte counts are collected by a thread."""

    def __init__(self, fab, host, port, flows, *extra):
        self.proc = fab.start(host, "sink", "--listen", "0.0.0.0:%d" % port, "--flows", str(flows), *extra)
        self.samples = []
        self.final = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        wait_listening(fab, host, port)

    def _read(self):
        for line in self.proc.stdout:
            d = json.loads(line)
            if "t" in d:
                self.samples.append((time.monotonic(), d["bytes"]))
            else:
                self.final = d

    def total(self, i=0):
        return self.samples[-1][1][i] if self.samples else 0

    def rate_bps(self, seconds, i=0):
        """Mean rate of flow i over the last `seconds` of samples (waits for them)."""
        t0 = time.monotonic()
        b0 = self.total(i)
        time.sleep(seconds)
        return (self.total(i) - b0) * 8 / (time.monotonic() - t0)

    def result(self, timeout=30):
        self.proc.wait(timeout=timeout)
        self.thread.join(timeout=5)
        return self.final


# ---------------------------------------------------------------------------------------------------
# scenarios (run inside `netlab session`)


def inner_connectivity():
    fab = Fabric()
    nh = len(fab.topo["hosts"])
    for h in range(nh):
        # predictable port names inside the host namespace (C4_SOCKET_IFNAME=p0 works)
        out = subprocess.run(["ip", "-n", fab.topo["hosts"][h]["netns"], "-j", "addr", "show"], stdout=subprocess.PIPE,
                             text=True, check=True).stdout
        have = {(e["ifname"], a["local"]) for e in json.loads(out) for a in e.get("addr_info", [])
                if a.get("family") == "inet"}
        for p in fab.topo["hosts"][h]["ports"]:
            assert (p["ifname"], p["addr"]) in have, "h%d lacks %s %s: %s" % (h, p["ifname"], p["addr"], have)
        fab.serve(h, 7000)
    checked = 0
    for h in range(nh):
        targets = []
        for o in range(nh):
            if o == h:
                continue
            for dp in fab.topo["hosts"][o]["ports"]:
                targets.append("%s:7000" % dp["addr"])  # unbound: the route of that port index
                for sp in fab.topo["hosts"][h]["ports"]:
                    targets.append("%s:7000,%s" % (dp["addr"], sp["addr"]))  # any port to any port
        rc, res = fab.load(h, "probe", "--timeout", "3", *sum((["--target", t] for t in targets), []))
        bad = [r for r in res["results"] if not r["ok"]]
        assert rc == 0 and not bad, "h%d: unreachable %s" % (h, bad)
        for r in res["results"]:
            if r["src"] is None:
                # an unbound connection to port i leaves through local port i (same index)
                dst_port = netlab.port_by_addr(fab.topo, r["target"].split(":")[0])[1]
                local = r["local"].split(":")[0]
                assert local == fab.topo["hosts"][h]["ports"][dst_port["index"]]["addr"], r
        checked += len(targets)
    fab.stop()
    print("connectivity: %d connections between %d hosts x %d ports all ok" % (
        checked, nh, len(fab.topo["hosts"][0]["ports"])))


def inner_ecmp():
    fab = Fabric()
    topo = fab.topo
    # the leaves run exactly the JSON's first-match list
    for leaf in topo["leaves"]:
        rules = json.loads(subprocess.run(["ip", "-n", leaf["netns"], "-j", "rule", "show"], stdout=subprocess.PIPE,
                                          text=True, check=True).stdout)
        got = [(("sport" if "sport_start" in r else "dport"), r.get("sport_start", r.get("dport_start")),
                r.get("sport_end", r.get("dport_end")), int(r["table"]) - netlab.SPINE_TABLE)
               for r in rules if r["priority"] >= netlab.ECMP_PREF and ("sport_start" in r or "dport_start" in r)]
        want = [(m["field"], m["lo"], m["hi"], m["spine"]) for m in topo["ecmp"]["match"]]
        assert got == want, "%s rules differ from the topology JSON" % leaf["name"]
    a, b = fab.addr(0), fab.addr(1)
    size = 4 * 2**20
    fab.serve(1, 7000)
    sink_port = 7100
    spines = [s["name"] for s in topo["spines"]]
    checks = []
    for spine in spines:
        lo, hi = netlab.sports_for_spine(topo, spine)[-1]
        checks.append(("upload", spine, lo + 7))
        checks.append(("download", spine, hi - 3))
    checks.append(("upload", None, None))  # kernel-chosen source port: the fallback hash decides
    checks.append(("download", None, None))
    for kind, spine, sport in checks:
        before = fab.spine_bytes()
        src = "%s:%d" % (a, sport) if sport else a
        if kind == "upload":
            sink = Sink(fab, 1, sink_port, 1)
            rc, res = fab.load(0, "source", "--flow", "%s:%d,%s" % (b, sink_port, src), "--bytes", str(size))
            sink.result()
            flow = res["flows"][0]
            assert rc == 0 and flow["bytes"] == size, res
            used = flow["sport"]
            expect = netlab.spine_for_packet(topo, a, b, used, sink_port)  # data: client -> server
            sink_port += 1
        else:
            rc, res = fab.load(0, "fetch", "--target", "%s:7000,%s" % (b, src), "--bytes", str(size))
            assert rc == 0, res
            used = res["sport"]
            expect = netlab.spine_for_packet(topo, b, a, 7000, used)  # data: server -> client
        after = fab.spine_bytes()
        delta = {s: after[s] - before[s] for s in spines}
        print("ecmp %-8s sport %5d: expected %s, spine bytes %s" % (kind, used, expect, delta))
        if spine is not None:
            assert expect == spine, (expect, spine)
        assert delta[expect] >= size, "flow did not cross %s: %s" % (expect, delta)
        for s in spines:
            if s != expect:
                assert delta[s] < size // 16, "flow leaked onto %s: %s" % (s, delta)
    fab.stop()


def _two_flows(fab, sport0, sport1, port):
    sink = Sink(fab, 1, port, 2, "--warmup", "0.7", "--window", "1.5", "--max-time", "20")
    flows = ["%s:%d,%s:%d" % (fab.addr(1, i), port, fab.addr(0, i), sp) for i, sp in ((0, sport0), (1, sport1))]
    src = fab.start(0, "source", "--flow", flows[0], "--flow", flows[1], "--seconds", "10")
    res = sink.result()
    src.wait(timeout=20)
    assert res and "window_s" in res, "sink failed: %s" % res
    return [f["bps"] for f in res["flows"]]


def inner_rate():
    fab = Fabric()
    topo = fab.topo
    s0 = netlab.sports_for_spine(topo, 0)[0][0]
    s1 = netlab.sports_for_spine(topo, 1)[0][0]
    same = _two_flows(fab, s0 + 1, s0 + 2, 7200)
    print("rate: two flows on spine0: %.1f + %.1f Mbit/s (link %d Mbit/s)" % (same[0] / 1e6, same[1] / 1e6, RATE / 1e6))
    diff = _two_flows(fab, s0 + 3, s1 + 3, 7201)
    print("rate: flows on spine0 and spine1: %.1f + %.1f Mbit/s" % (diff[0] / 1e6, diff[1] / 1e6))
    fab.stop()
    for bps in same:
        assert 0.35 * RATE < bps < 0.65 * RATE, "colliding flows should get about half the link: %s" % same
    for bps in diff:
        assert bps > 0.75 * RATE, "flows on different spines should each get the link: %s" % diff


def _probe(fab, sport, timeout="1.5"):
    rc, res = fab.load(0, "probe", "--timeout", timeout, "--target", "%s:7000,%s:%d" % (fab.addr(1), fab.addr(0),
                                                                                        sport))
    return res["results"][0]


def inner_link():
    fab = Fabric()
    topo = fab.topo
    s0 = netlab.sports_for_spine(topo, "spine0")[0][0]
    s1 = netlab.sports_for_spine(topo, "spine1")[0][0]
    fab.serve(1, 7000)
    sink = Sink(fab, 1, 7300, 1, "--interval", "0.1", "--max-time", "40")
    fab.start(0, "source", "--flow", "%s:7300,%s:%d" % (fab.addr(1), fab.addr(0), s1 + 11), "--seconds", "40")
    time.sleep(0.7)
    base = sink.rate_bps(1.0)
    rc = nl("link", fab.name, "leaf0-spine1", "--rate", "50mbit")
    assert rc.returncode == 0, rc.stderr
    time.sleep(0.5)
    slow = sink.rate_bps(1.0)
    print("link: flow on spine1 %.1f Mbit/s; after leaf0-spine1 --rate 50mbit: %.1f Mbit/s" % (base / 1e6, slow / 1e6))
    assert base > 0.6 * RATE, "baseline %.1f Mbit/s" % (base / 1e6)
    assert slow < 0.4 * RATE and slow < 0.5 * base, "throttle did not slow the flow: %.1f" % (slow / 1e6)

    rc = nl("link", fab.name, "leaf0-spine1", "--down")
    assert rc.returncode == 0, rc.stderr
    time.sleep(0.3)
    cut = sink.rate_bps(1.0)
    p_cut = _probe(fab, s1 + 21)
    p_other = _probe(fab, s0 + 21)
    print("link: after --down: flow %.3f Mbit/s; new connection via spine1: %s; via spine0: %s" % (
        cut / 1e6, p_cut["error"] or "ok", p_other["error"] or "ok"))
    assert cut < 0.5e6, "a cut link still carries %.3f Mbit/s" % (cut / 1e6)
    assert not p_cut["ok"], "connection through a cut link succeeded"
    assert p_other["ok"], "the other spine should be unaffected: %s" % p_other

    rc = nl("link", fab.name, "leaf0-spine1", "--up", "--rate", "200mbit")
    assert rc.returncode == 0, rc.stderr
    before = sink.total()
    p_up = _probe(fab, s1 + 31, timeout="3")
    deadline = time.monotonic() + 10
    while sink.total() - before < 2**20 and time.monotonic() < deadline:
        time.sleep(0.1)
    resumed = sink.total() - before
    print("link: after --up: new connection %s; flow carried %d bytes more" % (p_up["error"] or "ok", resumed))
    assert p_up["ok"], p_up
    assert resumed >= 2**20, "flow did not resume after --up"

    # a host link: cut and restore
    assert nl("link", fab.name, "h0p0-leaf0", "--down").returncode == 0
    p = _probe(fab, s0 + 41)
    assert not p["ok"], "connection through a cut host link succeeded"
    assert nl("link", fab.name, "h0p0-leaf0", "--up").returncode == 0
    p = _probe(fab, s0 + 42, timeout="3")
    assert p["ok"], p
    print("link: h0p0-leaf0 --down blocks, --up restores")
    bad = nl("link", fab.name, "leaf0-leaf1", "--down")
    assert bad.returncode != 0 and "no link" in bad.stderr, bad.stderr
    fab.stop()


INNER = {"connectivity": inner_connectivity, "ecmp": inner_ecmp, "rate": inner_rate, "link": inner_link}


# ---------------------------------------------------------------------------------------------------
# suites


class SessionCase(unittest.TestCase):
    def session(self, case, *opts, timeout=120):
        name = uname(case[:3])
        cp = subprocess.run([NETLAB, "session", "--name", name] + list(opts) + ["--", PY, __file__, "--inner", case],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        sys.stderr.write(cp.stdout)
        self.assertEqual(cp.returncode, 0, "scenario %s failed" % case)
        self.assertEqual(leftovers(name), [])
        return cp.stdout


class Connectivity(SessionCase):
    def test_2_hosts_2_ports(self):
        self.session("connectivity", "--hosts", "2", "--ports", "2", "--leaves", "2", "--spines", "2")

    def test_4_hosts_1_port(self):
        self.session("connectivity", "--hosts", "4", "--ports", "1", "--leaves", "2", "--spines", "2")

    def test_4_hosts_2_ports_rail(self):
        self.session("connectivity", "--hosts", "4", "--ports", "2", "--leaves", "2", "--spines", "2", "--placement",
                     "rail")


class Ecmp(SessionCase):
    def test_sport_range(self):
        self.session("ecmp", "--hosts", "2", "--leaves", "2", "--spines", "2", "--rate", "1gbit")

    def test_sport_mod_3_spines(self):
        self.session("ecmp", "--hosts", "2", "--leaves", "2", "--spines", "3", "--rate", "1gbit", "--ecmp", "sport-mod",
                     "--ecmp-block", "10")


class Rate(SessionCase):
    def test_collisions_share_a_spine_link(self):
        self.session("rate", "--hosts", "2", "--ports", "2", "--leaves", "2", "--spines", "2", "--rate", "200mbit")


class Link(SessionCase):
    def test_throttle_cut_restore(self):
        self.session("link", "--hosts", "2", "--leaves", "2", "--spines", "2", "--rate", "200mbit")


class Lifecycle(unittest.TestCase):
    def assertClean(self, name, extra=()):
        self.assertEqual(leftovers(name, extra), [], "fabric %s left things behind" % name)

    def test_up_down_leaves_nothing(self):
        name = uname("ud")
        links = root_links()
        tmp = tempfile.mkdtemp(prefix="netlab-test-")
        self.addCleanup(shutil.rmtree, tmp, True)
        out = os.path.join(tmp, "topo.json")
        cp = nl("up", "--name", name, "--hosts", "2", "--ports", "2", "--leaves", "2", "--spines", "2", "--rate",
                "100mbit", "--topo-out", out)
        self.assertEqual(cp.returncode, 0, cp.stderr)
        self.assertEqual(cp.stdout.strip(), out)
        try:
            self.assertEqual(len(leftovers(name)), 7)  # 6 namespaces + state dir
            topo = netlab.load_topology(out)
            self.assertEqual(topo, netlab.load_topology(name))
            self.assertEqual(len(topo["links"]), 8)
            self.assertEqual(root_links(), links, "netlab must not add interfaces to the root namespace")
            self.assertIn(name, nl("list").stdout)
            show = nl("show", name)
            self.assertEqual(show.returncode, 0, show.stderr)
            self.assertIn("leaf0-spine1", show.stdout)
            r = nl("run", name, "h1", "--", "sh", "-c", 'echo "$NETLAB_HOST $NETLAB_ADDRS"; exit 5')
            self.assertEqual(r.returncode, 5)  # exit status propagates
            self.assertEqual(r.stdout.strip(), "h1 %s,%s" % (topo["hosts"][1]["ports"][0]["addr"],
                                                              topo["hosts"][1]["ports"][1]["addr"]))
            self.assertNotEqual(nl("run", name, "h9", "--", "true").returncode, 0)
            self.assertEqual(nl("addr", name, "h1", "1").stdout.strip(), topo["hosts"][1]["ports"][1]["addr"])
            self.assertNotEqual(nl("addr", name, "leaf0").returncode, 0)
        finally:
            d = nl("down", name)
        self.assertEqual(d.returncode, 0, d.stderr)
        self.assertClean(name, [out])
        self.assertEqual(root_links(), links)
        self.assertEqual(nl("down", name).returncode, 0)  # idempotent
        self.assertNotEqual(nl("show", name).returncode, 0)

    def test_duplicate_name_refused(self):
        name = uname("dup")
        self.assertEqual(nl("up", "--name", name).returncode, 0)
        try:
            cp = nl("up", "--name", name)
            self.assertNotEqual(cp.returncode, 0)
            self.assertIn("already exists", cp.stderr)
            self.assertEqual(len(leftovers(name)), 7)  # the first one is intact
        finally:
            nl("down", name)
        self.assertClean(name)

    def test_bad_arguments_touch_nothing(self):
        name = uname("bad")
        for args in (["--hosts", "0"], ["--leaves", "2", "--spines", "0"], ["--rate", "fast"],
                     ["--ecmp-ports", "9-1"]):
            cp = nl("up", "--name", name, *args)
            self.assertNotEqual(cp.returncode, 0, args)
            self.assertIn("netlab: error:", cp.stderr)
            self.assertClean(name)

    def test_session_command_fails(self):
        name = uname("sf")
        cp = nl("session", "--name", name, "--", "sh", "-c", 'test -f "$NETLAB_TOPO" && test -n "$NETLAB_NAME" && '
                'netlab run "$NETLAB_NAME" h0 -- true && exit 7')
        self.assertEqual(cp.returncode, 7, cp.stderr)
        self.assertClean(name)
        cp = nl("session", "--name", name, "--", "/nonexistent/command")
        self.assertNotEqual(cp.returncode, 0)
        self.assertClean(name)

    def test_session_signals(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            name = uname("sig")
            # a rank in each host, one of them ignoring SIGTERM
            p = subprocess.Popen([NETLAB, "-q", "session", "--name", name, "--", "sh", "-c",
                                  'netlab run $NETLAB_NAME h0 -- sleep 60 & '
                                  'netlab run $NETLAB_NAME h1 -- sh -c "trap \\"\\" TERM; sleep 60" & wait'],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            ns = netlab.netns_name(name, "h1")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                pids = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True).stdout.split()
                if pids:
                    break
                time.sleep(0.05)
            self.assertTrue(pids, "the session's ranks did not start")
            p.send_signal(sig)
            p.communicate(timeout=30)
            self.assertEqual(p.returncode, 128 + sig)
            self.assertClean(name)
            for pid in pids:
                self.assertFalse(netlab.pid_alive(int(pid)), "rank %s survived" % pid)

    def test_signal_during_up(self):
        # Interrupted at whatever point of the build: afterwards either the whole fabric is up, or nothing.
        for delay in (0.0, 0.02, 0.05):
            name = uname("iu")
            p = subprocess.Popen([NETLAB, "-q", "up", "--name", name, "--hosts", "4", "--ports", "2", "--leaves", "2",
                                  "--spines", "2", "--ecmp", "sport-mod", "--ecmp-block", "8"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            sdir = netlab.state_dir(name)
            deadline = time.monotonic() + 10
            while not os.path.exists(sdir) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(delay)
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=30)
            if p.returncode == 0:
                self.assertEqual(len(leftovers(name)), 9)  # 8 namespaces + state
                nl("down", name)
            else:
                self.assertEqual(p.returncode, 130)
            self.assertClean(name)

    def test_concurrent_fabrics(self):
        a, b = uname("ca"), uname("cb")
        ps = [subprocess.Popen([NETLAB, "-q", "up", "--name", n, "--hosts", "2", "--ports", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (a, b)]
        try:
            for p in ps:
                out, err = p.communicate(timeout=60)
                self.assertEqual(p.returncode, 0, err)
            ta, tb = netlab.load_topology(a), netlab.load_topology(b)
            self.assertNotEqual(ta["subnet"], tb["subnet"])
            for t in (ta, tb):
                self.assertTrue(self._reach(t))
            self.assertEqual(nl("down", a).returncode, 0)
            self.assertClean(a)
            self.assertEqual(len(leftovers(b)), 7)
            self.assertTrue(self._reach(tb))
        finally:
            nl("down", a)
            nl("down", b)
        self.assertClean(b)

    def _reach(self, topo):
        name = topo["name"]
        srv = subprocess.Popen([NETLAB, "run", name, "h1", "--", PY, NETLOAD, "serve", "--listen", "0.0.0.0:7000",
                                "--max-time", "30"], stdout=subprocess.PIPE, text=True)
        try:
            self.assertIn("listening", srv.stdout.readline())
            targets = sum((["--target", "%s:7000,%s" % (topo["hosts"][1]["ports"][i]["addr"],
                                                         topo["hosts"][0]["ports"][i]["addr"])] for i in range(2)), [])
            cp = subprocess.run([NETLAB, "run", name, "h0", "--", PY, NETLOAD, "probe"] + targets,
                                stdout=subprocess.PIPE, text=True, timeout=30)
            return cp.returncode == 0
        finally:
            srv.terminate()
            srv.wait(timeout=10)

    def test_stale_fabrics_are_removed(self):
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale, live, orphan = uname("st"), uname("lv"), uname("or")
        self.assertEqual(nl("up", "--name", stale, "--owner", str(dead.pid)).returncode, 0)
        self.assertEqual(nl("up", "--name", live, "--owner", str(os.getpid())).returncode, 0)
        subprocess.run(["ip", "netns", "add", netlab.netns_name(orphan, "h0")], check=True)
        try:
            self.assertIn("dead", [l for l in nl("list").stdout.splitlines() if l.startswith(stale + " ")][0])
            cp = nl("down", "--stale")
            self.assertEqual(cp.returncode, 0, cp.stderr)
            self.assertClean(stale)
            self.assertClean(orphan)
            self.assertEqual(len(leftovers(live)), 7)
        finally:
            for n in (stale, live, orphan):
                nl("down", n)
        self.assertClean(live)


SUITES = {"lifecycle": [Lifecycle], "connectivity": [Connectivity], "ecmp": [Ecmp], "rate": [Rate], "link": [Link]}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        INNER[sys.argv[2]]()
        return 0
    if len(sys.argv) != 2 or sys.argv[1] not in SUITES:
        print("usage: test_netlab.py {%s} | --inner CASE" % ",".join(SUITES), file=sys.stderr)
        return 2
    ok, why = netlab.netns_available()
    if not ok:
        print("SKIPPED: " + why)
        return SKIP
    loader = unittest.TestLoader()
    suite = unittest.TestSuite([loader.loadTestsFromTestCase(c) for c in SUITES[sys.argv[1]]])
    res = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    return 0 if res.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
