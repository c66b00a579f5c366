"""Reading c4comm trace files (.c4t): the layout of libc4comm/trace/recorder.hpp, versions 1 and 2.

Version 2 (data path v2): a step's Event::lane is the lane it went over (255: striped over several),
the last byte of the event is the index of its transport, and the header's last 24 bytes name the
transports ("shm,tcp"). In version 1 the lane byte held the transport (0 shm, 1 tcp)."""
import math
import os
import struct
import sys

MAGIC = b"C4TRACE\0"
VERSION = 2
READS = (1, 2)
HEADER = struct.Struct("<8sIIIiiiIIQQQQQqQqdqqqqqqqII24s32s64s24s")
EVENT = struct.Struct("<QQQIiBBBBBBBB")
assert HEADER.size == 320 and EVENT.size == 40

# Event types, collectives, data types, reduction ops, algorithms (include/c4comm/*.hpp).
T_OP, T_STEP, T_ERROR, T_DIAG, T_SPAN, T_PLAN = 1, 2, 3, 4, 5, 6
# C4P lane planning (T_PLAN): Event::redop is a trace::PlanEvent; seq names the event's text.
PLAN_PLAN, PLAN_REPLAN, PLAN_WEIGHTS, PLAN_LANE_SAMPLE = 0, 1, 2, 3
PLANEVENTS = ["plan", "replan", "weights", "lane_sample"]
LANE_STRIPED = 255
COLLS = ["AllReduce", "AllGather", "Broadcast", "ReduceScatter", "Reduce", "AlltoAll", "Gather", "Scatter",
         "Send", "Recv", "Barrier"]
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
          "fp8e4m3", "fp8e5m2"]
REDOPS = ["sum", "prod", "max", "min", "avg"]
ALGOS = {0: "ring", 1: "tree", 2: "rhd", 3: "direct", 4: "hier", 0xfc: "zerocopy", 0xfd: "oneshot", 0xfe: "p2p", 0xff: "-"}
STEPKINDS = ["send", "recv", "recvReduce", "copy", "reduce"]
LANES = ["shm", "tcp"]  # version 1: the transport of a step
LEVELS = ["0", "op", "step"]
REASONS = ["finalize", "destroy", "abort", "signal", "request"]
FLAG_INPLACE, FLAG_NOOP, FLAG_NO_END, FLAG_OPEN = 1, 2, 4, 8  # OPEN: began, never ended (version 2)


def coll_name(c):
    return COLLS[c] if c < len(COLLS) else "coll%d" % c


def plan_kind(k):
    return PLANEVENTS[k] if k < len(PLANEVENTS) else "plan%d" % k


def dtype_name(d):
    return DTYPES[d] if d < len(DTYPES) else "type%d" % d


def _cstr(b):
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


class TraceFormatError(ValueError):
    """A file that is not a readable c4comm trace: too short, not a trace, a version this c4-trace does not read,
    truncated, or header fields out of range. The message names the file and what is wrong in one line; c4-trace
    skips such a file with a warning (and fails with that line when no file is left). The reader raises nothing else
    for a file's content (tests/fuzz/trace_fuzz.py checks it)."""


