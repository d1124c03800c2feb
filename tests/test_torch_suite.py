"""PyTorch's own distributed tests, unchanged, on the "colls" backend: torch's end-to-end DDP
training on CPU (`test_DistributedDataParallelCPU`: a model trained 5 steps under
DistributedDataParallel must end equal to the same model trained on the whole batch in one
process), run by tests/torch_suite.py as torch's test_distributed_spawn.py runs them on Gloo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")   # torch's test utilities import it

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNNER = REPO_ROOT / "tests" / "torch_suite.py"
TESTS = ["test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view"]


@pytest.mark.timeout(300)
def test_torch_own_ddp_tests_pass_on_colls(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLS_")}
    env.update(BACKEND="colls", WORLD_SIZE="2", TEMP_DIR=str(tmp_path), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])))
    selection = [arg for name in TESTS for arg in ("-k", name)]   # (unittest: substrings, any of them)
    done = subprocess.run([sys.executable, str(RUNNER), "-v", *selection], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=280)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    ran = re.findall(r"^(test_\w+) \(__main__\.TestBackend\.\w+\) \.\.\. ", report, re.MULTILINE)
    assert sorted(ran) == sorted(TESTS), report[-4000:]
    # unittest's verdict: "OK (skipped=1)" if one skipped itself, "FAILED (...)" if one failed
    assert re.search(rf"^Ran {len(TESTS)} tests? in .*\n\nOK$", report, re.MULTILINE), report[-4000:]
