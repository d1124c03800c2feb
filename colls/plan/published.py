"""Published nccl-tests all_reduce figures beside `colls plan`'s NCCL model (docs/planning.md).

Each row: the machine (a preset and its overrides), the algorithm NCCL ran ("best": NCCL's default
choice, so the model's fastest), the size, the published busbw and where it was published. `role`
is "fit" where the row set one of the model's constants (it checks nothing) and "check" otherwise.
`markdown()` renders the table the docs carry; a test keeps the two equal and every row within 10%.
"""

from __future__ import annotations

from dataclasses import dataclass

from .nccl_model import Estimate, best, price, whole_cluster
from .presets import preset


@dataclass(frozen=True)
class Figure:
    """One published busbw and the machine it was measured on."""

    case: str
    preset: str
    overrides: tuple[tuple[str, object], ...]
    algorithm: str
    nbytes: int
    busbw: float
    source: str
    role: str = "check"

    def model(self) -> Estimate:
        """The model's estimate of this row."""
        cluster = preset(self.preset, **dict(self.overrides))
        groups = whole_cluster(cluster)
        if self.algorithm == "best":
            return best("all_reduce", self.nbytes, cluster, groups)
        found = price("all_reduce", self.algorithm, self.nbytes, cluster, groups)
        if found is None:
            raise ValueError(f"{self.case}: {self.algorithm} does not apply")
        return found

    @property
    def error(self) -> float:
        """(model - published) / published."""
        return self.model().busbw / self.busbw - 1


GiB = 1 << 30
FIGURES = [
    Figure("8 x H100, one node, NCCL_ALGO=Ring", "dgx-h100", (("nodes", 1),), "ring", 8 * GiB, 370,
           "NVIDIA/nccl-tests#212 (S. Jeaugey: ~370 GB/s effective NVLink)", "fit"),
    Figure("8 x H100, one node, default (NVLS)", "dgx-h100", (("nodes", 1),), "nvls", 8 * GiB, 480,
           "NVIDIA/nccl-tests#212 (S. Jeaugey: peak busBw ~480, algbw ~275)", "fit"),
    Figure("2 x 8 H100, 8 x 400 Gb/s, NCCL_ALGO=Ring", "dgx-h100", (("nodes", 2),), "ring", 8 * GiB, 396,
           "NVIDIA/nccl-tests#309, #319 (issue 43's row)"),
    Figure("2 x 8 H100, 8 x 400 Gb/s, NVLSTree", "dgx-h100", (("nodes", 2),), "nvls_tree", 8 * GiB, 470,
           "NVIDIA/nccl-tests#309 (16 GPU-NIC pairs: 470 GB/s)"),
    Figure("4 x 8 H100, 8 x 400 Gb/s, default", "dgx-h100", (("nodes", 4),), "best", 16 * GiB, 365.84,
           "NVIDIA/nccl-tests#309 (32 GPU-NIC pairs: max 365.84)"),
    Figure("8 x H200, one node, default (NVLS)", "hgx-h200", (("nodes", 1),), "nvls", 4 * GiB, 475,
           "NVIDIA/nccl-tests#272 (peak 475 GB/s, NCCL 2.20.3)"),
    Figure("8 x H800 (NVLink 200 GB/s), one node, NVLS", "hgx-h800", (("nodes", 1),), "nvls", 8 * GiB, 215,
           "NVIDIA/nccl#1374 (215 GB/s on an H800 node)"),
    Figure("8 x A100 SXM, one node, default (ring)", "dgx-a100", (("nodes", 1),), "best", 4 * GiB, 232.54,
           "NVIDIA/nccl-tests#175 (single node: 232.54 GB/s)"),
    Figure("3 x 8 A100, 4 x 200 Gb/s HDR, default", "dgx-a100", (("nodes", 3), ("nics_per_node", 4)), "best",
           128 << 20, 96, "NVIDIA/nccl-tests#119 (peak ~96; 24 GB/s per 200G NIC is the target)"),
    Figure("248 x 8 H200, 8 x 400 Gb/s, default, 512 MiB", "hgx-h200",
           (("nodes", 248), ("nodes_per_leaf", 32)), "best", 512 << 20, 350,
           "NVIDIA/nccl-tests#283 (1984 GPUs: typically ~350 GB/s)"),
    Figure("72 x GB200 (NVL72), one NVLink domain, NVLS", "gb200-nvl72", (("nodes", 1),), "nvls", 8 * GiB,
           834.57, "coreweave/nccl-tests#43 (8 GiB: 834.57 GB/s)", "fit"),
]


def markdown() -> str:
    """The docs' table of every figure beside the model."""
    lines = ["| case | preset | algorithm | size | published busbw GB/s | model GB/s | error | bound | role "
             "| source |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in FIGURES:
        estimate = f.model()
        algorithm = f.algorithm if f.algorithm != "best" else f"best: {estimate.algorithm}"
        overrides = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in f.overrides)
        size = f"{f.nbytes // GiB} GiB" if f.nbytes % GiB == 0 else f"{f.nbytes >> 20} MiB"
        lines.append(f"| {f.case} | {f.preset} {overrides} | {algorithm} | {size} | {f.busbw:g} | "
                     f"{estimate.busbw:.0f} | {f.error * 100:+.1f}% | {estimate.bound} | {f.role} | "
                     f"{f.source} |")
    return "\n".join(lines)
