#!/usr/bin/env python3
"""The relational stages (reward_join + advantage + task_accuracy) on 0 (single node), 1, 2 and
3 local `rla-pipe worker`s, over benches/relational.py's data.

For each N (step rows; 3N RM rows):
  1. `rla-pipe run --until synthetic` generates and commits the inputs once (not measured);
  2. for each worker count, a copy of that store runs the three stages (`--cluster` with that
     many workers started on loopback; none: single node), measured: wall time, peak RSS of the
     coordinator and of each worker, bytes over loopback (/proc/net/dev), and the stages' own
     seconds and writer seconds (stage_runs);
  3. every committed file's digest is compared with the single-node run's (byte-identical).

Usage:  python3 benches/cluster.py [N ...]      (default: 10000000)
Env:    RLA_PIPE_BIN, BENCH_DIR as for benches/relational.py; WORKERS (default: 1,2,3)
"""
import json, os, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from relational import BIN, generate  # noqa: E402

STAGES = ("reward_join", "advantage", "task_accuracy")


def loopback_bytes():
    for line in open("/proc/net/dev"):
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])  # transmitted bytes
    return 0


def cpu_seconds(pid):
    """user + system CPU seconds of a running process."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_measured(cmd):
    """(wall seconds, peak RSS MiB, CPU seconds) of cmd, a child of this process (its own
    rusage, from wait4: not the maximum over every child so far)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, cmd)
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def peak_rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_worker(store):
    p = subprocess.Popen([BIN, "worker", "--listen", "127.0.0.1:0", "--store", store],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    return p, line.split("http://")[1].split()[0]


def run_on_workers(cmd, store, workers):
    """Run cmd with `--cluster` on `workers` workers started on loopback over store (none:
    single node): (wall s, peak RSS MiB, CPU s) of cmd, the workers' peak RSS (MiB each) and CPU
    seconds (summed), and the bytes sent over loopback."""
    procs = [start_worker(store) for _ in range(workers)]
    if procs:
        cmd = cmd + ["--cluster", ",".join(addr for _, addr in procs)]
    net0 = loopback_bytes()
    wall, rss, cpu = run_measured(cmd)
    net = loopback_bytes() - net0
    worker_rss = [peak_rss_mib(p.pid) for p, _ in procs]
    worker_cpu = sum(cpu_seconds(p.pid) for p, _ in procs)
    for p, _ in procs:
        p.terminate()
        p.wait()
    return wall, rss, cpu, worker_rss, worker_cpu, net


def digests(store, run="bench"):
    out = {}
    cdir = os.path.join(store, run, "_commits", "iter=000000")
    for name in sorted(os.listdir(cdir)):
        if name.startswith("_"):
            continue
        for o in json.load(open(os.path.join(cdir, name)))["outputs"]:
            out[o["table"]] = o["digest"]
    return out


def stage_seconds(store, stages=STAGES):
    q = ("SELECT stage, seconds, store_seconds FROM stage_runs WHERE stage IN "
         f"({', '.join(repr(s) for s in stages)}) ORDER BY stage")
    out = subprocess.run([BIN, "sql", "--store", store, "--format", "csv", q],
                         capture_output=True, text=True, check=True).stdout.splitlines()[1:]
    total = sum(float(l.split(",")[1]) for l in out)
    writing = sum(float(l.split(",")[2] or 0) for l in out)
    return total, writing


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [10_000_000]
    counts = [int(w) for w in os.environ.get("WORKERS", "1,2,3").split(",")]
    base = os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="rla-cluster-")
    rows = []
    for n in sizes:
        d = os.path.join(base, f"n{n}")
        cfg, inputs = os.path.join(d, "bench.toml"), os.path.join(d, "inputs")
        _, steps = generate(n, cfg, inputs)
        single = None
        for workers in [0] + counts:
            store = os.path.join(d, f"w{workers}")
            subprocess.run(["rm", "-rf", store], check=True)
            subprocess.run(["cp", "-r", inputs, store], check=True)
            wall, rss, cpu, worker_rss, worker_cpu, net = run_on_workers(
                [BIN, "run", cfg, "--store", store, "-q"], store, workers)
            stages, writing = stage_seconds(store)
            got = digests(store)
            if single is None:
                single = got
            same = got == single
            rows.append((steps, workers, wall, rss, cpu, worker_rss, worker_cpu, net, stages, writing, same))
            print(f"N={steps:>10} workers={workers} wall {wall:6.2f}s coordinator {rss:6.0f} MiB {cpu:6.2f} CPU-s "
                  f"workers {worker_cpu:6.2f} CPU-s "
                  f"workers {' '.join(f'{r:.0f}' for r in worker_rss) or '-'} MiB loopback {net / 2**20:8.1f} MiB "
                  f"stages {stages:6.2f}s store {writing:6.2f}s identical={same}", flush=True)
            if not same:
                sys.exit(f"workers={workers}: committed files differ from the single node's: {got} vs {single}")
    print("\n| step rows | workers | wall (s) | store (s) | coordinator CPU (s) | workers' CPU (s) | coordinator peak RSS (MiB) | worker peak RSS (MiB) | loopback (MiB) | identical |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for steps, w, wall, rss, cpu, wrss, wcpu, net, stages, writing, same in rows:
        print(f"| {steps:,} | {w or 'single node'} | {wall:.2f} | {writing:.2f} | {cpu:.2f} | {wcpu:.2f} | {rss:.0f} | "
              f"{' / '.join(f'{r:.0f}' for r in wrss) or '-'} | {net / 2**20:.1f} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
