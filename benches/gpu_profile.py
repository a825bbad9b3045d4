#!/usr/bin/env python3
"""The GPU path, profiled in one call (docs/src/real-models.md, "The GPU path"): where a
SmolLM2-135M household iteration spends its time on CUDA, stage by stage and kernel by kernel,
against the same machine's CPU cores and against PyTorch on the same GPU.

Runs on a machine with an NVIDIA GPU, PyTorch and `transformers`, with a `--features cuda`
binary built elsewhere (nothing is built here):

  RLA_PIPE_BIN=path/to/rla-pipe python3 benches/gpu_profile.py MODEL_DIR [--out DIR]

MODEL_DIR needs only config.json, generation_config.json and the tokenizer files: the weights
are initialised at random with SmolLM2-135M's shapes (transformers, seed 0) in a temporary copy,
since 540 MB of weights cannot travel to a lent GPU machine; speed depends on shapes, not values.
A random policy's samples carry no advantage, so the update trains on synthetic ones
(`RLA_PIPE_BENCH_ADVANTAGE`, src/stages/bench.rs): every step and RM sample, advantages drawn
from a seed, the same shapes a learning run's update has.

1. `cuda, compiling`: one iteration of the smaller household variant (the sets below) with an
   empty kernel cache (`RLA_PIPE_KERNEL_CACHE`): every kernel compiled at its first launch.
2. `cuda`: the same iteration again, its kernels loaded from the cache (as a user's second run),
   timed per stage, with the peak device memory in use during each stage (NVML, polled every
   20 ms: the whole device, as nvidia-smi counts it), its update dumped (`RLA_PIPE_BENCH_UPDATE`).
   rla-pipe's own kernels (src/model/hf/cube.rs), per-layer checkpointing
   (src/model/hf/checkpointed.rs) and draws from the device's leading tokens
   (src/model/hf/generate.rs) were written without a GPU: if this run fails, it is tried with
   `RLA_PIPE_DEVICE_SAMPLING=off`, then `RLA_PIPE_CUDA_KERNELS=off`, then with
   `update.checkpoint_layers=off`, then with the kernels and the checkpointing off,
   and every later step runs as the first of these that runs (reported), so that one failing
   change costs a lease its comparison, not its figures.
3. `pytorch` (run after 4 and 5): benches/smollm2_update.py on that dump with PyTorch on the
   same GPU — the same samples, prefix-tree rows, PPO loss, clipping and AdamW; full f32.
4. variants (`--variant NAME=KEY=VALUE,...`, `env:VAR=VALUE` items set the environment, e.g.
   `nocache=env:RLA_PIPE_KERNEL_CACHE=off`; by default DEFAULT_VARIANTS below: 512-token
   backward passes, and each GPU change not yet measured against its predecessor): the
   iteration with other settings, timed beside 2,
   each with its update's optimizer-step seconds from its own dump; `--pytorch-variant NAME`
   runs step 3 on that variant's dump too.
5. `kernels`: the same iteration (or `--profile-variant NAME`'s, after the variants, so that
   every kernel it launches is compiled already) with cubecl's own profiler (a `cubecl.toml`,
   profiling level "basic": every kernel launched alone), its log split at the stages' start
   lines: per stage, the kernels' time against the stage's wall time, and the kernels that take
   it. On CUDA a kernel's time is the host's wall time between a synchronisation before its
   launch and one after it (the kernel, its launch, and its compilation if that launch compiles
   it): an upper bound on the device's time.
6. `generate`: `rla-pipe model generate` (greedy, KV cache, one batched forward per token) at
   batch 1 and 32 against `transformers`' `generate` on the same GPU (benches/smollm2_generate.py);
   `--generate-variant NAME=VAR=VALUE,...` runs it again with that environment (by default
   DEFAULT_GENERATE: burn's operations for RMSNorm, RoPE, the activation and the softmax, and
   greedy picks on the host; the key/value cache grown by concatenation;
   `sampled=GENERATE_TEMPERATURE=1` samples on both sides instead of greedy).
7. `cpu`: the iteration on the machine's CPU cores, for the GPU/CPU ratio.

Every run also counts its model calls per stage (`model call` lines at debug level,
src/model/tree.rs): each call launches the same kernels whatever its size.

Each step has its own time limit; a failed step is reported and the rest still run. The summary
table is printed last and written, with every log, to --out.
"""
import argparse, collections, csv, io, json, os, re, shutil, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETS = ["run.iterations=1", "env.initial_tasks=4", "rollout.slots_per_iter=2", "eval.tasks=2",
        "eval.ood_tasks=2", "env.max_steps=6", "reward_model.max_tokens=16",
        "reward.policy_acc_min=0", "reward.policy_acc_max=1",
        "pretrain.enabled=false", "policy.lora.rank=0", "reward_model.lora.rank=0",
        "update.policy_lr=1e-5", "update.rm_lr=1e-5"]
