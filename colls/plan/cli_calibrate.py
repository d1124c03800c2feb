"""`colls plan calibrate`: the model's predictions beside measured `colls bench --json` times."""

from __future__ import annotations

import argparse


def calibrate_table(args: argparse.Namespace) -> int:
    """Price every bench point with the profiles and print the comparison."""
    from .calibrate import (
        batches_apart,
        compare,
        load_profiles,
        placements_seen,
        reproducibility,
        summary,
        table,
    )

    batches, args.bench = args.bench, [path for batch in args.bench for path in batch]

    window = {}
    for option, field, text, unit in (("--round-trip", "round_trip_ns", args.round_trip, "ns"),
                                       ("--exchange", "exchange_us", args.exchange, "us")):
        if text is not None:
            try:
                low, high = (float(bound) for bound in text.split("-"))
            except ValueError:
                raise SystemExit(f"colls plan calibrate: {option} takes LO-HI in {unit}, "
                                 f"got {text!r}") from None
            window[field] = (low, high)
    profiles = load_profiles(args.profile, args.runs, window or None)
    points = compare(args.bench, profiles, args.cores, args.runs, window or None, args.by_placement)
    if window:
        labels = {"round_trip_ns": ("a round trip of", "ns"), "exchange_us": ("a 256 KiB exchange of", "us")}
        print("# measured with " + " and ".join(f"{labels[field][0]} {low:g}-{high:g} {labels[field][1]}"
                                                 for field, (low, high) in window.items())
              + ": profiles at "
              + (", ".join(f"{ranks} ranks" for ranks in sorted(profiles)) or "no rank count")
              + f", {len(points)} bench points")
    for ranks, profile in sorted(profiles.items()):
        alpha, beta = profile.message_cost(1 << 20)
        print(f"# {ranks} ranks on {args.cores or profile.cores} cores: 8 B message "
              f"{profile.message[0][1] * 1e6:.2f} us, 1 MiB {(alpha + beta * (1 << 20)) * 1e6:.1f} us, "
              f"start {profile.start * 1e6:.2f} us, "
              f"spin {profile.spin * 1e6:.1f} us, wake {profile.wake * 1e6:.1f} us"
              + (f", 8 B send (the sender's) {profile.send_seconds(8) * 1e6:.2f} us"
                 if profile.send_seconds(8) is not None else "")
              + (f", 8 B sendrecv {profile.exchange_seconds(8) * 1e6:.2f} us"
                 if profile.exchange_seconds(8) is not None else "")
              + (f" (one-slot spin {profile.one_slot_spin * 1e6:.1f} us, "
                 f"wake {profile.one_slot_wake * 1e6:.1f} us)"
                 if profile.one_slot_spin is not None and profile.one_slot_wake is not None else "")
              + (f", MPI barrier's hold {profile.barrier_hold * 1e6:.1f} us"
                 if profile.barrier_hold is not None else "")
              + "; calls "
              + ", ".join(f"{name} {seconds * 1e6:.2f} us" for name, seconds in sorted(profile.call.items())))
    print(table(points))
    seen = placements_seen(args.bench, window or None)
    for ranks in sorted({p.ranks for p in points}):
        shared = ranks > (args.cores or profiles[ranks].cores)   # where the placement matters at all
        if shared and any(label != "-" for label in seen.get(ranks, {})):
            print(f"{ranks} ranks: points by where the bench saw the ranks (each one's core; -: "
                  "unrecorded, or a rank moved): "
                  + ", ".join(f"{label} {count}" for label, count in sorted(seen[ranks].items())))
    for ranks in sorted({p.ranks for p in points}):
        mean, worst = summary([p for p in points if p.ranks == ranks])
        print(f"{ranks} ranks: geometric-mean error {mean * 100:.1f}%, largest {worst * 100:.1f}%")
    # what the machine itself reproduces: no model can be shown closer than the runs agree
    for ranks, (mean, worst, count) in sorted(reproducibility(args.bench, args.runs, window or None,
                                                              args.by_placement).items()):
        print(f"{ranks} ranks: the bench against itself (alternate runs, each half's {args.runs}; "
              f"{count} point{'s' * (count != 1)}): {mean * 100:.1f}%, largest {worst * 100:.1f}%")
    if len(batches) > 1:
        for ranks, (mean, worst, count) in sorted(batches_apart(batches, args.runs, window or None,
                                                                args.by_placement).items()):
            print(f"{ranks} ranks: the {len(batches)} batches against each other ({count} "
                  f"point{'s' * (count != 1)} in all of them): a model that predicts a point alike for "
                  f"every batch is at best {mean * 100:.1f}% off, {worst * 100:.1f}% the largest (each "
                  f"point at the middle of its batches' {args.runs}s)")
    return 0
