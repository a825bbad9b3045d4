#!/usr/bin/env python3
"""Rollout scoring and RM generation against PyTorch (CPU): the same transformer, the same
prompts, the same key/value-cache computation, on the same weights.

1. `rla-pipe run pipelines/gridnav.toml --set run.iterations=1` with RLA_PIPE_BENCH_GENERATE
   set: the `rollout` stage writes every policy call (the live episodes' prompts and admissible
   actions, the log π it computed, its seconds) and `rm_score` its prompts, every sampled
   response with its log-probability and the seconds of each call, with the weights each ran
   (src/stages/bench.rs).
2. Here PyTorch does the same work: for the policy, each call's prompts encoded once and every
   admissible action scored as a continuation from the cache (src/model/policy.rs); for the
   RM, each call's prompts encoded once, the cache copied for the m samples, then one forward
   per generated token for all rows (src/model/reward.rs `generate`). PyTorch is fed the
   tokens burn sampled (teacher forcing through the same token-by-token loop), so both run the
   same forwards on the same shapes.
3. Checks: max |Δ| of log π (policy) and of each response's log-probability (RM); throughput:
   tokens/s (policy: prompts + every admissible action; RM: prompts + generated tokens),
   burn as the stage ran vs PyTorch on 1 and 2 threads.

Usage:  python3 benches/torch_generate.py [PIPELINE.toml] [--set key=value ...]
        (default pipelines/gridnav.toml; DUMP=dir reuses a dump instead of running rla-pipe)
Env:    RLA_PIPE_BIN (default: $CARGO_TARGET_DIR/debug/rla-pipe)
Needs:  torch, numpy (installed with pip if missing)
"""
import json, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_update import Transformer, dump_dir, encode, load_checkpoint, policy_log_probs, torch  # noqa: E402


def policy_calls(model, d):
    """Every rollout call: log π of each decision's admissible actions, flattened."""
    out = []
    with torch.no_grad():
        for call in d["calls"]:
            lp = policy_log_probs(model, call["decisions"], d["temperature"], d["action_mean"])
            for row, dec in zip(lp, call["decisions"]):
                out += row[:len(dec["actions"])].tolist()
    return out


def rm_calls(model, d):
    """Every rm_score call of `batch` prompts: encode once, m rows per prompt, one forward per
    token with the cache, the tokens burn sampled fed back. Returns each sample's log-prob."""
    m, temp, max_tokens = d["m"], d["temperature"], d["max_tokens"]
    vocab = model.w("head").shape[1]
    allowed = torch.tensor(d["allowed"] if d["allowed"] is not None else range(vocab), dtype=torch.long)
    slot = torch.full((vocab,), -1, dtype=torch.long)
    slot[allowed] = torch.arange(len(allowed))
    out = []
    with torch.no_grad():
        for s in range(0, len(d["prompts"]), d["batch"]):
            prompts = d["prompts"][s:s + d["batch"]]
            forced = [x["tokens"] for p in d["samples"][s:s + d["batch"]] for x in p]
            last, cache, lens = encode(model, prompts)
            rows = torch.tensor([p for p in range(len(prompts)) for _ in range(m)], dtype=torch.long)
            n = len(rows)
            cache = [(k[rows], v[rows]) for k, v in cache]
            logits = last[rows]
            tp = cache[0][0].shape[2]
            plen = torch.tensor(lens, dtype=torch.long)[rows]
            flen = torch.tensor([len(f) for f in forced], dtype=torch.long)
            toks = torch.zeros(n, max_tokens, dtype=torch.long)
            for r, f in enumerate(forced):
                toks[r, :len(f)] = torch.tensor(f, dtype=torch.long)
            lp = torch.zeros(n, dtype=torch.float64)
            kp = torch.arange(tp)
            prompt_mask = kp[None, :] >= plen[:, None]
            for g in range(max_tokens):
                live = g < flen
                z = torch.log_softmax(logits.double()[:, allowed] / temp, dim=1)
                tok = toks[:, g]
                lp[live] += z[live, slot[tok[live]]]
                if g + 1 == max_tokens or not bool((live & (g + 1 < flen)).any()):
                    break
                pos = (plen + g).clamp(max=model.context - 1)[:, None]
                mask = torch.cat([prompt_mask, torch.zeros(n, g + 1, dtype=torch.bool)], 1)[:, None, :]
                logits, cache = model(tok[:, None], pos, mask, cache)
                logits = logits[:, 0, :]
            out += lp.tolist()
    return out


def main():
    dump = dump_dir("RLA_PIPE_BENCH_GENERATE", sys.argv[1:])
    rows = []
    for name, run, label in (("rollout", policy_calls, "policy (rollout scoring)"),
                             ("rm_score", rm_calls, "reward model (rm_score generation)")):
        path = os.path.join(dump, f"{name}.json")
        if not os.path.exists(path):
            print(f"{name}: no dump (stage did not run the small transformer)")
            continue
        d = json.load(open(path))
        cfg, params = load_checkpoint(os.path.join(dump, f"{name}.ckpt"))
        model = Transformer(cfg, params)
        if name == "rollout":
            burn_s = sum(c["seconds"] for c in d["calls"])
            tokens = sum(len(x["prompt"]) + sum(len(a) for a in x["actions"]) for c in d["calls"] for x in c["decisions"])
            burn_vals = [v for c in d["calls"] for row in c["logprobs"] for v in row]
            what = f"{len(d['calls'])} calls, {sum(len(c['decisions']) for c in d['calls']):,} decisions"
        else:
            burn_s = sum(d["seconds"])
            generated = sum(len(x["tokens"]) for p in d["samples"] for x in p)
            tokens = sum(len(p) for p in d["prompts"]) + generated
            burn_vals = [x["logprob"] for p in d["samples"] for x in p]
            what = (f"{len(d['seconds'])} calls, {len(d['prompts']):,} prompts × {d['m']} samples, "
                    f"{generated:,} generated tokens")
        torch.set_num_threads(2)
        got = run(model, d)
        assert len(got) == len(burn_vals), (len(got), len(burn_vals))
        diff = max(abs(a - b) for a, b in zip(got, burn_vals))
        print(f"{label}: {what}, {tokens:,} tokens; log-prob max |Δ| vs burn {diff:.2e}", flush=True)
        rows.append((label, "burn (flex, as the stage ran)", d["cores"], burn_s, tokens / burn_s, 1.0))
        for threads in (1, 2):
            torch.set_num_threads(threads)
            t = time.perf_counter()
            run(model, d)
            dt = time.perf_counter() - t
            rows.append((label, "PyTorch", threads, dt, tokens / dt, burn_s / dt))
    print(f"\ntorch {torch.__version__}\n")
    print("| model | implementation | threads | seconds | tokens/s | PyTorch speed-up |")
    print("|---|---|---:|---:|---:|---:|")
    for label, impl, threads, sec, tps, ratio in rows:
        print(f"| {label} | {impl} | {threads} | {sec:.2f} | {tps:,.0f} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()
