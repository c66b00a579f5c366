#!/usr/bin/python3
"""netload: a small TCP load generator and prober for netlab fabrics (Python 3 standard library only).

Run its pieces inside fabric hosts with `netlab run NAME HOST -- netload.py ...`. Every mode prints JSON
on stdout (one object, or one object per line with --interval) so tests can read the results.

  sink   --listen ADDR:PORT --flows N [--warmup S] [--window S] [--interval S] [--max-time S]
         Accepts N connections and counts the bytes of each. With --window: once all N are connected,
         waits --warmup seconds, measures every flow's rate over --window seconds, closes and prints
         {"flows": [{"peer", "bytes", "window_bytes", "bps"}], "window_s"}. With --interval: prints
         {"t", "bytes": [cumulative per flow]} every interval until every flow ended or --max-time.
  source --flow DST:PORT[,SRC[:SPORT]] ... [--seconds S | --bytes N] [--connect-timeout S]
         One thread per flow sends until the peer closes, --seconds elapse or --bytes are sent; prints
         {"flows": [{"dst", "src", "sport", "bytes", "seconds", "error"}]}.
  serve  --listen ADDR:PORT [--max-time S]
         Answers each connection's request line: "echo TOKEN" -> "TOKEN\\n"; "send N" -> N bytes.
  probe  --target DST:PORT[,SRC[:SPORT]] ... [--timeout S]
         Connects to each target (bound to SRC/SPORT if given), checks an echo round trip; prints
         {"results": [{"target", "src", "ok", "error", "local"}]}; exit status 0 only when all are ok.
  fetch  --target DST:PORT[,SRC[:SPORT]] --bytes N [--timeout S]
         Asks a serve for N bytes and reads them (traffic in the server-to-client direction).
"""

import argparse
import json
import os
import selectors
import socket
import sys
import threading
import time

CHUNK = 256 * 1024


def _hostport(text, default_host=""):
    host, _, port = text.rpartition(":")
    return (host or default_host, int(port))


def _flow_spec(text):
    """"DST:PORT[,SRC[:SPORT]]" -> ((dst, port), (src, sport) or None)."""
    dst, _, src = text.partition(",")
    d = _hostport(dst)
    s = None
    if src:
        if ":" in src:
            h, p = _hostport(src)
            s = (h, p)
        else:
            s = (src, 0)
    return d, s


def _connect(dst, src, timeout):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if src:
            s.bind(src)
        s.settimeout(timeout)
        s.connect(dst)
        s.settimeout(None)
        return s
    except BaseException:
        s.close()
        raise


def _listen(addr, backlog=64):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(addr)
    s.listen(backlog)
    return s


def _out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def cmd_sink(a):
    ls = _listen(_hostport(a.listen, "0.0.0.0"))
    ls.settimeout(a.accept_timeout)
    conns = []
    try:
        while len(conns) < a.flows:
            c, peer = ls.accept()
            c.setblocking(False)
            conns.append({"sock": c, "peer": "%s:%d" % peer, "bytes": 0, "open": True})
    except socket.timeout:
        _out({"error": "only %d of %d flows connected within %.1fs" % (len(conns), a.flows, a.accept_timeout)})
        return 1
    finally:
        ls.close()
    sel = selectors.DefaultSelector()
    for i, c in enumerate(conns):
        sel.register(c["sock"], selectors.EVENT_READ, i)
    buf = bytearray(CHUNK)
    t0 = time.monotonic()
    mark = {}
    next_report = t0 + (a.interval or 0)
    win_start = t0 + a.warmup
    win_end = win_start + a.window if a.window else None
    deadline = t0 + a.max_time
    while True:
        now = time.monotonic()
        if win_end is not None and "start" not in mark and now >= win_start:
            mark["start"] = (now, [c["bytes"] for c in conns])
        if win_end is not None and now >= win_end:
            mark["end"] = (now, [c["bytes"] for c in conns])
            break
        if a.interval and now >= next_report:
            _out({"t": round(now - t0, 3), "bytes": [c["bytes"] for c in conns]})
            next_report += a.interval
        if now >= deadline or not any(c["open"] for c in conns):
            break
        for key, _ in sel.select(timeout=0.02):
            c = conns[key.data]
            try:
                n = c["sock"].recv_into(buf)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                n = 0
            if n == 0:
                c["open"] = False
                sel.unregister(c["sock"])
            else:
                c["bytes"] += n
    for c in conns:
        c["sock"].close()
    flows = []
    for i, c in enumerate(conns):
        f = {"peer": c["peer"], "bytes": c["bytes"]}
        if "end" in mark and "start" in mark:
            dt = mark["end"][0] - mark["start"][0]
            wb = mark["end"][1][i] - mark["start"][1][i]
            f.update(window_bytes=wb, bps=wb * 8 / dt if dt > 0 else 0.0)
        flows.append(f)
    res = {"flows": flows, "elapsed_s": round(time.monotonic() - t0, 3)}
    if "end" in mark and "start" in mark:
        res["window_s"] = round(mark["end"][0] - mark["start"][0], 3)
    _out(res)
    return 0


