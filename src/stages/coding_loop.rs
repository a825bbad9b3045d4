//! The coding setting's model stages (the reference's `sample/llm_policy_rollout.py` and
//! `sample/llm_reward_rollout.py`):
//! - [`CodingRollout`] (`rollout`): `rollout.n` programs per task from the policy, each a
//!   trajectory of one step (`steps.response` the reply, `steps.action` its program: the last
//!   ```` ```python ```` block, else the reference's "We can not extract the code" text). The
//!   trajectories' outcomes come from running them (`execute` writes `trajectories`).
//! - [`CodingRm`] (`rm_score`): `reward_model.samples` unit tests per task from the reward model
//!   (task-level samples: `traj_id` '', `step_idx` 0; `score` +1 when a test could be read from
//!   the reply, 0 otherwise — the rewards come from running the tests).
//! - [`CodingEvaluate`] (`evaluate`): `eval.rollouts` programs per held-out problem, each run
//!   against the problem's ground-truth tests; a success passes all of them.
//!
//! A pretrained model writes from the reference's prompts verbatim (raw ChatML text, as the
//! reference passes it), tokenized with the model's tokenizer; the n programs (or m tests) of a
//! task continue from its prompt's keys without copies ([`reward::generate_shared`]), two halves
//! of the tasks on two threads. Sampling: `policy.temperature` / `reward_model.temperature`,
//! up to `policy.max_tokens` / `reward_model.max_tokens` (no top-p: the reference's coding
//! sampler uses 1.0). `policy.kind = "uniform"` submits a program of `env.coding.candidates`
//! drawn uniformly (log-probability −ln k): no model, the floor of an ablation.

use super::execute::{self, problems};
use crate::determinism::{Rng, derive_seed};
use crate::env::coding::format::{extract_program, extract_test};
use crate::env::coding::{self, Problem};
use crate::error::{Error, Result};
use crate::model::count::halves;
use crate::model::reward::{self, Judgement};
use crate::model::{POLICY, RM, Weights};
use crate::schema;
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::collect;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

/// A written reply: its text (special tokens kept: what the update re-tokenizes), the text
/// without them (what is parsed) and its log-probability.
pub(crate) struct Reply {
    pub response: String,
    pub text: String,
    pub logprob: f64,
}

/// `n` replies to each prompt from a pretrained model; prompt `p`'s replies draw from
/// `seeds[p]` (sample j from `derive_seed(seeds[p], j)`).
#[allow(clippy::too_many_arguments)]
fn write_on<B: burn::tensor::backend::Backend>(
    device: &B::Device,
    tok: &crate::model::hf::HfTokenizer,
    checkpoint: &Weights,
    prompts: &[Vec<u32>],
    seeds: &[u64],
    n: usize,
    max_tokens: usize,
    temperature: f64,
) -> Result<Vec<Vec<Judgement>>> {
    let model = checkpoint.to_model::<B>(device)?;
    // Free text up to the end of the turn: no reply prefix, no verdict to read.
    let verdicts = reward::Verdicts::Text(tok, "");
    let steps = vec![1; prompts.len()];
    let write = |r: std::ops::Range<usize>| {
        super::rm_score::judge_trajectories(
            &model,
            verdicts,
            &prompts[r.clone()],
            &seeds[r.clone()],
            &steps[r],
            n,
            max_tokens,
            temperature,
            device,
        )
    };
    Ok(halves(prompts.len(), write).into_iter().flatten().collect())
}

