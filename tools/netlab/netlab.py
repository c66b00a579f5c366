"""netlab: emulated multi-host leaf-spine fabrics on one machine (network namespaces + veth + tc tbf).

Every host, leaf switch and spine switch is a network namespace; every link is a veth pair rate-limited
with `tc tbf` at both ends. Leaves pick the spine for a packet with policy routing on its TCP/UDP ports
(`ip rule ... sport A-B lookup <spine table>`), so a fabric behaves like switches hashing the 5-tuple and a
chosen source port lands on a chosen spine. The topology (hosts, ports, addresses, leaves, spines, links,
rates, ECMP rule) is written as JSON for C4P (`C4_TOPO_FILE`). See docs/netlab.md.

Pure Python 3 standard library; the commands that change the system need root. The module is importable
(tests and other tools use `build_topology`, `spine_for_packet`, `sports_for_spine`, `load_topology` ...);
the command line is `main()` (tools/netlab/netlab).
"""

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

VERSION = 1
NETNS_PREFIX = "nl-"
DEFAULT_RATE = "1gbit"
TBF_LATENCY = "50ms"  # queue limit of every tbf, expressed as time at the link rate
TBF_MIN_BURST = 128 * 1024  # bytes; at least 2 ms at the link rate (see tbf_burst)
DEFAULT_PORT_LO = 20000  # ECMP steering range: below the Linux ephemeral range (32768-60999)
DEFAULT_PORT_HI = 29999
DEFAULT_MOD_BLOCK = 100
FALLBACK_BLOCK = 1024  # ports outside the steering range hash to spine (sport // 1024) % spines
MAX_HOSTS = 63  # address plan: host h's port i is 10.B.i.(4h+2)/30
MAX_PORTS = 128
MAX_LEAVES = 63
MAX_SPINES = 127
MAX_RULE_PORT = 65534  # the kernel's fib rule port ranges must end below 65535
MAX_ECMP_MATCH = 4000  # ip rules per leaf (linear lookup per packet)
HOST_PREF = 100  # host: "from <port addr> lookup 100+i"
HOST_TABLE = 100
LEAF_LOCAL_PREF = 100  # leaf: "lookup main suppress_prefixlength 0" (directly attached host ports first)
ECMP_PREF = 1000  # leaf: the ECMP match list, in order, from this preference on
SPINE_TABLE = 100  # leaf: table 100+s routes the fabric via spine s
CMD_TIMEOUT = 60  # seconds for any one ip/tc command
KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL for processes left in a fabric's namespaces

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,39}")
NODE_RE = r"(?:h|leaf|spine)[0-9]+"


class NetlabError(Exception):
    """A failed netlab operation; the message says what failed (and the command and its stderr)."""


class Interrupted(BaseException):
    """A signal (SIGINT, SIGTERM, SIGHUP) arrived while netlab was building or running something."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_quiet = False


def log(msg):
    """Progress message on stderr (suppressed by --quiet)."""
    if not _quiet:
        print("[netlab] " + msg, file=sys.stderr, flush=True)


def _find_tool(name):
    for cand in (shutil.which(name), "/usr/sbin/" + name, "/sbin/" + name, "/usr/bin/" + name):
        if cand and os.access(cand, os.X_OK):
            return cand
    return name


IP = _find_tool("ip")
TC = _find_tool("tc")
SYSCTL = _find_tool("sysctl")


# ---------------------------------------------------------------------------------------------------
# rates, names, addresses


_RATE_UNITS = {
    "": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
}


def parse_rate(text):
    """Rate in bits/s from tc-style text ("200mbit", "1gbit", "1.5gbit", "500000"); 0 means unlimited
    ("none", "0", "unlimited"). Like tc, "mbps" means megabytes per second."""
    t = str(text).strip().lower()
    if t in ("none", "unlimited", "0"):
        return 0
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)", t)
    if not m or m.group(2) not in _RATE_UNITS:
        raise NetlabError("bad rate %r: expected e.g. 200mbit, 1gbit, 500kbit, a number of bit/s, or none" % text)
    bps = int(round(float(m.group(1)) * _RATE_UNITS[m.group(2)]))
    if bps < 8000:
        raise NetlabError("rate %r is below 8kbit" % text)
    return bps


def format_rate(bps):
    """Human-readable rate ("200mbit"); "unlimited" for 0."""
    if not bps:
        return "unlimited"
    for unit, div in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= div:
            v = bps / div
            return ("%d%s" % (v, unit)) if v == int(v) else ("%.3g%s" % (v, unit))
    return "%dbit" % bps


def tbf_burst(bps):
    """tbf bucket size in bytes for a rate: 2 ms of traffic, at least 128 KiB (a GSO packet of 64 KiB plus headers must fit)."""
    return max(TBF_MIN_BURST, bps // 8 // 500)


def check_name(name):
    """Raises NetlabError unless name is a valid fabric name (1-40 of [A-Za-z0-9_-], not starting with -)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise NetlabError("bad fabric name %r: use 1-40 characters of A-Z a-z 0-9 _ - (not starting with -)" % name)


def netns_name(name, node):
    """Namespace of a node ("h0", "leaf1", "spine0") of fabric name."""
    return "%s%s-%s" % (NETNS_PREFIX, name, node)


def _fabric_netns_re(name):
    return re.compile(re.escape(NETNS_PREFIX + name + "-") + NODE_RE)


_ANY_NETNS_RE = re.compile(re.escape(NETNS_PREFIX) + r"(" + NAME_RE.pattern + r")-" + NODE_RE)


def state_root():
    """Directory holding the per-fabric state directories (NETLAB_STATE_ROOT, default /tmp)."""
    return os.environ.get("NETLAB_STATE_ROOT", "/tmp")


def state_dir(name):
    """State directory of a fabric: <state root>/netlab-NAME (state.json, topo.json)."""
    return os.path.join(state_root(), "netlab-" + name)


# ---------------------------------------------------------------------------------------------------
# topology plan (pure; no system changes)


