#!/usr/bin/env python3
"""The `update` stage against PyTorch (CPU): the same transformer, PPO loss, AdamW, gradient
clipping and minibatches, on the same weights.

1. `rla-pipe run pipelines/gridnav.toml --set run.iterations=1` with RLA_PIPE_BENCH_UPDATE set:
   the update stage writes, per model, its samples (token ids), settings, optimizer plan,
   snapshot log-probabilities, burn's per-step metrics and seconds, and the weights it started
   from (src/stages/update.rs, `bench_dump`).
2. Here the same update runs in PyTorch: the snapshot log-probabilities (forward only), then
   every optimizer step of the plan (forward + backward + clip + AdamW).
3. Checks: snapshot log-probabilities (max abs difference), step 0's loss and gradient norm
   (the backward pass) and step 1's loss (after one AdamW step), relative to burn's;
   throughput: tokens/s of the optimizer steps (tokens as burn counts them: prompts + every
   scored continuation), burn (as the stage ran) vs PyTorch on 1 and 2 threads.

Usage:  python3 benches/torch_update.py [PIPELINE.toml] [--set key=value ...]
        (default pipelines/gridnav.toml; DUMP=dir reuses a dump instead of running rla-pipe)
Env:    RLA_PIPE_BIN (default: $CARGO_TARGET_DIR/debug/rla-pipe)
Needs:  torch, numpy (installed with pip if missing)
"""
import math, json, os, struct, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/rla-pipe-target"))
BIN = os.environ.get("RLA_PIPE_BIN", os.path.join(TARGET, "debug", "rla-pipe"))

try:
    import numpy as np
    import torch
except ImportError:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "numpy", "torch"], check=True)
    import numpy as np
    import torch

F = torch.float32
MAGIC = b"RLAPIPE-CKPT 1\n"


def load_checkpoint(path):
    """src/model/checkpoint.rs: magic, u64 LE header length, JSON header, f32 LE values."""
    b = open(path, "rb").read()
    assert b.startswith(MAGIC), f"{path}: not an rla-pipe checkpoint"
    n = struct.unpack("<Q", b[len(MAGIC):len(MAGIC) + 8])[0]
    at = len(MAGIC) + 8
    header = json.loads(b[at:at + n])
    at += n
    params = {}
    for name, (r, c) in header["params"]:
        params[name] = torch.from_numpy(
            np.frombuffer(b, dtype="<f4", count=r * c, offset=at).copy()).reshape(r, c)
        at += 4 * r * c
    return header["model"], params


class Transformer(torch.nn.Module):
    """src/model/transformer.rs: token + learned position embeddings, pre-norm blocks (RMSNorm,
    causal multi-head attention with an additive −1e9 mask, RMSNorm, SiLU MLP), final RMSNorm,
    untied head; weights `[in, out]`, x @ w."""

    def __init__(self, cfg, params):
        super().__init__()
        self.heads, self.layers = cfg["heads"], cfg["layers"]
        self.context = cfg["context"]
        self.p = torch.nn.ParameterDict(
            {k.replace(".", "_"): torch.nn.Parameter(v.clone()) for k, v in params.items()})

    def w(self, name):
        return self.p[name.replace(".", "_")]

    @staticmethod
    def rms(x, g):
        return x / torch.sqrt((x * x).mean(dim=2, keepdim=True) + 1e-6) * g

    def forward(self, tokens, positions, mask, cache=None):
        b, t = tokens.shape
        d = self.w("tok_emb").shape[1]
        h, hd = self.heads, d // self.heads
        x = self.w("tok_emb")[tokens] + self.w("pos_emb")[positions]
        bias = (mask.to(F) * -1e9).unsqueeze(1)
        scale = 1.0 / hd ** 0.5
        fresh = []
        for l in range(self.layers):
            blk = lambda n: self.w(f"blocks.{l}.{n}")
            normed = self.rms(x, blk("norm1"))
            q, k, v = ((normed @ blk(n)).view(b, t, h, hd).transpose(1, 2) for n in ("wq", "wk", "wv"))
            if cache:
                k = torch.cat([cache[l][0], k], 2)
                v = torch.cat([cache[l][1], v], 2)
            fresh.append((k, v))
            att = torch.softmax(q @ k.transpose(2, 3) * scale + bias, dim=3) @ v
            x = x + att.transpose(1, 2).reshape(b, t, d) @ blk("wo")
            x = x + torch.nn.functional.silu(self.rms(x, blk("norm2")) @ blk("w1")) @ blk("w2")
        return self.rms(x, self.w("norm_f")) @ self.w("head"), fresh


