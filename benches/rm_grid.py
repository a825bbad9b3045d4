#!/usr/bin/env python3
"""The RM-question grid's test (docs/src/rm-question.md): from pipelines/sql/rm_grid.sql's CSV
(run_id, iter, process, balanced_outcome, base_rate, separation, held_out), each variant against
its own seed's parent (`grid-s<seed>` vs `grid-s<seed>-<variant>`), paired per seed: the mean
over seeds of the difference at the last iteration and of the difference of the means over
iterations 1..last, with a bootstrap 95% interval (10,000 resamples of the per-seed differences,
percentile). H1: the parent's last iteration against its iteration 0, the same way.

Usage: python3 benches/rm_grid.py RM_GRID.csv [PARENT_PREFIX]      (standard library only)
PARENT_PREFIX (default `grid-s`): the parents' run ids are PARENT_PREFIX<seed>, e.g.
`abl-rmadapt-s` where the ablation's full-loop runs are the parents (household).
"""
import csv
import random
import re
import sys
from collections import defaultdict

METRICS = ["process", "balanced_outcome", "base_rate", "separation", "held_out"]
RESAMPLES = 10_000


def boot(diffs, rng):
    """Mean of the differences and its bootstrap 95% percentile interval."""
    n = len(diffs)
    means = sorted(sum(rng.choice(diffs) for _ in range(n)) / n for _ in range(RESAMPLES))
    return sum(diffs) / n, means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]


def cell(d, rng):
    if len(d) < 2:
        return "–"
    m, lo, hi = boot(d, rng)
    mark = " *" if lo > 0 or hi < 0 else ""
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]{mark}"


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    runs = defaultdict(dict)  # run -> iter -> metric -> value
    for r in rows:
        runs[r["run_id"]][int(r["iter"])] = {
            k: float(r[k]) for k in METRICS if r.get(k) not in (None, "")}
    prefix = sys.argv[2] if len(sys.argv) > 2 else "grid-s"
    parents = {m.group(1): run for run in runs
               if (m := re.fullmatch(re.escape(prefix) + r"(\d+)", run))}
    # A run still under way (fewer iterations than its parent, or its last one not yet
    # evaluated) is left out, as is a seed whose parent is unfinished.
    def done(run, like):
        return run in runs and max(runs[run]) == max(runs[like]) and \
            "held_out" in runs[run][max(runs[run])]
    full = max((max(runs[p]) for p in parents.values()), default=0)
    parents = {s: p for s, p in parents.items() if max(runs[p]) == full and done(p, p)}
    for run in list(runs):
        m = re.fullmatch(r"grid-s(\d+)-(.+)", run)
        if m and (m.group(1) not in parents or not done(run, parents[m.group(1)])):
            del runs[run]
    variants = sorted({m.group(2) for run in runs if (m := re.fullmatch(r"grid-s(\d+)-(.+)", run))})
    rng = random.Random(0)

    def last(run):
        return max(runs[run])

    def at(run, it, k):
        return runs[run].get(it, {}).get(k)

    def mean_from1(run, k):
        xs = [runs[run][i][k] for i in sorted(runs[run]) if i >= 1 and k in runs[run][i]]
        return sum(xs) / len(xs) if xs else None

    seeds = sorted(parents, key=int)
    print(f"{len(seeds)} seeds ({', '.join(seeds)}); * = the 95% interval excludes 0\n")
    print("## H1: the parent (full loop) at its last iteration minus its iteration 0\n")
    print("| metric | parent iter 0 (mean) | parent last (mean) | last − iter 0 [95% CI] |")
    print("|---|---:|---:|---:|")
    for k in METRICS:
        d, first, end = [], [], []
        for s in seeds:
            p = parents[s]
            a, b = at(p, 0, k), at(p, last(p), k)
            if a is not None and b is not None:
                d.append(b - a)
                first.append(a)
                end.append(b)
        if d:
            print(f"| {k} | {sum(first) / len(first):.3f} | {sum(end) / len(end):.3f} | {cell(d, rng)} |")
    for title, pick in [("at the last iteration", lambda run, k: at(run, last(run), k)),
                        ("mean over iterations 1..last", mean_from1)]:
        print(f"\n## Each variant minus its seed's parent, {title}\n")
        print("| variant | seeds | " + " | ".join(METRICS) + " |")
        print("|---|---:|" + "---:|" * len(METRICS))
        for v in variants:
            cells, n = [], 0
            for k in METRICS:
                d = []
                for s in seeds:
                    run = f"grid-s{s}-{v}"
                    if run not in runs:
                        continue
                    a, b = pick(parents[s], k), pick(run, k)
                    if a is not None and b is not None:
                        d.append(b - a)
                n = max(n, len(d))
                cells.append(cell(d, rng))
            print(f"| {v} | {n} | " + " | ".join(cells) + " |")
    print("\n## Values at the last iteration (mean over seeds)\n")
    print("| run | " + " | ".join(METRICS) + " |")
    print("|---|" + "---:|" * len(METRICS))
    for name in ["parent"] + variants:
        vals = []
        for k in METRICS:
            xs = []
            for s in seeds:
                run = parents[s] if name == "parent" else f"grid-s{s}-{name}"
                if run in runs and (x := at(run, last(run), k)) is not None:
                    xs.append(x)
            vals.append(f"{sum(xs) / len(xs):.3f}" if xs else "–")
        print(f"| {name} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    main()
