//! A Hugging Face `config.json` for the three decoder architectures rla-pipe loads
//! (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`), resolved into the shapes and
//! switches the burn model needs ([`HfArch`]), and the tensors a checkpoint must hold.

use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::Path;

/// The architectures rla-pipe implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
}

impl Architecture {
    /// The `architectures[0]` spelling in `config.json`.
    pub fn hf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    fn from_hf_name(name: &str) -> Option<Architecture> {
        [
            Architecture::Llama,
            Architecture::Qwen2,
            Architecture::Qwen3,
        ]
        .into_iter()
        .find(|a| a.hf_name() == name)
    }
}

/// The fields of `config.json` rla-pipe reads (every other key is kept verbatim in
/// [`HfArch::raw`] and written back on export).
#[derive(Debug, Clone, Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    /// transformers ≥ 5 writes `rope_theta` and the scaling inside one `rope_parameters`.
    rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "default_act")]
    hidden_act: String,
    max_position_embeddings: Option<usize>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
}

fn default_eps() -> f64 {
    1e-6
}

fn default_act() -> String {
    "silu".into()
}

/// A decoder's resolved shape and switches.
#[derive(Debug, Clone, PartialEq)]
pub struct HfArch {
    pub architecture: Architecture,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f64,
    /// RoPE inverse frequencies (`head_dim / 2`), scaling applied.
    pub inv_freq: Vec<f64>,
    pub tied: bool,
    /// q/k/v projections have a bias (Qwen2 always; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// The output projection has a bias (Llama with `attention_bias`).
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    pub max_positions: Option<usize>,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    /// The checkpoint's declared dtype (`torch_dtype`), as written.
    pub dtype: Option<String>,
    /// `config.json` as read (for export).
    pub raw: serde_json::Value,
}

