#!/usr/bin/env python3
"""Fails a test run in which an expected suite was not registered or skipped itself.

A suite whose prerequisite is missing (clang-format, NVIDIA's nccl.h, root for the emulated
fabrics, chromium) registers no test or exits 77 and ctest counts it as skipped: a run that should
have checked it stays green. CI runs this on ctest's JUnit report (ctest --output-junit):
  - every expected suite has tests in the report (at least as many as given below);
  - no test was skipped, except those whose name matches an allowed pattern (the GPU tests: no GPU
    in CI) or every test when C4_ALLOW_SKIPS=1 (a developer's machine without root, say).

Usage: check_suites.py JUNIT.xml [--only-skips] [--expect fuzz]

The suites expected depend on the build: the main build's (build/) by default; with --expect fuzz, those of the fuzz
build (build-fuzz/, scripts/fuzz.sh), whose report holds only the fuzz targets' tests.
"""
import fnmatch
import os
import sys
import xml.etree.ElementTree as ET

# suite -> (name patterns, minimum number of tests)
EXPECTED = {
    "style (clang-format, docs/params.md)": (["style_clang_format", "docs_params_current"], 2),
    "ABI (against NVIDIA's nccl.h)": (["abi_*"], 6),
    "ABI against NVIDIA's newest nccl.h (2.32: its new functions, one-sided calls, grow)":
        (["abi_header_decls", "abi_layout", "abi_nccl_new_*", "abi_allreduce_newest_*"], 5),
    "one-sided calls (windows, put/signal/wait)": (["OneSided.*"], 2),
    "staging of device-buffer calls and their pipelined pieces (on the host)":
        (["All/Staging.*", "StagingPinned.*", "StagingPieces.*"], 386),
    "netlab (emulated hosts and fabrics)": (["netlab_*"], 10),
    "transport conformance": (["*Conformance*"], 10),
    "trace report screenshot": (["trace_report_screenshot"], 1),
    "C4P planner": (["Planner*", "Topology*"], 30),
    "C4D health checks": (["C4D.*", "Diagnose.*", "SlowDetect.*", "Faults.*", "netlab_c4d_*", "c4d_*", "abi_c4d*"],
                          30),
    "soak (short soak, planted faults)": (["soak_*"], 6),
    "ucx transport (conformance, collective matrix, dead peers per mode)":
        (["*Conformance*ucx*", "Net/NetMatrix*ucx*", "Modes/UcxPeerFailure.*"], 18),
    "ibverbs transport setup (no RDMA device here)": (["IbVerbs.*"], 5),
    "ibverbs over real verbs (Soft-RoCE VMs: conformance, collective matrix, two hosts, two ports)":
        (["rdma_vm_*"], 3),
    "schedule files, c4-sim, c4-synth (issue 21)":
        (["ScheduleFile.*", "Files/ScheduleFileMatrix.*", "ScheduleFiles.*", "Sim.*", "synth_pytest",
          "netlab_synth_*"], 20),
    "CUDA without a GPU (kernel arithmetic on the host, the library without a driver, NVIDIA's exports)":
        (["Isa/CudaVectorPacks.*", "CudaRuntime.*", "abi_nvidia_exports"], 4),
    "CUDA device tests (registered; they skip without a GPU: scripts/gpu-check.sh)":
        (["Cuda.*", "CudaColl*", "Ranks/CudaColl.*", "Ranks/CudaIpc.*", "CudaIpcOff.*", "Modes/CudaIpcFallback.*",
          "CudaMem.*", "CudaPipeline.*", "CudaIpcRegistered.*", "Modes/CudaWindow.*", "CudaWindowOneProcess.*",
          "CudaWindowErrors.*", "CudaWindowStreams.*"], 28),
}
# The fuzz build (-DC4_FUZZ=ON, tests/fuzz): one ctest per target (docs/fuzzing.md), the Python one included.
EXPECTED_FUZZ = {
    "fuzz targets (libFuzzer, atheris)": (["fuzz_*"], 8),
}
ALLOWED_SKIPS = ["*Gpu*", "*gpu*", "*Cuda*"]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    only_skips = "--only-skips" in sys.argv[2:]
    expected = EXPECTED
    if "--expect" in sys.argv[2:]:
        i = sys.argv.index("--expect")
        kind = sys.argv[i + 1] if i + 1 < len(sys.argv) else ""
        if kind != "fuzz":
            print("check_suites: --expect takes 'fuzz', not %r" % kind)
            return 2
        expected = EXPECTED_FUZZ
    root = ET.parse(sys.argv[1]).getroot()
    cases = list(root.iter("testcase"))
    names = [c.get("name", "") for c in cases]
    bad = []
    if not only_skips:
        for suite, (patterns, least) in expected.items():
            n = sum(1 for name in names if any(fnmatch.fnmatch(name, p) for p in patterns))
            if n < least:
                bad.append("suite %s: %d test(s) registered, expected at least %d (is its prerequisite installed?)" %
                           (suite, n, least))
    allow_all = os.environ.get("C4_ALLOW_SKIPS") == "1"
    for c in cases:
        status = c.get("status", "")
        skipped = status in ("skipped", "notrun", "disabled") or c.find("skipped") is not None
        if not skipped or allow_all:
            continue
        name = c.get("name", "")
        if any(fnmatch.fnmatch(name, p) for p in ALLOWED_SKIPS):
            continue
        why = c.find("skipped")
        reason = (why.get("message") or why.text or "") if why is not None else ""
        bad.append("test %s was skipped%s" % (name, (": " + reason.strip()[:200]) if reason.strip() else ""))
    if bad:
        print("check_suites: %d problem(s) in %s:" % (len(bad), sys.argv[1]))
        for b in bad:
            print("  " + b)
        return 1
    print("check_suites: %d tests; every expected suite ran, nothing skipped" % len(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