/// `n` replies per prompt text from the model `role` of a config, at `temperature`.
#[allow(clippy::too_many_arguments)]
async fn write_replies(
    ctx: &StageContext,
    role: &str,
    texts: &[String],
    seeds: &[u64],
    n: usize,
    max_tokens: usize,
    temperature: f64,
) -> Result<Vec<Vec<Reply>>> {
    let spec = super::model_spec(&ctx.config, role)?;
    let ck = spec.load(&ctx.checkpoint(role).await?)?;
    let tok = &spec
        .hf
        .as_ref()
        .ok_or_else(|| {
            Error::config(format!(
                "the coding environment's {role} writes text: it needs a pretrained model ({}.init = \"hf:DIR\")",
                if role == POLICY { "policy" } else { "reward_model" }
            ))
        })?
        .tokenizer;
    let prompts = texts
        .iter()
        .map(|t| tok.encode(t, false))
        .collect::<Result<Vec<_>>>()?;
    let written = super::counted(ctx, || {
        crate::on_backend!(
            ctx.config.run.device,
            infer,
            write_on(tok, &ck, &prompts, seeds, n, max_tokens, temperature)
        )
    })?;
    let v = reward::Verdicts::Text(tok, "");
    written
        .into_iter()
        .map(|js| {
            js.into_iter()
                .map(|j| {
                    Ok(Reply {
                        response: v.response_text(&j.tokens),
                        text: tok.decode(&j.tokens, true)?,
                        logprob: j.logprob,
                    })
                })
                .collect()
        })
        .collect()
}

/// `n` programs for each problem from the config's policy (`eval`: the reference's evaluation
/// prompt), rollout r of problem p drawing from `derive_seed(seed, [task id, r])`.
pub(crate) async fn write_programs(
    ctx: &StageContext,
    problems: &[(String, Problem)],
    n: u32,
    temperature: f64,
    seed: u64,
    eval: bool,
) -> Result<Vec<Vec<Reply>>> {
    let cfg = &ctx.config;
    if cfg.policy.kind == crate::config::PolicyKind::Uniform {
        let programs = coding::candidates(&cfg.env.coding.candidates)?;
        let logprob = -(programs.len() as f64).ln();
        return Ok(problems
            .iter()
            .map(|(id, _)| {
                (0..n)
                    .map(|r| {
                        let mut rng = Rng::new(derive_seed(seed, &[id, &r.to_string()]));
                        let k =
                            ((rng.unit() * programs.len() as f64) as usize).min(programs.len() - 1);
                        let reply = format!("```python\n{}```", programs[k]);
                        Reply {
                            response: reply.clone(),
                            text: reply,
                            logprob,
                        }
                    })
                    .collect()
            })
            .collect());
    }
    let max_tokens = super::model_spec(cfg, POLICY)?
        .generating()
        .map(|(g, _)| g.max_tokens)
        .ok_or_else(|| {
            Error::config(
                "key `policy.action_mode`: the coding environment's policy writes programs: set \"generate\" (and policy.init = \"hf:DIR\")",
            )
        })?;
    let texts: Vec<String> = problems
        .iter()
        .map(|(_, p)| p.policy_prompt(eval))
        .collect();
    let seeds: Vec<u64> = problems
        .iter()
        .map(|(id, _)| derive_seed(seed, &[id]))
        .collect();
    write_replies(
        ctx,
        POLICY,
        &texts,
        &seeds,
        n as usize,
        max_tokens,
        temperature,
    )
    .await
}

/// `rollout` of the coding setting.
pub struct CodingRollout;

impl Stage for CodingRollout {
    fn name(&self) -> &'static str {
        "rollout"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["steps"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "rollout", "policy"]
    }
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[POLICY]
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let problems = problems(ctx).await?;
            let replies = write_programs(
                ctx,
                &problems,
                ctx.config.rollout.n,
                ctx.config.policy.temperature,
                ctx.seed,
                false,
            )
            .await?;
            let mut steps = TableBuilder::new("steps")?;
            for ((task_id, problem), replies) in problems.iter().zip(replies) {
                for (r, reply) in replies.into_iter().enumerate() {
                    steps
                        .push_str(task_id)
                        .push_str(&schema::traj_id(task_id, r as u32))
                        .push_u32(0)
                        .push_str(&problem.question)
                        .push_str(&extract_program(&reply.text))
                        .push_f64(reply.logprob)
                        .push_opt_i8(None)
                        .push_str("")
                        .push_str("[]")
                        .push_opt_str(Some(&reply.response));
                }
            }
            let steps = steps.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![(
                "steps",
                TableOutput::Frame(ctx.session.read_batch(steps)?),
            )])
        })
    }
}