def _source_flow(spec, a, result):
    dst, src = spec
    result.update(dst="%s:%d" % dst, src=src[0] if src else None, sport=src[1] if src else None, bytes=0,
                  seconds=0.0, error=None)
    try:
        s = _connect(dst, src, a.connect_timeout)
    except OSError as e:
        result["error"] = "connect: %s" % e
        return
    result["sport"] = s.getsockname()[1]
    data = memoryview(bytearray(CHUNK))
    t0 = time.monotonic()
    end = t0 + a.seconds
    try:
        while time.monotonic() < end and (a.bytes is None or result["bytes"] < a.bytes):
            n = CHUNK if a.bytes is None else min(CHUNK, a.bytes - result["bytes"])
            result["bytes"] += s.send(data[:n])
        if a.bytes is not None:
            # Wait until the receiver has everything (it closes) so the byte count is delivered, not queued.
            s.shutdown(socket.SHUT_WR)
            s.settimeout(max(1.0, end - time.monotonic()))
            s.recv(1)
    except (ConnectionResetError, BrokenPipeError, socket.timeout):
        pass
    except OSError as e:
        result["error"] = "send: %s" % e
    finally:
        result["seconds"] = round(time.monotonic() - t0, 3)
        s.close()


def cmd_source(a):
    specs = [_flow_spec(f) for f in a.flow]
    results = [{} for _ in specs]
    threads = [threading.Thread(target=_source_flow, args=(sp, a, r)) for sp, r in zip(specs, results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _out({"flows": results})
    return 0 if all(r["error"] is None for r in results) else 1


def _serve_one(c):
    try:
        c.settimeout(30)
        f = c.makefile("rb")
        line = f.readline(256).decode(errors="replace").strip()
        verb, _, arg = line.partition(" ")
        if verb == "echo":
            c.sendall((arg + "\n").encode())
        elif verb == "send":
            left = int(arg)
            data = bytes(CHUNK)
            while left > 0:
                n = c.send(data[:min(CHUNK, left)])
                left -= n
            c.shutdown(socket.SHUT_WR)
            c.recv(1)
    except (OSError, ValueError):
        pass
    finally:
        c.close()


def cmd_serve(a):
    ls = _listen(_hostport(a.listen, "0.0.0.0"))
    ls.settimeout(0.5)
    end = time.monotonic() + a.max_time
    _out({"listening": "%s:%d" % ls.getsockname()})
    while time.monotonic() < end:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            continue
        threading.Thread(target=_serve_one, args=(c,), daemon=True).start()
    return 0


def cmd_probe(a):
    results = []
    for t in a.target:
        dst, src = _flow_spec(t)
        r = {"target": "%s:%d" % dst, "src": src[0] if src else None, "ok": False, "error": None, "local": None}
        try:
            s = _connect(dst, src, a.timeout)
            try:
                r["local"] = "%s:%d" % s.getsockname()
                token = os.urandom(6).hex()
                s.settimeout(a.timeout)
                s.sendall(("echo %s\n" % token).encode())
                reply = s.makefile("rb").readline(64).decode().strip()
                r["ok"] = reply == token
                if not r["ok"]:
                    r["error"] = "bad echo %r" % reply
            finally:
                s.close()
        except OSError as e:
            r["error"] = str(e) or type(e).__name__
        results.append(r)
    _out({"results": results})
    return 0 if all(r["ok"] for r in results) else 1


def cmd_fetch(a):
    dst, src = _flow_spec(a.target)
    r = {"target": "%s:%d" % dst, "bytes": 0, "error": None, "sport": None}
    t0 = time.monotonic()
    try:
        s = _connect(dst, src, a.timeout)
        r["sport"] = s.getsockname()[1]
        s.settimeout(a.timeout)
        s.sendall(("send %d\n" % a.bytes).encode())
        buf = bytearray(CHUNK)
        while True:
            n = s.recv_into(buf)
            if n == 0:
                break
            r["bytes"] += n
        s.close()
    except OSError as e:
        r["error"] = str(e) or type(e).__name__
    r["seconds"] = round(time.monotonic() - t0, 3)
    _out(r)
    return 0 if r["error"] is None and r["bytes"] == a.bytes else 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="netload", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    k = sub.add_parser("sink")
    k.add_argument("--listen", required=True)
    k.add_argument("--flows", type=int, default=1)
    k.add_argument("--warmup", type=float, default=0.5)
    k.add_argument("--window", type=float, default=None)
    k.add_argument("--interval", type=float, default=None)
    k.add_argument("--max-time", type=float, default=60.0)
    k.add_argument("--accept-timeout", type=float, default=20.0)
    k.set_defaults(func=cmd_sink)
    s = sub.add_parser("source")
    s.add_argument("--flow", action="append", required=True)
    s.add_argument("--seconds", type=float, default=10.0)
    s.add_argument("--bytes", type=int, default=None)
    s.add_argument("--connect-timeout", type=float, default=5.0)
    s.set_defaults(func=cmd_source)
    v = sub.add_parser("serve")
    v.add_argument("--listen", required=True)
    v.add_argument("--max-time", type=float, default=300.0)
    v.set_defaults(func=cmd_serve)
    r = sub.add_parser("probe")
    r.add_argument("--target", action="append", required=True)
    r.add_argument("--timeout", type=float, default=3.0)
    r.set_defaults(func=cmd_probe)
    f = sub.add_parser("fetch")
    f.add_argument("--target", required=True)
    f.add_argument("--bytes", type=int, required=True)
    f.add_argument("--timeout", type=float, default=10.0)
    f.set_defaults(func=cmd_fetch)
    a = p.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
