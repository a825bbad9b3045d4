//! Benchmark dumps: off (and free) unless an environment variable names a directory. A model
//! stage then writes what it computed — its inputs as token ids, its results, its seconds — to
//! `<dir>/<name>.json` and the weights it ran to `<dir>/<name>.ckpt`, so that `benches/torch_*.py`
//! runs the same work in PyTorch on the same weights and compares results and speed.
//! The small transformer's weights are `<name>.ckpt` (rla-pipe's checkpoint format); a pretrained
//! model's are `<name>.safetensors` (f32, the Hugging Face layout: load them over the model
//! directory the dump's `hf_dir` names).

use crate::error::{Error, Result};
use crate::model::Weights;
use crate::model::policy::Decision;

/// `update` (`benches/torch_update.py`): each model's samples, PPO settings, optimizer plan,
/// snapshot log-probabilities and per-step metrics.
pub(crate) const UPDATE: &str = "RLA_PIPE_BENCH_UPDATE";
/// `rollout` and `rm_score` (`benches/torch_generate.py`): every scoring / generation call with
/// its prompts, results and seconds.
pub(crate) const GENERATE: &str = "RLA_PIPE_BENCH_GENERATE";

/// Whether `var` asks for dumps.
pub(crate) fn enabled(var: &str) -> bool {
    std::env::var_os(var).is_some()
}

/// Policy decisions as the benches read them: `[{"prompt": [ids], "actions": [[ids], ...]}]`.
pub(crate) fn decisions(decisions: &[Decision]) -> serde_json::Value {
    decisions
        .iter()
        .map(|d| serde_json::json!({"prompt": d.prompt, "actions": d.actions}))
        .collect()
}

/// Write `data` (plus the machine's core count) and `weights` as `<name>.json` and
/// `<name>.ckpt` (small transformer) or `<name>.safetensors` (pretrained) into the directory
/// `var` names; nothing when it is unset.
pub(crate) fn write(
    var: &str,
    name: &str,
    weights: &Weights,
    mut data: serde_json::Value,
) -> Result<()> {
    let Some(dir) = std::env::var_os(var) else {
        return Ok(());
    };
    let dir = std::path::PathBuf::from(dir);
    let io = |e: std::io::Error| Error::data(format!("{var}={}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    data["cores"] = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .into();
    let file = match weights {
        Weights::Small(_) => format!("{name}.ckpt"),
        Weights::Hf { .. } => format!("{name}.safetensors"),
        // The adapters alone (PEFT's keys); the base model is `hf_dir`.
        Weights::Lora { spec, .. } => {
            data["lora"] = serde_json::json!({
                "rank": spec.rank, "alpha": spec.alpha, "targets": spec.targets,
            });
            format!("{name}.adapter.safetensors")
        }
    };
    data["weights"] = file.clone().into();
    std::fs::write(dir.join(file), weights.encode()).map_err(io)?;
    let json = serde_json::to_vec(&data).map_err(|e| Error::data(e.to_string()))?;
    std::fs::write(dir.join(format!("{name}.json")), json).map_err(io)?;
    Ok(())
}
