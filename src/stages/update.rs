//! Stage 5, `update`: PPO for the policy and the reward model (see [`crate::model::ppo`]).
//!
//! Reads the included rows of `policy_advantages` and `rm_advantages` (SQL beside this file),
//! rebuilds each sample's prompt from `steps`, trains each model for `update.policy_steps` /
//! `update.rm_steps` optimizer steps (`update.schedule`: fixed minibatches, or one accumulated
//! pass as the reference) on log-probabilities at `update.logprob_temperature` (T = 1 by
//! default) from the checkpoint its samples came from, and writes `update_metrics` plus both new
//! checkpoints as artifacts. A model that is not trained this iteration (uniform policy, RM
//! disabled, no included samples) is written back unchanged, so the next iteration always finds
//! both checkpoints here.

use std::collections::BTreeMap;

use burn::tensor::backend::AutodiffBackend;

use super::trajectories::{self, Trajectory};
use crate::config::Config;
use crate::determinism::derive_seed;
use crate::error::{Error, Result};
use crate::model::count::halves;
use crate::model::policy::{self, Decision};
use crate::model::ppo::{self, PpoSettings, StepMetrics};
use crate::model::reward::{packed_response_log_probs, response_log_probs};
use crate::model::transformer::{bool_tensor, float_tensor};
use crate::model::{Lm, ModelSpec, POLICY, RM, Weights};
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::collect;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

const POLICY_SAMPLES_SQL: &str = include_str!("update_policy_samples.sql");
const RM_SAMPLES_SQL: &str = include_str!("update_rm_samples.sql");
const CODING_POLICY_SQL: &str = include_str!("update_coding_policy_samples.sql");
const CODING_RM_SQL: &str = include_str!("update_coding_rm_samples.sql");

/// Samples whose snapshot log-probabilities are computed per model call.
const SNAPSHOT_BATCH: usize = 512;

/// `coding`: the coding setting's samples, whose prompts are rebuilt from the task's problem
/// (`tasks`) rather than from a trajectory: the policy's reply to the reference's prompt, the
/// reward model's unit test to its unit-test prompt (`update_coding_*.sql`).
pub struct Update {
    pub coding: bool,
}

/// The coding setting's samples of a pretrained model from `sql`: (prompt tokens, reply tokens,
/// advantage), prompts as `coding_loop` wrote from them.
async fn coding_samples(
    ctx: &StageContext,
    spec: &ModelSpec,
    sql: &str,
) -> Result<(Vec<Vec<u32>>, Vec<Vec<u32>>, Vec<f64>)> {
    let (mut prompts, mut responses, mut adv) = (Vec::new(), Vec::new(), Vec::new());
    for b in collect(&ctx.session, sql).await? {
        let c = Columns::new(&b, "stages/update_coding_*.sql");
        let (ids, a) = (c.str("sample_key")?, c.f64("advantage")?);
        let (resp, specs) = (c.str("response")?, c.str("spec")?);
        for r in 0..b.num_rows() {
            let h = spec.hf.as_ref().ok_or_else(|| {
                Error::config("the coding environment trains pretrained models only (hf:DIR)")
            })?;
            let v: serde_json::Value = serde_json::from_str(specs.value(r))
                .map_err(|e| Error::data(format!("update: {}: spec: {e}", ids.value(r))))?;
            let p = crate::env::coding::Problem::parse(&v)
                .map_err(|m| Error::data(format!("update: {}: {m}", ids.value(r))))?;
            let prompt = if spec.role == RM {
                p.unit_test_prompt()
            } else {
                p.policy_prompt(false)
            };
            prompts.push(h.tokenizer.encode(&prompt, false)?);
            responses.push(h.tokenizer.encode(resp.value(r), false)?);
            adv.push(a.value(r));
        }
    }
    Ok((prompts, responses, adv))
}

