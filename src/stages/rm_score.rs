//! Stage 2, `rm_score`: `steps` + the RM checkpoint → `rm_samples`. The generative reward model
//! judges every step m times (`reward_model.samples`): a critique, then a verdict (+1 / −1; 0
//! when none came within `reward_model.max_tokens`). Each step's samples draw from a seed
//! derived from (stage seed, traj_id, step).
//!
//! With `reward_model.enabled = false` (the paper's outcome-only ablation: R = O, no RM
//! training) it commits an empty `rm_samples`, so every run has the same tables and the same SQL
//! works on all of them.

use arrow::array::RecordBatch;

use super::bench;
use super::trajectories::{self, Trajectory};
use crate::determinism::derive_seed;
use crate::error::Result;
use crate::model::count::halves;
use crate::model::reward::{self, Judgement};
use crate::model::tree::{self, SeqCache, encode_reusing};
use crate::model::{Lm, ModelSpec, RM, Weights};
use crate::schema;
use crate::schema::rows::TableBuilder;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

pub struct RmScore;

/// Steps judged per model call.
const STEP_BATCH: usize = 256;

/// Trajectories judged side by side by a pretrained reward model (each keeps its last prompt's
/// keys and values between its steps).
const TRAJ_BATCH: usize = 16;

/// Most prompt keys (prompts × the longest, padding included) a pretrained reward model
/// generates from at once: bounds the batch cache (SmolLM2-135M: 46 KB a key, 0.75 GB).
const GEN_KEYS: usize = 16_384;

/// RM prompts of every step of the given trajectories, in key order.
fn prompts(spec: &ModelSpec, max_tokens: usize, trajs: &[&Trajectory]) -> Result<Vec<Vec<u32>>> {
    trajs
        .iter()
        .flat_map(|t| (0..t.steps.len()).map(move |i| spec.rm_prompt(max_tokens, t, i)))
        .collect()
}

/// Where each trajectory's steps start among the steps in key order (and, last, their count).
fn starts(steps: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(steps.len() + 1);
    let mut at = 0;
    out.push(0);
    for n in steps {
        at += n;
        out.push(at);
    }
    out
}

/// A pretrained reward model's judgements of whole trajectories (`steps[t]` steps each; their
/// prompts and seeds in key order). Each step's prompt reuses what it shares token by token
/// with its trajectory's previous prompt ([`encode_reusing`], the trajectories' step `i` side
/// by side); the encoded prompts then generate together, up to [`GEN_KEYS`] cached keys at a
/// time, each prompt's m samples continuing from its keys without copies
/// ([`reward::generate_shared`]). The batches depend on the data alone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn judge_trajectories<B: burn::tensor::backend::Backend, M: Lm<B>>(
    model: &M,
    verdicts: reward::Verdicts<'_>,
    prompts: &[Vec<u32>],
    seeds: &[u64],
    steps: &[usize],
    m: usize,
    max_tokens: usize,
    temperature: f64,
    device: &B::Device,
) -> Vec<Vec<Judgement>> {
    let starts = starts(steps);
    let mut out: Vec<Vec<Judgement>> = vec![Vec::new(); prompts.len()];
    // Encoded prompts waiting to generate: (prompt index, next-token logits, own cache).
    type Pending<B> = Vec<(usize, burn::tensor::Tensor<B, 2>, SeqCache<B>)>;
    let mut pending: Pending<B> = Vec::new();
    let mut generate = |pending: &mut Pending<B>| {
        if pending.is_empty() {
            return;
        }
        let own: Vec<&SeqCache<B>> = pending.iter().map(|p| &p.2).collect();
        let cache = tree::batch_cache(&own, device);
        let lens: Vec<usize> = own.iter().map(|o| o.tokens.len()).collect();
        let last = burn::tensor::Tensor::cat(pending.iter().map(|p| p.1.clone()).collect(), 0);
        let s: Vec<u64> = pending.iter().map(|p| seeds[p.0]).collect();
        let judged = reward::generate_shared(
            model,
            verdicts,
            last,
            cache,
            &lens,
            &s,
            m,
            max_tokens,
            temperature,
            device,
        );
        for (p, j) in pending.drain(..).zip(judged) {
            out[p.0] = j;
        }
    };
    let all: Vec<usize> = (0..steps.len()).collect();
    for chunk in all.chunks(TRAJ_BATCH) {
        let mut caches: Vec<Option<SeqCache<B>>> = vec![None; chunk.len()];
        let rounds = chunk.iter().map(|&t| steps[t]).max().unwrap_or(0);
        for i in 0..rounds {
            let live: Vec<usize> = (0..chunk.len()).filter(|&c| steps[chunk[c]] > i).collect();
            let idx: Vec<usize> = live.iter().map(|&c| starts[chunk[c]] + i).collect();
            let ps: Vec<Vec<u32>> = idx.iter().map(|&k| prompts[k].clone()).collect();
            let past: Vec<Option<&SeqCache<B>>> =
                live.iter().map(|&c| caches[c].as_ref()).collect();
            let (last, _, _, own) = encode_reusing(model, &ps, &past, device);
            for (r, ((&c, &k), own)) in live.iter().zip(&idx).zip(own).enumerate() {
                let row = last.clone().narrow(0, r, 1);
                pending.push((k, row, own.clone()));
                caches[c] = Some(own);
            }
            let longest = pending.iter().map(|p| p.2.tokens.len()).max().unwrap_or(0);
            if pending.len() * longest >= GEN_KEYS {
                generate(&mut pending);
            }
        }
    }
    generate(&mut pending);
    out
}