def ecmp_rule(spines, mode, port_lo, port_hi, block):
    """Steering ranges [{"spine", "sport_lo", "sport_hi"}] for the ECMP mode.

    sport-range: [port_lo, port_hi] cut into `spines` contiguous ranges of (almost) equal size.
    sport-mod:   spine = (sport // block) % spines for sport in [port_lo, port_hi] (block 1: sport % spines).
    """
    if spines <= 0:
        return []
    if not (1 <= port_lo <= port_hi <= MAX_RULE_PORT):
        raise NetlabError("bad ECMP port range %d-%d (need 1 <= lo <= hi <= %d)" % (port_lo, port_hi, MAX_RULE_PORT))
    rule = []
    if mode == "sport-range":
        n = port_hi - port_lo + 1
        if n < spines:
            raise NetlabError("ECMP port range %d-%d has fewer ports than spines (%d)" % (port_lo, port_hi, spines))
        for s in range(spines):
            rule.append({"spine": s, "sport_lo": port_lo + s * n // spines, "sport_hi": port_lo + (s + 1) * n // spines - 1})
    elif mode == "sport-mod":
        if block < 1:
            raise NetlabError("bad --ecmp-block %d (need >= 1)" % block)
        p = port_lo
        while p <= port_hi:
            end = min(port_hi, (p // block + 1) * block - 1)
            rule.append({"spine": (p // block) % spines, "sport_lo": p, "sport_hi": end})
            p = end + 1
    else:
        raise NetlabError("unknown ECMP mode %r (sport-range or sport-mod)" % mode)
    return rule


def ecmp_match(rule, spines, fallback_block=FALLBACK_BLOCK):
    """The ordered first-match list a leaf installs: steering ranges on sport, then the same ranges on
    dport (so replies to a connection that the steering port opened take the same spine), then every
    port hashed by sport // fallback_block (flows that chose no steering port spread like ECMP)."""
    if spines <= 0:
        return []
    match = [{"field": "sport", "lo": r["sport_lo"], "hi": r["sport_hi"], "spine": r["spine"]} for r in rule]
    match += [{"field": "dport", "lo": r["sport_lo"], "hi": r["sport_hi"], "spine": r["spine"]} for r in rule]
    for lo in range(0, 65536, fallback_block):
        # ip rule port ranges are 1..65534: port-less packets (ICMP) and port 65535 take the default spine.
        match.append({"field": "sport", "lo": max(1, lo), "hi": min(MAX_RULE_PORT, lo + fallback_block - 1),
                      "spine": (lo // fallback_block) % spines})
    return match


def _leaf_of(placement, h, i, hosts, leaves):
    if placement == "host":
        return h * leaves // hosts
    return i % leaves  # rail


def build_topology(name, hosts=2, ports=1, leaves=2, spines=2, rate="1gbit", host_rate=None, uplink_rate=None,
                   ecmp="sport-range", port_lo=DEFAULT_PORT_LO, port_hi=DEFAULT_PORT_HI, block=None,
                   placement="host", octet=1, default_spine=0):
    """The topology dict (what topo.json holds) of a fabric; validates every argument. No system changes.

    Address plan inside 10.<octet>.0.0/16: host h port i is 10.<octet>.i.(4h+2)/30 with its leaf at .(4h+1);
    the link leaf l - spine s is 10.<octet>.(128+s).(4l)/30 (leaf .4l+1, spine .4l+2).
    """
    check_name(name)
    for what, v, lo, hi in (("hosts", hosts, 1, MAX_HOSTS), ("ports", ports, 1, MAX_PORTS),
                            ("leaves", leaves, 1, MAX_LEAVES), ("spines", spines, 0, MAX_SPINES),
                            ("subnet octet", octet, 1, 254)):
        if not isinstance(v, int) or not (lo <= v <= hi):
            raise NetlabError("bad --%s %r (need %d..%d)" % (what, v, lo, hi))
    if leaves > 1 and spines == 0:
        raise NetlabError("%d leaves need at least one spine" % leaves)
    if placement not in ("host", "rail"):
        raise NetlabError("unknown placement %r (host or rail)" % placement)
    rate_bps = parse_rate(rate)
    host_bps = parse_rate(host_rate) if host_rate is not None else rate_bps
    up_bps = parse_rate(uplink_rate) if uplink_rate is not None else rate_bps
    if block is None:
        block = DEFAULT_MOD_BLOCK if ecmp == "sport-mod" else 1
    rule = ecmp_rule(spines if leaves > 1 else 0, ecmp, port_lo, port_hi, block)
    match = ecmp_match(rule, spines if leaves > 1 else 0)
    if len(match) > MAX_ECMP_MATCH:
        raise NetlabError("ECMP rule needs %d ip rules per leaf (max %d): use a larger --ecmp-block or a smaller "
                          "port range" % (len(match), MAX_ECMP_MATCH))
    if spines and not (0 <= default_spine < spines):
        raise NetlabError("bad default spine %d" % default_spine)
    if spines and ecmp == "sport-range" and (port_hi - port_lo + 1) < spines:
        raise NetlabError("ECMP port range smaller than the number of spines")

    net = "10.%d" % octet
    topo = {
        "version": VERSION,
        "name": name,
        "subnet": net + ".0.0/16",
        "netns_prefix": NETNS_PREFIX + name + "-",
        "placement": placement,
        "hosts": [],
        "leaves": [],
        "spines": [],
        "links": [],
        "ecmp": {},
    }
    for l in range(leaves):
        topo["leaves"].append({"name": "leaf%d" % l, "index": l, "netns": netns_name(name, "leaf%d" % l),
                               "ports": [], "uplinks": []})
    for s in range(spines):
        topo["spines"].append({"name": "spine%d" % s, "index": s, "netns": netns_name(name, "spine%d" % s),
                               "downlinks": []})
    for h in range(hosts):
        host = {"name": "h%d" % h, "index": h, "netns": netns_name(name, "h%d" % h), "ports": []}
        for i in range(ports):
            l = _leaf_of(placement, h, i, hosts, leaves)
            leaf = topo["leaves"][l]
            link = "h%dp%d-leaf%d" % (h, i, l)
            port = {"name": "p%d" % i, "index": i, "ifname": "p%d" % i,
                    "addr": "%s.%d.%d" % (net, i, 4 * h + 2), "prefix_len": 30,
                    "subnet": "%s.%d.%d/30" % (net, i, 4 * h), "gateway": "%s.%d.%d" % (net, i, 4 * h + 1),
                    "leaf": leaf["name"], "link": link, "rate_bps": host_bps}
            host["ports"].append(port)
            leaf["ports"].append({"host": host["name"], "port": port["name"], "ifname": "h%dp%d" % (h, i),
                                  "addr": port["gateway"], "peer_addr": port["addr"], "subnet": port["subnet"],
                                  "link": link})
            topo["links"].append({"name": link, "kind": "host", "a": host["name"], "a_if": port["ifname"],
                                  "a_netns": host["netns"], "b": leaf["name"], "b_if": "h%dp%d" % (h, i),
                                  "b_netns": leaf["netns"], "rate_bps": host_bps})
        topo["hosts"].append(host)
    if leaves > 1 or spines > 0:
        for l in range(leaves):
            for s in range(spines):
                leaf, spine = topo["leaves"][l], topo["spines"][s]
                link = "leaf%d-spine%d" % (l, s)
                la, sa = "%s.%d.%d" % (net, 128 + s, 4 * l + 1), "%s.%d.%d" % (net, 128 + s, 4 * l + 2)
                leaf["uplinks"].append({"spine": spine["name"], "ifname": "s%d" % s, "addr": la, "peer_addr": sa,
                                        "subnet": "%s.%d.%d/30" % (net, 128 + s, 4 * l), "link": link,
                                        "table": SPINE_TABLE + s})
                spine["downlinks"].append({"leaf": leaf["name"], "ifname": "l%d" % l, "addr": sa, "peer_addr": la,
                                           "link": link})
                topo["links"].append({"name": link, "kind": "uplink", "a": leaf["name"], "a_if": "s%d" % s,
                                      "a_netns": leaf["netns"], "b": spine["name"], "b_if": "l%d" % l,
                                      "b_netns": spine["netns"], "rate_bps": up_bps})
    topo["ecmp"] = {
        "key": "sport",
        "mode": ecmp,
        "port_lo": port_lo,
        "port_hi": port_hi,
        "block": block,
        "spines": spines if leaves > 1 else 0,
        "rule": rule,
        "match": match,
        "fallback_block": FALLBACK_BLOCK,
        "default_spine": default_spine if spines else None,
        "decided_at": "leaf",
    }
    return topo


def topology_netns(topo):
    """All namespaces of a topology, hosts first."""
    return ([h["netns"] for h in topo["hosts"]] + [l["netns"] for l in topo["leaves"]] +
            [s["netns"] for s in topo["spines"]])


def find_node(topo, node):
    """The host, leaf or spine dict named node ("h0", "leaf1", "spine0"), or None."""
    for kind in ("hosts", "leaves", "spines"):
        for n in topo[kind]:
            if n["name"] == node:
                return n
    return None


def find_link(topo, link):
    """The link dict named link ("h0p1-leaf0", "leaf0-spine1"); also accepts the reversed form."""
    for l in topo["links"]:
        if link in (l["name"], "%s-%s" % (l["b"], l["name"].rsplit("-", 1)[0])):
            return l
    return None


def port_by_addr(topo, addr):
    """(host dict, port dict) owning a host port address, or (None, None)."""
    for h in topo["hosts"]:
        for p in h["ports"]:
            if p["addr"] == addr:
                return h, p
    return None, None


def ecmp_spine_index(ecmp, sport, dport):
    """Spine index the first-match ECMP list gives a packet with these TCP/UDP ports (or the default)."""
    for m in ecmp.get("match", []):
        v = sport if m["field"] == "sport" else dport
        if m["lo"] <= v <= m["hi"]:
            return m["spine"]
    return ecmp.get("default_spine")


def spine_for_packet(topo, src_addr, dst_addr, sport, dport):
    """Name of the spine a packet from host port src_addr to host port dst_addr with these ports crosses,
    or None when both ports hang off the same leaf (the packet never reaches a spine)."""
    _, sp = port_by_addr(topo, src_addr)
    _, dp = port_by_addr(topo, dst_addr)
    if sp is None or dp is None:
        raise NetlabError("%s or %s is not a host port address of fabric %s" % (src_addr, dst_addr, topo["name"]))
    if sp["leaf"] == dp["leaf"]:
        return None
    idx = ecmp_spine_index(topo["ecmp"], sport, dport)
    return None if idx is None else topo["spines"][idx]["name"]


def sports_for_spine(topo, spine):
    """Source port ranges [(lo, hi)] that steer a connection (both directions) onto spine (name or index),
    provided the listening port is outside the steering range ecmp.port_lo..port_hi."""
    idx = spine if isinstance(spine, int) else int(str(spine).replace("spine", ""))
    return [(r["sport_lo"], r["sport_hi"]) for r in topo["ecmp"]["rule"] if r["spine"] == idx]


# ---------------------------------------------------------------------------------------------------
# running commands


def _fmt_cmd(argv):
    return " ".join(a if re.fullmatch(r"[A-Za-z0-9_./:=,@%+-]+", a) else repr(a) for a in argv)


def run_cmd(argv, input=None, check=True, timeout=CMD_TIMEOUT):
    """Runs argv; returns CompletedProcess (text). With check, a failure raises NetlabError naming the
    command, its exit status, its stderr and, for `-batch -` input, the failing batch line."""
    try:
        cp = subprocess.run(argv, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=timeout)
    except FileNotFoundError:
        raise NetlabError("command not found: %s (is iproute2 installed?)" % argv[0])
    except subprocess.TimeoutExpired:
        raise NetlabError("command timed out after %ds: %s" % (timeout, _fmt_cmd(argv)))
    if check and cp.returncode != 0:
        msg = "command failed (exit %d): %s\n  %s" % (cp.returncode, _fmt_cmd(argv),
                                                      cp.stderr.strip().replace("\n", "\n  ") or "(no stderr)")
        m = re.search(r"Command failed -:(\d+)", cp.stderr or "")
        if m and input:
            lines = input.splitlines()
            n = int(m.group(1))
            if 1 <= n <= len(lines):
                msg += "\n  batch line %d: %s" % (n, lines[n - 1])
        raise NetlabError(msg)
    return cp


def ip_batch(ns, lines):
    """Runs ip commands (without the leading "ip") inside namespace ns as one batch."""
    if lines:
        run_cmd([IP, "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n")


def tc_batch(ns, lines):
    """Runs tc commands (without the leading "tc") inside namespace ns as one batch."""
    if lines:
        run_cmd([TC, "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n")


def list_netns():
    """Names of all named network namespaces (ip netns list)."""
    cp = run_cmd([IP, "netns", "list"], check=False)
    if cp.returncode != 0:
        return []
    return [line.split()[0] for line in cp.stdout.splitlines() if line.strip()]


def netns_available():
    """(True, "") when this process can create network namespaces, else (False, reason)."""
    if os.geteuid() != 0:
        return False, "netlab needs root (network namespaces, veth, tc)"
    for tool, pkg in ((IP, "iproute2"), (TC, "iproute2"), (SYSCTL, "procps")):
        if not os.access(tool, os.X_OK):
            return False, "%s is not installed (Debian package %s)" % (os.path.basename(tool), pkg)
    probe = "%sprobe%d" % (NETNS_PREFIX, os.getpid())
    cp = run_cmd([IP, "netns", "add", probe], check=False)
    if cp.returncode != 0:
        return False, "ip netns add failed: " + cp.stderr.strip()
    try:
        cp = run_cmd([IP, "-n", probe, "link", "add", "name", "a0", "type", "veth", "peer", "name", "b0"], check=False)
        if cp.returncode != 0:
            return False, "veth not available: " + cp.stderr.strip()
        cp = run_cmd([TC, "-n", probe, "qdisc", "add", "dev", "a0", "root", "tbf", "rate", "1mbit", "burst", "64kb",
                      "latency", "50ms"], check=False)
        if cp.returncode != 0:
            return False, "tc tbf not available: " + cp.stderr.strip()
    finally:
        run_cmd([IP, "netns", "del", probe], check=False)
    return True, ""


def _pid_start_time(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    if fields and fields[0] == "Z":
        return None  # a zombie is dead
    return int(fields[19]) if len(fields) > 19 else None


def pid_alive(pid, start_time=None):
    """True when process pid exists (and, if start_time is given, is the same process)."""
    st = _pid_start_time(pid)
    return st is not None and (start_time is None or st == start_time)


_WRAPPERS = {"sudo", "su", "doas", "runuser", "setpriv", "env", "timeout", "nice", "ionice", "chrt", "taskset",
             "stdbuf", "time"}


def default_owner():
    """Owner of a fabric made by `netlab up`: the parent process, skipping wrappers that exit with netlab
    (sudo, env, timeout, nice ...), so a fabric lives as long as the shell or program that asked for it."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open("/proc/%d/comm" % pid) as f:
                comm = f.read().strip()
            with open("/proc/%d/stat" % pid) as f:
                data = f.read()
            parent = int(data[data.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if comm not in _WRAPPERS or parent <= 1:
            break
        pid = parent
    return pid


def _ancestors():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open("/proc/%d/stat" % pid) as f:
                data = f.read()
            pid = int(data[data.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def kill_netns_processes(namespaces, grace=KILL_GRACE):
    """SIGTERM, then after grace seconds SIGKILL, every process inside the namespaces (except netlab itself
    and its ancestors). Returns the number of processes signalled."""
    spare = _ancestors()
    victims = set()
    for ns in namespaces:
        cp = run_cmd([IP, "netns", "pids", ns], check=False)
        if cp.returncode == 0:
            victims |= {int(p) for p in cp.stdout.split() if p.isdigit()} - spare
    if not victims:
        return 0
    for pid in victims:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in victims):
        time.sleep(0.05)
    for pid in victims:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return len(victims)


# ---------------------------------------------------------------------------------------------------
# state


def _write_json(path, obj):
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def load_state(name):
    """The state dict of fabric name, or None when it has no state directory / state file."""
    try:
        with open(os.path.join(state_dir(name), "state.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise NetlabError("cannot read state of fabric %s: %s" % (name, e))


def load_topology(path_or_name):
    """Reads a topology JSON file (a path, or the name of a running fabric)."""
    path = path_or_name
    if not os.path.sep in path_or_name and not path_or_name.endswith(".json"):
        st = load_state(path_or_name)
        if st is None:
            raise NetlabError("no fabric named %s (netlab list shows the fabrics)" % path_or_name)
        path = st["topo_path"]
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise NetlabError("cannot read topology %s: %s" % (path, e))


class _DirLock:
    """flock on a directory (exclusive), released on exit."""

    def __init__(self, path):
        self.path = path
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def list_fabrics():
    """[(name, state dict)] for every fabric with a state directory under the state root."""
    out = []
    root = state_root()
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return out
    for e in entries:
        if e.startswith("netlab-") and NAME_RE.fullmatch(e[len("netlab-"):]):
            name = e[len("netlab-"):]
            try:
                st = load_state(name)
            except NetlabError:
                st = None
            out.append((name, st))
    return out


def _create_state(name, owner):
    """Creates the state directory of a new fabric (fails if the name is taken) and picks the fabric's
    subnet octet (the lowest not used by another fabric). Returns the state dict."""
    root = state_root()
    os.makedirs(root, exist_ok=True)
    with _DirLock(root):
        used = {st.get("octet") for _, st in list_fabrics() if st}
        try:
            os.mkdir(state_dir(name), 0o755)
        except FileExistsError:
            st = load_state(name)
            who = ""
            if st:
                alive = pid_alive(st.get("owner_pid", 0), st.get("owner_start"))
                who = " (owner pid %s, %s)" % (st.get("owner_pid"), "alive" if alive else "dead: netlab down --stale")
            raise NetlabError("fabric %s already exists%s; use another --name or netlab down %s" % (name, who, name))
        octet = next((o for o in range(1, 255) if o not in used), None)
        if octet is None:
            shutil.rmtree(state_dir(name), ignore_errors=True)
            raise NetlabError("all 254 fabric subnets are in use (netlab down --stale?)")
        st = {"name": name, "status": "building", "owner_pid": owner, "owner_start": _pid_start_time(owner),
              "netlab_pid": os.getpid(), "created": time.time(), "octet": octet, "netns": [],
              "topo_path": os.path.join(state_dir(name), "topo.json"), "topo_out": None, "links": {}}
        _write_json(os.path.join(state_dir(name), "state.json"), st)
        return st


def _save_state(st):
    _write_json(os.path.join(state_dir(st["name"]), "state.json"), st)


# ---------------------------------------------------------------------------------------------------
# build and teardown


def _qdisc_lines(ifname, rate_bps, down):
    if down:
        # A pfifo that holds no packet drops everything: a black-holed link, routes unchanged.
        return ["qdisc replace dev %s root pfifo limit 0" % ifname]
    if rate_bps:
        return ["qdisc replace dev %s root tbf rate %dbit burst %d latency %s" % (ifname, rate_bps,
                                                                                 tbf_burst(rate_bps), TBF_LATENCY)]
    return []


def _node_configs(topo):
    """{netns: (sysctls, link-creation lines, addr/up lines, route/rule lines, tc lines)} for a topology."""
    cfg = {}

    def node(ns):
        return cfg.setdefault(ns, ([], [], ["link set lo up"], [], []))

    common = ["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
              "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
    switch = ["net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
              "net.ipv4.conf.default.send_redirects=0"]
    net16 = topo["subnet"]
    for h in topo["hosts"]:
        sysctls, links, addrs, routes, tcs = node(h["netns"])
        sysctls += common
        for p in h["ports"]:
            leaf = find_node(topo, p["leaf"])
            links.append("link add name %s type veth peer name h%dp%d netns %s" % (p["ifname"], h["index"], p["index"],
                                                                                    leaf["netns"]))
            addrs += ["addr add %s/%d dev %s" % (p["addr"], p["prefix_len"], p["ifname"]),
                      "link set %s up" % p["ifname"]]
            i = p["index"]
            routes += ["route add %s.%d.0/24 via %s dev %s" % (net16.rsplit(".", 2)[0], i, p["gateway"], p["ifname"]),
                       "route add %s via %s dev %s table %d" % (net16, p["gateway"], p["ifname"], HOST_TABLE + i),
                       "rule add pref %d from %s lookup %d" % (HOST_PREF + i, p["addr"], HOST_TABLE + i)]
            tcs += _qdisc_lines(p["ifname"], p["rate_bps"], False)
        routes.append("route add %s via %s dev %s" % (net16, h["ports"][0]["gateway"], h["ports"][0]["ifname"]))
    ecmp = topo["ecmp"]
    for leaf in topo["leaves"]:
        sysctls, links, addrs, routes, tcs = node(leaf["netns"])
        sysctls += common + switch
        for lp in leaf["ports"]:
            addrs += ["addr add %s/30 dev %s" % (lp["addr"], lp["ifname"]), "link set %s up" % lp["ifname"]]
        for up in leaf["uplinks"]:
            spine = find_node(topo, up["spine"])
            links.append("link add name %s type veth peer name l%d netns %s" % (up["ifname"], leaf["index"],
                                                                                  spine["netns"]))
            addrs += ["addr add %s/30 dev %s" % (up["addr"], up["ifname"]), "link set %s up" % up["ifname"]]
            routes.append("route add %s via %s dev %s table %d" % (net16, up["peer_addr"], up["ifname"], up["table"]))
        if leaf["uplinks"]:
            dflt = leaf["uplinks"][ecmp["default_spine"]]
            routes.append("route add default via %s dev %s" % (dflt["peer_addr"], dflt["ifname"]))
            routes.append("rule add pref %d lookup main suppress_prefixlength 0" % LEAF_LOCAL_PREF)
            for k, m in enumerate(ecmp["match"]):
                routes.append("rule add pref %d %s %d-%d lookup %d" % (ECMP_PREF + k, m["field"], m["lo"], m["hi"],
                                                                       SPINE_TABLE + m["spine"]))
    for spine in topo["spines"]:
        sysctls, links, addrs, routes, tcs = node(spine["netns"])
        sysctls += common + switch
        for dl in spine["downlinks"]:
            addrs += ["addr add %s/30 dev %s" % (dl["addr"], dl["ifname"]), "link set %s up" % dl["ifname"]]
        by_leaf = {dl["leaf"]: dl for dl in spine["downlinks"]}
        for h in topo["hosts"]:
            for p in h["ports"]:
                dl = by_leaf[p["leaf"]]
                routes.append("route add %s via %s dev %s" % (p["subnet"], dl["peer_addr"], dl["ifname"]))
    for link in topo["links"]:
        if link["kind"] == "host":
            node(link["b_netns"])[4].extend(_qdisc_lines(link["b_if"], link["rate_bps"], False))
        else:
            node(link["a_netns"])[4].extend(_qdisc_lines(link["a_if"], link["rate_bps"], False))
            node(link["b_netns"])[4].extend(_qdisc_lines(link["b_if"], link["rate_bps"], False))
    return cfg


def _build(topo, st):
    cfg = _node_configs(topo)
    order = topology_netns(topo)
    t0 = time.monotonic()
    log("%s: creating %d namespaces (%d hosts x %d ports, %d leaves, %d spines)" % (
        topo["name"], len(order), len(topo["hosts"]), len(topo["hosts"][0]["ports"]), len(topo["leaves"]),
        len(topo["spines"])))
    for ns in order:
        # Recorded before it exists, so that an interrupted build still removes it.
        st["netns"].append(ns)
        _save_state(st)
        run_cmd([IP, "netns", "add", ns])
        run_cmd([IP, "netns", "exec", ns, SYSCTL, "-q", "-e", "-w"] + cfg[ns][0])
    log("%s: creating %d links" % (topo["name"], len(topo["links"])))
    for ns in order:
        ip_batch(ns, cfg[ns][1])
    for ns in order:
        ip_batch(ns, cfg[ns][2])
    nrules = len(topo["ecmp"]["match"])
    log("%s: routes and ECMP rules (%d ip rules per leaf, mode %s)" % (topo["name"], nrules, topo["ecmp"]["mode"]))
    for ns in order:
        ip_batch(ns, cfg[ns][3])
    log("%s: rate limits (tbf)" % topo["name"])
    for ns in order:
        tc_batch(ns, cfg[ns][4])
    return time.monotonic() - t0


def teardown(name, quiet=False):
    """Removes everything fabric name created: processes left in its namespaces, the namespaces (and with
    them every veth and tc qdisc), its state directory and topology files. Idempotent; returns True when
    something was removed. Raises NetlabError listing what could not be removed."""
    check_name(name)
    st = load_state(name)
    pat = _fabric_netns_re(name)
    nss = [ns for ns in list_netns() if pat.fullmatch(ns)]
    sdir = state_dir(name)
    if not nss and st is None and not os.path.isdir(sdir):
        return False
    if not quiet:
        log("%s: tearing down (%d namespaces)" % (name, len(nss)))
    errors = []
    n = kill_netns_processes(nss)
    if n and not quiet:
        log("%s: stopped %d processes left in the fabric" % (name, n))
    for ns in nss:
        cp = run_cmd([IP, "netns", "del", ns], check=False)
        if cp.returncode != 0 and "No such file" not in cp.stderr:
            errors.append("ip netns del %s: %s" % (ns, cp.stderr.strip()))
    if st and st.get("topo_out"):
        try:
            os.unlink(st["topo_out"])
        except FileNotFoundError:
            pass
        except OSError as e:
            errors.append("rm %s: %s" % (st["topo_out"], e))
    shutil.rmtree(sdir, ignore_errors=True)
    if os.path.exists(sdir):
        errors.append("cannot remove %s" % sdir)
    if errors:
        raise NetlabError("teardown of %s incomplete:\n  %s" % (name, "\n  ".join(errors)))
    return True


def up(topo_args, owner=None, topo_out=None):
    """Builds a fabric from build_topology keyword arguments (name= required); writes topo.json (and
    topo_out); returns (topology dict, topology path). On any failure or signal, removes what it built and
    re-raises."""
    name = topo_args["name"]
    check_name(name)
    # Validate everything before touching the system.
    build_topology(**topo_args)
    st = None
    try:
        # A signal is held until the state exists, so that the teardown below finds it; a fabric of the
        # same name that already exists (st stays None) is not ours to remove.
        with _SignalsBlocked():
            st = _create_state(name, owner if owner is not None else default_owner())
        topo = build_topology(octet=st["octet"], **topo_args)
        st["topo_out"] = os.path.abspath(topo_out) if topo_out else None
        st["links"] = {l["name"]: {"rate_bps": l["rate_bps"], "down": False} for l in topo["links"]}
        _save_state(st)
        secs = _build(topo, st)
        _write_json(st["topo_path"], topo)
        if topo_out:
            _write_json(st["topo_out"], topo)
        st["status"] = "up"
        _save_state(st)
        log("%s up in %.1fs: subnet %s, topology %s" % (name, secs, topo["subnet"], st["topo_out"] or st["topo_path"]))
        return topo, st["topo_out"] or st["topo_path"]
    except BaseException:
        if st is None:
            raise
        with _SignalsBlocked():
            try:
                teardown(name, quiet=True)
            except NetlabError as e:
                print("netlab: " + str(e), file=sys.stderr)
        raise


def set_link(name, link_name, rate=None, down=None):
    """Throttles (rate: tc-style text or bits/s; "none" unlimits), cuts (down=True: every packet dropped in
    both directions, routes unchanged) or restores (down=False) one link of a running fabric."""
    st = load_state(name)
    if st is None or st.get("status") != "up":
        raise NetlabError("no running fabric named %s" % name)
    topo = load_topology(st["topo_path"])
    link = find_link(topo, link_name)
    if link is None:
        raise NetlabError("fabric %s has no link %s (links: %s)" % (name, link_name,
                                                                    ", ".join(l["name"] for l in topo["links"])))
    with _DirLock(state_dir(name)):
        st = load_state(name)
        cur = st["links"].setdefault(link["name"], {"rate_bps": link["rate_bps"], "down": False})
        if rate is not None:
            cur["rate_bps"] = rate if isinstance(rate, int) else parse_rate(rate)
        if down is not None:
            cur["down"] = bool(down)
        for ns, ifn in ((link["a_netns"], link["a_if"]), (link["b_netns"], link["b_if"])):
            lines = _qdisc_lines(ifn, cur["rate_bps"], cur["down"])
            if lines:
                tc_batch(ns, lines)
            else:
                cp = run_cmd([TC, "-n", ns, "qdisc", "del", "dev", ifn, "root"], check=False)
                if cp.returncode != 0 and "handle of zero" not in cp.stderr:
                    raise NetlabError("tc -n %s qdisc del dev %s root: %s" % (ns, ifn, cp.stderr.strip()))
        _save_state(st)
    return link["name"], cur


def link_counters(topo, link_name):
    """{"a": {"tx_bytes", "rx_bytes", ...}, "b": {...}} interface counters at both ends of a link."""
    link = find_link(topo, link_name)
    if link is None:
        raise NetlabError("no link %s" % link_name)
    return {"a": iface_counters(link["a_netns"], link["a_if"]), "b": iface_counters(link["b_netns"], link["b_if"])}


def iface_counters(ns, ifname=None):
    """Counters of one interface (dict) or, without ifname, {ifname: dict} of all interfaces in ns."""
    argv = [IP, "-n", ns, "-j", "-s", "link", "show"] + (["dev", ifname] if ifname else [])
    out = {}
    for e in json.loads(run_cmd(argv).stdout or "[]"):
        s = e.get("stats64", {})
        out[e["ifname"]] = {"tx_bytes": s.get("tx", {}).get("bytes", 0), "rx_bytes": s.get("rx", {}).get("bytes", 0),
                            "tx_packets": s.get("tx", {}).get("packets", 0),
                            "rx_packets": s.get("rx", {}).get("packets", 0),
                            "tx_dropped": s.get("tx", {}).get("dropped", 0)}
    return out[ifname] if ifname else out


def stale_fabrics():
    """Names of fabrics whose owner process is dead, and names that only have leftover namespaces."""
    names = []
    now = time.time()
    # Namespaces before state: a fabric's state directory exists before its first namespace and goes
    # after its last one, so a fabric being built or removed right now is never taken for an orphan.
    nss = list_netns()
    fabrics = list_fabrics()
    for name, st in fabrics:
        if st is None:
            try:
                age = now - os.stat(state_dir(name)).st_mtime
            except OSError:
                continue
            if age > 60:  # a state directory without state.json older than a build takes
                names.append(name)
        elif not pid_alive(st.get("owner_pid", 0), st.get("owner_start")) and \
                not (st.get("status") == "building" and pid_alive(st.get("netlab_pid", 0))):
            names.append(name)
    known = {n for n, _ in fabrics}
    for ns in nss:
        m = _ANY_NETNS_RE.fullmatch(ns)
        if m and m.group(1) not in known and m.group(1) not in names:
            names.append(m.group(1))
    return names


# ---------------------------------------------------------------------------------------------------
# signals


class _SignalsBlocked:
    """Blocks SIGINT/SIGTERM/SIGHUP for the duration (teardown must finish); delivered afterwards."""

    SIGS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}

    def __enter__(self):
        self.old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGS)

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self.old)


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def _install_raising_handlers():
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _raise_interrupted)


# ---------------------------------------------------------------------------------------------------
# command line


def _script_path():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "netlab")


def _add_up_options(p, name_required):
    p.add_argument("--name", required=name_required, help="fabric name (1-40 of A-Za-z0-9_-)%s" % (
        "" if name_required else "; default: a unique one"))
    p.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2, max %d)" % MAX_HOSTS)
    p.add_argument("--ports", type=int, default=1, help="NIC ports per host (default 1)")
    p.add_argument("--leaves", type=int, default=None, help="leaf switches (default: min(hosts, 2))")
    p.add_argument("--spines", type=int, default=2, help="spine switches (default 2; 0 only with one leaf)")
    p.add_argument("--rate", default=DEFAULT_RATE, help="rate of every link, tc syntax (default %s; none = "
                   "unlimited)" % DEFAULT_RATE)
    p.add_argument("--host-rate", default=None, help="rate of host-leaf links (default --rate)")
    p.add_argument("--uplink-rate", default=None, help="rate of leaf-spine links (default --rate)")
    p.add_argument("--ecmp", choices=("sport-range", "sport-mod"), default="sport-range",
                   help="how a leaf maps the steering source port to a spine (default sport-range)")
    p.add_argument("--ecmp-ports", default="%d-%d" % (DEFAULT_PORT_LO, DEFAULT_PORT_HI),
                   help="steering port range LO-HI (default %d-%d)" % (DEFAULT_PORT_LO, DEFAULT_PORT_HI))
    p.add_argument("--ecmp-block", type=int, default=None,
                   help="sport-mod: spine = (sport // BLOCK) %%%% spines (default %d)" % DEFAULT_MOD_BLOCK)
    p.add_argument("--placement", choices=("host", "rail"), default="host",
                   help="host: all ports of a host on its leaf, hosts split evenly over leaves (default); "
                        "rail: port i of every host on leaf i %% leaves")
    p.add_argument("--topo-out", default=None, help="also write the topology JSON here (removed at down)")
    p.add_argument("--owner", type=int, default=None,
                   help="pid whose death makes the fabric stale (default: up's parent; session: itself)")


def _topo_args(a, name):
    m = re.fullmatch(r"(\d+)-(\d+)", a.ecmp_ports)
    if not m:
        raise NetlabError("bad --ecmp-ports %r (expected LO-HI)" % a.ecmp_ports)
    leaves = a.leaves if a.leaves is not None else min(a.hosts, 2)
    return dict(name=name, hosts=a.hosts, ports=a.ports, leaves=leaves, spines=a.spines, rate=a.rate,
                host_rate=a.host_rate, uplink_rate=a.uplink_rate, ecmp=a.ecmp, port_lo=int(m.group(1)),
                port_hi=int(m.group(2)), block=a.ecmp_block, placement=a.placement)


def _require_root():
    if os.geteuid() != 0:
        raise NetlabError("this command needs root (network namespaces, veth, tc)")


def _cmd_up(a, cmd):
    _require_root()
    _install_raising_handlers()
    topo, path = up(_topo_args(a, a.name), owner=a.owner, topo_out=a.topo_out)
    print(path)
    return 0


def _cmd_down(a, cmd):
    _require_root()
    if a.stale:
        names = stale_fabrics()
        for n in names:
            with _SignalsBlocked():
                teardown(n)
        log("removed %d stale fabric(s)%s" % (len(names), (": " + ", ".join(names)) if names else ""))
        return 0
    if not a.names:
        raise NetlabError("down: name a fabric (or --stale)")
    for n in a.names:
        with _SignalsBlocked():
            if not teardown(n):
                log("%s: nothing to remove" % n)
    return 0


def _cmd_list(a, cmd):
    fabrics = list_fabrics()
    if a.json:
        print(json.dumps([dict(st or {"name": n, "status": "unknown"},
                               owner_alive=bool(st) and pid_alive(st.get("owner_pid", 0), st.get("owner_start")))
                          for n, st in fabrics], indent=1))
        return 0
    if not fabrics:
        print("no fabrics")
        return 0
    print("%-20s %-9s %-16s %-14s %s" % ("NAME", "STATUS", "OWNER", "SUBNET", "TOPOLOGY"))
    for n, st in fabrics:
        if not st:
            print("%-20s %-9s" % (n, "unknown"))
            continue
        alive = pid_alive(st.get("owner_pid", 0), st.get("owner_start"))
        print("%-20s %-9s %-16s %-14s %s" % (n, st["status"], "%s (%s)" % (st["owner_pid"], "alive" if alive else "dead"),
                                             "10.%d.0.0/16" % st["octet"], st.get("topo_out") or st["topo_path"]))
    return 0


def _cmd_show(a, cmd):
    st = load_state(a.name)
    if st is None:
        raise NetlabError("no fabric named %s" % a.name)
    if st["status"] != "up":
        raise NetlabError("fabric %s is %s" % (a.name, st["status"]))
    topo = load_topology(st["topo_path"])
    if a.json:
        print(json.dumps(topo, indent=1))
        return 0
    print("fabric %s: subnet %s, topology %s, owner pid %s" % (topo["name"], topo["subnet"],
                                                               st.get("topo_out") or st["topo_path"], st["owner_pid"]))
    for h in topo["hosts"]:
        print("  %s (netns %s): %s" % (h["name"], h["netns"], ", ".join(
            "%s %s/%d -> %s" % (p["ifname"], p["addr"], p["prefix_len"], p["leaf"]) for p in h["ports"])))
    e = topo["ecmp"]
    if e["spines"]:
        print("  ECMP (%s, decided at the leaves; first match): steering ports %d-%d:" % (e["mode"], e["port_lo"],
                                                                                          e["port_hi"]))
        for s in range(e["spines"]):
            rs = sports_for_spine(topo, s)
            txt = ", ".join("%d-%d" % r for r in rs[:6]) + (" ... (%d ranges)" % len(rs) if len(rs) > 6 else "")
            print("    spine%d: sport or dport in %s" % (s, txt))
        print("    other ports: spine (sport // %d) %% %d" % (e["fallback_block"], e["spines"]))
    print("  links:")
    for l in topo["links"]:
        cur = st["links"].get(l["name"], {"rate_bps": l["rate_bps"], "down": False})
        line = "    %-18s %-9s %s" % (l["name"], format_rate(cur["rate_bps"]), "DOWN (black hole)" if cur["down"] else "up")
        if a.counters:
            c = link_counters(topo, l["name"])
            line += "   %s->%s %d B, %s->%s %d B" % (l["a"], l["b"], c["a"]["tx_bytes"], l["b"], l["a"],
                                                    c["b"]["tx_bytes"])
        print(line)
    return 0


def _run_env(st, topo, node):
    env = dict(os.environ)
    path = st.get("topo_out") or st["topo_path"]
    env.update(NETLAB_NAME=topo["name"], NETLAB_HOST=node["name"], NETLAB_TOPO=path)
    env.setdefault("C4_TOPO_FILE", path)
    if node in topo["hosts"]:
        env["NETLAB_ADDR"] = node["ports"][0]["addr"]
        env["NETLAB_ADDRS"] = ",".join(p["addr"] for p in node["ports"])
    return env


def _cmd_run(a, cmd):
    _require_root()
    if not cmd:
        raise NetlabError("run: no command (netlab run NAME HOST -- CMD ...)")
    st = load_state(a.name)
    if st is None or st.get("status") != "up":
        raise NetlabError("no running fabric named %s" % a.name)
    topo = load_topology(st["topo_path"])
    node = find_node(topo, a.host)
    if node is None:
        raise NetlabError("fabric %s has no host %s (hosts: %s)" % (a.name, a.host,
                                                                    " ".join(h["name"] for h in topo["hosts"])))
    env = _run_env(st, topo, node)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(IP, [IP, "netns", "exec", node["netns"]] + cmd, env)


def _cmd_addr(a, cmd):
    topo = load_topology(a.name) if load_state(a.name) else None
    if topo is None:
        raise NetlabError("no fabric named %s" % a.name)
    host = find_node(topo, a.host)
    if host is None or host not in topo["hosts"]:
        raise NetlabError("fabric %s has no host %s" % (a.name, a.host))
    if not (0 <= a.port < len(host["ports"])):
        raise NetlabError("host %s has ports 0..%d" % (a.host, len(host["ports"]) - 1))
    print(host["ports"][a.port]["addr"])
    return 0


def _unique_name():
    return "s%d%s" % (os.getpid(), os.urandom(2).hex())


def _cmd_session(a, cmd):
    _require_root()
    if not cmd:
        raise NetlabError("session: no command (netlab session [up options] -- CMD ...)")
    _install_raising_handlers()
    name = a.name or _unique_name()
    rc = 1
    try:
        topo, path = up(_topo_args(a, name), owner=a.owner if a.owner is not None else os.getpid(),
                        topo_out=a.topo_out)
        env = dict(os.environ)
        env.update(NETLAB_NAME=name, NETLAB_TOPO=path, C4_TOPO_FILE=path,
                   NETLAB=_script_path(),
                   PATH=os.path.dirname(_script_path()) + os.pathsep + os.environ.get("PATH", ""))
        rc = _run_child(cmd, env)
    finally:
        with _SignalsBlocked():
            try:
                teardown(name, quiet=False)
            except NetlabError as e:
                print("netlab: error: " + str(e), file=sys.stderr)
                rc = rc or 1
    return rc


def _run_child(cmd, env, grace=5.0):
    """Runs cmd in its own process group; SIGINT/SIGTERM/SIGHUP are forwarded to that group, and after
    grace seconds the group is killed. Returns the exit status (128+signal when it died by a signal, or
    when netlab was interrupted)."""
    got = []
    box = {"child": None}

    def forward(signum, frame):
        got.append(signum)
        if box["child"] is not None:
            try:
                os.killpg(box["child"].pid, signum)
            except OSError:
                pass

    tty = None
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            tty = 0
    except OSError:
        pass
    # Handlers first (not a blocked mask: the command would inherit it).
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    try:
        child = subprocess.Popen(cmd, env=env, process_group=0)
    except OSError as e:
        _install_raising_handlers()
        raise NetlabError("cannot start %s: %s" % (cmd[0], e))
    box["child"] = child
    if got:
        forward(got[0], None)
    old_ttou = None
    if tty is not None:
        # Give the terminal to the command (as a shell does), so that it reads the tty and gets Ctrl-C.
        old_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(tty, child.pid)
            os.killpg(child.pid, signal.SIGCONT)
        except OSError:
            pass
    killed_at = None
    try:
        while True:
            try:
                rc = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if got and killed_at is None:
                killed_at = time.monotonic()
            if killed_at is not None and time.monotonic() - killed_at > grace:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except OSError:
                    pass
                killed_at = float("inf")
    finally:
        if tty is not None:
            try:
                os.tcsetpgrp(tty, os.getpgrp())
            except OSError:
                pass
            signal.signal(signal.SIGTTOU, old_ttou)
        _install_raising_handlers()
    # Leftover members of the command's group (background jobs) go too.
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    if got:
        return 128 + got[0]
    return rc if rc >= 0 else 128 - rc


def _cmd_link(a, cmd):
    _require_root()
    if a.rate is None and not a.down and not a.up:
        raise NetlabError("link: give --rate R, --down or --up")
    down = True if a.down else (False if a.up else None)
    name, cur = set_link(a.name, a.link, rate=a.rate, down=down)
    log("%s %s: %s, %s" % (a.name, name, format_rate(cur["rate_bps"]), "down (black hole)" if cur["down"] else "up"))
    return 0


def _parser():
    p = argparse.ArgumentParser(prog="netlab", description="Emulated multi-host leaf-spine fabrics (network "
                                "namespaces, veth, tc tbf, source-port ECMP). Run as root. See docs/netlab.md.")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="build a fabric and write its topology JSON")
    _add_up_options(u, True)
    u.set_defaults(func=_cmd_up)
    d = sub.add_parser("down", help="remove fabrics (idempotent)")
    d.add_argument("names", nargs="*", help="fabric names")
    d.add_argument("--stale", action="store_true", help="remove fabrics whose owner process is dead")
    d.set_defaults(func=_cmd_down)
    l = sub.add_parser("list", help="list fabrics")
    l.add_argument("--json", action="store_true")
    l.set_defaults(func=_cmd_list)
    s = sub.add_parser("show", help="describe a fabric")
    s.add_argument("name")
    s.add_argument("--json", action="store_true", help="print the topology JSON")
    s.add_argument("--counters", action="store_true", help="byte counters of every link")
    s.set_defaults(func=_cmd_show)
    r = sub.add_parser("run", help="run a command inside a host: netlab run NAME HOST -- CMD ...")
    r.add_argument("name")
    r.add_argument("host")
    r.set_defaults(func=_cmd_run)
    ad = sub.add_parser("addr", help="print the address of a host port: netlab addr NAME HOST [PORT]")
    ad.add_argument("name")
    ad.add_argument("host")
    ad.add_argument("port", type=int, nargs="?", default=0)
    ad.set_defaults(func=_cmd_addr)
    se = sub.add_parser("session", help="up, run a command in the root namespace, always down: "
                        "netlab session [up options] -- CMD ...")
    _add_up_options(se, False)
    se.set_defaults(func=_cmd_session)
    k = sub.add_parser("link", help="throttle, cut or restore one link of a running fabric")
    k.add_argument("name")
    k.add_argument("link", help='link name as in the topology, e.g. "h0p1-leaf0", "leaf0-spine1"')
    k.add_argument("--rate", default=None, help="new rate, both directions (tc syntax; none = unlimited)")
    g = k.add_mutually_exclusive_group()
    g.add_argument("--down", action="store_true", help="drop every packet on the link (routes unchanged)")
    g.add_argument("--up", action="store_true", help="restore a cut link")
    k.set_defaults(func=_cmd_link)
    return p


def main(argv=None):
    """Command-line entry point; returns the exit status."""
    global _quiet
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = []
    if "--" in argv:
        k = argv.index("--")
        argv, cmd = argv[:k], argv[k + 1:]
    a = _parser().parse_args(argv)
    _quiet = a.quiet
    if a.cmd not in ("run", "session") and cmd:
        print("netlab: error: unexpected arguments after --", file=sys.stderr)
        return 2
    try:
        return a.func(a, cmd)
    except NetlabError as e:
        print("netlab: error: %s" % e, file=sys.stderr)
        return 1
    except Interrupted as e:
        print("netlab: interrupted (%s)" % e, file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
