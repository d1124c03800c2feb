"""The speed targets of the benchmark issue, judged from `colls bench --json` files.

    python -m colls.bench.targets ar2_shm.json ar2_mpi.json others2.json ar4_shm.json

prints the "Targets" table of bench/RESULTS.md: each target, the measured ratios (medians, from the
same run) and met / not met. A target whose run is missing from the files is reported as such.
"""

from __future__ import annotations

import json
import sys

from .spec import format_bytes

MiB = 1 << 20


def _points(files: list[dict], collective: str, ranks: int, transport: str) -> list[dict]:
    """The records of one (collective, ranks, colls transport) run, by size."""
    found = [r for data in files for r in data["records"] if r.get("mode") != "memcheck"
             and r["collective"] == collective and r["ranks"] == ranks and r["transport"] == transport]
    return sorted(found, key=lambda r: r["bytes"])


def _ratio(record: dict, baseline: str) -> float | None:
    return record["baselines"].get(baseline, {}).get("ratio")


def _worst(records: list[dict], baseline: str, low: int = 0) -> tuple[float, int] | None:
    """(smallest colls/baseline ratio at sizes >= low, its size)."""
    pairs = [(_ratio(r, baseline), r["bytes"]) for r in records if r["bytes"] >= low]
    pairs = [(ratio, size) for ratio, size in pairs if ratio is not None]
    return min(pairs) if pairs else None


def _mode(record: dict | None) -> str:
    """The machine's mode while `record` was measured, as `colls bench` recorded it (ranks 0 and 1's
    cache-line round trip and 256 KiB exchange before and after, `colls.bench.machine`), or nothing
    where it did not."""
    parts = []
    for field, label, unit in (("round_trip_ns", "round trip", "ns"),
                               ("exchange_us", "256 KiB exchange", "us")):
        values = [value for value in (record or {}).get(field) or [] if value is not None]
        if values:
            parts.append(f"{label} {min(values):.0f}-{max(values):.0f} {unit}")
    return f" ({'; '.join(parts)})" if parts else ""


def _row(what: str, target: str, measured: str, met: bool | None) -> str:
    verdict = "no data" if met is None else ("met" if met else "not met")
    return f"| {what} | {target} | {measured} | {verdict} |"


def _at_least(records: list[dict], baseline: str, low: int, bound: float) -> tuple[str, bool | None]:
    worst = _worst(records, baseline, low)
    if worst is None:
        return "-", None
    failing = [format_bytes(r["bytes"]) for r in records
               if r["bytes"] >= low and (_ratio(r, baseline) or 0) < bound]
    at = next(r for r in records if r["bytes"] == worst[1])
    text = f"worst {worst[0]:.2f}x at {format_bytes(worst[1])}{_mode(at)}"
    if failing:
        text += f"; below {bound:.3g}x at {len(failing)} of {sum(r['bytes'] >= low for r in records)} sizes"
    return text, not failing


def _worst_step(records: list[dict], baseline: str | None = None) -> tuple[float, int]:
    """(largest time ratio between neighbouring sizes over their size ratio, the larger size)."""
    def seconds(record: dict) -> float | None:
        return record["time_median_s"] if baseline is None else \
            record["baselines"].get(baseline, {}).get("time_median_s")
    steps = [((seconds(b) / seconds(a)) / (b["bytes"] / a["bytes"]), b["bytes"])
             for a, b in zip(records, records[1:], strict=False) if seconds(a) and seconds(b) and a["bytes"]]
    return max(steps) if steps else (1.0, 0)


def _growth(records: list[dict]) -> tuple[str, bool | None]:
    """Past 1 MiB: time per byte within 2x (linear) and no step between neighbouring sizes costing
    more than 2x its share; the worst step at any size is shown too (small sizes are noisier)."""
    big = [r for r in records if r["bytes"] >= MiB]
    if len(big) < 2:
        return "-", None
    per_byte = [r["time_median_s"] / r["bytes"] for r in big]
    spread = max(per_byte) / min(per_byte)
    step, at = _worst_step(big)
    mpi_step, mpi_at = _worst_step(big, "mpi")
    anywhere, anywhere_at = _worst_step(records)
    text = (f"past 1 MiB: time/byte varies {spread:.2f}x, worst step {step:.2f}x its size step (to "
            f"{format_bytes(at)}; MPI's {mpi_step:.2f}x to {format_bytes(mpi_at)}); at any size: "
            f"{anywhere:.2f}x (to {format_bytes(anywhere_at)})")
    return text, spread <= 2.0 and step <= 2.0


