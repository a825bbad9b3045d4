#!/usr/bin/env python3
"""The `update` stage on a pretrained model (SmolLM2-135M-Instruct) against PyTorch +
Hugging Face `transformers` (CPU): the same samples, PPO loss, micro-batches, gradient clipping
and AdamW, on the same weights.

1. `rla-pipe run pipelines/household-smollm2.toml` (one small iteration, a temporary store)
   with RLA_PIPE_BENCH_UPDATE set: the update stage writes, per model, its samples (token
   ids), settings, optimizer plan, snapshot log-probabilities, burn's per-step metrics and
   seconds, and the weights it started from — for a pretrained model `<role>.safetensors`
   (f32, Hugging Face key names) and the model directory `hf_dir` (src/stages/update.rs,
   `bench_dump`; src/stages/bench.rs).
2. Here, for every role whose dump is a pretrained model, `transformers` loads `hf_dir` and the
   dumped weights over it, and the same update runs in PyTorch on 2 threads: the snapshot
   log-probabilities (no grad), then every optimizer step of the plan (forward + backward +
   clip + AdamW, torch's AdamW as benches/torch_update.py uses it). The samples are scored as
   rla-pipe scores them (src/model/tree.rs): packed into prefix-tree rows (a decision's prompt
   once, every admissible action a leaf; responses whose prompts share ≥ 16 leading tokens
   share a stem), passed to the model as one custom 4-D attention mask with explicit
   position ids, the head applied only at the positions that predict a scored token.
3. Checks: snapshot log-probabilities (max abs difference), step 0's loss and gradient norm
   (the backward pass) and step 1's loss (after one AdamW step), relative to burn's; seconds
   and tokens/s of the snapshot and of the optimizer steps (tokens as burn counts them:
   prompts + every scored continuation), rla-pipe (as the stage ran) vs PyTorch (2 threads).
   Exits 1 when the snapshot log-probabilities differ by more than 1e-3 or step 0's loss by
   more than 1e-3 relative (absolute below a loss of 1e-3); on cuda 5e-3 and 5e-2 (burn-cuda's
   TF32 products, see LP_TOL); timing never fails.

With low-rank adapters (`--set policy.lora.rank=8 ...`) the dump holds the adapters alone
(`<role>.adapter.safetensors`, PEFT's keys) and `lora` (rank, alpha, targets): PyTorch then
loads `hf_dir` and the adapters with `peft` (`PeftModel.from_pretrained(..., is_trainable=True)`,
installed with pip if missing) and trains the adapters alone, as rla-pipe does.

Usage:  python3 benches/smollm2_update.py [PIPELINE.toml] [--set key=value ...]
        (no arguments: pipelines/household-smollm2.toml with the small CPU sets in
        DEFAULT_SETS; otherwise run.iterations=1 then the given sets. DUMP=dir reuses a dump
        instead of running rla-pipe)
Env:    RLA_PIPE_BIN (default: $CARGO_TARGET_DIR/release/rla-pipe if built, else debug/),
        ATTN (transformers' attn_implementation: sdpa, the default, or eager),
        TORCH_DEVICE (cpu, the default, on 2 threads; or cuda: PyTorch on the GPU, for a dump
        made with run.device = "cuda" — benches/gpu.sh)
Needs:  torch, numpy, transformers, safetensors (installed with pip if missing); the model
        directory the pipeline names (models/smollm2-135m, see the pipeline's header)
"""
import json, os, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_update import F, ROOT, TARGET, Update, flat, reached, rel, torch  # noqa: E402  (installs torch, numpy)

try:
    import transformers
    from safetensors.torch import load_file
except ImportError:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "transformers", "safetensors"], check=True)
    import transformers
    from safetensors.torch import load_file

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

BIN = os.environ.get("RLA_PIPE_BIN") or next(
    (p for p in (os.path.join(TARGET, k, "rla-pipe") for k in ("release", "debug")) if os.path.exists(p)),
    os.path.join(TARGET, "debug", "rla-pipe"))
