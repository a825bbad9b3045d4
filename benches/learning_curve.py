#!/usr/bin/env python3
"""The learning curve of benches/ablation.sh's runs, from pipelines/sql/learning_curve.sql's CSV:
per setting and iteration the mean over seeds of held-out and OOD success (sampled, and greedy
where the runs evaluated both ways: eval.mode = "both") with a bootstrap 95% interval of the mean
(10,000 resamples of the seeds, percentile); the warm start alone (`pre-s<seed>`) as the row
before iteration 0; then the RL gain per setting — held-out at the last iteration every run of
the setting reached minus the same seed's warm start — with its paired interval (`*`: the
interval excludes 0); then the settings paired per seed (the same seed shares the warm start,
the task pool and iteration 0): each difference at the last iteration both settings reached, for
every metric, with its paired interval.

With `--svg OUT.svg` it also draws the curve: held-out success per iteration (sampled, and
greedy in a second panel where there is one), a line per setting through the means over seeds
and a band over their intervals, the warm start first — the figures of the tables, not a second
resampling.

With `--variants "NAME:k=v,k=v ..."` (benches/ablation.sh's VARIANTS) the tables and the legend
name each variant by its settings.

Usage: python3 benches/learning_curve.py CURVE.csv [--svg OUT.svg] [--variants "..."]
(standard library only)
"""
import csv
import random
from html import escape
import sys
from collections import defaultdict

from ablation import SETTINGS, variants_option, with_variants
from rm_grid import boot, cell

METRICS = [("held_out", "held-out"), ("held_out_greedy", "held-out greedy"),
           ("ood", "OOD"), ("ood_greedy", "OOD greedy"), ("rm_process", "RM process")]


def num(x):
    return float(x) if x not in (None, "") else None


def mean_ci(xs, rng, rec=None):
    """The cell's text; `rec` (a list) gets (mean, low, high), the interval None for one seed."""
    if not xs:
        return "–"
    if len(xs) < 2:
        if rec is not None:
            rec.append((xs[0], None, None))
        return f"{xs[0]:.3f}"
    m, lo, hi = boot(xs, rng)
    if rec is not None:
        rec.append((m, lo, hi))
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def paired_cells(pairs, shown, rng):
    """Per metric of `shown`, the differences x − y over the (row x, row y) pairs (one per seed)
    where both have the metric: mean [paired bootstrap interval], the one difference, or "–"."""
    cells = []
    for k, _ in shown:
        d = [num(x[k]) - num(y[k]) for x, y in pairs
             if num(x[k]) is not None and num(y[k]) is not None]
        cells.append(cell(d, rng) if len(d) > 1 else (f"{d[0]:+.3f}" if d else "–"))
    return cells


COLOURS = {"policy": "#1f77b4", "rm": "#ff7f0e", "rmadapt": "#2ca02c"}
# benches/ablation.sh's VARIANTS (sorted by name).
VARIANT_COLOURS = ["#d62728", "#9467bd", "#8c564b", "#e377c2"]


def colour(setting, settings):
    if setting in COLOURS:
        return COLOURS[setting]
    extra = [k for k, _ in settings if k not in COLOURS]
    i = extra.index(setting) if setting in extra else 0
    return VARIANT_COLOURS[i % len(VARIANT_COLOURS)]