def padded_inputs(seqs):
    """src/model/lm.rs `padded_inputs`."""
    lens = [max(len(s), 1) for s in seqs]
    t = max(lens, default=1)
    tokens = torch.zeros(len(seqs), t, dtype=torch.long)
    positions = torch.zeros(len(seqs), t, dtype=torch.long)
    ar = torch.arange(t)
    mask = torch.ones(len(seqs), t, t, dtype=torch.bool)
    for r, (s, n) in enumerate(zip(seqs, lens)):
        tokens[r, :len(s)] = torch.tensor(s, dtype=torch.long)
        positions[r] = ar.clamp(max=n - 1)
        mask[r] = ~((ar[None, :] <= ar[:, None]) & (ar[None, :] < n))
    return tokens, positions, mask, lens


def encode(model, prompts):
    tokens, positions, mask, lens = padded_inputs(prompts)
    logits, cache = model(tokens, positions, mask)
    last = logits[torch.arange(len(prompts)), torch.tensor(lens) - 1]
    return last, cache, lens


def continuation_logprobs(model, last, cache, lens, rows, conts, bias, temperature):
    """src/model/lm.rs `continuation_logprobs`: `[n, max_len]` log-probs (0 past the end)."""
    n, lmax = len(rows), max(max(len(c) for c in conts), 1)

    def norm(logits):
        if temperature != 1.0:
            logits = logits / temperature
        if bias is not None:
            logits = logits + bias[None, :]
        return torch.log_softmax(logits, dim=1)

    row_idx = torch.tensor(rows, dtype=torch.long)
    first = torch.tensor([c[0] for c in conts], dtype=torch.long)[:, None]
    parts = [norm(last[row_idx]).gather(1, first)]
    if lmax > 1:
        tp, t = cache[0][0].shape[2], lmax - 1
        toks = torch.zeros(n, t, dtype=torch.long)
        nxt = torch.zeros(n, t, dtype=torch.long)
        pos = torch.zeros(n, t, dtype=torch.long)
        mask = torch.zeros(n, t, tp + t, dtype=torch.bool)
        ar, kp = torch.arange(t), torch.arange(tp)
        causal = ar[None, :] > ar[:, None]
        for r, c in enumerate(conts):
            plen = lens[rows[r]]
            toks[r, :min(len(c), t)] = torch.tensor(c[:t], dtype=torch.long)
            nxt[r, :len(c) - 1] = torch.tensor(c[1:], dtype=torch.long)
            pos[r] = (plen + ar).clamp(max=model.context - 1)
            mask[r, :, :tp] = (kp >= plen)[None, :]
            mask[r, :, tp:] = causal
        sel = [(k[row_idx], v[row_idx]) for k, v in cache]
        logits, _ = model(toks, pos, mask, sel)
        lp = norm(logits.reshape(n * t, -1))
        parts.append(lp.gather(1, nxt.reshape(n * t, 1)).reshape(n, t))
    out = torch.cat(parts, 1)
    valid = torch.zeros(n, lmax, dtype=torch.bool)
    for r, c in enumerate(conts):
        valid[r, :len(c)] = True
    return out.masked_fill(~valid, 0.0), valid


def policy_log_probs(model, decisions, temperature, mean):
    """src/model/policy.rs `log_probs`: log-softmax over each decision's admissible actions."""
    last, cache, lens = encode(model, [d["prompt"] for d in decisions])
    rows, conts = [], []
    for i, d in enumerate(decisions):
        for a in d["actions"]:
            rows.append(i)
            conts.append(a)
    lp, _ = continuation_logprobs(model, last, cache, lens, rows, conts, None, 1.0)
    ll = lp.sum(1)
    if mean:
        ll = ll / torch.tensor([len(c) for c in conts], dtype=F)
    amax = max(max(len(d["actions"]) for d in decisions), 1)
    idx, pad, at = [], [], 0
    for d in decisions:
        k = len(d["actions"])
        idx += [at + j if j < k else 0 for j in range(amax)]
        pad += [j >= k for j in range(amax)]
        at += k
    logits = ll[torch.tensor(idx)].reshape(len(decisions), amax) / temperature
    logits = logits.masked_fill(torch.tensor(pad).reshape(len(decisions), amax), -1e9)
    return torch.log_softmax(logits, dim=1)


