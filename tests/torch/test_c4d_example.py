"""The PyTorch C4D example (examples/torch/c4d_shrink.py): a rank dies mid-training, the survivors
read the diagnosis, rebuild the group without it and finish with identical parameters."""

import os
import subprocess
import sys

from harness import _BUILD_PYTHON

_EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch", "c4d_shrink.py")


def test_survivors_rebuild_the_group_and_finish():
    env = dict(os.environ, PYTHONPATH=os.path.abspath(_BUILD_PYTHON), C4_TIMEOUT="20")
    p = subprocess.run([sys.executable, _EXAMPLE, "--ranks", "4", "--kill-rank", "2", "--kill-step", "5"], env=env,
                       capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "ok: the survivors rebuilt the group" in out, out
    for r in (0, 1, 3):
        assert "rank %d: C4D says dead_rank: rank 2 died" % r in out, out
        assert "rank %d: finished 15 steps with 3 ranks; parameters identical" % r in out, out