def _latency(small: dict | None) -> list[str]:
    """The two 8 B rows: colls' time against MPICH's (at most 2x) and Gloo's (at least 20x less)."""
    what = "all_reduce, 2 ranks, 8 B latency"
    ours = small["time_median_s"] if small else None
    rows = []
    for name, target in (("mpi", "<= 2x MPICH"), ("gloo", ">= 20x faster than Gloo")):
        theirs = (small or {}).get("baselines", {}).get(name, {}).get("time_median_s")
        if ours is None or theirs is None:
            rows.append(_row(what, target, "-", None))
        elif name == "mpi":
            rows.append(_row(what, target, f"{ours * 1e6:.1f} us vs {theirs * 1e6:.1f} us: "
                                           f"{ours / theirs:.1f}x slower{_mode(small)}", ours <= 2 * theirs))
        else:
            rows.append(_row(what, target, f"{ours * 1e6:.1f} us vs {theirs * 1e6:.0f} us: "
                                           f"{theirs / ours:.1f}x faster", theirs >= 20 * ours))
    return rows


def table(files: list[dict]) -> str:
    """The Markdown table of every target row."""
    ar2 = _points(files, "all_reduce", 2, "shm")
    rows = ["| what | target | measured (colls / baseline, busbw; medians) | verdict |",
            "| --- | --- | --- | --- |"]
    text, met = _at_least(ar2, "mpi", 64 << 10, 1.0)
    rows.append(_row("all_reduce, 2 ranks, busbw vs MPICH", ">= 1.0x at every size >= 64 KiB", text, met))
    text, met = _at_least(ar2, "mpi", 16 * MiB, 1.25)
    rows.append(_row("all_reduce, 2 ranks, busbw vs MPICH", ">= 1.25x at >= 16 MiB", text, met))
    rows += _latency(next((r for r in ar2 if r["bytes"] == 8), None))
    for collective in ("broadcast", "all_gather", "reduce_scatter", "all_to_all"):
        text, met = _at_least(_points(files, collective, 2, "shm"), "mpi", MiB, 1.0)
        rows.append(_row(f"{collective}, 2 ranks", ">= 1.0x MPICH busbw at >= 1 MiB", text, met))
    ar4 = _points(files, "all_reduce", 4, "shm")
    text, met = _at_least(ar4, "mpi", MiB, 0.8)
    rows.append(_row("all_reduce, 4 ranks on 2 cores", ">= 0.8x MPICH at >= 1 MiB", text, met))
    text, met = _at_least(ar4, "mpi", 0, 1 / 3)
    rows.append(_row("all_reduce, 4 ranks on 2 cores", "never worse than 3x (>= 0.33x) at any size",
                     text, met))
    text, met = _at_least(_points(files, "all_reduce", 2, "mpi"), "mpi", MiB, 0.7)
    rows.append(_row("all_reduce on the mpi transport, 2 ranks", ">= 0.7x MPI's Allreduce at >= 1 MiB",
                     text, met))
    shm_runs = [(c, n) for c in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")
                for n in (2, 4) if _points(files, c, n, "shm")]
    worst = [(w, c, n) for c, n in shm_runs if (w := _worst(_points(files, c, n, "shm"), "gloo"))]
    if worst:
        (ratio, size), collective, ranks = min(worst)
        failing = sum(1 for c, n in shm_runs for r in _points(files, c, n, "shm")
                      if (_ratio(r, "gloo") or 99) < 3)
        total = sum(len(_points(files, c, n, "shm")) for c, n in shm_runs)
        rows.append(_row("any collective vs Gloo", ">= 3x busbw at every size",
                         f"worst {ratio:.2f}x ({collective}, {ranks} ranks, {format_bytes(size)}); "
                         f"below 3x at {failing} of {total} points", failing == 0))
    else:
        rows.append(_row("any collective vs Gloo", ">= 3x busbw at every size", "-", None))
    text, met = _growth(ar2)
    rows.append(_row("cost growth (all_reduce, 2 ranks, shm)", "linear past 1 MiB; no cliff > 2x", text, met))
    return "\n".join(rows)


def main(paths: list[str]) -> int:
    """Print the Targets table for the given JSON files."""
    files = []
    for path in paths:
        with open(path) as handle:
            files.append(json.load(handle))
    print(table(files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