STAGE_START = re.compile(r"stage started.*\biter=(\d+).*\bstage=\"?([A-Za-z_]+)")
STAGE_DONE = re.compile(r"stage committed.*\biter=(\d+).*\bstage=\"?([A-Za-z_]+)\"?.*\bseconds=([0-9.e+-]+)")
# one line per model call (src/model/tree.rs, at debug level): its rows and packed length
CALL = re.compile(r"model call.*\brows=(\d+).*\blen=(\d+)")
# one line per sampled generation on the device (src/model/hf/generate.rs, at debug level): its
# draws, and those its rows' leading tokens did not decide (those rows' logits read whole)
DRAWN = re.compile(r"sampled from the device's leading tokens.*\bdraws=(\d+).*\bfar=(\d+)")
# cubecl's profiler: `| 12.3µs     | kernel name`
KERNEL = re.compile(r"^\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.+?)\s*$")
UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


# The variants a lease measures when none are named: a smaller GPU's backward passes, and each
# GPU change since the last lease against its predecessor — sampled draws made on the host from
# every row's logits (before draws from each row's leading tokens read from the device,
# src/model/hf/generate.rs), training that keeps every layer's
# activations (before per-layer checkpointing, src/model/hf/checkpointed.rs), the key/value
# cache grown by concatenation (before bucketed buffers written in place, src/model/kv.rs) and
# training attention that keeps its probabilities (before recomputing them,
# src/model/hf/recompute.rs), RMSNorm, RoPE, the MLP's activation and attention's softmax as
# burn's operations, burn's AdamW and greedy picks on the host (before one kernel each,
# src/model/hf/fused.rs and src/model/adamw.rs, and picks on the device) — and one not yet
# adopted: training with balanced checkpointing (src/model/backend.rs).
# The newest change first: a lease whose budget runs out keeps the comparisons that matter most.
DEFAULT_VARIANTS = ["hostdraw=env:RLA_PIPE_DEVICE_SAMPLING=off", "keeplayers=update.checkpoint_layers=off",
                    "burnops=env:RLA_PIPE_CUDA_KERNELS=off",
                    "keepattn=update.recompute_attention=off", "kvcat=env:RLA_PIPE_DEVICE_KV=cat",
                    "mb512=update.cuda_micro_batch_tokens=512",
                    "balanced=env:RLA_PIPE_CUDA_CHECKPOINTING=balanced"]
# (`--generate-variant sampled=GENERATE_TEMPERATURE=1` samples on both sides instead: with random
# weights every row's distribution is nearly flat, so nearly every draw reaches past the device's
# leading tokens and reads its row: the worst case of src/model/hf/generate.rs's draws.)
DEFAULT_GENERATE = ["burnops=RLA_PIPE_CUDA_KERNELS=off", "kvcat=RLA_PIPE_DEVICE_KV=cat"]


# `--budget` seconds for the whole script: each step's limit is cut to what is left (less a
# reserve for the summary), so that the summary is always printed.
DEADLINE = [float("inf")]


def left(limit):
    return max(0.0, min(limit, DEADLINE[0] - time.perf_counter() - 5))


def log(msg):
    print(msg, flush=True)


