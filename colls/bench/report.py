"""What `colls bench` shows: the terminal table (nccl-tests' columns plus baselines), JSON and a plot."""

from __future__ import annotations

import json
import math
import os
import time

from .spec import Spec, format_bytes

_BASELINE_KEYS = {"MPI": "mpi", "Gloo": "gloo", "auto": "auto"}


def _microseconds(seconds: float) -> str:
    return f"{seconds * 1e6:10.1f}" if seconds < 1e3 else f"{seconds * 1e6:10.3g}"


def _bandwidth(gbps: float) -> str:
    return f"{gbps:6.2f}"


def _ratio(value: float | None) -> str:
    if value is None:
        return f"{'-':>6}"
    return f"{value:5.2f}x" if value < 100 else f"{value:5.0f}x"


class Table:
    """Rows as nccl-tests prints them, one block per collective, printed by rank 0 as they come."""

    def __init__(self, spec: Spec, ranks: int, baselines: list[str], absent: dict[str, str],
                 placement: tuple[int, ...] | None = None) -> None:
        self.spec = spec
        self.placement = placement   # `--pin`: each rank's CPU, as an index into the CPUs allowed
        self.ranks = ranks
        self.baselines = baselines
        self.absent = absent
        self.busbw: list[float] = []
        self.wrong = 0
        self.explained: set[str] = set()   # reasons for an n/a cell already printed

    def preamble(self) -> None:
        """What was measured and how to read the columns."""
        spec = self.spec
        algorithm = spec.algorithm or "auto"
        load = "  load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())   # others' work skews timings
        print(f"# colls bench  {time.strftime('%Y-%m-%d %H:%M')}  ranks {self.ranks}  transport "
              f"{spec.transport}  dtype {spec.dtype}  op {spec.op}  algorithm {algorithm}{load}")
        print("# time: median over iterations of the slowest rank's call (min: the fastest iteration); "
              "us = microseconds")
        print("# algbw = bytes / time, busbw = algbw x nccl-tests' factor, GB/s = 1e9 bytes/s; "
              "#wrong: elements that differ from numpy")
        if self.baselines:
            print("# beside each baseline: its median time, its busbw, and colls' busbw / its busbw "
                  "(> 1x: colls is faster)")
        if "auto" in self.baselines:
            print(f"# auto: colls' own choice at each size (algorithm=None), beside the forced "
                  f"{spec.algorithm}")
        for label, reason in self.absent.items():
            print(f"# {label}: not measured: {reason}")
        if self.placement:
            print("# pinned: rank r on CPU index " + ", ".join(f"{rank}->{cpu}" for rank, cpu in
                                                          enumerate(self.placement)))
        if spec.registered:
            print("# --registered: colls' buffers in registered memory (colls.alloc); the baselines' "
                  "buffers are their own, mapped as without it")
        print("# copy GB/s: np.copyto of the same bytes on every rank at once (the memory roofline)")
        print(flush=True)

    def start(self, collective: str) -> None:
        """The header of one collective's block."""
        if self.busbw:
            print()   # a blank line between collectives
        head = (f"{'size':>9}  {'algorithm':<18} {'iters':>5} {'time us':>10} {'min us':>10} "
                f"{'algbw':>6} {'busbw':>6} {'#wrong':>6}")
        units = f"{'':>9}  {'':<18} {'':>5} {'':>10} {'':>10} {'GB/s':>6} {'GB/s':>6} {'':>6}"
        for label in self.baselines:
            head += f" | {label + ' us':>10} {'busbw':>6} {'x ' + label:>6}"
            units += f" | {'':>10} {'GB/s':>6} {'':>6}"
        head += f" | {'copy':>6}"
        units += f" | {'GB/s':>6}"
        print(f"# {collective}")
        print(head)
        print(units, flush=True)

    def row(self, record: dict) -> None:
        """One size."""
        for label in self.baselines:
            reason = record["baselines"].get(_BASELINE_KEYS[label], {}).get("unavailable")
            if reason and reason not in self.explained:
                self.explained.add(reason)
                print(f"# {label} n/a: {reason}")
        line = (f"{format_bytes(record['bytes']):>9}  {record['algorithm']:<18} {record['iterations']:>5} "
                f"{_microseconds(record['time_median_s'])} {_microseconds(record['time_min_s'])} "
                f"{_bandwidth(record['algbw_GBps'])} {_bandwidth(record['busbw_GBps'])} {record['wrong']:>6}")
        for label in self.baselines:
            figures = record["baselines"].get(_BASELINE_KEYS[label], {})
            if "time_median_s" not in figures:
                line += f" | {'n/a':>10} {'-':>6} {'-':>6}"
                continue
            flag = "!" if figures.get("wrong") else ""   # a wrong baseline means a broken bench
            line += (f" | {_microseconds(figures['time_median_s'])} {_bandwidth(figures['busbw_GBps'])}"
                     f" {_ratio(figures['ratio'])}{flag}")
        line += f" | {_bandwidth(record['memcpy']['algbw_GBps'])}"
        print(line, flush=True)
        self.busbw.append(record["busbw_GBps"])
        self.wrong += record["wrong"]

    def summary(self) -> None:
        """nccl-tests' closing lines: wrong results and the average bus bandwidth."""
        verdict = "OK" if self.wrong == 0 else "FAILED"
        average = sum(self.busbw) / len(self.busbw) if self.busbw else 0.0
        print(f"\n# wrong elements: {self.wrong} {verdict}")
        print(f"# average busbw (colls): {average:.3f} GB/s", flush=True)