/// `rm_score` of the coding setting: the reward model writes unit tests.
pub struct CodingRm;

impl Stage for CodingRm {
    fn name(&self) -> &'static str {
        "rm_score"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks"]
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
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let rm = &ctx.config.reward_model;
            let mut out = TableBuilder::new("rm_samples")?;
            if rm.enabled {
                let problems = problems(ctx).await?;
                let texts: Vec<String> =
                    problems.iter().map(|(_, p)| p.unit_test_prompt()).collect();
                let seeds: Vec<u64> = problems
                    .iter()
                    .map(|(id, _)| derive_seed(ctx.seed, &[id]))
                    .collect();
                let written = write_replies(
                    ctx,
                    RM,
                    &texts,
                    &seeds,
                    rm.samples as usize,
                    rm.max_tokens,
                    rm.temperature,
                )
                .await?;
                for ((task_id, _), tests) in problems.iter().zip(written) {
                    for (j, t) in tests.into_iter().enumerate() {
                        let read = extract_test(&t.text).is_some();
                        out.push_str(task_id)
                            .push_str("")
                            .push_u32(0)
                            .push_u32(j as u32)
                            .push_str(&t.text)
                            .push_i8(i8::from(read))
                            .push_str(&t.response)
                            .push_f64(t.logprob);
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

/// `evaluate` of the coding setting: held-out problems (drawn from `env.coding.eval_problems`,
/// or from the training file, with `eval.seed`; never one of this iteration's training tasks),
/// `eval.rollouts` programs each sampled at `eval.temperature` (as the reference evaluates;
/// `eval.mode` is not read), each run against the ground truth. No OOD split: problems have no
/// harder level.
pub struct CodingEvaluate;

impl Stage for CodingEvaluate {
    fn name(&self) -> &'static str {
        "evaluate"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["evaluations"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "policy", "eval"]
    }
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[POLICY]
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let cfg = &ctx.config;
            let mut training = std::collections::BTreeSet::new();
            for b in collect(&ctx.session, "SELECT task_id FROM tasks").await? {
                let ids = Columns::new(&b, "the evaluate stage's tasks").str("task_id")?;
                training.extend((0..b.num_rows()).map(|i| ids.value(i).to_string()));
            }
            let file = if cfg.env.coding.eval_problems.is_empty() {
                &cfg.env.coding.problems
            } else {
                &cfg.env.coding.eval_problems
            };
            let environment = coding::Coding::new(file);
            use crate::env::Environment;
            let mut held: Vec<(String, Problem)> = Vec::new();
            for spec in
                environment.generate(derive_seed(cfg.eval.seed, &["held-out"]), cfg.eval.tasks)?
            {
                let id = crate::env::task_id("coding", &spec);
                if !training.contains(&id) {
                    let p = Problem::parse(&spec).map_err(Error::data)?;
                    held.push((id, p));
                }
            }
            held.sort_by(|a, b| a.0.cmp(&b.0));
            let (per_task, temperature) = (cfg.eval.rollouts, cfg.eval.temperature);
            let replies = write_programs(ctx, &held, per_task, temperature, ctx.seed, true).await?;
            let programs: Vec<Vec<String>> = replies
                .iter()
                .map(|rs| rs.iter().map(|r| extract_program(&r.text)).collect())
                .collect();
            let items: Vec<(&Problem, &str)> = held
                .iter()
                .zip(&programs)
                .flat_map(|((_, p), ps)| ps.iter().map(move |x| (p, x.as_str())))
                .collect();
            let passed = execute::passes_all(&cfg.env.coding, &items)?;
            let mut out = TableBuilder::new("evaluations")?;
            for (t, (task_id, _)) in held.iter().enumerate() {
                let n = per_task as usize;
                let won = passed[t * n..(t + 1) * n].iter().filter(|x| **x).count() as u32;
                out.push_str(task_id)
                    .push_u32(per_task)
                    .push_u32(won)
                    .push_str("held_out");
            }
            let batch = out.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![(
                "evaluations",
                TableOutput::Frame(ctx.session.read_batch(batch)?),
            )])
        })
    }
}