impl HfArch {
    /// Read and resolve `DIR/config.json`.
    pub fn from_dir(dir: &Path) -> Result<HfArch> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::Model(format!(
                "{}: {e} (a Hugging Face model directory holds config.json, \
                 model.safetensors or model.safetensors.index.json, tokenizer.json)",
                path.display()
            ))
        })?;
        HfArch::from_json(&text).map_err(|e| match e {
            Error::Model(m) => Error::Model(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Resolve a `config.json` text.
    pub fn from_json(text: &str) -> Result<HfArch> {
        let raw: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::Model(format!("line {}: {e}", e.line())))?;
        let c: RawConfig = serde_path_to_error::deserialize(&raw)
            .map_err(|e| Error::Model(format!("key `{}`: {}", e.path(), e.inner())))?;
        let name = c.architectures.first().ok_or_else(|| {
            Error::Model(
                "key `architectures`: missing (expected e.g. [\"LlamaForCausalLM\"])".into(),
            )
        })?;
        let architecture = Architecture::from_hf_name(name).ok_or_else(|| {
            Error::Model(format!(
                "key `architectures`: unknown architecture {name:?} (supported: \
                 LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)"
            ))
        })?;
        if c.hidden_act != "silu" {
            return Err(Error::Model(format!(
                "key `hidden_act`: {:?} is not supported (silu only)",
                c.hidden_act
            )));
        }
        let heads = c.num_attention_heads;
        let kv_heads = c.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::Model(format!(
                "keys `num_attention_heads` ({heads}) / `num_key_value_heads` ({kv_heads}): \
                 the query heads must be a positive multiple of the key/value heads"
            )));
        }
        let head_dim = match c.head_dim {
            Some(d) => d,
            None if c.hidden_size % heads == 0 => c.hidden_size / heads,
            None => {
                return Err(Error::Model(format!(
                    "key `hidden_size` ({}) is not a multiple of `num_attention_heads` ({heads})",
                    c.hidden_size
                )));
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(Error::Model(format!(
                "key `head_dim`: {head_dim} must be even (RoPE rotates halves)"
            )));
        }
        if c.vocab_size == 0 || c.hidden_size == 0 || c.num_hidden_layers == 0 {
            return Err(Error::Model(
                "keys `vocab_size`, `hidden_size`, `num_hidden_layers` must be positive".into(),
            ));
        }
        // transformers ≥ 5 saves `rope_parameters: {rope_theta, rope_type, factor, ...}` in
        // place of `rope_theta` + `rope_scaling`: read either (a file saved by transformers 5
        // would otherwise fall back to theta 10000 without a word).
        let params = c.rope_parameters.as_ref().filter(|p| !p.is_null());
        let theta = match (c.rope_theta, params.and_then(|p| p.get("rope_theta"))) {
            (Some(t), _) => t,
            (None, Some(v)) => v.as_f64().ok_or_else(|| {
                Error::Model(format!(
                    "key `rope_parameters.rope_theta`: {v} is not a number"
                ))
            })?,
            (None, None) => 10000.0,
        };
        let (scaling, key) = match c.rope_scaling.as_ref().filter(|s| !s.is_null()) {
            Some(s) => (Some(s), "rope_scaling"),
            None => (params, "rope_parameters"),
        };
        let inv_freq = rope_inv_freq(theta, head_dim, scaling, key)?;
        let attention_bias = c.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            Architecture::Llama | Architecture::Qwen3 => (attention_bias, attention_bias),
        };
        Ok(HfArch {
            architecture,
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            rms_eps: c.rms_norm_eps,
            inv_freq,
            tied: c.tie_word_embeddings,
            qkv_bias,
            o_bias,
            mlp_bias: c.mlp_bias,
            qk_norm: architecture == Architecture::Qwen3,
            max_positions: c.max_position_embeddings,
            bos: c
                .bos_token_id
                .as_ref()
                .and_then(ids)
                .and_then(|v| v.first().copied()),
            eos: c.eos_token_id.as_ref().and_then(ids).unwrap_or_default(),
            dtype: c.torch_dtype.or(c.dtype),
            raw,
        })
    }

    /// Every tensor a checkpoint of this shape holds, with its Hugging Face name and shape
    /// (linear weights `[out, in]`). `lm_head.weight` is absent when the embeddings are tied.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (v, h, i) = (self.vocab, self.hidden, self.intermediate);
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            let mut push = |name: &str, shape: Vec<usize>| out.push((format!("{p}.{name}"), shape));
            push("input_layernorm.weight", vec![h]);
            push("self_attn.q_proj.weight", vec![q, h]);
            push("self_attn.k_proj.weight", vec![kv, h]);
            push("self_attn.v_proj.weight", vec![kv, h]);
            push("self_attn.o_proj.weight", vec![h, q]);
            if self.qkv_bias {
                push("self_attn.q_proj.bias", vec![q]);
                push("self_attn.k_proj.bias", vec![kv]);
                push("self_attn.v_proj.bias", vec![kv]);
            }
            if self.o_bias {
                push("self_attn.o_proj.bias", vec![h]);
            }
            if self.qk_norm {
                push("self_attn.q_norm.weight", vec![self.head_dim]);
                push("self_attn.k_norm.weight", vec![self.head_dim]);
            }
            push("post_attention_layernorm.weight", vec![h]);
            push("mlp.gate_proj.weight", vec![i, h]);
            push("mlp.up_proj.weight", vec![i, h]);
            push("mlp.down_proj.weight", vec![h, i]);
            if self.mlp_bias {
                push("mlp.gate_proj.bias", vec![i]);
                push("mlp.up_proj.bias", vec![i]);
                push("mlp.down_proj.bias", vec![h]);
            }
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tied {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }

    /// Number of parameters.
    pub fn parameters(&self) -> usize {
        self.expected_tensors()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }

    /// `config.json` for a checkpoint of this model saved as `dtype` (`"float32"`, …): the
    /// original keys, with `torch_dtype` updated.
    pub fn config_json(&self, dtype: &str) -> String {
        let mut raw = self.raw.clone();
        if let Some(o) = raw.as_object_mut() {
            o.insert(
                "torch_dtype".into(),
                serde_json::Value::String(dtype.into()),
            );
        }
        serde_json::to_string_pretty(&raw).expect("a JSON value serializes")
    }
}

/// Token ids from a `bos_token_id` / `eos_token_id` value (a number or a list).
fn ids(v: &serde_json::Value) -> Option<Vec<u32>> {
    match v {
        serde_json::Value::Number(n) => n.as_u64().map(|n| vec![n as u32]),
        serde_json::Value::Array(a) => a.iter().map(|x| x.as_u64().map(|n| n as u32)).collect(),
        _ => None,
    }
}