def reached(old):
    """The samples whose snapshot log-probabilities the stage computed: it skips those no
    optimizer step reaches (steps × minibatch below the samples), dumped as `null` (a decision)
    or `[]` (a response)."""
    return [i for i, v in enumerate(old)
            if v is not None and v != [] and not (isinstance(v, float) and math.isnan(v))]


def flat(o):
    return [x for r in o for x in (r if isinstance(r, list) else [r])]


class Update:
    """One model's update as the dump describes it."""

    def __init__(self, dump, ckpt):
        self.d = dump
        self.cfg, self.params = load_checkpoint(ckpt)
        allowed = dump.get("allowed")
        self.bias = None
        if dump["kind"] == "responses" and allowed is not None:
            self.bias = torch.full((self.cfg["vocab"],), -1e9)
            self.bias[torch.tensor(allowed, dtype=torch.long)] = 0.0

    def model(self):
        return Transformer(self.cfg, self.params)

    def log_probs(self, m, idx):
        """New log-probs `[b, len]`, validity `[b, len]` (float) for samples idx."""
        d = self.d
        if d["kind"] == "decisions":
            decs = [d["decisions"][i] for i in idx]
            lp = policy_log_probs(m, decs, d["temperature"], d["action_mean"])
            pick = torch.tensor([d["chosen"][i] for i in idx], dtype=torch.long)[:, None]
            return lp.gather(1, pick), torch.ones(len(idx), 1)
        prompts = [d["prompts"][i] for i in idx]
        conts = [d["responses"][i] for i in idx]
        last, cache, lens = encode(m, prompts)
        lp, valid = continuation_logprobs(m, last, cache, lens, list(range(len(idx))), conts,
                                          self.bias, d["temperature"])
        return lp, valid.to(F)

    def old(self, m, only=None):
        """Snapshot log-probs, in batches of 512 as the stage computes them; with `only`, of
        those samples alone (`[]` for the others: see `reached`)."""
        n = len(self.d["adv"])
        want = list(range(n)) if only is None else list(only)
        out = [[] for _ in range(n)]
        with torch.no_grad():
            for s in range(0, len(want), 512):
                idx = want[s:s + 512]
                lp, valid = self.log_probs(m, idx)
                for i, row, v in zip(idx, lp, valid):
                    out[i] = row[:int(v.sum())].tolist()
        return out

    def old_tensor(self, old, idx, width):
        t = torch.zeros(len(idx), width)
        for k, i in enumerate(idx):
            row = old[i] if isinstance(old[i], list) else [old[i]]
            t[k, :len(row)] = torch.tensor(row)
        return t

    def loss(self, m, old, idx):
        """src/model/ppo.rs `ppo_loss` (reference = old: the pre-update snapshot)."""
        s = self.d["settings"]
        new, valid = self.log_probs(m, idx)
        oldt = self.old_tensor(old, idx, new.shape[1])
        adv = torch.tensor([self.d["adv"][i] for i in idx], dtype=F)[:, None]
        c = s["log_ratio_clamp"]
        ratio = (new - oldt).clamp(-c, c).exp()
        pg = torch.maximum(-(ratio * adv), -(ratio.clamp(1 - s["clip_eps"], 1 + s["clip_eps"]) * adv))
        dl = (oldt - new).clamp(-c, c)
        k3 = dl.exp() - dl - 1.0
        count = valid.sum(1)
        return (((pg + s["kl_beta"] * k3) * valid).sum(1) / count).mean()

    def train(self, m, old, steps=None):
        """src/model/ppo.rs `train`: per step, micro-batch gradients summed (weighted by size),
        clipped to the global norm, one AdamW step. Returns (loss, grad_norm) per step."""
        s = self.d["settings"]
        params = [p for p in m.parameters() if p.requires_grad]  # adapters alone under LoRA
        opt = torch.optim.AdamW(params, lr=s["lr"], betas=(0.9, 0.999),
                                eps=s["adam_eps"], weight_decay=s["weight_decay"])
        out = []
        for micro in self.d["plan"][:steps]:
            total = sum(len(b) for b in micro)
            opt.zero_grad()
            loss_v = 0.0
            for batch in micro:
                w = len(batch) / total
                loss = self.loss(m, old, batch)
                loss_v += w * loss.item()
                (loss if len(micro) == 1 else loss * w).backward()
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
            if norm > s["grad_clip"]:
                for p in params:
                    p.grad.mul_(s["grad_clip"] / (norm + 1e-6))
            opt.step()
            out.append((loss_v, norm))
        return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def dump_dir(var, args):
    """$DUMP, or the dump directory of one iteration of the pipeline in `args` (default
    pipelines/gridnav.toml, then --set key=value ...) run with the dump variable `var` set."""
    dump = os.environ.get("DUMP")
    if dump:
        return dump
    pipeline = args[0] if args and not args[0].startswith("--") else os.path.join(ROOT, "pipelines", "gridnav.toml")
    sets = [a for a in args if a != pipeline]
    tmp = tempfile.mkdtemp(prefix="rla-torch-")
    dump = os.path.join(tmp, "dump")
    env = dict(os.environ, **{var: dump})
    cmd = [BIN, "run", pipeline, "--store", os.path.join(tmp, "runs"), "--set", "run.iterations=1", *sets, "-q"]
    print("running:", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, check=True)
    return dump


