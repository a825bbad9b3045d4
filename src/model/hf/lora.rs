//! Low-rank adapters (LoRA) on a pretrained model: a target projection `y = x·W (+ b)` becomes
//! `y = x·W (+ b) + (α / r)·(x·A)·B` with `A [in, r]` and `B [r, out]`; only `A` and `B` train
//! (the base weights are frozen: no gradients, no optimizer state).
//!
//! As PEFT initialises them: `A` uniform in `±1/√in` (PyTorch's `kaiming_uniform_(a = √5)`),
//! seeded per (layer, projection); `B` zero, so a fresh adapter leaves the model unchanged.
//!
//! An adapter is stored as PEFT writes `adapter_model.safetensors`: f32 tensors
//! `base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_A.weight` (`[r, in]`) and
//! `….lora_B.weight` (`[out, r]`), with one metadata key recording the base model's blake3
//! (`rla_pipe.base_blake3`) beside PEFT's `format = pt`, in a fixed byte layout
//! ([`super::weights::write_safetensors`]): the same adapter gives the same bytes.

pub use super::adapter::{LayerLora, Lora, LoraSpec};
use super::arch::{CausalLm, DecoderLayer};
use crate::determinism::{Rng, derive_seed};
use crate::error::{Error, Result};
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// A target's place in a layer: its module (`self_attn` / `mlp`) and `(in, out)`.
fn place(layer: &DecoderLayer<impl Backend>, target: &str) -> (&'static str, [usize; 2]) {
    let a = &layer.self_attn;
    let m = &layer.mlp;
    let (module, w) = match target {
        "q_proj" => ("self_attn", &a.q_proj.weight),
        "k_proj" => ("self_attn", &a.k_proj.weight),
        "v_proj" => ("self_attn", &a.v_proj.weight),
        "o_proj" => ("self_attn", &a.o_proj.weight),
        "gate_proj" => ("mlp", &m.gate_proj.weight),
        "up_proj" => ("mlp", &m.up_proj.weight),
        "down_proj" => ("mlp", &m.down_proj.weight),
        other => unreachable!("not a LoRA target: {other}"),
    };
    (module, w.shape().dims())
}

/// What every adapter tensor's PEFT key starts with, before the layer's index.
const LAYERS_PREFIX: &str = "base_model.model.model.layers.";

/// PEFT's key prefix of a layer's target.
fn key(layer: usize, module: &str, target: &str) -> String {
    format!("{LAYERS_PREFIX}{layer}.{module}.{target}")
}