fn settings(cfg: &Config, lr: f64, steps: u32) -> PpoSettings {
    PpoSettings {
        clip_eps: cfg.reward.clip_eps,
        kl_beta: cfg.reward.kl_beta,
        log_ratio_clamp: cfg.update.log_ratio_clamp,
        lr,
        weight_decay: cfg.update.weight_decay,
        adam_eps: cfg.update.adam_eps,
        grad_clip: cfg.update.grad_clip,
        steps,
        minibatch: cfg.update.minibatch as usize,
        schedule: cfg.update.schedule,
        micro_tokens: cfg.update.micro_tokens(cfg.run.device),
        // Threads keep CPU cores busy; on a GPU the micro-batches queue on one device anyway,
        // and each thread's copy of the parameters and autodiff graph would only take its
        // memory (the same bits for any value).
        threads: match cfg.run.device {
            crate::model::Device::Cuda => 1,
            _ => cfg.update.threads,
        },
        target_kl: cfg.update.target_kl,
        gpu: cfg.run.device == crate::model::Device::Cuda,
        checkpoint_layers: cfg.update.checkpoints_layers(cfg.run.device),
    }
}

/// The trajectory a sample names, or a clear error.
fn traj<'a>(
    trajs: &'a BTreeMap<String, Trajectory>,
    id: &str,
    step: u32,
) -> Result<&'a Trajectory> {
    trajs
        .get(id)
        .filter(|t| (step as usize) < t.steps.len())
        .ok_or_else(|| {
            Error::data(format!(
                "update: sample ({id}, step {step}) has no row in steps"
            ))
        })
}

/// Train the policy: one PPO sample per included step (the chosen action among the admissible).
#[allow(clippy::too_many_arguments)]
fn train_policy<B: AutodiffBackend>(
    device: &B::Device,
    spec: &ModelSpec,
    ck: Weights,
    decisions: &[Decision],
    chosen: &[usize],
    adv: &[f64],
    s: &PpoSettings,
    seed: u64,
    temperature: f64,
) -> Result<(Weights, Vec<StepMetrics>)> {
    let model = spec.trainable_model::<B>(&ck, device)?;
    // The weights' bytes are kept only for a benchmark dump.
    let ck = super::bench::enabled(super::bench::UPDATE).then_some(ck);
    let t0 = std::time::Instant::now();
    // A pretrained model takes the old log-probabilities of the samples step 0 holds from that
    // step's forward pass; a snapshot pass computes those of the samples only later steps
    // reach ([`ppo::before_training`]). The small transformer keeps the computation its
    // committed numbers were made with (a pass over every sample).
    let mut old: Vec<Option<f32>> = vec![None; decisions.len()];
    let before = ppo::before_training(decisions.len(), s, seed, model.packs_prefixes());
    if !before.is_empty() {
        let snap = ppo::snapshot(&model);
        let decisions: Vec<Decision> = before.iter().map(|&i| decisions[i].clone()).collect();
        let chosen: Vec<usize> = before.iter().map(|&i| chosen[i]).collect();
        let mut at = 0;
        for (d, c) in decisions
            .chunks(SNAPSHOT_BATCH)
            .zip(chosen.chunks(SNAPSHOT_BATCH))
        {
            let chosen_lp = |r: std::ops::Range<usize>| -> Vec<f32> {
                let lp = policy::to_host(policy::log_probs(
                    &snap,
                    &d[r.clone()],
                    temperature,
                    spec.action_mean,
                    device,
                ));
                lp.iter().zip(&c[r]).map(|(row, k)| row[*k]).collect()
            };
            // A pretrained model's snapshot in two fixed halves on two threads (as scoring).
            let lp: Vec<f32> = if snap.packs_prefixes() {
                halves(d.len(), chosen_lp).into_iter().flatten().collect()
            } else {
                chosen_lp(0..d.len())
            };
            for v in lp {
                old[before[at]] = Some(v);
                at += 1;
            }
        }
        // The snapshot ends here: it shares the parameters' storage, and once the first step
        // replaced them it would keep a second copy of the weights alive.
    }
    let old = ppo::OldLogprobs::new(old);
    let (snapshot_seconds, t0) = (t0.elapsed().as_secs_f64(), std::time::Instant::now());
    let sizes: Vec<usize> = decisions.iter().map(Decision::tokens).collect();
    let (model, metrics) = ppo::train(model, &sizes, s, seed, |m, idx| {
        let b = idx.len();
        let (new, tokens) = policy::chosen_log_probs(
            m,
            decisions,
            chosen,
            idx,
            temperature,
            spec.action_mean,
            device,
        );
        let fresh = || {
            policy::to_host(new.clone())
                .into_iter()
                .map(|r| r[0])
                .collect()
        };
        let old_t = float_tensor::<B, 2>(old.get_or_fill(idx, fresh), [b, 1], device);
        let adv_t =
            float_tensor::<B, 2>(idx.iter().map(|i| adv[*i] as f32).collect(), [b, 1], device);
        let valid = float_tensor::<B, 2>(vec![1.0; b], [b, 1], device);
        let (loss, kl, clip) = ppo::ppo_loss(new, old_t.clone(), old_t, adv_t, valid, s);
        (loss, kl, clip, tokens)
    });
    let old: Vec<f32> = old
        .into_vec()
        .into_iter()
        .map(|v| v.unwrap_or(f32::NAN))
        .collect();
    let seconds = [snapshot_seconds, t0.elapsed().as_secs_f64()];
    let run = Run {
        spec,
        ck: ck.as_ref(),
        s,
        seed,
        metrics: &metrics,
        adv,
        temperature,
        seconds,
    };
    bench_dump(run, || {
        serde_json::json!({
            "kind": "decisions",
            "action_mean": spec.action_mean,
            "decisions": super::bench::decisions(decisions),
            "chosen": chosen,
            "old_logprobs": old,
        })
    })?;
    Ok((spec.weights_of(&ppo::snapshot(&model))?, metrics))
}