def write_json(path: str, meta: dict, records: list[dict]) -> None:
    """Every record, with how the run was made."""
    with open(path, "w") as handle:
        json.dump({**meta, "records": records}, handle, indent=1)
        handle.write("\n")


def _time_cell(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def markdown(records: list[dict], heading: str) -> str:
    """The records as Markdown tables, one per collective, for bench/RESULTS.md."""
    names = [name for name in ("mpi", "gloo")
             if any("time_median_s" in r.get("baselines", {}).get(name, {}) for r in records)]
    labels = {"mpi": "MPI", "gloo": "Gloo"}
    out = []
    for collective in dict.fromkeys(r["collective"] for r in records if r.get("mode") != "memcheck"):
        out.append(f"{heading}: **{collective}**\n")
        head = "| size | algorithm | time | busbw GB/s | #wrong |"
        rule = "| ---: | --- | ---: | ---: | ---: |"
        for name in names:
            head += f" {labels[name]} time | {labels[name]} busbw | colls / {labels[name]} |"
            rule += " ---: | ---: | ---: |"
        out += [head + " memcpy GB/s |", rule + " ---: |"]
        for r in (r for r in records if r.get("collective") == collective and r.get("mode") != "memcheck"):
            line = (f"| {format_bytes(r['bytes'])} | {r['algorithm']} | {_time_cell(r['time_median_s'])} | "
                    f"{r['busbw_GBps']:.3f} | {r['wrong']} |")
            for name in names:
                theirs = r["baselines"].get(name, {})
                if "time_median_s" in theirs:
                    line += (f" {_time_cell(theirs['time_median_s'])} | {theirs['busbw_GBps']:.3f} | "
                             f"{theirs['ratio']:.2f}x |")
                else:
                    line += " n/a | n/a | n/a |"
            out.append(line + f" {r['memcpy']['algbw_GBps']:.2f} |")
        out.append("")
    for r in (r for r in records if r.get("mode") == "memcheck"):
        out += [f"{heading}: **memcheck**, {r['calls']} x {r['collective']} of {format_bytes(r['bytes'])} "
                f"({r['algorithm']}), #wrong {r['wrong']}\n",
                "| rank | RSS at start | RSS at end | growth |", "| ---: | ---: | ---: | ---: |"]
        for rank, (start, end) in enumerate(zip(r["rss_start_bytes"], r["rss_end_bytes"], strict=True)):
            out.append(f"| {rank} | {start / 2**20:.1f} MiB | {end / 2**20:.1f} MiB | "
                       f"{(end - start) / 1024:.1f} KiB |")
        out.append("")
    return "\n".join(out)


def _series(records: list[dict]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """{(collective, implementation label): [(bytes, busbw)]} with baselines and memcpy."""
    lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for record in records:
        if record.get("mode") == "memcheck":
            continue
        collective, nbytes = record["collective"], record["bytes"]
        lines.setdefault((collective, f"colls {record['transport']}"), []).append(
            (nbytes, record["busbw_GBps"]))
        for name, figures in record["baselines"].items():
            if "busbw_GBps" in figures:
                label = {"mpi": "MPI native", "gloo": "torch Gloo"}.get(name, name)
                lines.setdefault((collective, label), []).append((nbytes, figures["busbw_GBps"]))
        lines.setdefault((collective, "memcpy (roofline)"), []).append(
            (nbytes, record["memcpy"]["algbw_GBps"]))
    return lines


def plot(path: str, records: list[dict], title: str) -> str | None:
    """busbw against size, log-log, one line per implementation, a panel per collective.

    Returns None when written, else why not (matplotlib missing, nothing to draw).
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return "matplotlib is not installed (pip install 'colls[bench]'); no plot written"
    series = _series(records)
    collectives = list(dict.fromkeys(collective for collective, _ in series))
    if not collectives:
        return "no measurements to plot"
    columns = min(2, len(collectives))
    rows = math.ceil(len(collectives) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 4.4 * rows), squeeze=False)
    styles = {"memcpy (roofline)": dict(color="0.5", linestyle="--"), "MPI native": dict(marker="s"),
              "torch Gloo": dict(marker="^")}
    for index, collective in enumerate(collectives):
        ax = axes[index // columns][index % columns]
        for (name, label), points in series.items():
            if name != collective:
                continue
            points = [(b, bw) for b, bw in points if b > 0 and bw > 0]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, label=label, markersize=4, **styles.get(label, dict(marker="o")))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(int(value))
                                                   .replace(" ", "")))
        ax.set_title(collective)
        ax.set_xlabel("buffer size per rank")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="major", alpha=0.4)
        ax.legend(fontsize=8)
    for index in range(len(collectives), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None
