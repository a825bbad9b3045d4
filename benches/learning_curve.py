#!/usr/bin/env python3
"""The learning curve of benches/ablation.sh's runs, from pipelines/sql/learning_curve.sql's CSV:
per setting and iteration the mean over seeds of held-out and OOD success (sampled, and greedy
where the runs evaluated both ways: eval.mode = "both") with a bootstrap 95% interval of the mean
(10,000 resamples of the seeds, percentile); the warm start alone (`pre-s<seed>`) as the row
before iteration 0; then the RL gain per setting — held-out at the last iteration every run of
the setting reached minus the same seed's warm start — with its paired interval (`*`: the
interval excludes 0).

Usage: python3 benches/learning_curve.py CURVE.csv      (standard library only)
"""
import csv
import random
import sys
from collections import defaultdict

from rm_grid import boot, cell

SETTINGS = [("policy", "policy only"), ("rm", "+ reward model"),
            ("rmadapt", "+ reward model + adaptation")]
METRICS = [("held_out", "held-out"), ("held_out_greedy", "held-out greedy"),
           ("ood", "OOD"), ("ood_greedy", "OOD greedy"), ("rm_process", "RM process")]


def num(x):
    return float(x) if x not in (None, "") else None


def mean_ci(xs, rng):
    if not xs:
        return "–"
    if len(xs) < 2:
        return f"{xs[0]:.3f}"
    m, lo, hi = boot(xs, rng)
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    # setting -> seed -> iter -> row
    runs = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        runs[r["setting"]][int(r["seed"])][int(r["iter"])] = r
    warm = {s: its[0] for s, its in runs.get("warm", {}).items() if 0 in its}
    rng = random.Random(0)
    shown = [(k, n) for k, n in METRICS if any(num(r[k]) is not None for r in rows)]
    for key, name in SETTINGS:
        seeds = runs.get(key, {})
        if not seeds:
            continue
        last = min(max(its) for its in seeds.values())
        print(f"\n{name}: {len(seeds)} seeds ({', '.join(map(str, sorted(seeds)))}), "
              f"iterations 0–{last}; mean [bootstrap 95% interval]\n")
        print("| iteration | " + " | ".join(n for _, n in shown) + " |")
        print("|---|" + "---:|" * len(shown))
        if warm:
            cells = [mean_ci([v for s in sorted(seeds) if s in warm
                              and (v := num(warm[s][k])) is not None], rng) for k, _ in shown]
            print("| warm start | " + " | ".join(cells) + " |")
        for i in range(last + 1):
            cells = [mean_ci([v for s in sorted(seeds)
                              if (v := num(seeds[s][i][k])) is not None], rng) for k, _ in shown]
            print(f"| {i} | " + " | ".join(cells) + " |")
    print("\nRL gain: the last iteration every run of the setting reached minus the same seed's "
          "warm start; mean [paired bootstrap 95% interval], * = excludes 0\n")
    print("| setting | seeds | " + " | ".join(n for _, n in shown) + " |")
    print("|---|---:|" + "---:|" * len(shown))
    for key, name in SETTINGS:
        seeds = runs.get(key, {})
        common = sorted(s for s in seeds if s in warm)
        if not common:
            continue
        last = min(max(seeds[s]) for s in common)
        cells = []
        for k, _ in shown:
            d = [num(seeds[s][last][k]) - num(warm[s][k]) for s in common
                 if num(seeds[s][last][k]) is not None and num(warm[s][k]) is not None]
            cells.append(cell(d, rng) if len(d) > 1 else (f"{d[0]:+.3f}" if d else "–"))
        print(f"| {name} | {len(common)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