/// A model's update, as [`bench_dump`] records it for either kind of samples.
struct Run<'a> {
    spec: &'a ModelSpec,
    /// The weights the update started from (kept only when dumping).
    ck: Option<&'a Weights>,
    s: &'a PpoSettings,
    seed: u64,
    metrics: &'a [StepMetrics],
    adv: &'a [f64],
    temperature: f64,
    /// Seconds computing the snapshot log-probabilities, then in the optimizer steps.
    seconds: [f64; 2],
}

/// With `RLA_PIPE_BENCH_UPDATE=<dir>` (`benches/torch_update.py`, see [`bench`](super::bench)),
/// write what a model's update did to `<dir>/<role>.json` — its samples (`data`: their kind,
/// token ids and snapshot log-probabilities), advantages, settings, optimizer plan, burn's
/// per-step metrics and seconds — and the weights it started from to `<dir>/<role>.ckpt`, so
/// that PyTorch can run the same update on the same weights. `data` is only built when dumping.
fn bench_dump(run: Run<'_>, data: impl FnOnce() -> serde_json::Value) -> Result<()> {
    let Run {
        spec,
        ck,
        s,
        seed,
        metrics,
        adv,
        temperature,
        seconds,
    } = run;
    let (true, Some(ck)) = (super::bench::enabled(super::bench::UPDATE), ck) else {
        return Ok(());
    };
    let mut data = data();
    data["role"] = spec.role.into();
    data["hf_dir"] = spec.hf.as_ref().map(|h| h.dir.display().to_string()).into();
    data["adv"] = serde_json::json!(adv);
    data["temperature"] = temperature.into();
    data["snapshot_seconds"] = seconds[0].into();
    data["train_seconds"] = seconds[1].into();
    data["settings"] = serde_json::json!({
        "clip_eps": s.clip_eps,
        "kl_beta": s.kl_beta,
        "log_ratio_clamp": s.log_ratio_clamp,
        "lr": s.lr,
        "weight_decay": s.weight_decay,
        "adam_eps": s.adam_eps,
        "grad_clip": s.grad_clip,
    });
    data["plan"] = serde_json::json!(ppo::plan(adv.len(), s, seed));
    data["metrics"] = metrics
        .iter()
        .map(|m| {
            serde_json::json!({
                "loss": m.loss, "kl": m.kl, "clip_frac": m.clip_frac,
                "grad_norm": m.grad_norm, "samples": m.samples, "tokens": m.tokens,
            })
        })
        .collect();
    super::bench::write(super::bench::UPDATE, spec.role, ck, data)
}