/// RoPE inverse frequencies `1 / theta^(2i/d)`, with `rope_scaling` applied as Hugging Face
/// does (`default`, `linear`, `llama3`); `key` names the config key the scaling came from
/// (`rope_scaling`, or transformers 5's `rope_parameters`) in errors.
pub fn rope_inv_freq(
    theta: f64,
    head_dim: usize,
    scaling: Option<&serde_json::Value>,
    key: &str,
) -> Result<Vec<f64>> {
    let base: Vec<f64> = (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64))
        .collect();
    let Some(s) = scaling.filter(|s| !s.is_null()) else {
        return Ok(base);
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let num = |field: &str| {
        s.get(field)
            .and_then(|v| v.as_f64())
            .ok_or_else(|| Error::Model(format!("key `{key}.{field}`: missing or not a number")))
    };
    match kind {
        "default" => Ok(base),
        "linear" => {
            let factor = num("factor")?;
            Ok(base.into_iter().map(|f| f / factor).collect())
        }
        "llama3" => {
            let factor = num("factor")?;
            let low = num("low_freq_factor")?;
            let high = num("high_freq_factor")?;
            let old = num("original_max_position_embeddings")?;
            let (low_wavelen, high_wavelen) = (old / low, old / high);
            Ok(base
                .into_iter()
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect())
        }
        other => Err(Error::Model(format!(
            "key `{key}.rope_type`: {other:?} is not supported (default, linear, llama3)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = r#"{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 64,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
        "eos_token_id": [1, 2], "torch_dtype": "bfloat16", "some_future_key": {"a": 1}}"#;

    #[test]
    fn resolves_qwen3_switches_and_tensor_list() {
        let a = HfArch::from_json(QWEN3).unwrap();
        assert_eq!(a.architecture, Architecture::Qwen3);
        assert!(a.qk_norm && a.tied && !a.qkv_bias);
        assert_eq!((a.heads, a.kv_heads, a.head_dim), (4, 2, 16));
        assert_eq!(a.eos, vec![1, 2]);
        let t = a.expected_tensors();
        assert!(t.iter().all(|(n, _)| n != "lm_head.weight"));
        let q = t
            .iter()
            .find(|(n, _)| n == "model.layers.1.self_attn.q_proj.weight");
        assert_eq!(q.unwrap().1, vec![64, 32]);
        let k = t
            .iter()
            .find(|(n, _)| n == "model.layers.0.self_attn.k_norm.weight");
        assert_eq!(k.unwrap().1, vec![16]);
        // 64·32 + 2·(32 + 64·32 + 2·32·32 + 32·64 + 2·16 + 32 + 3·48·32) + 32
        assert_eq!(
            a.parameters(),
            2048 + 2 * (32 + 2048 + 2048 + 2048 + 32 + 32 + 4608) + 32
        );
        assert!(a.config_json("float32").contains("\"some_future_key\""));
    }

    #[test]
    fn errors_name_the_key() {
        let e = HfArch::from_json(&QWEN3.replace("Qwen3ForCausalLM", "GPT2LMHeadModel"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("architectures") && e.contains("GPT2LMHeadModel"),
            "{e}"
        );
        let e = HfArch::from_json(&QWEN3.replace("\"vocab_size\": 64", "\"vocab_size\": \"x\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("vocab_size"), "{e}");
        let e = HfArch::from_json(
            &QWEN3.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("num_key_value_heads"), "{e}");
    }

    #[test]
    fn transformers_5_rope_parameters_are_read() {
        // transformers ≥ 5 saves theta and scaling as one `rope_parameters` object.
        let old = HfArch::from_json(QWEN3).unwrap();
        let v5 = QWEN3.replace(
            "\"rope_theta\": 1000000.0",
            "\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}",
        );
        assert_ne!(v5, QWEN3);
        assert_eq!(HfArch::from_json(&v5).unwrap().inv_freq, old.inv_freq);
        let linear = v5.replace("\"default\"", "\"linear\", \"factor\": 4.0");
        let scaled = HfArch::from_json(&linear).unwrap().inv_freq;
        assert!((scaled[1] - old.inv_freq[1] / 4.0).abs() < 1e-18);
        let e = HfArch::from_json(&v5.replace("\"default\"", "\"linear\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rope_parameters.factor"), "{e}");
    }

    #[test]
    fn llama3_rope_scaling_matches_hugging_face() {
        // Hugging Face `_compute_llama3_parameters` with factor 8, low 1, high 4, old 8192
        // on theta 500000, head_dim 64: high frequencies kept, low ones divided by 8, the band
        // between interpolated.
        let s = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let base = rope_inv_freq(500000.0, 64, None, "rope_scaling").unwrap();
        let scaled = rope_inv_freq(500000.0, 64, Some(&s), "rope_scaling").unwrap();
        assert_eq!(scaled[0], base[0]);
        assert!((scaled[31] - base[31] / 8.0).abs() < 1e-18);
        let mid: Vec<usize> = (0..32)
            .filter(|&i| {
                let w = 2.0 * std::f64::consts::PI / base[i];
                (2048.0..=8192.0).contains(&w)
            })
            .collect();
        assert!(!mid.is_empty());
        for i in mid {
            assert!(scaled[i] < base[i] && scaled[i] > base[i] / 8.0);
        }
        let e = rope_inv_freq(
            1e4,
            8,
            Some(&serde_json::json!({"rope_type": "yarn"})),
            "rope_scaling",
        );
        assert!(e.unwrap_err().to_string().contains("yarn"));
    }
}
