//! Supervised warm start (the `pretrain` stage): behaviour cloning for the policy — the
//! cross-entropy of the demonstrated action among the admissible ones, at T = 1 — and
//! teacher-forced responses for the reward model — the mean token log-likelihood of a short
//! critique and the oracle's verdict. Both run the optimizer loop of PPO ([`ppo::train`]:
//! AdamW, gradient clipping, seeded minibatches), with the supervised loss in place of the
//! clipped surrogate.

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::lm::bool_tensor;
use super::policy::{self, Decision};
use super::ppo::{self, PpoSettings, StepMetrics};
use super::reward::response_log_probs;
use super::{ModelSpec, Weights};
use crate::error::Result;

/// Train the policy to pick `chosen[i]` among the admissible actions of `decisions[i]`.
pub fn clone_policy<B: AutodiffBackend>(
    device: &B::Device,
    spec: &ModelSpec,
    ck: &Weights,
    decisions: &[Decision],
    chosen: &[usize],
    s: &PpoSettings,
    seed: u64,
) -> Result<(Weights, Vec<StepMetrics>)> {
    let model = spec.trainable_model::<B>(ck, device)?;
    let sizes: Vec<usize> = decisions.iter().map(Decision::tokens).collect();
    let (model, metrics) = ppo::train(model, &sizes, s, seed, |m, idx| {
        let (lp, tokens) =
            policy::chosen_log_probs(m, decisions, chosen, idx, 1.0, spec.action_mean, device);
        let loss = lp.clone().mean().neg();
        // "kl" reports the demonstrated action's mean probability (how well it is imitated).
        let p = lp.exp().mean().detach();
        (loss, p, Tensor::zeros([1], device), tokens)
    });
    Ok((spec.weights_of(&ppo::snapshot(&model))?, metrics))
}

/// Train a model to answer `responses[i]` to `prompts[i]` (teacher forcing over the response
/// tokens): the reward model's verdicts (a small RM restricted to critique words and verdicts as
/// when it generates), and a `generate`-mode policy's `\boxed{index}` replies.
pub fn teach_responses<B: AutodiffBackend>(
    device: &B::Device,
    spec: &ModelSpec,
    ck: &Weights,
    prompts: &[Vec<u32>],
    responses: &[Vec<u32>],
    s: &PpoSettings,
    seed: u64,
) -> Result<(Weights, Vec<StepMetrics>)> {
    let model = spec.trainable_model::<B>(ck, device)?;
    let bias = spec.verdicts().bias::<B>(spec.config.vocab, device);
    let sizes = ppo::sample_tokens(prompts, responses);
    let (model, metrics) = ppo::train(model, &sizes, s, seed, |m, idx| {
        let b = idx.len();
        let (lp, valid, tokens) =
            response_log_probs(m, prompts, responses, idx, bias.as_ref(), 1.0, device);
        let l = valid.len() / b;
        let valid = bool_tensor::<B, 2>(valid, [b, l], device).float();
        let count = valid.clone().sum_dim(1);
        let per_sample = (lp * valid).sum_dim(1).div(count);
        let loss = per_sample.clone().mean().neg();
        let p = per_sample.exp().mean().detach();
        (loss, p, Tensor::zeros([1], device), tokens)
    });
    Ok((spec.weights_of(&ppo::snapshot(&model))?, metrics))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ppo::Schedule;
    use crate::model::{CpuTrain, POLICY, RM};

    fn settings(steps: u32) -> PpoSettings {
        PpoSettings {
            clip_eps: 0.2,
            kl_beta: 0.0,
            log_ratio_clamp: 10.0,
            lr: 1e-2,
            weight_decay: 0.0,
            adam_eps: 1e-8,
            grad_clip: 1.0,
            steps,
            micro_tokens: 0,
            threads: 1,
            minibatch: 8,
            schedule: Schedule::Fixed,
            target_kl: 0.0,
            gpu: false,
            checkpoint_layers: false,
        }
    }

    /// Behaviour cloning raises the demonstrated action's probability, and the RM learns to
    /// answer the taught verdict: the loss falls from the first step to the last.
    #[test]
    fn supervised_losses_fall() {
        let words: Vec<String> = ["north", "south", "east", "west", "at", "goal"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let pc = crate::model::config::PolicyConfig::default();
        let rc = crate::model::config::RewardModelConfig::default();
        let dev = Default::default();
        let spec = ModelSpec::for_role(POLICY, &pc, &rc, &words).unwrap();
        let ck = spec
            .load(&crate::model::initial_checkpoint(&spec, 1).unwrap())
            .unwrap();
        let admissible: Vec<String> = ["north", "south", "east", "west"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let decisions: Vec<Decision> = (0..8)
            .map(|i| {
                spec.decision(
                    "at goal",
                    &[],
                    if i % 2 == 0 { "at" } else { "goal" },
                    &admissible,
                )
                .unwrap()
            })
            .collect();
        let chosen: Vec<usize> = (0..8).map(|i| i % 2).collect();
        let (_, m) =
            clone_policy::<CpuTrain>(&dev, &spec, &ck, &decisions, &chosen, &settings(30), 3)
                .unwrap();
        assert!(m.last().unwrap().loss < m[0].loss * 0.5, "{:?}", m);

        let spec = ModelSpec::for_role(RM, &pc, &rc, &words).unwrap();
        let ck = spec
            .load(&crate::model::initial_checkpoint(&spec, 2).unwrap())
            .unwrap();
        let tok = &spec.tokenizer;
        let good = vec![
            tok.encode("progress")[0],
            tok.special(crate::model::tokenizer::GOOD),
        ];
        let bad = vec![
            tok.encode("wasted")[0],
            tok.special(crate::model::tokenizer::BAD),
        ];
        let prompts: Vec<Vec<u32>> = (0..8)
            .map(|i| tok.encode(if i % 2 == 0 { "north" } else { "south" }))
            .collect();
        let responses: Vec<Vec<u32>> = (0..8)
            .map(|i| {
                if i % 2 == 0 {
                    good.clone()
                } else {
                    bad.clone()
                }
            })
            .collect();
        let (_, m) =
            teach_responses::<CpuTrain>(&dev, &spec, &ck, &prompts, &responses, &settings(30), 4)
                .unwrap();
        assert!(m.last().unwrap().loss < m[0].loss * 0.5, "{:?}", m);
    }
}
