//! Pretrained Hugging Face checkpoints: Llama, Qwen2 and Qwen3 causal language models read
//! from a model directory (`config.json`, `model.safetensors` or a sharded
//! `model.safetensors.index.json`, `tokenizer.json`, `tokenizer_config.json`).
//!
//! - [`config`]: `config.json` → [`HfArch`] (shapes, switches, RoPE frequencies), and the
//!   tensors a checkpoint must hold;
//! - [`arch`]: the decoder in burn ([`CausalLm`]), with a grouped-query KV cache;
//! - [`weights`]: safetensors ↔ model through burn-store, checks naming tensor and shapes,
//!   the weights' blake3 digest;
//! - [`tokenizer`]: `tokenizer.json` + the chat template;
//! - [`generate`]: batched sampling with the cache;
//! - [`lora`]: low-rank adapters, PEFT's adapter files.

pub mod adapter;
pub mod arch;
pub mod attention;
pub mod checkpointed;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cube;
pub mod frozen;
pub mod fused;
pub mod generate;
pub mod heads;
pub mod kernels;
pub mod lora;
pub mod prompt;
pub mod recompute;
pub mod silu;
pub mod softmax;
pub mod tokenizer;
pub mod weights;

pub use arch::{CausalLm, KvCache};
pub use config::{Architecture, HfArch};
pub use generate::{Sampling, generate};
pub use tokenizer::{ChatMessage, HfTokenizer};

use crate::error::Result;
use burn::tensor::backend::Backend;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// A loaded model directory.
pub struct HfModel<B: Backend> {
    pub dir: PathBuf,
    pub model: CausalLm<B>,
    pub tokenizer: HfTokenizer,
    /// blake3 of the weight files (see [`weights::digest`]).
    pub digest: String,
}

impl<B: Backend> HfModel<B> {
    /// Load a model directory onto `device`.
    pub fn open(dir: &Path, device: &B::Device) -> Result<HfModel<B>> {
        let arch = HfArch::from_dir(dir)?;
        let files = weights::weight_files(dir)?;
        let tokenizer = HfTokenizer::from_dir(dir, &arch)?;
        let model = weights::load::<B>(&arch, &files, device)?;
        Ok(HfModel {
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            digest: weights::digest(&files)?,
        })
    }
}

/// What `rla-pipe model inspect` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub dir: String,
    pub architecture: String,
    pub parameters: usize,
    /// Stored dtypes of the weights, with tensor counts.
    pub dtypes: std::collections::BTreeMap<String, usize>,
    pub vocab: usize,
    pub tokenizer_vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub tied_embeddings: bool,
    pub max_positions: Option<usize>,
    pub eos_ids: Vec<u32>,
    pub chat_template: bool,
    pub weight_files: Vec<String>,
    pub weight_bytes: u64,
    /// blake3 of the weight files.
    pub digest: String,
}

/// Inspect a model directory: its config, the checkpoint's headers (checked against it) and
/// the weights' digest; no tensor is loaded.
pub fn inspect(dir: &Path) -> Result<Inspection> {
    let arch = HfArch::from_dir(dir)?;
    let files = weights::weight_files(dir)?;
    let headers = weights::read_headers(&files)?;
    weights::check_tensors(&arch, &headers)?;
    let tokenizer = HfTokenizer::from_dir(dir, &arch)?;
    let mut dtypes = std::collections::BTreeMap::new();
    for info in headers.values() {
        *dtypes.entry(info.dtype.clone()).or_insert(0) += 1;
    }
    let weight_bytes = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    Ok(Inspection {
        dir: dir.display().to_string(),
        architecture: arch.architecture.hf_name().to_string(),
        parameters: arch.parameters(),
        dtypes,
        vocab: arch.vocab,
        tokenizer_vocab: tokenizer.vocab_size(),
        hidden: arch.hidden,
        layers: arch.layers,
        heads: arch.heads,
        kv_heads: arch.kv_heads,
        head_dim: arch.head_dim,
        intermediate: arch.intermediate,
        tied_embeddings: arch.tied,
        max_positions: arch.max_positions,
        eos_ids: tokenizer.eos_ids.clone(),
        chat_template: tokenizer.has_chat_template(),
        weight_files: files
            .iter()
            .map(|f| {
                f.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect(),
        weight_bytes,
        digest: weights::digest(&files)?,
    })
}

/// What `rla-pipe model generate` asks for.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// One or more prompts, generated as one batch (row `r` samples from its own seed).
    pub prompts: Vec<String>,
    /// Wrap each prompt as a user message in the chat template.
    pub chat: bool,
    /// A system message (chat only).
    pub system: Option<String>,
    pub sampling: Sampling,
}

/// What `rla-pipe model generate` answers, per prompt.
#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    /// The generated text (special tokens dropped).
    pub text: String,
    /// The model's weights digest.
    pub digest: String,
    pub load_seconds: f64,
    /// Seconds generating the whole batch (prompt encoding included).
    pub seconds: f64,
    /// Generated tokens per second of the whole batch (prompt encoding included).
    pub tokens_per_second: f64,
}