/// The adapters' tensors: `(PEFT key, shape, f32 values)`, sorted by key.
type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Freeze `model`'s weights and give it fresh adapters: `A` seeded from `seed`, `B` zero.
pub fn attach_fresh<B: Backend>(
    model: CausalLm<B>,
    spec: &LoraSpec,
    seed: u64,
    device: &B::Device,
) -> CausalLm<B> {
    let mut tensors: Tensors = Vec::new();
    let total = model.model.layers.len();
    for (l, layer) in model.model.layers.iter().enumerate() {
        if !spec.covers(l, total) {
            continue;
        }
        for t in &spec.targets {
            let (module, [d_in, d_out]) = place(layer, t);
            let mut rng = Rng::new(derive_seed(seed, &["lora", &l.to_string(), t]));
            let bound = 1.0 / (d_in as f64).sqrt();
            let a: Vec<f32> = (0..spec.rank * d_in)
                .map(|_| ((rng.unit() * 2.0 - 1.0) * bound) as f32)
                .collect();
            let k = key(l, module, t);
            tensors.push((format!("{k}.lora_A.weight"), vec![spec.rank, d_in], a));
            tensors.push((
                format!("{k}.lora_B.weight"),
                vec![d_out, spec.rank],
                vec![0.0; d_out * spec.rank],
            ));
        }
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    attach(model, spec, &tensors, device).expect("fresh adapters fit their model")
}

/// Freeze `model`'s weights and give it the adapters of `bytes` (an adapter file, named
/// `what` in errors).
pub fn attach_bytes<B: Backend>(
    model: CausalLm<B>,
    spec: &LoraSpec,
    bytes: &[u8],
    what: &str,
    device: &B::Device,
) -> Result<CausalLm<B>> {
    let (tensors, _) = decode(bytes, what)?;
    attach(model, spec, &tensors, device)
}

fn attach<B: Backend>(
    model: CausalLm<B>,
    spec: &LoraSpec,
    tensors: &Tensors,
    device: &B::Device,
) -> Result<CausalLm<B>> {
    let mut model = model.no_grad();
    let total = model.model.layers.len();
    if spec.layers > total {
        return Err(Error::Model(format!(
            "lora.layers = {}: the model has {total} decoder layers",
            spec.layers
        )));
    }
    // Each tensor is taken once; what is left at the end is not an adapter of the targets.
    let mut left: std::collections::BTreeMap<&str, (&Vec<usize>, &Vec<f32>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), (s, v)))
        .collect();
    let mut take = |name: &str, shape: &[usize]| -> Result<Tensor<B, 2>> {
        let (s, v) = left
            .remove(name)
            .ok_or_else(|| Error::Model(format!("adapter: tensor `{name}` is missing")))?;
        if s != shape {
            return Err(Error::Model(format!(
                "adapter: tensor `{name}` has shape {s:?}, the model and lora.rank imply {shape:?}"
            )));
        }
        // PEFT's `[out, in]` → burn's `[in, out]`.
        Ok(Tensor::<B, 2>::from_data(TensorData::new(v.clone(), [s[0], s[1]]), device).transpose())
    };
    for (l, layer) in model.model.layers.iter_mut().enumerate() {
        if !spec.covers(l, total) {
            // Below the adapted layers: frozen, and outside the autodiff graph.
            continue;
        }
        let mut adapters = LayerLora {
            q_proj: None,
            k_proj: None,
            v_proj: None,
            o_proj: None,
            gate_proj: None,
            up_proj: None,
            down_proj: None,
        };
        for t in &spec.targets {
            let (module, [d_in, d_out]) = place(layer, t);
            let k = key(l, module, t);
            let a = take(&format!("{k}.lora_A.weight"), &[spec.rank, d_in])?;
            let b = take(&format!("{k}.lora_B.weight"), &[d_out, spec.rank])?;
            *adapters.slot(t) = Some(Lora {
                a: Param::from_tensor(a),
                b: Param::from_tensor(b),
            });
        }
        layer.lora = Some(adapters);
    }
    if let Some(extra) = left.keys().next() {
        return Err(Error::Model(format!(
            "adapter: tensor `{extra}` is not an adapter of the configured targets {:?}",
            spec.targets
        )));
    }
    model.lora = Some(spec.clone());
    Ok(model)
}

/// The model with every adapter folded into its weights (`W + (α/r)·A·B`), no adapters left:
/// for inference, and for a merged export.
pub fn merge<B: Backend>(mut model: CausalLm<B>) -> CausalLm<B> {
    let Some(spec) = model.lora.take() else {
        return model;
    };
    let scale = spec.scale();
    for layer in model.model.layers.iter_mut() {
        let Some(adapters) = layer.lora.take() else {
            continue;
        };
        for t in &spec.targets {
            let Some(l) = adapters.get(t) else { continue };
            let d = l.a.val().matmul(l.b.val()).mul_scalar(scale);
            let w = match t.as_str() {
                "q_proj" => &mut layer.self_attn.q_proj.weight,
                "k_proj" => &mut layer.self_attn.k_proj.weight,
                "v_proj" => &mut layer.self_attn.v_proj.weight,
                "o_proj" => &mut layer.self_attn.o_proj.weight,
                "gate_proj" => &mut layer.mlp.gate_proj.weight,
                "up_proj" => &mut layer.mlp.up_proj.weight,
                "down_proj" => &mut layer.mlp.down_proj.weight,
                other => unreachable!("not a LoRA target: {other}"),
            };
            *w = Param::from_tensor(w.val() + d);
        }
    }
    model
}

