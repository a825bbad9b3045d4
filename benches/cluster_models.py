#!/usr/bin/env python3
"""The model stages (rollout + rm_score) on 0 (single node), 1 and 2 local `rla-pipe worker`s:
pipelines/gridnav.toml (small transformer policy and generative RM, CPU) with T tasks.

For each T:
  1. `rla-pipe run --until pool` commits the warm start and the pool once (not measured);
  2. for each worker count, a copy of that store runs rollout and rm_score (`--until rm_score`,
     `--cluster` with that many workers on loopback; none: single node), measured: wall time,
     CPU and peak RSS of the coordinator and of the workers, bytes over loopback, the stages'
     own seconds;
  3. every committed file's digest is compared with the single-node run's (byte-identical).

Usage:  python3 benches/cluster_models.py [T ...]      (default: 256)
Env:    RLA_PIPE_BIN, BENCH_DIR as for benches/relational.py; WORKERS (default: 1,2)
"""
import os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import BIN, digests, run_on_workers, stage_seconds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = os.path.join(ROOT, "pipelines", "gridnav.toml")
STAGES = ("rollout", "rm_score")


def run_cmd(store, tasks, until):
    return [BIN, "run", PIPELINE, "--store", store, "--run-id", "bench", "--iterations", "1",
            "--until", until, "--set", f"env.initial_tasks={tasks}", "-q"]


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [256]
    counts = [int(w) for w in os.environ.get("WORKERS", "1,2").split(",")]
    base = os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="rla-cluster-models-")
    rows = []
    for tasks in sizes:
        d = os.path.join(base, f"t{tasks}")
        inputs = os.path.join(d, "inputs")
        subprocess.run(["rm", "-rf", d], check=True)
        os.makedirs(d)
        subprocess.run(run_cmd(inputs, tasks, "pool"), check=True)
        single = None
        for workers in [0] + counts:
            store = os.path.join(d, f"w{workers}")
            subprocess.run(["cp", "-r", inputs, store], check=True)
            wall, rss, cpu, worker_rss, worker_cpu, net = run_on_workers(
                run_cmd(store, tasks, "rm_score"), store, workers)
            stages, _ = stage_seconds(store, STAGES)
            got = {t: g for t, g in digests(store).items() if t in ("trajectories", "steps", "rm_samples")}
            single = single or got
            same = got == single
            rows.append((tasks, workers, wall, stages, rss, cpu, worker_rss, worker_cpu, net, same))
            print(f"T={tasks} workers={workers} wall {wall:6.2f}s stages {stages:6.2f}s coordinator "
                  f"{rss:5.0f} MiB {cpu:6.2f} CPU-s workers {worker_cpu:6.2f} CPU-s "
                  f"{' '.join(f'{r:.0f}' for r in worker_rss) or '-'} MiB loopback {net / 2**20:6.1f} MiB "
                  f"identical={same}", flush=True)
            if not same:
                sys.exit(f"workers={workers}: committed files differ from the single node's")
    print("\n| tasks × rollouts | workers | wall (s) | rollout + rm_score (s) | coordinator CPU (s) | "
          "workers' CPU (s) | coordinator peak RSS (MiB) | worker peak RSS (MiB) | loopback (MiB) | identical |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for tasks, w, wall, stages, rss, cpu, wrss, wcpu, net, same in rows:
        print(f"| {tasks} × 8 | {w or 'single node'} | {wall:.2f} | {stages:.2f} | {cpu:.2f} | {wcpu:.2f} | "
              f"{rss:.0f} | {' / '.join(f'{r:.0f}' for r in wrss) or '-'} | {net / 2**20:.1f} | "
              f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
