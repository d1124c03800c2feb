"""Named machines for `colls plan --preset`: published link speeds, memory and compute per GPU.

Link speeds are per direction (NVLink 4's "900 GB/s" is 450 GB/s each way; a 400 Gb/s NIC moves
50 GB/s each way). Three constants say how much of a line rate NCCL turns into bus bandwidth; each
comes from one published statement, and `colls.plan.published` checks the model against others:

- NVLink, Simple protocol: 370 of 450 GB/s (0.822): "with the protocol overhead (~20%) NCCL can get
  an effective NVLink bandwidth of 370GB/s" (S. Jeaugey, NVIDIA/nccl-tests#212).
- NIC: 24 GB/s per 200 Gb/s NIC (0.96): "we usually consider 24GB/s is the peak performance per
  200G NIC" (S. Jeaugey, NVIDIA/nccl-tests#119).
- NVLink SHARP (NVLS): an all-reduce's algbw is 275 of 450 GB/s on NVSwitch 3 (0.611): "on 8 GPUs
  you should reach a peak busBw of ~480GB/s (algbw ~275GB/s)" (nccl-tests#212). For NVLink 5 the
  fraction is fitted on one GB200 NVL72 run (0.472; coreweave/nccl-tests#43), so that row checks
  nothing.
"""

from __future__ import annotations

from dataclasses import replace

from .topology import GB, Cluster

NVLINK_EFFICIENCY = 370 / 450
NIC_EFFICIENCY = 24 / 25
NVLS_NVSWITCH3 = 275 / 450
NVLS_NVSWITCH4 = 425 / 900

# name: (GPUs per node, NVLink GB/s per direction, NICs, NIC Gb/s, HBM GB, dense bf16 TFLOP/s, NVLS)
PRESETS: dict[str, tuple[int, float, int, float, float, float, float]] = {
    "dgx-h100": (8, 450, 8, 400, 80, 989, NVLS_NVSWITCH3),
    "hgx-h200": (8, 450, 8, 400, 141, 989, NVLS_NVSWITCH3),
    "hgx-h800": (8, 200, 8, 400, 80, 989, NVLS_NVSWITCH3),
    "dgx-a100": (8, 300, 8, 200, 80, 312, 0.0),
    "dgx-b200": (8, 900, 8, 400, 180, 2250, NVLS_NVSWITCH4),
    "gb200-nvl72": (72, 900, 72, 400, 186, 2500, NVLS_NVSWITCH4),
}


def preset(name: str, **overrides) -> Cluster:
    """The `Cluster` of a named machine, with `overrides` (e.g. nodes=2, nics_per_node=4).

    Args:
        name: one of `PRESETS`.
        overrides: any `Cluster` field.

    Returns:
        The cluster.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r} is not known; choose one of {', '.join(PRESETS)}")
    gpus, nvlink, nics, nic_gbits, hbm, tflops, nvls = PRESETS[name]
    cluster = Cluster(ranks_per_node=gpus, intra_bandwidth=nvlink * GB, nics_per_node=nics,
                      nic_bandwidth=nic_gbits / 8 * GB, hbm=hbm * GB, gpu_flops=tflops * 1e12,
                      nvls_fraction=nvls, nvlink_efficiency=NVLINK_EFFICIENCY,
                      nic_efficiency=NIC_EFFICIENCY, name=name)
    return replace(cluster, **overrides)


def markdown() -> str:
    """The docs' table of the presets (a test keeps docs/planning.md's copy equal to it)."""
    lines = ["| preset | GPUs per node | NVLink per direction | NICs | NIC speed | HBM | dense bf16 "
             "| NVLS algbw |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, (gpus, nvlink, nics, nic_gbits, hbm, tflops, nvls) in PRESETS.items():
        lines.append(f"| {name} | {gpus} | {nvlink:g} GB/s | {nics} | {nic_gbits:g} Gb/s | {hbm:g} GB | "
                     f"{tflops:g} TFLOP/s | {f'{nvls * nvlink:.0f} GB/s' if nvls else '-'} |")
    return "\n".join(lines)