ATTN = os.environ.get("ATTN", "sdpa")
THREADS = 2
DEVICE = os.environ.get("TORCH_DEVICE", "cpu")
TORCH_LABEL = f"{THREADS} threads" if DEVICE == "cpu" else DEVICE
# The checks' tolerances. On cuda the dump comes from burn-cuda, whose f32 matrix products run
# in TF32 on the tensor cores (10-bit mantissa: log-probabilities move by ~1e-3; tests/it/gpu.rs)
# while PyTorch keeps full f32 (its default, allow_tf32 off): 5e-3 and 5e-2.
LP_TOL, LOSS_TOL = (1e-3, 1e-3) if DEVICE == "cpu" else (5e-3, 5e-2)
PIPELINE = "pipelines/household-smollm2.toml"
DEFAULT_SETS = ["run.iterations=1", "env.initial_tasks=4", "rollout.slots_per_iter=2", "eval.tasks=2",
                "eval.ood_tasks=2", "env.max_steps=6", "reward_model.max_tokens=16",
                "reward.policy_acc_min=0", "reward.policy_acc_max=1",
                "pretrain.enabled=false", "policy.lora.rank=0", "reward_model.lora.rank=0",
                "update.policy_lr=1e-5", "update.rm_lr=1e-5"]

# src/stages/update.rs, src/model/reward.rs, src/model/tree.rs.
SNAPSHOT_BATCH = 512
TREE_MIN_SHARED = 16
TREE_MAX_ROW = 1024
# src/model/tree.rs `attention_budget`: the same environment variable moves both sides
ATTENTION_BUDGET = int(os.environ.get("RLA_PIPE_ATTENTION_BUDGET") or (1 << 21 if DEVICE == "cpu" else 1 << 23))


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def packed_len(row):
    """Tokens a tree row feeds the model: the stem, then every leaf but its last token."""
    stem, leaves = row
    return len(stem) + sum(max(len(l) - 1, 0) for l, _ in leaves)


def pack(prompts, responses, min_shared=TREE_MIN_SHARED, max_row=TREE_MAX_ROW):
    """src/model/tree.rs `pack`: rows `(stem, [(leaf, scored_from)])` and, per sample in input
    order, its leaf's index in (row, leaf) order."""
    order = sorted(range(len(prompts)), key=lambda i: (prompts[i], i))
    groups = []  # [stem length, members]
    for i in order:
        p = prompts[i]
        if groups:
            g = groups[-1]
            first = prompts[g[1][0]]
            shared = min(common_prefix(first[:g[0]], p), len(p))
            fed = lambda k: len(prompts[k]) - shared + len(responses[k]) - 1
            length = shared + sum(fed(k) for k in g[1]) + fed(i)
            half = 2 * shared >= max(len(p), len(first))
            if shared >= max(min_shared, 1) and half and length <= max_row:
                g[0] = shared
                g[1].append(i)
                continue
        groups.append([len(p), [i]])
    slot, rows, k = [0] * len(prompts), [], 0
    for stem, members in groups:
        leaves = []
        for i in members:
            slot[i] = k
            k += 1
            rest = prompts[i][stem:]
            leaves.append((rest + responses[i], len(rest)))
        rows.append((prompts[members[0]][:stem], leaves))
    return rows, slot


