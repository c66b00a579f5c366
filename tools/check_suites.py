#!/usr/bin/env python3
"""Fails a test run in which an expected suite was not registered, or a test skipped itself without a
reason this machine bears out.

A suite whose prerequisite is missing (clang-format, NVIDIA's nccl.h, root for the emulated
fabrics, chromium) registers no test or exits 77 and ctest counts it as skipped: a run that should
have checked it stays green. CI runs this on ctest's JUnit report (ctest --output-junit):
  - every expected suite has tests in the report (at least as many as given below);
  - no test was skipped, except a test that cannot apply on this machine and says so: its output
    carries "[not applicable: KEY]" with a KEY of REASONS (tests/common/not_applicable.hpp), and the
    machine bears the claim out (a "no-gpu" skip on a host with /dev/nvidia0 fails the run, so does
    "cpu-lacks-avx512" on a CPU with AVX-512 unless C4_KERNELS_ISA_MAX caps it). Every other skip
    fails, unless C4_ALLOW_SKIPS=1 (a developer's machine without root, say).
The summary lists what did not apply here and why.

Usage: check_suites.py JUNIT.xml [JUNIT.xml ...] [--only-skips] [--expect fuzz]
(several reports of one build: the suites are counted over all of them)

The suites expected depend on the build: the main build's (build/) by default; with --expect fuzz, those of the fuzz
build (build-fuzz/, scripts/fuzz.sh), whose report holds only the fuzz targets' tests.
For its own tests, C4_CHECK_CPUINFO and C4_CHECK_GPU_NODE name the files read for the CPU's flags and the GPU.
"""
import collections
import fnmatch
import os
import re
import sys
import xml.etree.ElementTree as ET

# suite -> (name patterns, minimum number of tests)
EXPECTED = {
    "style (clang-format, docs/params.md, this script's own tests)":
        (["style_clang_format", "docs_params_current", "tools_check_suites", "tests_all_labelled"], 4),
    "host kernels (every dtype x op x ISA; the dispatch under C4_KERNELS_ISA_MAX=avx2 and scalar)":
        (["AllTypesOps/ReduceTest.*", "Isas/IsaTest.*", "KernelsDispatch.*", "kernels_isa_max_*"], 228),
    "ABI (against NVIDIA's nccl.h)": (["abi_*"], 6),
    "ABI against NVIDIA's newest nccl.h (2.32: its new functions, one-sided calls, grow)":
        (["abi_header_decls", "abi_layout", "abi_nccl_new_*", "abi_allreduce_newest_*"], 5),
    "collective matrix (forked and thread ranks; every path and algorithm; tcp; zero-copy; staging)":
        (["Ranks/ForkedMatrix.*", "Ranks/ThreadMatrix.*", "Paths/PathMatrix.*", "Tcp/TcpMatrix.*",
          "ZeroCopy/ZeroCopyMatrix.*", "Exec/StagingMatrix.*"], 39),
    "shm transport (every mode)": (["All/ShmModes.*", "shm_small_devshm"], 17),
    "hardening against hostile or unlucky use (mappings, pid namespaces, abort, bounded buffers and logs)":
        (["Hardening3.*"], 10),
    "one-sided calls (windows, put/signal/wait)": (["OneSided.*"], 2),
    "call observers (dispatch order, event masks, verdicts passed on)": (["CallObservers.*"], 4),
    "staging of device-buffer calls and their pipelined pieces (on the host)":
        (["All/Staging.*", "StagingPinned.*", "StagingPieces.*"], 386),
    "netlab (emulated hosts and fabrics)": (["netlab_*"], 10),
    "transport conformance": (["*Conformance*"], 10),
    "trace report screenshot": (["trace_report_screenshot"], 1),
    "C4P planner": (["Planner*", "Topology*"], 30),
    "C4P fabric service (wire, books, the c4-fabricd daemon)": (["Fabric*"], 8),
    "C4D health checks": (["C4D.*", "Diagnose.*", "SlowDetect.*", "Faults.*", "netlab_c4d_*", "c4d_*", "abi_c4d*"],
                          30),
    "soak (short soak, planted faults)": (["soak_*"], 6),
    "ucx transport (conformance, collective matrix, dead peers per mode)":
        (["*Conformance*ucx*", "Net/NetMatrix*ucx*", "Modes/UcxPeerFailure.*"], 18),
    "ibverbs transport setup (no RDMA device here)": (["IbVerbs.*"], 5),
    "ibverbs over real verbs (Soft-RoCE VMs: conformance, collective matrix, two hosts, two ports)":
        (["rdma_vm_*"], 3),
    "schedule files, c4-sim, c4-synth":
        (["ScheduleFile.*", "Files/ScheduleFileMatrix.*", "ScheduleFiles.*", "Sim.*", "synth_pytest",
          "netlab_synth_*"], 20),
    "CUDA without a GPU (kernel arithmetic on the host, the library without a driver, NVIDIA's exports)":
        (["Isa/CudaVectorPacks.*", "CudaRuntime.*", "abi_nvidia_exports"], 4),
    "CUDA device tests (registered; not applicable without a GPU: scripts/gpu-check.sh)":
        (["Cuda.*", "CudaColl*", "Ranks/CudaColl.*", "Ranks/CudaIpc.*", "CudaIpcOff.*", "Modes/CudaIpcFallback.*",
          "CudaMem.*", "CudaPipeline.*", "CudaIpcRegistered.*", "Modes/CudaWindow.*", "CudaWindowOneProcess.*",
          "CudaWindowErrors.*", "CudaWindowStreams.*"], 28),
}
# The fuzz build (-DC4_FUZZ=ON, tests/fuzz): one ctest per target (docs/fuzzing.md), the Python one included.
EXPECTED_FUZZ = {
    "fuzz targets (libFuzzer, atheris)": (["fuzz_*"], 9),
}


