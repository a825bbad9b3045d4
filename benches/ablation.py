#!/usr/bin/env python3
"""The ablation's tables (benches/ablation.sh) from pipelines/sql/ablation.sql's CSV (one row per
run, at the last iteration every run reached): per setting the mean over seeds with a bootstrap
95% interval of that mean (10,000 resamples of the seeds, percentile), the sample std and the
range; then the settings paired per seed (the same seed shares the warm start and the task
pool), each difference's mean with its bootstrap 95% interval (`*`: the interval excludes 0).

With `--variants "NAME:k=v,k=v ..."` (benches/ablation.sh's VARIANTS) each variant is named by
its settings ("g32: env.initial_tasks=32"); without it, "g32 (variant)".

Usage: python3 benches/ablation.py ABLATION.csv [--variants "..."]      (standard library only)
"""
import csv
import random
import statistics
import sys
from collections import defaultdict

from rm_grid import boot, cell

SETTINGS = [("policy", "policy only"), ("rm", "+ reward model"),
            ("rmadapt", "+ reward model + adaptation")]
PAIRS = [("rm", "policy"), ("rmadapt", "rm"), ("rmadapt", "policy")]


def with_variants(runs, described=None):
    """The three settings, then any other setting of the CSV (benches/ablation.sh's VARIANTS:
    branches of the full loop), named as in its runs and by their settings where `described`
    (name -> "k=v,k=v") gives them; the pairs, then each variant against the full loop and
    + reward model."""
    described = described or {}
    known = {k for k, _ in SETTINGS}
    extra = sorted(s for s in runs if s not in known and s != "warm")
    name = lambda v: f"{v}: {described[v].replace(',', ', ')}" if v in described else f"{v} (variant)"
    return (SETTINGS + [(v, name(v)) for v in extra],
            PAIRS + [p for v in extra for p in ((v, "rmadapt"), (v, "rm"))])


def variants_option(args):
    """Remove `--variants VALUE` from `args` (a list) and return it as name -> "k=v,k=v"
    (benches/ablation.sh's VARIANTS syntax, "NAME:k=v,k=v" items separated by spaces)."""
    if "--variants" not in args:
        return {}
    i = args.index("--variants")
    if i + 1 >= len(args):
        sys.exit("error: --variants needs a value: \"NAME:k=v,k=v ...\"")
    value = args[i + 1]
    del args[i:i + 2]
    out = {}
    for item in value.split():
        name, sep, sets = item.partition(":")
        if not sep or not name or not sets:
            sys.exit(f"error: --variants: '{item}' is not NAME:k=v[,k=v...]")
        out[name] = sets
    return out


PAIRED = [("held_out", "held-out (last)"), ("held_out_curve", "held-out (all iter.)"),
          ("ood", "OOD (last)"), ("rm_process", "RM process (last)"),
          ("rm_balanced_outcome", "RM balanced outcome")]


def num(x):
    return float(x) if x not in (None, "") else None


def mean_ci(xs, rng):
    if len(xs) < 2:
        return f"{xs[0]:.3f}" if xs else "–"
    m, lo, hi = boot(xs, rng)
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def main():
    args = sys.argv[1:]
    described = variants_option(args)
    rows = list(csv.DictReader(open(args[0])))
    runs = defaultdict(dict)  # setting -> seed -> row
    for r in rows:
        runs[r["setting"]][int(r["seed"])] = r
    settings, pairs = with_variants(runs, described)
    rng = random.Random(0)
    iters = sorted({r["iterations"] for r in rows})
    seeds = sorted({int(r["seed"]) for r in rows})
    print(f"{len(seeds)} seeds ({', '.join(map(str, seeds))}), {'/'.join(iters)} iterations; "
          "mean [bootstrap 95% interval of the mean] ± sample std\n")
    print("| setting | seeds | held-out (last) | std | range | held-out (all iter.) | OOD (last) "
          "| RM process first → last | RM balanced outcome | accepted (per iter., R²) "
          "| harder share | wall |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, name in settings:
        rs = [runs[key][s] for s in sorted(runs.get(key, {}))]
        if not rs:
            continue

        def col(k):
            return [x for r in rs if (x := num(r[k])) is not None]

        held = col("held_out")
        std = f"{statistics.stdev(held):.3f}" if len(held) > 1 else "–"
        rng_ = f"{min(held):.3f}–{max(held):.3f}" if held else "–"
        first, last = col("rm_process_first"), col("rm_process")
        rm = f"{statistics.mean(first):.3f} → {mean_ci(last, rng)}" if last else "–"
        bal = mean_ci(col("rm_balanced_outcome"), rng) if col("rm_balanced_outcome") else "–"
        acc = col("accepted")
        accepted = "0"
        if acc and statistics.mean(acc) > 0:
            accepted = (f"{statistics.mean(acc):.1f} ({statistics.mean(col('slope')):.1f}, "
                        f"{statistics.mean(col('r2')):.2f})")
        harder = sum(col("harder"))
        share = f"{harder / sum(acc):.2f}" if acc and sum(acc) > 0 else "–"
        wall = f"{statistics.mean(col('seconds')):.0f} s"
        print(f"| {name} | {len(rs)} | {mean_ci(held, rng)} | {std} | {rng_} | "
              f"{mean_ci(col('held_out_curve'), rng)} | {mean_ci(col('ood'), rng)} | {rm} | {bal} "
              f"| {accepted} | {share} | {wall} |")
    print("\nPaired per seed: each difference's mean [bootstrap 95% interval]; * = excludes 0\n")
    print("| difference | seeds | " + " | ".join(n for _, n in PAIRED) + " |")
    print("|---|---:|" + "---:|" * len(PAIRED))
    for a, b in pairs:
        common = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
        if not common:
            continue
        cells = []
        for k, _ in PAIRED:
            d = [num(runs[a][s][k]) - num(runs[b][s][k]) for s in common
                 if num(runs[a][s][k]) is not None and num(runs[b][s][k]) is not None]
            cells.append(cell(d, rng) if d else "–")
        print(f"| {a} − {b} | {len(common)} | " + " | ".join(cells) + " |")
    print("\nPer seed (held-out / OOD at the last iteration):\n")
    for key, name in settings:
        if key in runs:
            per = ", ".join(f"s{s} {num(r['held_out']):.3f} / {num(r['ood']):.3f}"
                            for s, r in sorted(runs[key].items()))
            print(f"- {name}: {per}")


if __name__ == "__main__":
    main()