def tree_chunk(model, rows, bias, temperature):
    """src/model/tree.rs `tree_chunk`: one model call over packed rows; returns the scored
    log-probabilities of every leaf, flat in (row, leaf, token) order, and per leaf its count."""
    b = len(rows)
    t = max(max(packed_len(r) for r in rows), 1)
    ctx = model.config.max_position_embeddings
    tokens = torch.zeros(b, t, dtype=torch.long)
    positions = torch.zeros(b, t, dtype=torch.long)
    visible = torch.zeros(b, t, t, dtype=torch.bool)
    at, target, scored = [], [], []
    for r, (stem, leaves) in enumerate(rows):
        assert stem, "a tree row needs a non-empty stem"
        s = len(stem)
        fed, pos = list(stem), list(range(s))
        visible[r, :s, :s] = torch.ones(s, s, dtype=torch.bool).tril()
        for leaf, frm in leaves:
            assert frm < len(leaf), "a leaf needs a scored token"
            start, n_in = len(fed), len(leaf) - 1
            fed += leaf[:n_in]
            pos += range(s, s + n_in)
            visible[r, start:start + n_in, :s] = True
            visible[r, start:start + n_in, start:start + n_in] = torch.ones(n_in, n_in, dtype=torch.bool).tril()
            for j in range(frm, len(leaf)):
                q = s - 1 if j == 0 else start + j - 1
                at.append(r * t + q)
                target.append(leaf[j])
            scored.append(len(leaf) - frm)
        used = len(fed)
        tokens[r, :used] = torch.tensor(fed, dtype=torch.long)
        positions[r, :used] = torch.tensor(pos, dtype=torch.long).clamp(max=ctx - 1)
        for q in range(used, t):  # padding sees itself only; nothing reads it
            visible[r, q, q] = True
    mask = torch.zeros(b, 1, t, t, dtype=F).masked_fill(~visible[:, None], torch.finfo(F).min)
    hidden = model.model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                         use_cache=False).last_hidden_state
    logits = model.lm_head(hidden.reshape(b * t, -1)[torch.tensor(at)])
    if temperature != 1.0:
        logits = logits / temperature
    if bias is not None:
        logits = logits + bias[None, :]
    lp = torch.log_softmax(logits, dim=1).gather(1, torch.tensor(target)[:, None])[:, 0]
    return lp, scored


def tree_logprobs(model, rows, bias, temperature):
    """src/model/tree.rs `tree_logprobs`: `[leaves, longest scored]` (0 past a leaf's end) and
    the validity mask, rows sent in consecutive chunks within the attention budget."""
    flat, scored, lo = [], [], 0
    while lo < len(rows):
        hi, t = lo + 1, packed_len(rows[lo])
        while hi < len(rows):
            t2 = max(t, packed_len(rows[hi]))
            if (hi + 1 - lo) * t2 * t2 > ATTENTION_BUDGET:
                break
            t, hi = t2, hi + 1
        lp, sc = tree_chunk(model, rows[lo:hi], bias, temperature)
        flat.append(lp)
        scored += sc
        lo = hi
    per_leaf = torch.cat(flat).split(scored)
    lp = torch.nn.utils.rnn.pad_sequence(list(per_leaf), batch_first=True)
    valid = torch.zeros(lp.shape, dtype=torch.bool)
    for i, c in enumerate(scored):
        valid[i, :c] = True
    return lp, valid


