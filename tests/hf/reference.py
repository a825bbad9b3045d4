#!/usr/bin/env python3
"""Independent numpy reference forward for Hugging Face causal LMs.

This is the reference the logits-parity tests compare our burn implementation
against. It is written from the `transformers` semantics of LlamaForCausalLM,
Qwen2ForCausalLM and Qwen3ForCausalLM, using only the standard library and
numpy (safetensors is parsed by hand), so it shares no code with the Rust side.

Usage:
    python3 tests/hf/reference.py MODEL_DIR IDS_JSON OUT_JSON [--greedy N] [--dtype f64|f32]
                                  [--adapter PEFT_DIR]

MODEL_DIR holds config.json and model.safetensors (or a sharded
model.safetensors.index.json). IDS_JSON holds a JSON list of token-id lists
(one batch, all the same length). OUT_JSON receives
    {"logits": [[[vocab floats] per position] per sequence]}
for the given ids, plus "generated": [[ids]] (the N new tokens per sequence,
full recompute each step) when --greedy N is given. Computation is float64
unless --dtype f32.

--adapter applies a PEFT LoRA adapter directory (adapter_config.json +
adapter_model.safetensors) the way peft's LoraLayer does without dropout:
y = x W^T + b + (lora_alpha / r) * (x A^T) B^T for every module named in
target_modules (of the layers in layers_to_transform, when set), with the keys
`base_model.model.<module>.lora_A.weight`.
"""
import argparse
import json
import math
import os
import struct

import numpy as np

ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base, out = 8 + n, {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        raw = data[base + start:base + end]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "F64":
            arr = np.frombuffer(raw, dtype="<f8")
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{name}: unsupported dtype {dt}")
        out[name] = arr.reshape(info["shape"])
    return out


def load_weights(model_dir, dtype):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        files = [single]
    else:
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            files = [os.path.join(model_dir, s) for s in sorted(set(json.load(f)["weight_map"].values()))]
    w = {}
    for path in files:
        w.update({k: v.astype(dtype) for k, v in read_safetensors(path).items()})
    return w


def load_adapter(adapter_dir, dtype):
    """PEFT adapter -> {module name: (A [r, in], B [out, r], scale)}."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    if cfg.get("peft_type") != "LORA" or cfg.get("use_rslora") or cfg.get("use_dora"):
        raise ValueError(f"unsupported adapter config {cfg}")
    scale = cfg["lora_alpha"] / cfg["r"]
    w = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    out = {}
    for key, a in w.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[len("base_model.model."):-len(".lora_A.weight")]
        if module.split(".")[-1] not in cfg["target_modules"]:
            raise ValueError(f"{key}: not a target module")
        # peft adapts only these layers' modules (null: every layer's).
        only = cfg.get("layers_to_transform")
        if only is not None and int(module.split(".layers.")[1].split(".")[0]) not in only:
            raise ValueError(f"{key}: layer not in layers_to_transform {only}")
        b = w[key.replace(".lora_A.", ".lora_B.")]
        out[module] = (a.astype(dtype), b.astype(dtype), scale)
    return out


def rope_inv_freq(cfg, head_dim):
    # transformers < 5: rope_theta + rope_scaling; transformers >= 5 saves both in rope_parameters
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    theta = rs.get("rope_theta", cfg.get("rope_theta")) or 10000.0
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling {rs}")
    # transformers.modeling_rope_utils._compute_llama3_parameters
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_ctx = rs["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_ctx / lo, old_ctx / hi
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama)


class Model:
    def __init__(self, model_dir, dtype=np.float64, adapter=None):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.arch = cfg["architectures"][0]
        if self.arch not in ARCHS:
            raise ValueError(f"unsupported architecture {self.arch}")
        self.dtype = dtype
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        head_dim = cfg.get("head_dim")
        if head_dim is None:  # Qwen3Config defaults head_dim to 128, the others to hidden/heads
            head_dim = 128 if self.arch == "Qwen3ForCausalLM" else cfg["hidden_size"] // self.n_heads
        self.head_dim = head_dim
        self.eps = cfg["rms_norm_eps"]
        self.inv_freq = rope_inv_freq(cfg, head_dim)
        self.w = load_weights(model_dir, dtype)
        self.lora = load_adapter(adapter, dtype) if adapter else {}
        if cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]

    def linear(self, x, name):
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")  # q/k/v bias (Qwen2, Llama attention_bias), mlp_bias
        y = y if b is None else y + b
        if name in self.lora:
            a, bb, scale = self.lora[name]
            y = y + scale * ((x @ a.T) @ bb.T)
        return y

    def rms_norm(self, x, weight):
        var = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(var + self.eps) * weight

    def forward(self, ids):
        """ids: int array [B, T] -> logits [B, T, vocab]."""
        B, T = ids.shape
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        x = self.w["model.embed_tokens.weight"][ids]
        freqs = np.outer(np.arange(T, dtype=np.float64), self.inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)  # [T, D]
        cos, sin = np.cos(emb).astype(self.dtype), np.sin(emb).astype(self.dtype)

        def rope(t):  # t: [B, heads, T, D]
            half = D // 2
            rot = np.concatenate([-t[..., half:], t[..., :half]], axis=-1)
            return t * cos + rot * sin

        mask = np.triu(np.full((T, T), -np.inf), k=1).astype(self.dtype)
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = self.linear(h, p + "self_attn.q_proj").reshape(B, T, H, D)
            k = self.linear(h, p + "self_attn.k_proj").reshape(B, T, KV, D)
            v = self.linear(h, p + "self_attn.v_proj").reshape(B, T, KV, D)
            if self.arch == "Qwen3ForCausalLM":  # per-head RMSNorm before RoPE
                q = self.rms_norm(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.rms_norm(k, self.w[p + "self_attn.k_norm.weight"])
            q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
            q, k = rope(q), rope(k)
            g = H // KV  # repeat_kv: kv head j serves query heads j*g .. (j+1)*g-1
            k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D) + mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            attn = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H * D)
            x = x + self.linear(attn, p + "self_attn.o_proj")
            h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            gate = self.linear(h, p + "mlp.gate_proj")
            act = gate / (1.0 + np.exp(-gate)) * self.linear(h, p + "mlp.up_proj")
            x = x + self.linear(act, p + "mlp.down_proj")
        x = self.rms_norm(x, self.w["model.norm.weight"])
        return x @ self.w["lm_head.weight"].T


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("ids_json")
    ap.add_argument("out_json")
    ap.add_argument("--greedy", type=int, default=0, metavar="N")
    ap.add_argument("--dtype", choices=["f64", "f32"], default="f64")
    ap.add_argument("--adapter", metavar="PEFT_DIR")
    a = ap.parse_args()
    model = Model(a.model_dir, np.float64 if a.dtype == "f64" else np.float32, a.adapter)
    with open(a.ids_json) as f:
        ids = np.array(json.load(f), dtype=np.int64)
    logits = model.forward(ids)
    out = {"logits": logits.astype(np.float64).tolist()}
    if a.greedy:
        seq, nxt = ids, logits[:, -1].argmax(-1)
        for step in range(a.greedy):
            seq = np.concatenate([seq, nxt[:, None]], axis=1)
            if step + 1 < a.greedy:
                nxt = model.forward(seq)[:, -1].argmax(-1)
        out["generated"] = seq[:, ids.shape[1]:].tolist()
    with open(a.out_json, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
