#!/usr/bin/env python3
"""A run's exported LoRA adapter, loaded by `peft` onto the base model in `transformers`, gives
the logits rla-pipe's model gives — the documented check behind the adapter export (CI checks
the same with an independent numpy forward: tests/it/lora.rs).

    python3 tests/hf/peft_check.py --store DIR --run ID --iter N [--model policy|rm]

1. `rla-pipe export` (adapter directory) and `rla-pipe export --merge` (merged model) of the
   committed checkpoint, into a temporary directory.
2. transformers + peft: the base model (the directory the run started from) with the adapter
   (`PeftModel.from_pretrained`), and transformers alone on the merged directory.
3. rla-pipe: `rla-pipe model generate` on the merged directory (greedy), the same prompts.
4. Checks: logits of base + adapter (peft) vs the merged model (max abs difference, f32), and
   greedy token ids of peft vs rla-pipe equal. Exits 1 when the logits differ by more than
   1e-3 or the ids differ.

Env: RLA_PIPE_BIN (default: $CARGO_TARGET_DIR/debug/rla-pipe). Needs torch, transformers, peft
(installed with pip if missing).
"""
import argparse, json, os, subprocess, sys, tempfile

try:
    import peft, torch, transformers
except ImportError:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "torch", "transformers", "peft"], check=True)
    import peft, torch, transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BIN = os.environ.get("RLA_PIPE_BIN", os.path.join(TARGET, "debug", "rla-pipe"))
PROMPTS = ["Task: put the apple in the fridge.", "You are in the kitchen. What do you do next?"]
TOKENS = 8


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--iter", required=True)
    ap.add_argument("--model", default="policy")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="rla-peft-")
    adapter, merged = os.path.join(tmp, "adapter"), os.path.join(tmp, "merged")
    common = [BIN, "export", "--store", a.store, "--run", a.run, "--iter", a.iter, "--model", a.model]
    subprocess.run(common + ["--out", adapter], check=True)
    subprocess.run(common + ["--merge", "--out", merged], check=True)
    base_dir = json.load(open(os.path.join(adapter, "adapter_config.json")))["base_model_name_or_path"]
    base_dir = base_dir if os.path.isabs(base_dir) else os.path.join(ROOT, base_dir)
    torch.set_num_threads(2)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with_adapter = peft.PeftModel.from_pretrained(base, adapter).eval()
    plain = transformers.AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    worst, moved, ok = 0.0, 0.0, True
    for p in PROMPTS:
        out = subprocess.run([BIN, "model", "generate", merged, "--prompt", p, "--max-tokens", str(TOKENS),
                              "--format", "json"], check=True, capture_output=True, text=True).stdout
        ours = json.loads(out)
        ours = ours[0] if isinstance(ours, list) else ours
        ids = torch.tensor([ours["prompt_ids"]])  # the same prompt ids for both
        with torch.no_grad():
            la = with_adapter(input_ids=ids).logits
            lm = plain(input_ids=ids).logits
            worst = max(worst, (la - lm).abs().max().item())
            with with_adapter.disable_adapter():
                moved = max(moved, (with_adapter(input_ids=ids).logits - la).abs().max().item())
            g = with_adapter.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=TOKENS, do_sample=False)[0, ids.shape[1]:]
        n = len(ours["generated_ids"])
        same = ours["generated_ids"] == g.tolist()[:n] and n > 0
        ok &= same
        print(f"{p!r}: peft {g.tolist()} rla-pipe {ours['generated_ids']} {'equal' if same else 'DIFFERENT'}")
    ok &= worst <= 1e-3
    print(f"base + adapter (peft {peft.__version__}) vs merged export: max |Δlogit| = {worst:.2e} "
          f"(the adapter itself moves the logits by up to {moved:.2e})")
    print("ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