class HfUpdate(Update):
    """A pretrained model's update as the dump describes it: torch_update's `Update` (snapshot
    batches, PPO loss, accumulation, clipping, AdamW) with rla-pipe's prefix-tree scoring on
    the Hugging Face model."""

    def __init__(self, dump, weights):
        self.d = dump
        hf_dir = dump["hf_dir"]
        self.hf_dir = hf_dir if os.path.isabs(hf_dir) else os.path.join(ROOT, hf_dir)
        self.weights = weights
        self.bias = None
        allowed = dump.get("allowed")
        if dump["kind"] == "responses" and allowed is not None:
            vocab = json.load(open(os.path.join(self.hf_dir, "config.json")))["vocab_size"]
            self.bias = torch.full((vocab,), -1e9)
            self.bias[torch.tensor(allowed, dtype=torch.long)] = 0.0

    def model(self):
        m = transformers.AutoModelForCausalLM.from_pretrained(self.hf_dir, dtype=F, attn_implementation=ATTN)
        if self.d.get("lora"):
            return self.peft_model(m).to(DEVICE)
        state = load_file(self.weights)
        missing, unexpected = m.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if m.config.tie_word_embeddings else set()
        assert not set(missing) - tied and not unexpected, \
            f"{self.weights}: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}"
        if tied:
            assert m.lm_head.weight is m.model.embed_tokens.weight, "tied head not tied"
        m.eval()  # no dropout (the attention dropout is 0 anyway); gradients still flow
        return m.to(DEVICE)

    def peft_model(self, m):
        """The base model with the dumped adapters (PEFT), only they trainable."""
        try:
            import peft
        except ImportError:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "peft"], check=True)
            import peft
        lora = self.d["lora"]
        adir = tempfile.mkdtemp(prefix="rla-adapter-")
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora["rank"],
                   "lora_alpha": lora["alpha"], "lora_dropout": 0.0, "target_modules": lora["targets"],
                   "bias": "none", "base_model_name_or_path": self.hf_dir},
                  open(os.path.join(adir, "adapter_config.json"), "w"))
        os.symlink(os.path.abspath(self.weights), os.path.join(adir, "adapter_model.safetensors"))
        pm = peft.PeftModel.from_pretrained(m, adir, is_trainable=True)
        pm.eval()
        trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)
        print(f"peft {peft.__version__}: {trainable:,} trainable parameters (the adapters)")
        # tree_chunk calls `model.model(...)` and `model.lm_head`: the wrapped causal LM.
        return pm.base_model.model

    def log_probs(self, m, idx):
        """New log-probs `[b, len]`, validity `[b, len]` (float) for samples idx."""
        d = self.d
        if d["kind"] == "decisions":
            # src/model/policy.rs `log_probs`: one row per decision, every action a leaf.
            decs = [d["decisions"][i] for i in idx]
            rows = [(x["prompt"], [(a, 0) for a in x["actions"]]) for x in decs]
            lp, _ = tree_logprobs(m, rows, None, 1.0)
            ll = lp.sum(1)
            lens = [len(a) for x in decs for a in x["actions"]]
            if d["action_mean"]:
                ll = ll / torch.tensor(lens, dtype=F)
            amax = max(max(len(x["actions"]) for x in decs), 1)
            gather, pad, at = [], [], 0
            for x in decs:
                k = len(x["actions"])
                gather += [at + j if j < k else 0 for j in range(amax)]
                pad += [j >= k for j in range(amax)]
                at += k
            logits = ll[torch.tensor(gather)].reshape(len(decs), amax) / d["temperature"]
            logits = logits.masked_fill(torch.tensor(pad).reshape(len(decs), amax), -1e9)
            pick = torch.tensor([d["chosen"][i] for i in idx], dtype=torch.long)[:, None]
            return torch.log_softmax(logits, dim=1).gather(1, pick), torch.ones(len(idx), 1)
        # src/model/reward.rs `packed_response_log_probs`.
        rows, slot = pack([d["prompts"][i] for i in idx], [d["responses"][i] for i in idx])
        lp, valid = tree_logprobs(m, rows, self.bias, d["temperature"])
        order = torch.tensor(slot)
        return lp[order], valid[order].to(F)


def dump_dir(args):
    """$DUMP, or the dump directory of one iteration of the pipeline, run from the repository
    root (the pipeline's model paths are relative to it) into a temporary store."""
    dump = os.environ.get("DUMP")
    if dump:
        return dump
    if not args:
        pipeline, sets = PIPELINE, DEFAULT_SETS
    else:
        named = not args[0].startswith("--")
        pipeline = os.path.abspath(args[0]) if named else PIPELINE
        sets = ["run.iterations=1", *(a for a in args[named:] if a != "--set")]
    tmp = tempfile.mkdtemp(prefix="rla-smollm2-")
    dump = os.path.join(tmp, "dump")
    env = dict(os.environ, RLA_PIPE_BENCH_UPDATE=dump)
    cmd = [BIN, "run", pipeline, "--set", f"run.store={os.path.join(tmp, 'runs')}"]
    for s in sets:
        cmd += ["--set", s]
    cmd.append("-q")
    print("running:", " ".join(cmd), flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=ROOT, check=True)
    print(f"rla-pipe: {time.perf_counter() - t:.0f} s; dump in {dump}", flush=True)
    return dump