class TraceFile:
    """One rank's file of one communicator: header fields, events converted to aligned ns."""

    def __init__(self, path, data=None):
        """Reads the file at path, or, with data (bytes), that content under the name path."""
        self.path = path
        if data is None:
            with open(path, "rb") as f:
                data = f.read()
        if len(data) < HEADER.size:
            raise TraceFormatError("%s: too short for a c4comm trace (%d bytes)" % (path, len(data)))
        h = HEADER.unpack_from(data, 0)
        (magic, version, hbytes, ebytes, self.rank, self.nranks, self.pid, self.level, self.reason,
         self.first_index, self.n_events, self.valid_from, self.total_events, at0, an0, at1, an1, tpn,
         self.realtime_ns0, o0, r0, a0, o1, r1, a1, nclock, names_bytes, tag, name, host, tail) = h
        if magic != MAGIC:
            raise TraceFormatError("%s: not a c4comm trace (bad magic)" % path)
        if version not in READS or hbytes != HEADER.size or ebytes != EVENT.size:
            raise TraceFormatError("%s: trace format version %d (header %d, event %d bytes); this c4-trace reads "
                                   "versions %s" % (path, version, hbytes, ebytes, ", ".join(str(v) for v in READS)))
        if not 0 <= self.rank < self.nranks:
            raise TraceFormatError("%s: rank %d of %d ranks" % (path, self.rank, self.nranks))
        self.version = version
        names = _cstr(tail) if version >= 2 else ""
        self.transports = names.split(",") if names else list(LANES)
        self.tag, self.name, self.host = _cstr(tag), _cstr(name), _cstr(host)
        end = HEADER.size + self.n_events * EVENT.size
        if len(data) < end + names_bytes:
            raise TraceFormatError("%s: truncated (%d events announced)" % (path, self.n_events))
        self.names = data[end:end + names_bytes]
        self.clock = [(o0, r0, a0), (o1, r1, a1)][:nclock]
        # Ticks -> ns: the file's two anchors give a long baseline; else the process calibration.
        if an1 - an0 > 50_000_000 and at1 > at0:
            self.ticks_per_ns = (at1 - at0) / (an1 - an0)
        else:
            self.ticks_per_ns = tpn if tpn > 0 else 1.0
        # Converted times must stay finite: a clock of 1e-9 .. 1e9 ticks per ns covers every real one.
        if not (math.isfinite(self.ticks_per_ns) and 1e-9 <= self.ticks_per_ns <= 1e9):
            raise TraceFormatError("%s: clock rate %r ticks per ns" % (path, self.ticks_per_ns))
        self.anchor_ticks, self.anchor_ns = at0, an0
        self._raw = memoryview(data)[HEADER.size:end]
        self.dropped = self.total_events - self.n_events
        skip = max(0, self.valid_from - self.first_index)
        self.skip = min(skip, self.n_events)

    def offset_at(self, local_ns):
        """rank 0's clock minus this rank's at local time local_ns (interpolated between samples)."""
        if not self.clock:
            return 0
        if len(self.clock) == 1 or self.clock[1][2] == self.clock[0][2]:
            return self.clock[0][0]
        (o0, _, a0), (o1, _, a1) = self.clock
        return o0 + (o1 - o0) * (local_ns - a0) / (a1 - a0)

    def name_of(self, off):
        """The text at byte offset off of the name table, up to its NUL (the whole text: a C4D record is long)."""
        if off <= 0 or off >= len(self.names):
            return ""
        end = self.names.find(b"\0", off)
        return self.names[off:end if end >= 0 else len(self.names)].decode("utf-8", "replace")

    def transport_name(self, via):
        return self.transports[via] if 0 <= via < len(self.transports) else "transport%d" % via

    def events(self):
        """Events as tuples (t0, t1, bytes, seq, peer, type, coll, dtype, redop, algo, via, flags, lane), times
        in ns on rank 0's clock (aligned). via: the step's transport (transport_name); lane: its lane, 255
        when striped over several, -1 when the file (version 1) does not say."""
        tpn = self.ticks_per_ns
        at, an = self.anchor_ticks, self.anchor_ns
        inv = 1.0 / tpn
        out = []
        append = out.append
        if len(self.clock) == 2 and self.clock[1][2] != self.clock[0][2]:
            (o0, _, a0), (o1, _, a1) = self.clock
            slope = (o1 - o0) / (a1 - a0)
            base = o0 - slope * a0
        else:
            slope, base = 0.0, (self.clock[0][0] if self.clock else 0)
        k = 0
        v1 = self.version < 2
        for t0, t1, nbytes, seq, peer, typ, coll, dt, red, algo, lane, flags, tr in EVENT.iter_unpack(self._raw):
            k += 1
            if k <= self.skip:
                continue
            l0 = an + (t0 - at) * inv
            l1 = an + (t1 - at) * inv
            off = base + slope * l0
            if v1:
                append((int(l0 + off), int(l1 + off), nbytes, seq, peer, typ, coll, dt, red, algo, lane, flags, -1))
            else:
                append((int(l0 + off), int(l1 + off), nbytes, seq, peer, typ, coll, dt, red, algo, tr, flags, lane))
        return out


def find_files(root):
    """Every .c4t file under root (or root itself), sorted."""
    if os.path.isfile(root):
        return [root]
    if not os.path.isdir(root):
        raise FileNotFoundError("%s: no such trace directory or file" % root)
    found = []
    for d, _, files in os.walk(root):
        found.extend(os.path.join(d, f) for f in files if f.endswith(".c4t"))
    return sorted(found)


class Progress:
    """A progress bar on stderr (only when it is a terminal, or forced)."""

    def __init__(self, total, label, enabled):
        self.total, self.label, self.enabled, self.done, self.last = max(1, total), label, enabled, 0, -1

    def add(self, n):
        self.done += n
        if not self.enabled:
            return
        pct = int(100 * self.done / self.total)
        if pct != self.last:
            self.last = pct
            bar = "#" * (pct // 4) + "." * (25 - pct // 4)
            sys.stderr.write("\r%s [%s] %3d%%" % (self.label, bar, pct))
            sys.stderr.flush()

    def close(self):
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
