#!/usr/bin/env python3
"""Benchmark of the relational stages (reward_join + advantage + task_accuracy) against DuckDB.

For each N (step rows; m = 3 RM samples per step, so 3N RM rows):
  1. `rla-pipe run --until synthetic` generates and commits synthetic trajectories, steps and
     rm_samples (not measured);
  2. `rla-pipe run` resumes and runs reward_join, advantage and task_accuracy over the committed
     Parquet, writing sorted zstd Parquet and committing manifests (measured: wall time, peak RSS);
  3. DuckDB runs the equivalent SQL (benches/duckdb_relational.sql) over the same committed files
     and writes the same four tables as sorted zstd Parquet (measured the same way).

Usage:  python3 benches/relational.py [N ...]        (default: 1000000 10000000)
Env:    RLA_PIPE_BIN (default: $CARGO_TARGET_DIR/debug/rla-pipe), BENCH_DIR (default: a temp dir)
"""
import json, os, resource, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/rla-pipe-target"))
BIN = os.environ.get("RLA_PIPE_BIN", os.path.join(TARGET, "debug", "rla-pipe"))
STEPS_PER_TASK = 8 * 10  # n = 8 rollouts, episodes of 1..19 steps (mean 10)


def measured(cmd, may_fail=False):
    """Run cmd in a child, return (seconds, peak RSS in MiB) of that child alone; with may_fail,
    (None, None) when it fails (DuckDB held to 2 GB runs out of memory at 10M rows)."""
    wrapper = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter(); r = subprocess.run(sys.argv[1:]); dt = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(f'{dt} {rss}'); sys.exit(r.returncode)\n"
    )
    out = subprocess.run([sys.executable, "-c", wrapper] + cmd, capture_output=True, text=True)
    if out.returncode != 0:
        if may_fail:
            errors = [l for l in out.stderr.splitlines() if "Error" in l] or [f"exit {out.returncode}"]
            print(f"failed: {errors[-1]}", flush=True)
            return None, None
        sys.exit(f"command failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    dt, rss = out.stdout.strip().splitlines()[-1].split()
    return float(dt), float(rss)


def fmt(x, spec, unit=""):
    return "failed" if x is None else format(x, spec) + unit


def config(n):
    tasks = max(1, n // STEPS_PER_TASK)
    return f"""
[run]
name = "bench"
iterations = 1
memory_limit_mib = 1024
[env]
initial_tasks = {tasks}
max_steps = 19
[rollout]
n = 8
[reward_model]
samples = 3
"""


def generate(n, cfg, store):
    """Write the config for N step rows to cfg and commit the synthetic inputs into a new store:
    (seconds it took, step rows)."""
    os.makedirs(os.path.dirname(cfg), exist_ok=True)
    open(cfg, "w").write(config(n))
    subprocess.run(["rm", "-rf", store], check=True)
    t = time.perf_counter()
    subprocess.run([BIN, "run", cfg, "--store", store, "--until", "synthetic", "-q"], check=True)
    gen = time.perf_counter() - t
    steps = int(subprocess.run([BIN, "sql", "--store", store, "--format", "csv", "SELECT count(*) FROM steps"],
                               capture_output=True, text=True, check=True).stdout.splitlines()[1])
    return gen, steps


def committed_files(store, table):
    out = []
    cdir = os.path.join(store, "bench", "_commits", "iter=000000")
    for name in sorted(os.listdir(cdir)):
        if name.startswith("_"):
            continue
        m = json.load(open(os.path.join(cdir, name)))
        out += [os.path.join(store, o["path"]) for o in m["outputs"] if o["table"] == table]
    return out


def duckdb_sql(store, outdir):
    sql = open(os.path.join(ROOT, "benches", "duckdb_relational.sql")).read()
    files = lambda t: "[" + ", ".join(f"'{p}'" for p in committed_files(store, t)) + "]"
    return (sql.replace("${steps}", files("steps"))
               .replace("${trajectories}", files("trajectories"))
               .replace("${rm_samples}", files("rm_samples"))
               .replace("${out}", outdir))


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [1_000_000, 10_000_000]
    try:
        import duckdb  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "duckdb"], check=True)
    base = os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="rla-bench-")
    rows = []
    for n in sizes:
        d = os.path.join(base, f"n{n}")
        cfg, store = os.path.join(d, "bench.toml"), os.path.join(d, "runs")
        gen, steps = generate(n, cfg, store)
        ours, ours_rss = measured([BIN, "run", cfg, "--store", store, "-q"])
        outdir = os.path.join(d, "duckdb-out")
        os.makedirs(outdir, exist_ok=True)
        script = os.path.join(d, "duckdb.sql")
        open(script, "w").write(duckdb_sql(store, outdir))
        runner = ("import duckdb, sys; c = duckdb.connect(); c.execute(\"SET threads = 2\"); "
                  "c.execute(sys.argv[2]); c.execute(open(sys.argv[1]).read())")
        theirs, theirs_rss = measured([sys.executable, "-c", runner, script, "SELECT 1"])
        capped, capped_rss = measured([sys.executable, "-c", runner, script, "SET memory_limit = '2GB'"],
                                      may_fail=True)
        rows.append((n, steps, gen, ours, ours_rss, theirs, theirs_rss, capped, capped_rss))
        print(f"N={n:>10} steps={steps:>10} gen={gen:6.1f}s  rla-pipe {ours:6.2f}s {ours_rss:7.0f} MiB"
              f"  duckdb {theirs:6.2f}s {theirs_rss:7.0f} MiB  duckdb(2GB) {fmt(capped, '6.2f', ' s')} {fmt(capped_rss, '7.0f', ' MiB')}",
              flush=True)
    print("\n| step rows | RM rows | rla-pipe (s) | rla-pipe peak RSS (MiB) | s per 1M steps | DuckDB (s) | DuckDB peak RSS (MiB) | rla-pipe / DuckDB | DuckDB, memory_limit 2GB (s) | its peak RSS (MiB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, steps, gen, ours, orss, theirs, trss, capped, crss in rows:
        print(f"| {steps:,} | {3*steps:,} | {ours:.2f} | {orss:.0f} | {ours / steps * 1e6:.2f} | {theirs:.2f} | {trss:.0f} | {ours / theirs:.2f}× | {fmt(capped, '.2f')} | {fmt(crss, '.0f')} |")


if __name__ == "__main__":
    main()