class Memory:
    """The device memory in use (NVML), polled in a thread; the peak since the last `mark`."""

    def __init__(self):
        self.peak, self.stop = {}, False
        self.stage = None
        try:
            import pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.read = lambda: pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20
        except Exception as e:  # noqa: BLE001 - reported, then the rest runs without it
            log(f"(no NVML: {e}; no memory figures)")
            self.read = None
        threading.Thread(target=self.poll, daemon=True).start()

    def poll(self):
        while not self.stop and self.read:
            m = self.read()
            for k in (self.stage, "(run)"):
                if k is not None:
                    self.peak[k] = max(self.peak.get(k, 0.0), m)
            time.sleep(0.02)


def run_iteration(bin_, model, device, out, name, env_extra=None, cwd=None, limit=300, sets=()):
    """One iteration on a fresh store: per stage its seconds, peak device memory and (when
    cubecl profiles) kernel times. Returns a dict, or None when it failed."""
    limit = left(limit)
    if limit < 20:
        log(f"{name}: skipped, no time left in the budget")
        return None
    store = tempfile.mkdtemp(prefix=f"gpu-{name}-")
    cmd = [bin_, "run", os.path.join(ROOT, "pipelines/household-smollm2.toml"), "--store", store,
           "--run-id", "gpu", "-q", "--set", f"run.device={device}",
           "--set", f"policy.init=hf:{model}", "--set", f"reward_model.init=hf:{model}"]
    for s in SETS + list(sets):
        cmd += ["--set", s]
    env = dict(os.environ, RUST_LOG="rla_pipe=info,rla_pipe::model::tree=debug,rla_pipe::model::hf::generate=debug", **(env_extra or {}))
    mem = Memory() if device == "cuda" else None
    stages, order, kernels = {}, [], collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    current = "(start)"
    calls = collections.defaultdict(lambda: [0, 0, 0])  # per stage: model calls, rows, longest row
    drawn = collections.defaultdict(lambda: [0, 0])  # per stage: draws on the device, read whole
    logf = open(os.path.join(out, f"{name}.log"), "w")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         cwd=cwd or ROOT, errors="replace")
    timer = threading.Timer(limit, p.kill)
    timer.start()
    for line in p.stdout:
        m = KERNEL.match(line)
        if m:
            k = kernels[current][m.group(3)[:110]]
            k[0] += 1
            k[1] += float(m.group(1)) * UNIT[m.group(2)]
            continue
        m = CALL.search(line)
        if m:
            c = calls[current]
            c[0] += 1
            c[1] += int(m.group(1))
            c[2] = max(c[2], int(m.group(2)))
            continue
        m = DRAWN.search(line)
        if m:
            d = drawn[current]
            d[0] += int(m.group(1))
            d[1] += int(m.group(2))
            continue
        logf.write(line)
        m = STAGE_START.search(line)
        if m:
            current = key(m.group(1), m.group(2))
            order.append(current)
            if mem:
                mem.stage = current
            continue
        m = STAGE_DONE.search(line)
        if m:
            stages[key(m.group(1), m.group(2))] = float(m.group(3))
    rc = p.wait()
    timer.cancel()
    wall = time.perf_counter() - t0
    if mem:
        mem.stop = True
    logf.close()
    # What the stages' models reserved at their peak, as the run recorded it
    # (`stage_runs.peak_device_bytes`: cubecl's pages, not the whole device as NVML counts it).
    reserved = {}
    q = subprocess.run([bin_, "sql", "--store", store, "--format", "csv", "-q",
                        "SELECT iter, stage, peak_device_bytes FROM stage_runs"],
                       capture_output=True, text=True)
    for row in csv.DictReader(io.StringIO(q.stdout)) if q.returncode == 0 else []:
        if row.get("peak_device_bytes"):
            reserved[key(row["iter"], row["stage"])] = int(row["peak_device_bytes"]) / 2**20
    shutil.rmtree(store, ignore_errors=True)
    res = {"wall": wall, "stages": stages, "order": order, "failed": rc != 0,
           "peak": dict(mem.peak) if mem else {}, "reserved": reserved, "kernels": kernels,
           "calls": {k: v for k, v in calls.items()}, "drawn": {k: v for k, v in drawn.items()}}
    if rc != 0:
        log(f"{name}: exit {rc} after {wall:.1f} s (log: {name}.log); what it measured until then is kept")
        with open(os.path.join(out, f"{name}.log")) as f:
            log("".join(f.readlines()[-15:]))
        return res if order else None
    log(f"{name}: {wall:.1f} s wall")
    return res