/// Load a model directory and continue its prompts in one batch (`on_backend!`-callable).
pub fn generate_text<B: Backend>(
    device: &B::Device,
    dir: &Path,
    req: &GenerateRequest,
) -> Result<Vec<Generation>> {
    let started = std::time::Instant::now();
    let m = HfModel::<B>::open(dir, device)?;
    let load_seconds = started.elapsed().as_secs_f64();
    let prompts = req
        .prompts
        .iter()
        .map(|prompt| {
            if req.chat {
                let mut messages = Vec::new();
                if let Some(system) = &req.system {
                    messages.push(ChatMessage::new("system", system));
                }
                messages.push(ChatMessage::new("user", prompt));
                let text = m.tokenizer.apply_chat_template(&messages, true)?;
                m.tokenizer.encode(&text, false)
            } else {
                m.tokenizer.encode(prompt, true)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let started = std::time::Instant::now();
    let generated = generate(
        &m.model,
        &prompts,
        &m.tokenizer.eos_ids,
        &req.sampling,
        device,
    )?;
    let seconds = started.elapsed().as_secs_f64();
    let total: usize = generated.iter().map(Vec::len).sum();
    prompts
        .into_iter()
        .zip(generated)
        .map(|(prompt_ids, generated_ids)| {
            Ok(Generation {
                text: m.tokenizer.decode(&generated_ids, true)?,
                seconds,
                tokens_per_second: total as f64 / seconds.max(1e-9),
                prompt_ids,
                generated_ids,
                digest: m.digest.clone(),
                load_seconds,
            })
        })
        .collect()
}

/// [`weights::digest`] of a model directory, computed once per process and directory (the
/// files' sizes and modification times must be unchanged to reuse it).
pub fn directory_digest(dir: &Path) -> Result<String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Stamp = Vec<(u64, Option<std::time::SystemTime>)>;
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, (Stamp, String)>>> = OnceLock::new();
    let files = weights::weight_files(dir)?;
    let stamp: Stamp = files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok();
            (
                m.as_ref().map(|m| m.len()).unwrap_or(0),
                m.and_then(|m| m.modified().ok()),
            )
        })
        .collect();
    let cache = CACHE.get_or_init(Default::default);
    if let Some((s, d)) = cache.lock().expect("digest cache").get(dir)
        && *s == stamp
    {
        return Ok(d.clone());
    }
    let digest = weights::digest(&files)?;
    cache
        .lock()
        .expect("digest cache")
        .insert(dir.to_path_buf(), (stamp, digest.clone()));
    Ok(digest)
}

/// Files of a model directory besides its config and weights that a Hugging Face directory
/// carries over (tokenizer, chat template, generation defaults).
const CARRIED: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "vocab.json",
];

