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

/// `update` on synthetic advantages (`benches/gpu_profile.py`: random weights, whose samples carry
/// no advantage): every step and RM sample of the iteration is trained, not only the included
/// ones, each with an advantage drawn from the seed this names (uniform in ±[0.5, 1.5]), so
/// that the update trains on the same shapes a learning run's would. Benchmarks only: the
/// run's committed results then follow from these advantages, not from its rewards.
pub(crate) const ADVANTAGE: &str = "RLA_PIPE_BENCH_ADVANTAGE";

/// The seed [`ADVANTAGE`] names, if it is set; a value that is not a number is an error.
pub(crate) fn advantage_seed() -> Result<Option<u64>> {
    match std::env::var(ADVANTAGE) {
        Err(_) => Ok(None),
        Ok(v) => v.trim().parse().map(Some).map_err(|_| {
            Error::config(format!(
                "{ADVANTAGE}={v:?}: expected a seed (an unsigned integer)"
            ))
        }),
    }
}

/// `sql` (an `update_*_samples.sql`) with its `included` filter dropped when [`ADVANTAGE`] is
/// set: every sample, included or not.
pub(crate) fn samples_sql(sql: &'static str, synthetic: bool) -> std::borrow::Cow<'static, str> {
    if !synthetic {
        return sql.into();
    }
    sql.replace("WHERE a.included", "WHERE true")
        .replace("WHERE included", "WHERE true")
        .into()
}

/// Replace every advantage by a draw from `seed`: uniform in ±[0.5, 1.5], sign by coin.
pub(crate) fn synthetic_advantages(adv: &mut [f64], seed: u64) {
    let mut rng = crate::determinism::Rng::new(seed);
    for a in adv {
        let m = 0.5 + rng.unit();
        *a = if rng.unit() < 0.5 { -m } else { m };
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_advantages_are_seeded_non_zero_and_signed_both_ways() {
        let (mut a, mut b) = (vec![0.0; 64], vec![0.0; 64]);
        synthetic_advantages(&mut a, 7);
        synthetic_advantages(&mut b, 7);
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (0.5..=1.5).contains(&v.abs())), "{a:?}");
        assert!(a.iter().any(|v| *v < 0.0) && a.iter().any(|v| *v > 0.0));
        synthetic_advantages(&mut b, 8);
        assert_ne!(a, b);
    }

    #[test]
    fn samples_sql_drops_only_the_included_filter() {
        let policy = include_str!("update_policy_samples.sql");
        let rm = include_str!("update_rm_samples.sql");
        assert_eq!(samples_sql(policy, false), policy);
        for sql in [policy, rm] {
            let all = samples_sql(sql, true);
            assert!(
                !all.contains("WHERE included") && !all.contains("WHERE a.included"),
                "{all}"
            );
            assert!(all.contains("WHERE true"), "{all}");
        }
    }
}
