#!/usr/bin/env python3
"""Fetches NVIDIA's newest nccl.h (from PyPI's nvidia-nccl-cu13 wheel) for the ABI tests.

The wheel is 300 MB; the header is 47 KB. Wheels are zip files, so this reads the zip's central
directory with an HTTP range request, then only the header's compressed bytes, inflates them and
checks the zip's CRC and the pinned SHA-256 below. A wheel already on disk (C4_NCCL_WHEEL=path) is
read instead of the network. Idempotent: an existing file with the right hash is kept.

  tools/fetch_nccl_header.py [--out DIR]    (default .deps/nccl-<version> in the repository)

Prints the header's path. Exit 0 when the header is in place, 1 when it could not be fetched.
"""
import argparse
import hashlib
import os
import re
import struct
import sys
import urllib.request
import zlib

VERSION = "2.32.3"
PACKAGE = "nvidia-nccl-cu13"
WHEEL = "nvidia_nccl_cu13-%s-py3-none-manylinux_2_27_x86_64.whl" % VERSION
MEMBER = "nvidia/nccl/include/nccl.h"
SHA256 = "7d36e8a70b3c3a0a135f3ab7c8422d1a9b0180f09774bd604d58a39d73bdcb6b"
INDEX = os.environ.get("C4_PYPI_SIMPLE", "https://pypi.org/simple")
TIMEOUT = 60


def log(msg):
    print("[fetch_nccl_header] " + msg, file=sys.stderr, flush=True)


class HttpRange:
    """Random access to a remote file through HTTP range requests."""

    def __init__(self, url):
        self.url = url
        self.size = None

    def read(self, offset, length):
        if offset < 0:  # from the end
            hdr = "bytes=%d" % offset
        else:
            hdr = "bytes=%d-%d" % (offset, offset + length - 1)
        req = urllib.request.Request(self.url, headers={"Range": hdr})
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            if r.status != 206:
                raise OSError("the server ignored the range request (HTTP %d)" % r.status)
            total = r.headers.get("Content-Range", "").rsplit("/", 1)[-1]
            if total.isdigit():
                self.size = int(total)
            return r.read()


class LocalFile:
    def __init__(self, path):
        self.f = open(path, "rb")
        self.f.seek(0, 2)
        self.size = self.f.tell()

    def read(self, offset, length):
        if offset < 0:
            offset = max(0, self.size + offset)
            length = self.size - offset
        self.f.seek(offset)
        return self.f.read(length)


def wheel_url():
    req = urllib.request.Request("%s/%s/" % (INDEX, PACKAGE), headers={"Accept": "text/html"})
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        html = r.read().decode("utf-8", "replace")
    for href in re.findall(r'href="([^"]+)"', html):
        if href.split("#")[0].endswith("/" + WHEEL):
            return href.split("#")[0]
    raise OSError("%s is not listed by %s/%s/" % (WHEEL, INDEX, PACKAGE))


def extract(src):
    """The member's bytes, read through `src` (HttpRange or LocalFile)."""
    tail = src.read(-65536, 65536)
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise OSError("no zip end-of-central-directory record")
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12:eocd + 20])
    if cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:  # zip64
        loc = tail.rfind(b"PK\x06\x07", 0, eocd)
        (eocd64_off,) = struct.unpack("<Q", tail[loc + 8:loc + 16])
        rec = src.read(eocd64_off, 56)
        cd_size, cd_offset = struct.unpack("<QQ", rec[40:56])
    cd = src.read(cd_offset, cd_size)
    pos = 0
    while pos + 46 <= len(cd) and cd[pos:pos + 4] == b"PK\x01\x02":
        (method, crc, csize, usize, nlen, xlen, clen) = struct.unpack("<H4xIIIHHH", cd[pos + 10:pos + 34])
        (local_off,) = struct.unpack("<I", cd[pos + 42:pos + 46])
        name = cd[pos + 46:pos + 46 + nlen].decode("utf-8")
        if name == MEMBER:
            head = src.read(local_off, 30)
            lnlen, lxlen = struct.unpack("<HH", head[26:30])
            data = src.read(local_off + 30 + lnlen + lxlen, csize)
            if method == 8:
                data = zlib.decompress(data, -15)
            elif method != 0:
                raise OSError("zip compression method %d is not supported" % method)
            if len(data) != usize or zlib.crc32(data) & 0xFFFFFFFF != crc:
                raise OSError("%s: size or CRC mismatch" % MEMBER)
            return data
        pos += 46 + nlen + xlen + clen
    raise OSError("%s is not in the wheel" % MEMBER)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(root, ".deps", "nccl-" + VERSION))
    args = ap.parse_args()
    path = os.path.join(args.out, "nccl.h")
    if os.path.exists(path):
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() == SHA256:
                print(path)
                return 0
    try:
        local = os.environ.get("C4_NCCL_WHEEL")
        if local:
            log("reading %s from %s" % (MEMBER, local))
            data = extract(LocalFile(local))
        else:
            url = wheel_url()
            log("reading %s from %s (range requests, ~100 KB)" % (MEMBER, url))
            data = extract(HttpRange(url))
    except (OSError, ValueError, zlib.error, struct.error) as e:
        log("FAILED: %s" % e)
        return 1
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        log("FAILED: %s has SHA-256 %s, expected %s" % (MEMBER, digest, SHA256))
        return 1
    os.makedirs(args.out, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