/// Write a Hugging Face model directory at `out` that `transformers` loads as it is: the
/// architecture of `source` (its `config.json`, `torch_dtype` float32), `weights` (f32 or bf16
/// safetensors in the Hugging Face layout, checked against the architecture; bf16 is widened)
/// as `model.safetensors`, and `source`'s tokenizer files. `out` must not exist or be empty;
/// the files appear together (written to a sibling directory, then renamed).
pub fn export_dir(source: &Path, weights: &[u8], out: &Path) -> Result<Vec<String>> {
    let arch = HfArch::from_dir(source)?;
    let mut headers = std::collections::BTreeMap::new();
    weights::check_bytes(weights, &mut headers)?;
    weights::check_tensors(&arch, &headers)?;
    let widened;
    let weights = if headers.values().any(|t| t.dtype != "F32") {
        let m = weights::load_bytes::<crate::model::Cpu>(
            &arch,
            weights,
            "checkpoint",
            &Default::default(),
        )?;
        widened = weights::to_safetensors(&m)?;
        &widened[..]
    } else {
        weights
    };
    let mut files = vec![
        (
            "config.json".to_string(),
            arch.config_json("float32").into_bytes(),
        ),
        ("model.safetensors".to_string(), weights.to_vec()),
    ];
    for f in CARRIED {
        let from = source.join(f);
        if from.exists() {
            let bytes = std::fs::read(&from)
                .map_err(|e| crate::error::Error::Model(format!("{}: {e}", from.display())))?;
            files.push((f.to_string(), bytes));
        }
    }
    write_dir(out, files)
}

/// Write a PEFT adapter directory at `out` (`adapter_config.json`, `adapter_model.safetensors`)
/// that `peft` loads onto the model in `source` (named in the config as `base`).
pub fn export_adapter_dir(
    base: &str,
    spec: &lora::LoraSpec,
    adapter: &[u8],
    out: &Path,
) -> Result<Vec<String>> {
    let layers = lora::adapted_layers(adapter, "checkpoint")?;
    write_dir(
        out,
        vec![
            (
                "adapter_config.json".to_string(),
                lora::adapter_config(spec, base, &layers).into_bytes(),
            ),
            ("adapter_model.safetensors".to_string(), adapter.to_vec()),
        ],
    )
}

/// The model in `source` with the adapters of `adapter` folded into its weights, as a Hugging
/// Face directory ([`export_dir`]).
pub fn export_merged_dir(
    source: &Path,
    spec: &lora::LoraSpec,
    adapter: &[u8],
    out: &Path,
) -> Result<Vec<String>> {
    let arch = HfArch::from_dir(source)?;
    let dev = Default::default();
    let base = weights::load::<crate::model::Cpu>(&arch, &weights::weight_files(source)?, &dev)?;
    let merged = lora::merge(lora::attach_bytes(base, spec, adapter, "checkpoint", &dev)?);
    export_dir(source, &weights::to_safetensors(&merged)?, out)
}

/// Write `files` into a new directory `out` (it must not exist or be empty): into a sibling
/// staging directory first, then renamed, so they appear together. Returns their names.
fn write_dir(out: &Path, files: Vec<(String, Vec<u8>)>) -> Result<Vec<String>> {
    use crate::error::Error;
    if out.exists()
        && std::fs::read_dir(out)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(Error::Model(format!(
            "{}: exists and is not empty; export writes a new directory",
            out.display()
        )));
    }
    let name = out
        .file_name()
        .ok_or_else(|| Error::Model(format!("{}: not a directory name", out.display())))?;
    let staging = out.with_file_name(format!(".{}.partial", name.to_string_lossy()));
    let io = |e: std::io::Error, p: &Path| Error::Model(format!("{}: {e}", p.display()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| io(e, &staging))?;
    let mut written = Vec::with_capacity(files.len());
    for (file, bytes) in files {
        let p = staging.join(&file);
        std::fs::write(&p, bytes).map_err(|e| io(e, &p))?;
        written.push(file);
    }
    if out.exists() {
        std::fs::remove_dir(out).map_err(|e| io(e, out))?;
    }
    std::fs::rename(&staging, out).map_err(|e| io(e, out))?;
    Ok(written)
}