/// The model's adapters as an adapter file (PEFT's keys and layout), recording `base` (the
/// base weights' blake3).
pub fn to_bytes<B: Backend>(model: &CausalLm<B>, base: &str) -> Result<Vec<u8>> {
    let spec = model
        .lora
        .as_ref()
        .ok_or_else(|| Error::Model("the model has no adapters".into()))?;
    let mut tensors: Tensors = Vec::new();
    for (l, layer) in model.model.layers.iter().enumerate() {
        for t in &spec.targets {
            let Some(ad) = layer.lora.as_ref().and_then(|x| x.get(t)) else {
                continue;
            };
            let k = key(l, place(layer, t).0, t);
            for (suffix, p) in [("lora_A", &ad.a), ("lora_B", &ad.b)] {
                // burn's `[in, out]` → PEFT's `[out, in]`.
                let v = p.val().transpose();
                let shape = v.dims().to_vec();
                let data = v
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .map_err(|e| Error::Model(format!("adapter `{k}`: {e:?}")))?;
                tensors.push((format!("{k}.{suffix}.weight"), shape, data));
            }
        }
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(encode(&tensors, base))
}

/// The adapter file: f32 tensors (sorted by name), `format = pt` and the base digest as
/// metadata, in a fixed byte layout.
fn encode(tensors: &Tensors, base: &str) -> Vec<u8> {
    let raw: Vec<super::weights::RawTensor> = tensors
        .iter()
        .map(|(name, shape, data)| {
            let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name.clone(), "F32", shape.clone(), bytes)
        })
        .collect();
    super::weights::write_safetensors(&raw, &[("format", "pt"), ("rla_pipe.base_blake3", base)])
}

/// An adapter file's tensors (sorted by name) and its recorded base digest (empty if none).
pub fn decode(bytes: &[u8], what: &str) -> Result<(Tensors, String)> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| {
        Error::Model(format!(
            "{what}: not a readable adapter (safetensors) file: {e}"
        ))
    })?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| Error::Model(format!("{what}: {e}")))?;
    let base = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("rla_pipe.base_blake3").cloned())
        .unwrap_or_default();
    let mut out: Tensors = Vec::new();
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        let data: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            safetensors::Dtype::BF16 => view
                .data()
                .chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                .collect(),
            safetensors::Dtype::F16 => view
                .data()
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            d => {
                return Err(Error::Model(format!(
                    "{what}: tensor `{name}`: dtype {d:?} is not supported (F32, F16, BF16)"
                )));
            }
        };
        if shape.len() != 2 {
            return Err(Error::Model(format!(
                "{what}: tensor `{name}` has shape {shape:?}; an adapter's tensors are 2-D"
            )));
        }
        out.push((name, shape, data));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((out, base))
}

/// The decoder layers an adapter file adapts (the `layers.{i}` of its tensors' keys), ascending.
pub fn adapted_layers(bytes: &[u8], what: &str) -> Result<Vec<usize>> {
    let (tensors, _) = decode(bytes, what)?;
    let mut layers: Vec<usize> = tensors
        .iter()
        .filter_map(|(name, _, _)| {
            name.strip_prefix(LAYERS_PREFIX)?
                .split('.')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    layers.sort_unstable();
    layers.dedup();
    Ok(layers)
}

/// PEFT's `adapter_config.json` for adapters of `spec` on the model in `base_dir`; `layers`:
/// the decoder layers they adapt ([`adapted_layers`]), written as `layers_to_transform` when
/// `spec.layers` restricts them (null: every layer).
pub fn adapter_config(spec: &LoraSpec, base_dir: &str, layers: &[usize]) -> String {
    let v = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_dir,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "target_modules": spec.targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "layers_to_transform": (spec.layers > 0).then_some(layers),
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    serde_json::to_string_pretty(&v).expect("JSON serializes") + "\n"
}