def key(it, stage):
    """A stage's key: its name in iteration 0, `name#i` in iteration i."""
    return stage if it == "0" else f"{stage}#{it}"


def kernel_table(res, out):
    """Per model stage: wall, kernel sum, share, top kernels."""
    lines = []
    for stage in res["order"]:
        ks = res["kernels"].get(stage)
        if not ks:
            continue
        total = sum(v[1] for v in ks.values())
        n = sum(v[0] for v in ks.values())
        wall = res["stages"].get(stage, float("nan"))
        lines.append(f"\n{stage}: {wall:.2f} s wall (profiled), {n:,} kernels, {total:.3f} s on the device "
                     f"({100 * total / wall:.0f}%), mean {1e6 * total / max(n, 1):.1f} µs/kernel")
        lines.append("| kernel | launches | device s | share of device time |")
        lines.append("|---|---:|---:|---:|")
        for name, (c, t) in sorted(ks.items(), key=lambda kv: -kv[1][1])[:12]:
            lines.append(f"| `{name}` | {c:,} | {t:.3f} | {100 * t / total:.1f}% |")
    text = "\n".join(lines)
    with open(os.path.join(out, "kernels.md"), "w") as f:
        f.write(text + "\n")
        # every kernel, for the notes
        for stage, ks in res["kernels"].items():
            f.write(f"\n## {stage} (all)\n")
            for name, (c, t) in sorted(ks.items(), key=lambda kv: -kv[1][1]):
                f.write(f"{t:.6f}\t{c}\t{name}\n")
    return text


def random_model(model):
    d = tempfile.mkdtemp(prefix="smollm2-random-")
    for f in os.listdir(model):
        if f.endswith(".json"):
            shutil.copy(os.path.join(model, f), d)
    code = ("import sys, torch, transformers\n"
            "torch.manual_seed(0)\n"
            "cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])\n"
            "transformers.AutoModelForCausalLM.from_config(cfg).float().save_pretrained(sys.argv[1])\n")
    subprocess.run([sys.executable, "-c", code, d], check=True)
    # the model's own config (transformers 5 rewrites it in its newer layout)
    for f in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(model, f), d)
    return d