/// Train a model on its own responses, token by token: the reward model (one PPO sample per
/// included RM sample; a small RM samples from its critique words and verdicts only) and a
/// `generate`-mode policy (one per included step: its reply).
#[allow(clippy::too_many_arguments)]
fn train_responses<B: AutodiffBackend>(
    device: &B::Device,
    spec: &ModelSpec,
    ck: Weights,
    prompts: &[Vec<u32>],
    responses: &[Vec<u32>],
    adv: &[f64],
    s: &PpoSettings,
    seed: u64,
    temperature: f64,
) -> Result<(Weights, Vec<StepMetrics>)> {
    let model = spec.trainable_model::<B>(&ck, device)?;
    // The weights' bytes are kept only for a benchmark dump.
    let ck = super::bench::enabled(super::bench::UPDATE).then_some(ck);
    let vocab = spec.config.vocab;
    let t0 = std::time::Instant::now();
    // As the policy's: a pretrained model takes step 0's samples' old log-probabilities from
    // that step's forward pass, a snapshot pass those of the samples only later steps reach.
    let mut old: Vec<Option<Vec<f32>>> = vec![None; prompts.len()];
    let before = ppo::before_training(prompts.len(), s, seed, model.packs_prefixes());
    if !before.is_empty() {
        let snap = ppo::snapshot(&model);
        let bias_inner = spec.verdicts().bias::<B::InnerBackend>(vocab, device);
        let prompts: Vec<&[u32]> = before.iter().map(|&i| prompts[i].as_slice()).collect();
        let responses: Vec<&[u32]> = before.iter().map(|&i| responses[i].as_slice()).collect();
        let mut at = 0;
        for (p, r) in prompts
            .chunks(SNAPSHOT_BATCH)
            .zip(responses.chunks(SNAPSHOT_BATCH))
        {
            let (p, r) = (p.to_vec(), r.to_vec());
            let half = |k: std::ops::Range<usize>| -> Vec<Vec<f32>> {
                let (lp, _) = packed_response_log_probs(
                    &snap,
                    &p[k.clone()],
                    &r[k.clone()],
                    bias_inner.as_ref(),
                    temperature,
                    device,
                );
                policy::to_host(lp)
                    .into_iter()
                    .zip(&r[k])
                    .map(|(row, resp)| row[..resp.len()].to_vec())
                    .collect()
            };
            // As the policy's snapshot: two halves for a pretrained model.
            let lp: Vec<Vec<f32>> = if snap.packs_prefixes() {
                halves(p.len(), half).into_iter().flatten().collect()
            } else {
                half(0..p.len())
            };
            for v in lp {
                old[before[at]] = Some(v);
                at += 1;
            }
        }
        // The snapshot ends here (it would keep the first step's weights alive).
    }
    let old = ppo::OldLogprobs::new(old);
    let bias = spec.verdicts().bias::<B>(vocab, device);
    let (snapshot_seconds, t0) = (t0.elapsed().as_secs_f64(), std::time::Instant::now());
    let sizes = ppo::sample_tokens(prompts, responses);
    let (model, metrics) = ppo::train(model, &sizes, s, seed, |m, idx| {
        let b = idx.len();
        let (new, valid, tokens) = response_log_probs(
            m,
            prompts,
            responses,
            idx,
            bias.as_ref(),
            temperature,
            device,
        );
        let l = valid.len() / b;
        let mut old_v = vec![0f32; b * l];
        let fresh = || {
            let rows = policy::to_host(new.clone());
            idx.iter()
                .zip(rows)
                .map(|(i, row)| row[..responses[*i].len()].to_vec())
                .collect()
        };
        for (k, o) in old.get_or_fill(idx, fresh).iter().enumerate() {
            old_v[k * l..k * l + o.len()].copy_from_slice(o);
        }
        let old_t = float_tensor::<B, 2>(old_v, [b, l], device);
        let valid_t = bool_tensor::<B, 2>(valid, [b, l], device).float();
        let adv_t =
            float_tensor::<B, 2>(idx.iter().map(|i| adv[*i] as f32).collect(), [b, 1], device);
        let (loss, kl, clip) = ppo::ppo_loss(new, old_t.clone(), old_t, adv_t, valid_t, s);
        (loss, kl, clip, tokens)
    });
    let old: Vec<Vec<f32>> = old
        .into_vec()
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect();
    let seconds = [snapshot_seconds, t0.elapsed().as_secs_f64()];
    let run = Run {
        spec,
        ck: ck.as_ref(),
        s,
        seed,
        metrics: &metrics,
        adv,
        temperature,
        seconds,
    };
    bench_dump(run, || {
        serde_json::json!({
            "kind": "responses",
            "allowed": spec.verdicts().allowed(),
            "prompts": prompts,
            "responses": responses,
            "old_logprobs": old,
        })
    })?;
    Ok((spec.weights_of(&ppo::snapshot(&model))?, metrics))
}

