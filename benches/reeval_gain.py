#!/usr/bin/env python3
"""The RL gain on the re-evaluations (benches/ablation.sh with REEVAL=N), from
pipelines/sql/reeval_gain.sql's CSV (one row per setting and seed: the held-out success after
the warm start and at the last iteration, sampled and greedy): per setting the mean gain over
its seeds with a bootstrap 95% interval (10,000 resamples of the seeds, percentile; `*`: the
interval excludes 0); then each other setting (a variant, or the ablation's) paired with the
full loop on the seeds both have, the mean of the per-seed differences the same way. Every
interval starts from `random.Random(0)`, so each figure is the same whatever else is printed.

Usage: python3 benches/reeval_gain.py REEVAL_GAIN.csv [REFERENCE]      (standard library only)
REFERENCE (default `rmadapt`, the full loop): the setting the others are paired with.
"""
import csv
import random
import sys
from collections import defaultdict

from rm_grid import cell


def gains(rows):
    """setting -> seed -> (sampled gain, greedy gain)."""
    out = defaultdict(dict)
    for r in rows:
        greedy = None
        if r.get("warm_greedy") not in (None, "") and r.get("last_greedy") not in (None, ""):
            greedy = float(r["last_greedy"]) - float(r["warm_greedy"])
        out[r["setting"]][int(r["seed"])] = (float(r["gain"]), greedy)
    return out


def interval(xs):
    xs = [x for x in xs if x is not None]
    if len(xs) == 1:
        return f"{xs[0]:+.3f}"
    return cell(xs, random.Random(0)) if xs else "–"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    path = sys.argv[1]
    reference = sys.argv[2] if len(sys.argv) > 2 else "rmadapt"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = {"setting", "seed", "gain"} - set(rows[0] if rows else {})
    if not rows or missing:
        sys.exit(f"error: {path}: no rows of pipelines/sql/reeval_gain.sql"
                 + (f" (missing columns: {', '.join(sorted(missing))})" if rows else ""))
    g = gains(rows)
    order = sorted(g, key=lambda s: (s != reference, s))
    print("The RL gain (last iteration - warm start, held-out success), mean over seeds "
          "[bootstrap 95% interval]; * the interval excludes 0\n")
    print("| setting | seeds | sampled | greedy |")
    print("|---|---|---|---|")
    for s in order:
        seeds = sorted(g[s])
        print(f"| {s} | {' '.join(map(str, seeds))} | {interval([g[s][k][0] for k in seeds])} "
              f"| {interval([g[s][k][1] for k in seeds])} |")
    others = [s for s in order if s != reference]
    if reference not in g or not others:
        return
    print(f"\nPaired with {reference} on the same seeds: the setting's gain, {reference}'s on "
          "those seeds, and the mean of the per-seed differences\n")
    print(f"| setting - {reference} | seeds | setting | {reference} | difference, sampled "
          "| difference, greedy |")
    print("|---|---|---|---|---|---|")
    for s in others:
        seeds = sorted(set(g[s]) & set(g[reference]))
        if not seeds:
            continue
        diff = [g[s][k][0] - g[reference][k][0] for k in seeds]
        greedy = [g[s][k][1] - g[reference][k][1] for k in seeds
                  if g[s][k][1] is not None and g[reference][k][1] is not None]
        print(f"| {s} | {' '.join(map(str, seeds))} | {interval([g[s][k][0] for k in seeds])} "
              f"| {interval([g[reference][k][0] for k in seeds])} | {interval(diff)} "
              f"| {interval(greedy)} |")


if __name__ == "__main__":
    main()