#[allow(clippy::too_many_arguments)]
fn judge_on<B: burn::tensor::backend::Backend>(
    device: &B::Device,
    spec: &ModelSpec,
    checkpoint: &Weights,
    prompts: &[Vec<u32>],
    seeds: &[u64],
    steps: &[usize],
    m: usize,
    max_tokens: usize,
    temperature: f64,
) -> Result<Vec<Vec<Judgement>>> {
    let model = spec.inference_model::<B>(checkpoint, device)?;
    let mut out = Vec::with_capacity(prompts.len());
    let mut seconds = Vec::new();
    // A pretrained model: its trajectories in two halves on two threads (each prompt's samples
    // depend only on its own seeds and its trajectory's earlier prompts).
    if model.packs_prefixes() {
        let t0 = std::time::Instant::now();
        let starts = starts(steps);
        let judge = |r: std::ops::Range<usize>| {
            let k = starts[r.start]..starts[r.end];
            judge_trajectories(
                &model,
                spec.verdicts(),
                &prompts[k.clone()],
                &seeds[k],
                &steps[r],
                m,
                max_tokens,
                temperature,
                device,
            )
        };
        out.extend(halves(steps.len(), judge).into_iter().flatten());
        seconds.push(t0.elapsed().as_secs_f64());
    } else {
        // rla-pipe's small model: STEP_BATCH steps per call (its committed numbers come from
        // this).
        for (p, s) in prompts.chunks(STEP_BATCH).zip(seeds.chunks(STEP_BATCH)) {
            let t0 = std::time::Instant::now();
            out.extend(reward::generate(
                &model,
                spec.verdicts(),
                p,
                s,
                m,
                max_tokens,
                temperature,
                device,
            ));
            seconds.push(t0.elapsed().as_secs_f64());
        }
    }
    // `RLA_PIPE_BENCH_GENERATE` (`benches/torch_generate.py`): the prompts, the sampled tokens
    // and their log-probabilities, the seconds of each call of STEP_BATCH prompts.
    if bench::enabled(bench::GENERATE) {
        let v = spec.verdicts();
        let data = serde_json::json!({
            "kind": "responses",
            "batch": STEP_BATCH,
            "m": m,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "allowed": v.allowed(),
            "stops": v.stops(),
            "prompts": prompts,
            "samples": out.iter().map(|js| js.iter().map(|j| serde_json::json!({"tokens": j.tokens, "logprob": j.logprob})).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "seconds": seconds,
        });
        bench::write(bench::GENERATE, "rm_score", checkpoint, data)?;
    }
    Ok(out)
}

impl Stage for RmScore {
    fn name(&self) -> &'static str {
        "rm_score"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["steps"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["rm_samples"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "reward_model"]
    }
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[RM]
    }
    /// Sharded where its numbers are exact in any batch (as `rollout`'s): no RM, rla-pipe's
    /// small transformer, or any model on a GPU; a pretrained RM on CPU stays in the coordinator.
    fn shard_column(&self, config: &crate::config::Config) -> Option<&'static str> {
        let rm = &config.reward_model;
        let exact = !rm.enabled || !rm.pretrained() || !config.run.device.is_deterministic();
        exact.then_some("task_id")
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let def = schema::table_def("rm_samples").expect("known table");
            let rm = &ctx.config.reward_model;
            if !rm.enabled {
                let empty = RecordBatch::new_empty(def.schema.clone());
                return Ok(vec![(
                    "rm_samples",
                    TableOutput::Frame(ctx.session.read_batch(empty)?),
                )]);
            }
            let trajs = trajectories::load(ctx).await?;
            let spec = super::model_spec(&ctx.config, RM)?;
            let ck = spec.load(&ctx.checkpoint(RM).await?)?;
            let list: Vec<&Trajectory> = trajs.values().collect();
            let prompts = prompts(&spec, rm.max_tokens, &list)?;
            let seeds: Vec<u64> = list
                .iter()
                .flat_map(|t| {
                    (0..t.steps.len()).map(|i| derive_seed(ctx.seed, &[&t.traj_id, &i.to_string()]))
                })
                .collect();
            let steps: Vec<usize> = list.iter().map(|t| t.steps.len()).collect();
            let (m, max_tokens, temperature) = (rm.samples as usize, rm.max_tokens, rm.temperature);
            let judged = super::counted(ctx, || {
                crate::on_backend!(
                    ctx.config.run.device,
                    infer,
                    judge_on(
                        &spec,
                        &ck,
                        &prompts,
                        &seeds,
                        &steps,
                        m,
                        max_tokens,
                        temperature
                    )
                )
            })?;
            let mut out = TableBuilder::new("rm_samples")?;
            let mut at = judged.iter();
            for t in &list {
                for i in 0..t.steps.len() {
                    for (j, s) in at
                        .next()
                        .expect("one judgement list per step")
                        .iter()
                        .enumerate()
                    {
                        out.push_str(&t.task_id)
                            .push_str(&t.traj_id)
                            .push_u32(i as u32)
                            .push_u32(j as u32)
                            .push_str(&s.reasoning)
                            .push_i8(s.score)
                            .push_str(&spec.verdicts().response_text(&s.tokens))
                            .push_f64(s.logprob);
                    }
                }
            }
            let batch = out.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![(
                "rm_samples",
                TableOutput::Frame(ctx.session.read_batch(batch)?),
            )])
        })
    }
}