impl Stage for Update {
    fn name(&self) -> &'static str {
        "update"
    }
    fn inputs(&self) -> &'static [&'static str] {
        if self.coding {
            &[
                "tasks",
                "steps",
                "rm_samples",
                "policy_advantages",
                "rm_advantages",
            ]
        } else {
            &["steps", "rm_samples", "policy_advantages", "rm_advantages"]
        }
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["update_metrics"]
    }
    /// Of `[reward]` only the PPO clip and the KL coefficient: the rest shapes the advantages
    /// this stage reads, so a branch that changes it shares the update whenever the
    /// advantages come out the same (`reward.train_candidates` before any candidate trains).
    fn config_sections(&self) -> &'static [&'static str] {
        &[
            "env",
            "policy",
            "reward_model",
            "reward.clip_eps",
            "reward.kl_beta",
            "update",
        ]
    }
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[POLICY, RM]
    }
    fn checkpoints_out(&self) -> &'static [&'static str] {
        &[POLICY, RM]
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let cfg = &ctx.config;
            let device = cfg.run.device;
            let trajs = trajectories::load(ctx).await?;
            // Benchmarks: every sample on synthetic advantages (`RLA_PIPE_BENCH_ADVANTAGE`).
            let synthetic = super::bench::advantage_seed()?;
            let mut rows: Vec<(&'static str, StepMetrics)> = Vec::new();

            // Policy.
            let policy_out = if cfg.policy.kind == crate::config::PolicyKind::Uniform {
                ctx.checkpoint(POLICY).await?
            } else {
                let spec = super::model_spec(cfg, POLICY)?;
                let (mut decisions, mut chosen, mut adv) = (Vec::new(), Vec::new(), Vec::new());
                // `generate` mode: the replies, token by token.
                let (mut prompts, mut responses) = (Vec::new(), Vec::new());
                if self.coding {
                    (prompts, responses, adv) =
                        coding_samples(ctx, &spec, CODING_POLICY_SQL).await?;
                }
                let plain = if self.coding {
                    Vec::new()
                } else {
                    collect(
                        &ctx.session,
                        &super::bench::samples_sql(POLICY_SAMPLES_SQL, synthetic.is_some()),
                    )
                    .await?
                };
                for b in plain {
                    let c = Columns::new(&b, "stages/update_policy_samples.sql");
                    let (ids, steps, a) =
                        (c.str("traj_id")?, c.u32("step_idx")?, c.f64("advantage")?);
                    for r in 0..b.num_rows() {
                        let t = traj(&trajs, ids.value(r), steps.value(r))?;
                        let i = steps.value(r) as usize;
                        let st = &t.steps[i];
                        adv.push(a.value(r));
                        if let Some((_, h)) = spec.generating() {
                            let reply = st.response.as_deref().ok_or_else(|| {
                            Error::data(format!(
                                "update: trajectory {} step {i} has no response, but policy.action_mode is \"generate\"",
                                t.traj_id
                            ))
                        })?;
                            prompts.push(spec.reply_prompt(
                                t.task(),
                                &t.past(i),
                                &st.observation,
                                &st.admissible,
                            )?);
                            responses.push(h.tokenizer.encode(reply, false)?);
                            continue;
                        }
                        let k = st.admissible.iter().position(|x| *x == st.action).ok_or_else(|| {
                        Error::data(format!(
                            "update: trajectory {} step {i}: action {:?} is not among its admissible actions",
                            t.traj_id, st.action
                        ))
                    })?;
                        decisions.push(spec.decision(
                            t.task(),
                            &t.past(i),
                            &st.observation,
                            &st.admissible,
                        )?);
                        chosen.push(k);
                    }
                }
                if let Some(seed) = synthetic {
                    super::bench::synthetic_advantages(&mut adv, derive_seed(seed, &[POLICY]));
                }
                // Loaded only now, and held by nothing but the model it becomes while it trains.
                let policy_in = ctx.checkpoint(POLICY).await?;
                if adv.is_empty() {
                    spec.load(&policy_in)?;
                    policy_in
                } else {
                    let ck = spec.load(&policy_in)?;
                    drop(policy_in);
                    let s = settings(cfg, cfg.update.policy_lr, cfg.update.policy_steps);
                    let seed = derive_seed(ctx.seed, &[POLICY]);
                    let t = cfg
                        .update
                        .logprob_temperature
                        .resolve(cfg.policy.temperature);
                    let (ck, metrics) = super::counted(ctx, || {
                        if spec.generating().is_some() {
                            crate::on_backend!(
                                device,
                                train,
                                train_responses(&spec, ck, &prompts, &responses, &adv, &s, seed, t)
                            )
                        } else {
                            crate::on_backend!(
                                device,
                                train,
                                train_policy(&spec, ck, &decisions, &chosen, &adv, &s, seed, t)
                            )
                        }
                    })?;
                    rows.extend(metrics.into_iter().map(|m| (POLICY, m)));
                    ck.encode()
                }
            };

            // Reward model.
            let rm_out = if !cfg.reward_model.enabled {
                ctx.checkpoint(RM).await?
            } else {
                let spec = super::model_spec(cfg, RM)?;
                let (mut prompts, mut responses, mut adv) = if self.coding {
                    coding_samples(ctx, &spec, CODING_RM_SQL).await?
                } else {
                    (Vec::new(), Vec::new(), Vec::new())
                };
                let plain = if self.coding {
                    Vec::new()
                } else {
                    collect(
                        &ctx.session,
                        &super::bench::samples_sql(RM_SAMPLES_SQL, synthetic.is_some()),
                    )
                    .await?
                };
                for b in plain {
                    let c = Columns::new(&b, "stages/update_rm_samples.sql");
                    let (ids, steps) = (c.str("traj_id")?, c.u32("step_idx")?);
                    let (a, resp) = (c.f64("advantage")?, c.str("response")?);
                    for r in 0..b.num_rows() {
                        let t = traj(&trajs, ids.value(r), steps.value(r))?;
                        let i = steps.value(r) as usize;
                        let tokens = spec.verdicts().response_ids(resp.value(r))?;
                        // A pretrained model's text is re-tokenized canonically, which may differ in
                        // length from what it sampled.
                        let limit = if spec.hf.is_some() {
                            usize::MAX
                        } else {
                            cfg.reward_model.max_tokens
                        };
                        // Synthetic advantages take every sample: an empty reply has nothing to train.
                        if tokens.is_empty() && synthetic.is_some() {
                            continue;
                        }
                        if tokens.is_empty() || tokens.len() > limit {
                            return Err(Error::data(format!(
                                "update: rm_samples response {:?} of ({}, step {i}) is not a response of at most {} tokens",
                                resp.value(r),
                                t.traj_id,
                                cfg.reward_model.max_tokens
                            )));
                        }
                        prompts.push(spec.rm_prompt(cfg.reward_model.max_tokens, t, i)?);
                        responses.push(tokens);
                        adv.push(a.value(r));
                    }
                }
                if let Some(seed) = synthetic {
                    super::bench::synthetic_advantages(&mut adv, derive_seed(seed, &[RM]));
                }
                let rm_in = ctx.checkpoint(RM).await?;
                if prompts.is_empty() {
                    spec.load(&rm_in)?;
                    rm_in
                } else {
                    let ck = spec.load(&rm_in)?;
                    drop(rm_in);
                    let s = settings(cfg, cfg.update.rm_lr, cfg.update.rm_steps);
                    let seed = derive_seed(ctx.seed, &[RM]);
                    let t = cfg
                        .update
                        .logprob_temperature
                        .resolve(cfg.reward_model.temperature);
                    let (ck, metrics) = super::counted(ctx, || {
                        crate::on_backend!(
                            device,
                            train,
                            train_responses(&spec, ck, &prompts, &responses, &adv, &s, seed, t)
                        )
                    })?;
                    rows.extend(metrics.into_iter().map(|m| (RM, m)));
                    ck.encode()
                }
            };
            ctx.emit_artifact(POLICY, policy_out);
            ctx.emit_artifact(RM, rm_out);

            let mut out = TableBuilder::new("update_metrics")?;
            let mut counters: BTreeMap<&str, u32> = BTreeMap::new();
            for (name, m) in &rows {
                let k = counters.entry(name).or_default();
                out.push_str(name)
                    .push_u32(*k)
                    .push_f64(m.loss)
                    .push_f64(m.kl)
                    .push_f64(m.clip_frac)
                    .push_f64(m.grad_norm)
                    .push_u32(m.samples)
                    .push_u64(m.tokens);
                *k += 1;
            }
            let batch = out.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![(
                "update_metrics",
                TableOutput::Frame(ctx.session.read_batch(batch)?),
            )])
        })
    }
}