def step(name, limit, argv, out, env=None):
    limit = left(limit)
    if limit < 20:
        log(f"{name}: skipped, no time left in the budget")
        return "", "skipped"
    t = time.perf_counter()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=limit, cwd=ROOT,
                           env=dict(os.environ, **(env or {})))
        text, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    with open(os.path.join(out, f"{name}.log"), "w") as f:
        f.write(text)
    log(f"{name}: exit {rc} after {time.perf_counter() - t:.1f} s")
    return text, rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip", default="", help="comma-separated steps to skip (cold,pytorch,kernels,variants,generate,cpu)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=KEY=VALUE[,KEY=VALUE...]: one more cuda iteration with these sets, timed "
                         "beside the first (default: DEFAULT_VARIANTS: a smaller GPU's backward passes, the old "
                         "key/value cache, attention that keeps its probabilities)")
    ap.add_argument("--device", default="cuda", help="the device of every run but `cpu` (cpu: to check this "
                    "script on a machine without a GPU)")
    ap.add_argument("--real-weights", action="store_true",
                    help="use MODEL's own weights instead of random ones (needs its model.safetensors)")
    ap.add_argument("--generate-variant", action="append", default=[],
                    help="NAME=VAR=VALUE[,VAR=VALUE...]: the generation comparison again with this environment "
                         "(default: DEFAULT_GENERATE: burn's operations and host picks; the key/value "
                         "cache grown by concatenation)")
    ap.add_argument("--generate-runs", type=int, default=1,
                    help="run the generation comparison this many times; the last is reported")
    ap.add_argument("--profile-variant", default=None,
                    help="NAME of a --variant: profile its kernels instead of the default iteration's")
    ap.add_argument("--pytorch-variant", action="append", default=[],
                    help="NAME of a --variant: PyTorch's update on its dump too")
    ap.add_argument("--budget", type=float, default=float("inf"), help="seconds for the whole script")
    a = ap.parse_args()
    DEADLINE[0] = time.perf_counter() + a.budget
    out = a.out or tempfile.mkdtemp(prefix="gpu-profile-")
    os.makedirs(out, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    bin_ = os.environ.get("RLA_PIPE_BIN") or os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/rla-pipe-target")), "release", "rla-pipe")
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        smi = "no nvidia-smi"
    gpu = a.device
    log(f"GPU: {smi}; CPU cores: {os.cpu_count()}")
    t = time.perf_counter()
    model = os.path.abspath(a.model) if a.real_weights else random_model(a.model)
    if not a.real_weights:
        log(f"random SmolLM2-shaped weights: {time.perf_counter() - t:.1f} s")
    variants = [v.split("=", 1) for v in (a.variant or DEFAULT_VARIANTS)]
    gen_variants = [("", {})] + [(n, dict(kv.split("=", 1) for kv in rest.split(",")))
                                 for n, rest in (v.split("=", 1) for v in (a.generate_variant or DEFAULT_GENERATE))]
    dump = tempfile.mkdtemp(prefix="gpu-dump-")
    bench = {"RLA_PIPE_BENCH_ADVANTAGE": "0"}

    # The first run compiles every kernel it launches (an empty kernel cache); every later run
    # here finds them compiled, as a user's second run does.
    bench["RLA_PIPE_KERNEL_CACHE"] = tempfile.mkdtemp(prefix="kernels-")
    cold = None if "cold" in skip else run_iteration(bin_, model, gpu, out, "cuda-cold", bench, limit=150)
    cuda = run_iteration(bin_, model, gpu, out, "cuda", dict(bench, RLA_PIPE_BENCH_UPDATE=dump), limit=150)
    # rla-pipe's own kernels (src/model/hf/cube.rs) and its per-layer checkpointing
    # (src/model/hf/checkpointed.rs) were built without a GPU and run first here: if the
    # iteration failed, try it with sampled draws on the host (a failure there costs a few
    # seconds: the rollout's first draws), then with burn's operations, then without the
    # checkpointing, then without both, and measure everything else with the first that runs (the failure is in
    # cuda.log; the variant of what failed is then the default).
    fallbacks = [("draws-off", {"RLA_PIPE_DEVICE_SAMPLING": "off"}, []),
                 ("kernels-off", {"RLA_PIPE_CUDA_KERNELS": "off"}, []),
                 ("layers-off", {}, ["update.checkpoint_layers=off"]),
                 ("kernels-and-layers-off", {"RLA_PIPE_CUDA_KERNELS": "off"}, ["update.checkpoint_layers=off"])]
    for name, env, sets in ([] if cuda is not None or "RLA_PIPE_CUDA_KERNELS" in os.environ else fallbacks):
        again = run_iteration(bin_, model, gpu, out, f"cuda-{name}",
                              dict(bench, RLA_PIPE_BENCH_UPDATE=dump, **env), limit=150, sets=sets)
        if again is not None:
            log(f"THE DEFAULT ITERATION FAILED (cuda.log); the rest runs with {env} {sets}")
            bench.update(env)
            os.environ.update(env)
            SETS.extend(sets)
            cuda = again
            break
    var, dumps = {}, {"cuda": dump}
    for name, spec in ([] if "variants" in skip else variants):
        items = spec.split(",")
        env = dict(i[4:].split("=", 1) for i in items if i.startswith("env:"))
        dumps[name] = tempfile.mkdtemp(prefix=f"gpu-dump-{name}-")
        var[name] = run_iteration(bin_, model, gpu, out, f"cuda-{name}",
                                  dict(bench, RLA_PIPE_BENCH_UPDATE=dumps[name], **env),
                                  sets=[i for i in items if not i.startswith("env:")])
    # Profiled after the variants: every kernel it launches is compiled by then (cubecl's
    # profiler would count a launch's compilation as that kernel's time).
    prof = None
    if "kernels" not in skip:
        d = tempfile.mkdtemp(prefix="cubecl-")
        with open(os.path.join(d, "cubecl.toml"), "w") as f:
            f.write('[profiling.logger]\nlevel = "basic"\nstdout = true\n')
        psets, penv = [], {}
        for name, spec in variants:
            if name == a.profile_variant:
                items = spec.split(",")
                penv = dict(i[4:].split("=", 1) for i in items if i.startswith("env:"))
                psets = [i for i in items if not i.startswith("env:")]
        log(f"kernels: profiling {a.profile_variant or 'the default iteration'}")
        prof = run_iteration(bin_, model, gpu, out, "kernels", dict(bench, **penv), sets=psets,
                             cwd=d, limit=300)
    # PyTorch on the same dumps: the default iteration's, and each --pytorch-variant's (with its
    # environment, so that RLA_PIPE_ATTENTION_BUDGET groups the rows alike on both sides).
    torch_texts = {}
    for name in ([] if "pytorch" in skip else ["cuda"] + a.pytorch_variant):
        if (name == "cuda" and not cuda) or (name != "cuda" and not var.get(name)):
            continue
        env = {}
        for n, spec in variants:
            if n == name:
                env = dict(i[4:].split("=", 1) for i in spec.split(",") if i.startswith("env:"))
        torch_texts[name], _ = step("pytorch" + ("" if name == "cuda" else f"-{name}"), 180,
                                    [sys.executable, "benches/smollm2_update.py"], out,
                                    dict({"DUMP": dumps[name], "TORCH_DEVICE": "cuda", "RLA_PIPE_BIN": bin_},
                                         **env))
    gen_texts = {}
    for gname, genv in ([] if "generate" in skip else gen_variants):
        for _ in range(a.generate_runs):
            # A later run finds every kernel of the first compiled (the kernel cache).
            gen_texts[gname], _ = step(f"generate{'-' + gname if gname else ''}", 150,
                                       [sys.executable, "benches/smollm2_generate.py", model,
                                        "--batches", "1,32", "--max-tokens", "32"], out,
                                       dict({"TORCH_DEVICE": "cuda", "RLA_PIPE_BIN": bin_,
                                             "RLA_PIPE_KERNEL_CACHE": bench["RLA_PIPE_KERNEL_CACHE"]}, **genv))
    cpu = None
    if "cpu" not in skip:
        cpu = run_iteration(bin_, model, "cpu", out, "cpu", bench, limit=240)

    # The summary, last.
    log("\n" + "=" * 100)
    log(f"GPU: {smi}; {os.cpu_count()} CPU cores")
    if prof:
        log(kernel_table(prof, out))
    names = [n for n, _ in variants]
    log("\n| stage | cuda, compiling (s) | cuda (s) | peak device MiB | reserved by its models MiB | cuda, profiled (s) | kernels' device s | "
        "cpu (s) | cpu / cuda | " + " | ".join(f"cuda {n} (s) | {n} peak MiB" for n in names) + " |")
    log("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(names))
    for stage in (cuda or prof or cpu or {"order": []})["order"]:
        c0 = (cold or {}).get("stages", {}).get(stage)
        c = (cuda or {}).get("stages", {}).get(stage)
        pk = (cuda or {}).get("peak", {}).get(stage)
        rv = (cuda or {}).get("reserved", {}).get(stage)
        ps = (prof or {}).get("stages", {}).get(stage)
        ks = (prof or {}).get("kernels", {}).get(stage)
        kd = sum(v[1] for v in ks.values()) if ks else None
        cp = (cpu or {}).get("stages", {}).get(stage)
        f = lambda v, fmt="{:.2f}": "" if v is None else fmt.format(v)  # noqa: E731
        ratio = f"{cp / c:.2f}×" if c and cp else ""
        vs = " | ".join(f"{f((var.get(n) or {}).get('stages', {}).get(stage))} | "
                        f"{f((var.get(n) or {}).get('peak', {}).get(stage), '{:,.0f}')}" for n in names)
        log(f"| {stage} | {f(c0)} | {f(c)} | {f(pk, '{:,.0f}')} | {f(rv, '{:,.0f}')} | {f(ps)} | {f(kd)} | {f(cp)} | {ratio} | {vs} |")
    w = lambda r: f"{r['wall']:.1f}" if r else "failed"  # noqa: E731
    it = lambda r: sum(r["stages"].values()) if r else 0  # noqa: E731
    log(f"| **stages, sum** | {it(cold):.1f} | {it(cuda):.1f} | {(cuda or {}).get('peak', {}).get('(run)', 0):,.0f} "
        f"| {max((cuda or {}).get('reserved', {}).values(), default=0):,.0f} | {it(prof):.1f} | | {it(cpu):.1f} | "
        + (f"{it(cpu) / it(cuda):.2f}×" if cuda and cpu and it(cuda) else "") + " | "
        + " | ".join(f"{it(var.get(n)):.1f} | {(var.get(n) or {}).get('peak', {}).get('(run)', 0):,.0f}" for n in names) + " |")
    log(f"process wall: cuda compiling {w(cold)} s, cuda {w(cuda)} s, profiled {w(prof)} s, cpu {w(cpu)} s, "
        + ", ".join(f"{n} {w(var.get(n))} s" for n in names))
    runs = [("cuda", cuda)] + [(n, var.get(n)) for n in names]

    def per_stage(title, field, cell):
        """A table of one counted field per stage (rows) and run (columns)."""
        log(f"\n| {title} | " + " | ".join(n for n, _ in runs) + " |\n|---|" + "---:|" * len(runs))
        for stage in (cuda or {"order": []})["order"]:
            cells = [(lambda c: cell(c) if c else "")((r or {}).get(field, {}).get(stage)) for _, r in runs]
            if any(cells):
                log(f"| {stage} | " + " | ".join(cells) + " |")

    # Model calls per stage and run: each launches the same kernels whatever its size.
    per_stage("model calls (rows, longest packed row)", "calls", lambda c: f"{c[0]:,} ({c[1]:,}, {c[2]:,})")
    # Sampled draws made from the device's leading tokens, and those that read a row whole.
    per_stage("sampled draws on the device (read whole)", "drawn", lambda d: f"{d[0]:,} ({d[1]:,})")
    # The update's optimizer steps per run, from each run's dump (the stage's own seconds).
    log("\n| run | policy optimizer steps (s) | RM optimizer steps (s) |\n|---|---:|---:|")
    for name, d in dumps.items():
        secs = []
        for role in ("policy", "rm"):
            try:
                with open(os.path.join(d, f"{role}.json")) as f:
                    secs.append(f"{json.load(f)['train_seconds']:.2f}")
            except (OSError, KeyError, ValueError):
                secs.append("")
        log(f"| {name} | {secs[0]} | {secs[1]} |")
    for title, text, keep in [(f"update: burn-cuda vs PyTorch CUDA ({n})", t, r"^\||step 0|snapshot|tokens")
                              for n, t in torch_texts.items()] + \
            [(f"generation{' (' + n + ')' if n else ''}", t, r"^\||^batch") for n, t in gen_texts.items()]:
        if text:
            log(f"\n{title}:")
            log("\n".join(l for l in text.splitlines() if re.search(keep, l)))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"gpu": smi, "cold": cold and {k: v for k, v in cold.items() if k != "kernels"}, "cuda": cuda and {k: v for k, v in cuda.items() if k != "kernels"},
                   "cpu": cpu and {k: v for k, v in cpu.items() if k != "kernels"},
                   "profiled": prof and {k: v for k, v in prof.items() if k != "kernels"},
                   "variants": {n: r and {k: v for k, v in r.items() if k != "kernels"} for n, r in var.items()}},
                  f, indent=1)


if __name__ == "__main__":
    main()