def cpu_flags():
    """The CPU's flags as the kernel reports them (empty where /proc/cpuinfo has none)."""
    try:
        with open(os.environ.get("C4_CHECK_CPUINFO", "/proc/cpuinfo")) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def isa_cap():
    """The level C4_KERNELS_ISA_MAX caps the host kernels at (0 scalar, 1 avx2, 2 avx512)."""
    return {"scalar": 0, "avx2": 1}.get(os.environ.get("C4_KERNELS_ISA_MAX", "auto"), 2)


def gpu_node():
    return os.path.exists(os.environ.get("C4_CHECK_GPU_NODE", "/dev/nvidia0"))


def why_not_avx512():
    flags = cpu_flags()
    lacks = [f for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl") if f not in flags]
    if lacks:
        return None
    if isa_cap() < 2:
        return None
    return "the CPU has AVX-512 (avx512f, bw, dq, vl) and C4_KERNELS_ISA_MAX does not cap it"


def why_not_avx2():
    flags = cpu_flags()
    if any(f not in flags for f in ("avx2", "fma", "f16c")) or isa_cap() < 1:
        return None
    return "the CPU has AVX2 (avx2, fma, f16c) and C4_KERNELS_ISA_MAX does not cap it"


def why_not_one_cpu():
    n = len(os.sched_getaffinity(0))
    return None if n < 2 else "this process may run on %d CPUs" % n


# The reasons a test may give for not applying here (tests/common/not_applicable.hpp): key ->
# (what it means, a check that returns None where the machine bears the claim out, else why not).
REASONS = {
    "no-gpu": ("no CUDA GPU here (scripts/gpu-check.sh runs these on one)",
               lambda: "this host has a GPU (/dev/nvidia0)" if gpu_node() else None),
    "has-gpu": ("a GPU is here, so the no-GPU path cannot be tested",
                lambda: None if gpu_node() else "this host has no GPU (/dev/nvidia0)"),
    "cpu-lacks-avx512": ("the kernels cannot run AVX-512 here (the CPU lacks it, or C4_KERNELS_ISA_MAX caps it)",
                         why_not_avx512),
    "cpu-lacks-avx2": ("the kernels cannot run AVX2 here (the CPU lacks it, or C4_KERNELS_ISA_MAX caps it)",
                       why_not_avx2),
    "one-cpu": ("the process may run on one CPU only", why_not_one_cpu),
}
MARK = re.compile(r"\[not applicable: ([a-z0-9-]+)\]")


def skip_reason(case):
    """The reason key a skipped test gave ("" if none), and its message."""
    texts = []
    why = case.find("skipped")
    if why is not None:
        texts += [why.get("message") or "", why.text or ""]
    out = case.find("system-out")
    if out is not None and out.text:
        texts.append(out.text)
    for t in texts:
        m = MARK.search(t)
        if m:
            line = t[m.start():].splitlines()[0]
            return m.group(1), line
    return "", " ".join(t.strip() for t in texts if t.strip())[:200]


def main_args(argv):
    """argv: the reports and the options (sys.argv[1:]); returns the exit status."""
    reports = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] != "--expect")]
    if not reports:
        print(__doc__)
        return 2
    only_skips = "--only-skips" in argv
    expected = EXPECTED
    if "--expect" in argv:
        i = argv.index("--expect")
        kind = argv[i + 1] if i + 1 < len(argv) else ""
        if kind != "fuzz":
            print("check_suites: --expect takes 'fuzz', not %r" % kind)
            return 2
        expected = EXPECTED_FUZZ
    cases = []
    for report in reports:
        cases += list(ET.parse(report).getroot().iter("testcase"))
    names = [c.get("name", "") for c in cases]
    bad = []
    if not only_skips:
        for suite, (patterns, least) in expected.items():
            n = sum(1 for name in names if any(fnmatch.fnmatch(name, p) for p in patterns))
            if n < least:
                bad.append("suite %s: %d test(s) registered, expected at least %d (is its prerequisite installed?)" %
                           (suite, n, least))
    allow_all = os.environ.get("C4_ALLOW_SKIPS") == "1"
    not_applicable = collections.OrderedDict()  # key -> test names
    allowed_blindly = []
    for c in cases:
        status = c.get("status", "")
        skipped = status in ("skipped", "notrun", "disabled") or c.find("skipped") is not None
        if not skipped:
            continue
        name = c.get("name", "")
        key, message = skip_reason(c)
        if key in REASONS:
            refuted = REASONS[key][1]()
            if refuted is None:
                not_applicable.setdefault(key, []).append(name)
                continue
            bad.append("test %s says it does not apply here (%s), but %s" % (name, key, refuted))
            continue
        if allow_all:
            allowed_blindly.append(name)
            continue
        if key:
            bad.append("test %s was skipped for a reason check_suites does not know: %s" % (name, key))
        else:
            bad.append("test %s was skipped%s" % (name, (": " + message) if message else " (no reason given)"))
    if not_applicable:
        total = sum(len(v) for v in not_applicable.values())
        print("check_suites: %d test(s) did not apply on this machine:" % total)
        for key, tests in not_applicable.items():
            print("  not run: %s: %d test(s) (%s), e.g. %s" % (REASONS[key][0], len(tests), key,
                                                             tests[0].split("  #")[0]))
    if allowed_blindly:
        print("check_suites: C4_ALLOW_SKIPS=1: %d other skipped test(s) accepted, e.g. %s" %
              (len(allowed_blindly), allowed_blindly[0]))
    if bad:
        print("check_suites: %d problem(s) in %s:" % (len(bad), " + ".join(reports)))
        for b in bad:
            print("  " + b)
        return 1
    ran = len(cases) - sum(len(v) for v in not_applicable.values()) - len(allowed_blindly)
    print("check_suites: %d tests, %d ran; every expected suite ran, every skip explained" % (len(cases), ran))
    return 0


if __name__ == "__main__":
    sys.exit(main_args(sys.argv[1:]))
