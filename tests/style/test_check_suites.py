#!/usr/bin/env python3
"""tools/check_suites.py on made-up JUnit reports: which skips it accepts, and only where the machine
bears the claim out (the CPU's flags and the GPU node come from files these tests write)."""
import contextlib
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import check_suites  # noqa: E402

AVX512 = "fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512dq avx512vl"
AVX2 = "fpu sse2 avx avx2 fma f16c"


def case(name, skipped_out=None, status="run"):
    if skipped_out is None:
        return '<testcase name="%s" status="%s"/>' % (name, status)
    return ('<testcase name="%s" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>'
            '<system-out>%s</system-out></testcase>' % (name, skipped_out))


class CheckSuites(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.env = dict(os.environ)
        for k in ("C4_KERNELS_ISA_MAX", "C4_ALLOW_SKIPS"):
            os.environ.pop(k, None)
        self.cpuinfo = os.path.join(self.dir.name, "cpuinfo")
        self.set_cpu(AVX2)
        os.environ["C4_CHECK_CPUINFO"] = self.cpuinfo
        os.environ["C4_CHECK_GPU_NODE"] = os.path.join(self.dir.name, "nvidia0")

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.env)
        self.dir.cleanup()

    def set_cpu(self, flags):
        with open(self.cpuinfo, "w") as f:
            f.write("processor\t: 0\nflags\t\t: %s\n" % flags)

    def run_check(self, *cases):
        path = os.path.join(self.dir.name, "junit.xml")
        with open(path, "w") as f:
            f.write('<?xml version="1.0"?><testsuite>%s</testsuite>' % "".join(cases))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = check_suites.main_args([path, "--only-skips"])
        return rc, out.getvalue()

    def test_no_skips_passes(self):
        rc, out = self.run_check(case("A.b"), case("A.c"))
        self.assertEqual(rc, 0, out)
        self.assertIn("2 ran", out)

    def test_avx512_skip_accepted_on_a_cpu_without_it(self):
        rc, out = self.run_check(case("Isas/IsaTest.Fp8AllPairs/avx512",
                                      "Skipped\n[not applicable: cpu-lacks-avx512] avx512: the CPU lacks AVX-512\n"),
                                 case("A.b"))
        self.assertEqual(rc, 0, out)
        self.assertIn("did not apply", out)
        self.assertIn("cpu-lacks-avx512", out)

    def test_avx512_skip_refused_on_a_cpu_with_it(self):
        self.set_cpu(AVX512)
        rc, out = self.run_check(case("Isas/IsaTest.Fp8AllPairs/avx512",
                                      "[not applicable: cpu-lacks-avx512] avx512: the CPU lacks AVX-512"))
        self.assertEqual(rc, 1, out)
        self.assertIn("the CPU has AVX-512", out)

    def test_avx512_skip_accepted_under_the_cap(self):
        self.set_cpu(AVX512)
        os.environ["C4_KERNELS_ISA_MAX"] = "avx2"
        rc, out = self.run_check(case("Isas/IsaTest.Fp8AllPairs/avx512",
                                      "[not applicable: cpu-lacks-avx512] C4_KERNELS_ISA_MAX=avx2 caps it"))
        self.assertEqual(rc, 0, out)

    def test_avx2_skip_needs_a_cpu_without_it_or_the_scalar_cap(self):
        skip = case("Isas/IsaTest.Fp8AllPairs/avx2", "[not applicable: cpu-lacks-avx2] avx2: lacks")
        self.assertEqual(self.run_check(skip)[0], 1)
        os.environ["C4_KERNELS_ISA_MAX"] = "scalar"
        self.assertEqual(self.run_check(skip)[0], 0)
        os.environ.pop("C4_KERNELS_ISA_MAX")
        self.set_cpu("fpu sse2")
        self.assertEqual(self.run_check(skip)[0], 0)

    def test_no_gpu_skip_needs_no_gpu(self):
        skip = case("Ranks/CudaIpc.AllReduce/2", "[not applicable: no-gpu] no CUDA GPU here")
        rc, out = self.run_check(skip)
        self.assertEqual(rc, 0, out)
        self.assertIn("no CUDA GPU here", out)
        open(os.environ["C4_CHECK_GPU_NODE"], "w").close()
        rc, out = self.run_check(skip)
        self.assertEqual(rc, 1, out)
        self.assertIn("this host has a GPU", out)

    def test_has_gpu_skip_needs_a_gpu(self):
        skip = case("CudaRuntime.AHostWithoutAGpuGetsErrorsNotCrashes", "[not applicable: has-gpu] 1 GPU")
        self.assertEqual(self.run_check(skip)[0], 1)
        open(os.environ["C4_CHECK_GPU_NODE"], "w").close()
        self.assertEqual(self.run_check(skip)[0], 0)

    def test_unexplained_and_unknown_skips_fail(self):
        rc, out = self.run_check(case("A.b", "Skipped\nneeds chromium\n"))
        self.assertEqual(rc, 1, out)
        self.assertIn("needs chromium", out)
        rc, out = self.run_check(case("A.c", "[not applicable: no-chromium] missing"))
        self.assertEqual(rc, 1, out)
        self.assertIn("does not know", out)
        # A GPU-looking name is no excuse: the reason is what counts.
        rc, out = self.run_check(case("CudaPipeline.AllReduce", "Skipped\n"))
        self.assertEqual(rc, 1, out)

    def test_allow_skips_accepts_the_rest(self):
        os.environ["C4_ALLOW_SKIPS"] = "1"
        rc, out = self.run_check(case("A.b", "Skipped\nneeds root\n"))
        self.assertEqual(rc, 0, out)
        self.assertIn("C4_ALLOW_SKIPS=1", out)

    def test_several_reports_are_counted_together(self):
        paths = []
        for i, names in enumerate((["fuzz_a", "fuzz_b", "fuzz_c", "fuzz_d"], ["fuzz_e", "fuzz_f", "fuzz_g", "fuzz_h", "fuzz_i"])):
            path = os.path.join(self.dir.name, "junit%d.xml" % i)
            with open(path, "w") as f:
                f.write('<?xml version="1.0"?><testsuite>%s</testsuite>' % "".join(case(n) for n in names))
            paths.append(path)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(check_suites.main_args([paths[0], "--expect", "fuzz"]), 1)
            self.assertEqual(check_suites.main_args(paths + ["--expect", "fuzz"]), 0, out.getvalue())

    def test_expected_suites_counted(self):
        path = os.path.join(self.dir.name, "junit.xml")
        with open(path, "w") as f:
            f.write('<?xml version="1.0"?><testsuite>%s</testsuite>' % case("fuzz_one"))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = check_suites.main_args([path, "--expect", "fuzz"])
        self.assertEqual(rc, 1)
        self.assertIn("expected at least", out.getvalue())


if __name__ == "__main__":
    unittest.main()