def svg(curves, seeds, title, settings=SETTINGS):
    """Panels of `curves[metric][setting] = [(x, mean, lo, hi)]` (x = -1: the warm start)."""
    panels = [(k, n) for k, n in (("held_out", "held-out, sampled"),
                                  ("held_out_greedy", "held-out, greedy")) if curves.get(k)]
    pw, ph, ml, mt, mb = 420, 260, 48, 40, 42
    gap = 48
    width = ml + len(panels) * (pw + gap)
    # The legend flows in rows: each entry a swatch and its label (~6.5 px a character at 11 px,
    # wider than the font's mean), the next where it ends, a new row where the figure does.
    legend, x, row, row_h = [], ml, 0, 14
    for key, name in settings:
        if key not in seeds:
            continue
        label = f"{name} ({seeds[key]} seed{'s' if seeds[key] != 1 else ''})"
        w = 18 + 6.5 * len(label)
        if x > ml and x + w > width - 8:
            x, row = ml, row + 1
        legend.append((key, label, x, row))
        x += w + 24
    height = mt + ph + mb + 24 + row_h * row
    xs = sorted({x for c in curves.values() for pts in c.values() for x, *_ in pts})
    x0, x1 = min(xs), max(xs)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{ml}" y="16" font-size="13">{title}</text>']
    for p, (key, name) in enumerate(panels):
        left = ml + p * (pw + gap)
        fx = lambda x: left + (x - x0) / max(x1 - x0, 1) * pw
        fy = lambda y: mt + (1 - y) * ph
        out.append(f'<text x="{left}" y="{mt - 8}">{name} (mean over seeds, 95% interval)</text>')
        out.append(f'<rect x="{left}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        for t in (0, 0.25, 0.5, 0.75, 1):
            out.append(f'<line x1="{left}" x2="{left + pw}" y1="{fy(t):.1f}" y2="{fy(t):.1f}" '
                       f'stroke="#eee"/><text x="{left - 6}" y="{fy(t) + 4:.1f}" '
                       f'text-anchor="end">{t:g}</text>')
        for x in xs:
            label = "warm" if x < 0 else str(x)
            out.append(f'<text x="{fx(x):.1f}" y="{mt + ph + 14}" text-anchor="middle">{label}</text>')
        out.append(f'<text x="{left + pw / 2}" y="{mt + ph + 30}" text-anchor="middle">'
                   f'iteration (warm: after the warm start)</text>')
        for setting, pts in curves[key].items():
            c = colour(setting, settings)
            band = [(x, lo, hi) for x, _, lo, hi in pts if lo is not None]
            if len(band) > 1:
                poly = [f"{fx(x):.1f},{fy(hi):.1f}" for x, _, hi in band] + \
                       [f"{fx(x):.1f},{fy(lo):.1f}" for x, lo, _ in reversed(band)]
                out.append(f'<polygon points="{" ".join(poly)}" fill="{c}" fill-opacity="0.15"/>')
            line = " ".join(f"{fx(x):.1f},{fy(m):.1f}" for x, m, *_ in pts)
            out.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="2"/>')
            for x, m, *_ in pts:
                out.append(f'<circle cx="{fx(x):.1f}" cy="{fy(m):.1f}" r="2.5" fill="{c}"/>')
    for key, label, x, row in legend:
        y = mt + ph + mb + 10 + row_h * row
        out.append(f'<rect x="{x:g}" y="{y - 9}" width="14" height="10" '
                   f'fill="{colour(key, settings)}"/>'
                   f'<text x="{x + 18:g}" y="{y}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    args = sys.argv[1:]
    out_svg = None
    if "--svg" in args:
        i = args.index("--svg")
        out_svg = args[i + 1]
        del args[i:i + 2]
    described = variants_option(args)
    rows = list(csv.DictReader(open(args[0])))
    curves = defaultdict(dict)  # metric -> setting -> [(x, mean, lo, hi)]
    seeds_of = {}
    # setting -> seed -> iter -> row
    runs = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        runs[r["setting"]][int(r["seed"])][int(r["iter"])] = r
    warm = {s: its[0] for s, its in runs.get("warm", {}).items() if 0 in its}
    settings, pairs = with_variants(runs, described)
    rng = random.Random(0)
    shown = [(k, n) for k, n in METRICS if any(num(r[k]) is not None for r in rows)]
    for key, name in settings:
        seeds = runs.get(key, {})
        if not seeds:
            continue
        last = min(max(its) for its in seeds.values())
        print(f"\n{name}: {len(seeds)} seeds ({', '.join(map(str, sorted(seeds)))}), "
              f"iterations 0–{last}; mean [bootstrap 95% interval]\n")
        print("| iteration | " + " | ".join(n for _, n in shown) + " |")
        print("|---|" + "---:|" * len(shown))
        seeds_of[key] = len(seeds)
        points = {k: [] for k, _ in shown}

        def row(x, values):
            cells = []
            for k, _ in shown:
                rec = []
                cells.append(mean_ci(values(k), rng, rec))
                if rec:
                    points[k].append((x, *rec[0]))
            return cells

        if warm:
            cells = row(-1, lambda k: [v for s in sorted(seeds) if s in warm
                                       and (v := num(warm[s][k])) is not None])
            print("| warm start | " + " | ".join(cells) + " |")
        for i in range(last + 1):
            cells = row(i, lambda k: [v for s in sorted(seeds)
                                      if (v := num(seeds[s][i][k])) is not None])
            print(f"| {i} | " + " | ".join(cells) + " |")
        for k, pts in points.items():
            if pts:
                curves[k][key] = pts
    print("\nRL gain: the last iteration every run of the setting reached minus the same seed's "
          "warm start; mean [paired bootstrap 95% interval], * = excludes 0\n")
    print("| setting | seeds | " + " | ".join(n for _, n in shown) + " |")
    print("|---|---:|" + "---:|" * len(shown))
    for key, name in settings:
        seeds = runs.get(key, {})
        common = sorted(s for s in seeds if s in warm)
        if not common:
            continue
        last = min(max(seeds[s]) for s in common)
        cells = paired_cells([(seeds[s][last], warm[s]) for s in common], shown, rng)
        print(f"| {name} | {len(common)} | " + " | ".join(cells) + " |")
    print("\nSettings paired per seed: a − b at the last iteration both reached; mean [paired "
          "bootstrap 95% interval], * = excludes 0\n")
    print("| difference | seeds | iteration | " + " | ".join(n for _, n in shown) + " |")
    print("|---|---:|---:|" + "---:|" * len(shown))
    for a, b in pairs:
        common = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
        if not common:
            continue
        last = min(min(max(runs[a][s]), max(runs[b][s])) for s in common)
        cells = paired_cells([(runs[a][s][last], runs[b][s][last]) for s in common], shown, rng)
        print(f"| {a} − {b} | {len(common)} | {last} | " + " | ".join(cells) + " |")
    if out_svg and any(curves.values()):
        n = max(seeds_of.values(), default=0)
        with open(out_svg, "w") as f:
            f.write(svg(curves, seeds_of, f"Learning curve: held-out success, {n} seeds",
                        settings))
        print(f"\nwrote {out_svg}")


if __name__ == "__main__":
    main()