def main():
    dump = dump_dir("RLA_PIPE_BENCH_UPDATE", sys.argv[1:])
    rows = []
    for role in ("policy", "rm"):
        path = os.path.join(dump, f"{role}.json")
        if not os.path.exists(path):
            print(f"{role}: not trained in this iteration (no dump)")
            continue
        d = json.load(open(path))
        if str(d.get("weights") or "").endswith(".safetensors"):
            print(f"{role}: a pretrained model ({d['weights']}): skipped, see benches/smollm2_update.py")
            continue
        u = Update(d, os.path.join(dump, f"{role}.ckpt"))
        burn = d["metrics"]
        tokens = sum(m["tokens"] for m in burn)
        torch.set_num_threads(2)
        # Agreement: forward (snapshot), step 0 (loss, gradient norm), step 1 (loss after AdamW).
        seen = reached(d["old_logprobs"])
        old = u.old(u.model(), seen)
        mine, theirs = flat([old[i] for i in seen]), flat([d["old_logprobs"][i] for i in seen])
        assert len(mine) == len(theirs), f"snapshot sizes differ: {len(mine)} vs {len(theirs)}"
        lp_diff = max(abs(a - b) for a, b in zip(mine, theirs))
        steps = u.train(u.model(), d["old_logprobs"], steps=2)
        checks = {
            "snapshot log-prob max |Δ|": lp_diff,
            "step 0 loss rel. Δ": rel(steps[0][0], burn[0]["loss"]),
            "step 0 grad-norm rel. Δ": rel(steps[0][1], burn[0]["grad_norm"]),
            "step 1 loss rel. Δ": rel(steps[1][0], burn[1]["loss"]) if len(steps) > 1 else float("nan"),
        }
        print(f"  burn  steps 0, 1: loss {burn[0]['loss']:.9g}, {burn[1]['loss'] if len(burn) > 1 else float('nan'):.9g}; grad norm {burn[0]['grad_norm']:.9g}")
        print(f"  torch steps 0, 1: loss {steps[0][0]:.9g}, {steps[1][0] if len(steps) > 1 else float('nan'):.9g}; grad norm {steps[0][1]:.9g}")
        print(f"{role}: {len(d['adv'])} samples, {len(d['plan'])} optimizer steps, {tokens:,} tokens; "
              + "; ".join(f"{k} {v:.2e}" for k, v in checks.items()))
        ok = checks["step 0 loss rel. Δ"] <= 1e-4 and checks["step 0 grad-norm rel. Δ"] <= 1e-4
        print(f"  step 0 agrees within 1e-4: {'yes' if ok else 'NO'}")
        burn_tps = tokens / d["train_seconds"]
        rows.append((role, "burn (flex, as the stage ran)", d["cores"], d["train_seconds"], burn_tps, 1.0))
        for threads in (1, 2):
            torch.set_num_threads(threads)
            t = time.perf_counter()
            u.train(u.model(), d["old_logprobs"])
            dt = time.perf_counter() - t
            rows.append((role, "PyTorch", threads, dt, tokens / dt, (tokens / dt) / burn_tps))
    print(f"\ntorch {torch.__version__}\n")
    print("| model | implementation | threads | optimizer steps (s) | tokens/s | vs burn |")
    print("|---|---|---:|---:|---:|---:|")
    for role, impl, threads, sec, tps, ratio in rows:
        print(f"| {role} | {impl} | {threads} | {sec:.2f} | {tps:,.0f} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()
