"""Run tests of PyTorch's own distributed suite (torch.testing._internal.distributed.distributed_test,
shipped in the torch wheel) on the backend named by $BACKEND, as torch's test_distributed_spawn.py
runs them on Gloo: every test spawns $WORLD_SIZE processes that call
`dist.init_process_group(backend=BACKEND, init_method="file://...")`.

The suite gates some tests on a list of backends it knows (DDP, sub-groups, plugins); a backend
registered by `import colls.torch` is added to those lists, and nothing else of the suite changes.

Usage: BACKEND=colls WORLD_SIZE=2 python tests/torch_suite.py -k test_DistributedDataParallelCPU
"""

import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "colls")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="colls-torch-suite-"))   # the suite's own files
# With $CI set, torch's runner switches to its own CI mode (JUnit XML through xmlrunner, lists of
# disabled tests fetched from the network); run it as on a developer's machine.
os.environ.pop("CI", None)

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

import colls.torch  # noqa: E402,F401  (registers the backend "colls")

if os.environ["BACKEND"] != "gloo":
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add(os.environ["BACKEND"])

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestBackend(TestDistBackend, DistributedTest._DistTestBase):
    """torch's distributed tests, each in freshly spawned processes (as test_distributed_spawn)."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    sys.exit(run_tests())
