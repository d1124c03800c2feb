"""How long `colls plan` takes to answer: NCCL's model, the layout search, and (--sim) the simulator.

Run: python bench/plan_speed.py [--sim]
Prints CPU seconds of each: the NCCL model's all_reduce on 1024 and 8192 GPUs, `plan search`'s
1024-GPU question (issue 43), and with --sim the sim transport's 1024-rank 1 GiB ring all_reduce and
8192-rank hierarchical one (the issue's targets: 20 s and 60 s), each with the ranks it simulated
(one per orbit where ranks are symmetric, `transports/sim/symmetry.py`); COLLS_SIM_THREADS=1 runs
them on threads rather than greenlets.
"""

from __future__ import annotations

import argparse
import time

from colls.plan.nccl_model import _CACHE, every, whole_cluster
from colls.plan.presets import preset
from colls.plan.search import search
from colls.plan.simulate import simulate, simulate_hierarchical
from colls.plan.training import Training


def cpu(label: str, work) -> None:
    """Run `work()` and print its CPU seconds beside `label`."""
    start = time.process_time()
    result = work()
    print(f"{label:<58}{time.process_time() - start:8.2f} s CPU   {result}")


def main() -> None:
    """Time each answer once."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="also the simulator (minutes)")
    args = parser.parse_args()
    for nodes in (128, 1024):
        cluster = preset("dgx-h100", nodes=nodes, nodes_per_leaf=16)
        _CACHE.clear()
        cpu(f"NCCL model, all_reduce 1 GiB, {cluster.size} GPUs, every algorithm",
            lambda c=cluster: ", ".join(f"{e.algorithm} {e.busbw:.0f} GB/s"
                                        for e in every("all_reduce", 1 << 30, c, whole_cluster(c))))
    _CACHE.clear()
    question = preset("dgx-h100", nodes=128, oversubscription=2)
    model = Training(params=100e9, layers=80, hidden=10240, seq=2048)
    def answer() -> str:
        result = search(model, question, 1024)
        return f"{result.tried} tried, best {result.ranked[0].seconds:.3f} s a step"

    cpu("plan search: 100B, 1024 GPUs, 2:1 leaf-spine, batch 1024", answer)
    if args.sim:
        ring = preset("dgx-h100", nodes=128)
        cpu("sim: ring all_reduce 1 GiB, 1024 ranks",
            lambda: simulated(simulate("all_reduce", "ring", 1 << 30, ring.network(), ring.size, ring.gamma)))
        big = preset("dgx-h100", nodes=1024, nodes_per_leaf=16)
        cpu("sim: hierarchical (rabenseifner across) 1 GiB, 8192 ranks",
            lambda: simulated(simulate_hierarchical(1 << 30, big.network(), big.size, 8, "rabenseifner",
                                                    big.gamma)))


def simulated(result) -> str:
    """A simulation's answer, its messages and the ranks it ran."""
    return (f"{result.seconds!r} s, {result.messages} messages, {result.ranks_simulated} of "
            f"{result.size} ranks run")


if __name__ == "__main__":
    main()
