#!/usr/bin/python3
"""Runs PyTorch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py,
DistributedTest._DistTestBase) against backend c4, the way torch-ucc runs it for "ucc", and prints
passed / skipped / failed counts.

    PYTHONPATH=build/python /usr/bin/python3 tests/torch/run_torch_distributed_suite.py \
        [--world-size 2] [--per-test-timeout 60] [--max-minutes 40] [-k PATTERN ...] [--list-failures]
    PYTHONPATH=build/python-torch2 .venv-torch/bin/python tests/torch/run_torch_distributed_suite.py ...
                                                              (PyPI's torch 2.x: scripts/torch-venv.sh)

Not part of the CI suite (it takes tens of minutes on 2 cores); docs/torch.md records the last run.
"""

import argparse
import os
import sys
import tempfile
import time
import unittest

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--per-test-timeout", type=int, default=60, help="seconds before a test counts as hung")
    ap.add_argument("--max-minutes", type=float, default=40, help="stop starting new tests after this")
    ap.add_argument("-k", action="append", default=[], help="run tests whose name contains this (repeatable)")
    ap.add_argument("--list-failures", action="store_true", help="print each failure's traceback tail")
    ARGS = ap.parse_args()
    # Read by distributed_test.py and common_distributed.py at import: set them before the import.
    os.environ["BACKEND"] = "c4"
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="c4-torch-suite-"))
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(ARGS.per_test_timeout)
    os.environ.setdefault("C4_TIMEOUT", str(ARGS.per_test_timeout))

# torch's test utilities import expecttest (a pip package Debian does not ship); the distributed
# tests never use its inline-expectation asserts, so a plain unittest.TestCase stands in for it.
try:
    import expecttest  # noqa: F401
except ImportError:
    import types

    sys.modules["expecttest"] = types.SimpleNamespace(TestCase=unittest.TestCase, ACCEPT=False)


def _import_shard_on_python311():
    """torch 1.13's torch.distributed._shard declares a dataclass field whose default is another
    dataclass instance (`tensor_properties = field(default=TensorProperties())`). Python 3.11 refuses
    unhashable defaults, so the import fails before any communication, and with it every DDP test that
    imports the module. Import it once here with Python 3.10's rule for such fields (the default
    instance is shared, as torch expects); the later imports find the module loaded."""
    import dataclasses

    original = dataclasses._get_field

    def get_field(cls, name, type_, *rest):
        declared = cls.__dict__.get(name)
        default = getattr(declared, "default", None)
        klass = type(default)
        if not (isinstance(declared, dataclasses.Field) and dataclasses.is_dataclass(klass) and klass.__hash__ is None):
            return original(cls, name, type_, *rest)
        klass.__hash__ = object.__hash__  # only while the field is checked
        try:
            return original(cls, name, type_, *rest)
        finally:
            klass.__hash__ = None

    dataclasses._get_field = get_field
    try:
        import torch.distributed._shard  # noqa: F401
    except Exception as e:  # report it; the tests that need the module fail with its own error
        print("note: torch.distributed._shard does not import: %s" % e, file=sys.stderr)
    finally:
        dataclasses._get_field = original


if sys.version_info >= (3, 11):
    _import_shard_on_python311()

# Spawned ranks import this file as __mp_main__ with the environment above inherited.
import c4comm_torch  # noqa: E402,F401  registers backend "c4" in every rank
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendC4(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Result(unittest.TextTestResult):
    def __init__(self, *a, deadline=None, **kw):
        super().__init__(*a, **kw)
        self.deadline = deadline
        self.passed = []
        self.not_run = []

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed.append(test)

    def startTest(self, test):
        if time.monotonic() > self.deadline:
            self.not_run.append(test)
            self.stop()  # stops the run before this test
        super().startTest(test)


def main():
    loader = unittest.TestLoader()
    names = sorted(loader.getTestCaseNames(TestDistBackendC4))
    if ARGS.k:
        names = [n for n in names if any(k in n for k in ARGS.k)]
    suite = unittest.TestSuite(TestDistBackendC4(n) for n in names)
    deadline = time.monotonic() + ARGS.max_minutes * 60
    runner = unittest.TextTestRunner(verbosity=2, stream=sys.stdout,
                                     resultclass=lambda *a, **kw: _Result(*a, deadline=deadline, **kw))
    t0 = time.monotonic()
    res = runner.run(suite)
    ran = res.testsRun - len(res.not_run)
    print("\n=== torch %s distributed_test.py, backend c4, world size %d: %d tests, %d run in %.0f s ===" %
          (__import__("torch").__version__, ARGS.world_size, len(names), ran, time.monotonic() - t0))
    print("passed %d, skipped %d, failed %d (errors %d, failures %d), unexpected successes %d, not run (time) %d" %
          (len(res.passed), len(res.skipped), len(res.errors) + len(res.failures), len(res.errors),
           len(res.failures), len(res.unexpectedSuccesses), len(names) - ran))
    for kind, items in (("ERROR", res.errors), ("FAIL", res.failures)):
        for test, tb in items:
            print("%s %s" % (kind, test.id().split(".")[-1]))
            if ARGS.list_failures:
                print("    " + "\n    ".join(tb.strip().splitlines()[-6:]))
    return 0 if not (res.errors or res.failures) else 1


if __name__ == "__main__":
    sys.exit(main())
