// A test that cannot apply on this machine says so, with one of a fixed set of reasons.
//
// tools/check_suites.py fails a run in which a test skipped itself, except for a skip whose message
// carries "[not applicable: KEY]" with a KEY of this list, and only after checking the claim
// against the machine (a test that says "no-gpu" on a host with /dev/nvidia0 still fails the run).
// The run's summary lists what did not apply and why. Keep this list and check_suites' REASONS alike:
//   no-gpu            no CUDA GPU here (/dev/nvidia0 absent): scripts/gpu-check.sh runs these on one
//   has-gpu           a GPU is here, so a no-GPU path cannot be tested
//   cpu-lacks-avx512  the kernels cannot run AVX-512 here (the CPU lacks it, or C4_KERNELS_ISA_MAX caps it)
//   cpu-lacks-avx2    likewise for AVX2
//   one-cpu           the process may run on one CPU only
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

/// Skips the current test as not applicable here (in a test body or SetUp). `key` is a key of the
/// list above; `why` says what is missing (both streamed).
#define C4_NOT_APPLICABLE(key, why) GTEST_SKIP() << "[not applicable: " << (key) << "] " << why

namespace c4test {

/// Whether this host has a CUDA GPU (the device node check_suites also looks at).
inline bool haveGpuDevice() { return access("/dev/nvidia0", F_OK) == 0; }

}  // namespace c4test