def main():
    dump = dump_dir(sys.argv[1:])
    torch.set_num_threads(THREADS)
    if DEVICE != "cpu":
        torch.set_default_device(DEVICE)  # every tensor the update makes lives there
    ok, any_role = True, False
    for role in ("policy", "rm"):
        path = os.path.join(dump, f"{role}.json")
        if not os.path.exists(path):
            print(f"\n{role}: not trained in this iteration (no dump)")
            continue
        d = json.load(open(path))
        if not d.get("hf_dir"):
            print(f"\n{role}: the small transformer (see benches/torch_update.py)")
            continue
        any_role = True
        u = HfUpdate(d, os.path.join(dump, d["weights"]))
        m = u.model()
        burn = d["metrics"]
        tokens = sum(x["tokens"] for x in burn)
        t = time.perf_counter()
        # Only the samples the stage's snapshot computed (those some optimizer step reaches).
        seen = reached(d["old_logprobs"])
        old = u.old(m, seen)
        snap_s = time.perf_counter() - t
        mine, theirs = flat([old[i] for i in seen]), flat([d["old_logprobs"][i] for i in seen])
        assert len(mine) == len(theirs), f"snapshot sizes differ: {len(mine)} vs {len(theirs)}"
        lp_diff = max(abs(a - b) for a, b in zip(mine, theirs))
        t = time.perf_counter()
        steps = u.train(m, d["old_logprobs"])  # burn's snapshot as "old", as the stage trains
        train_s = time.perf_counter() - t
        nan = float("nan")
        b1 = burn[1]["loss"] if len(burn) > 1 else nan
        t1 = steps[1][0] if len(steps) > 1 else nan
        loss_d = abs(steps[0][0] - burn[0]["loss"]) / max(abs(burn[0]["loss"]), 1e-3)
        role_ok = lp_diff <= LP_TOL and loss_d <= LOSS_TOL
        ok &= role_ok
        burn_tps, torch_tps = tokens / d["train_seconds"], tokens / train_s
        print(f"\n## {role} ({d['kind']}): {len(d['adv'])} samples, {len(d['plan'])} optimizer steps "
              f"({', '.join(str(x['samples']) for x in burn)} samples), {tokens:,} tokens\n")
        burn_label = f"burn, {d['cores']} cores" if DEVICE == "cpu" else "burn-cuda"
        print(f"| {role} | rla-pipe ({burn_label}) | PyTorch ({TORCH_LABEL}) | difference |")
        print("|---|---:|---:|---:|")
        print(f"| snapshot log-probs ({len(mine)} of {len(seen)} samples) | | | max abs {lp_diff:.2e} |")
        print(f"| step 0 loss | {burn[0]['loss']:.9g} | {steps[0][0]:.9g} | rel {rel(steps[0][0], burn[0]['loss']):.2e} |")
        print(f"| step 0 grad norm | {burn[0]['grad_norm']:.9g} | {steps[0][1]:.9g} | rel {rel(steps[0][1], burn[0]['grad_norm']):.2e} |")
        print(f"| step 1 loss | {b1:.9g} | {t1:.9g} | rel {rel(t1, b1) if len(steps) > 1 else nan:.2e} |")
        print(f"| snapshot (s) | {d['snapshot_seconds']:.2f} | {snap_s:.2f} | {d['snapshot_seconds'] / snap_s:.2f}× the time |")
        print(f"| optimizer steps (s) | {d['train_seconds']:.2f} | {train_s:.2f} | {d['train_seconds'] / train_s:.2f}× the time |")
        print(f"| optimizer steps (tokens/s) | {burn_tps:,.0f} | {torch_tps:,.0f} | rla-pipe/torch {burn_tps / torch_tps:.2f}× |")
        print(f"\n{role}: snapshot within {LP_TOL:g} and step 0 loss within {LOSS_TOL:g}: {'yes' if role_ok else 'NO'}", flush=True)
        del m
    print(f"\ntorch {torch.__version__}, transformers {transformers.__version__}, attention {ATTN}, "
          f"{TORCH_LABEL}, f32; rla-pipe {BIN if not os.environ.get('DUMP') else '(dump ' + dump + ')'}")
    if not any_role:
        print("no pretrained model was trained: nothing compared")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
