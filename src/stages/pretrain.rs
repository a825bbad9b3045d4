//! Stage `pretrain` (iteration 0 only): the warm start, in place of the pretrained LLM the
//! paper starts from. It draws demonstration tasks from the environment one difficulty level
//! EASIER than the training pool's ([`env::at_level`] `env.pool_level − 1`, seed
//! `pretrain.seed`), minus every task of the training pool, the held-out set and the OOD set,
//! and
//!
//! - plays `pretrain.policy_episodes` episodes with the environment's planner
//!   ([`env::Episode::oracle_action`]) and trains the policy by behaviour cloning on them
//!   (`pretrain.policy_epochs` passes);
//! - plays episodes where a uniformly random admissible action replaces the planner's with
//!   probability `pretrain.random_action_prob` until `pretrain.rm_steps` steps are gathered,
//!   and teaches the reward model the step oracle's verdict on each (`progress <good>` /
//!   `wasted <bad>`, `pretrain.rm_epochs` passes).
//!
//! Its data is the committed `demonstrations` table; its outputs are the `policy` and `rm`
//! checkpoints every later stage starts from (content-addressed artifacts like the update's).
//! Deterministic on the CPU backend: `replay --verify` re-executes it.
//!
//! Screenshots (`env.web.screenshots`): each demonstration step's screen, and the screen after
//! an episode's last step, as artifacts `screenshot-demo-<purpose>-<episode>-<step_idx>` (the
//! `demonstrations` key; the last one's `step_idx` is the episode's step count).

use crate::config::{Config, PolicyKind};
use crate::determinism::{Rng, canonical, derive_seed};
use crate::env::{self, Environment};
use crate::error::{Error, Result};
use crate::model::policy::Decision;
use crate::model::ppo::{PpoSettings, Schedule};
use crate::model::pretrain::{clone_policy, teach_responses};
use crate::model::{POLICY, RM, StepRow, Trajectory};
use crate::schema::rows::TableBuilder;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

pub struct Pretrain;

/// One demonstration episode.
struct Episode {
    task_id: String,
    spec: String,
    steps: Vec<Demo>,
    /// The screen before each step, then after the last one (empty where the environment
    /// keeps no screenshots).
    screenshots: Vec<Vec<u8>>,
}

struct Demo {
    row: StepRow,
    planner: bool,
    oracle: Option<i8>,
}

/// Play one episode: the planner's action, or (with probability `random`) a uniformly random
/// admissible one. Stops when the episode ends, or after `cap` steps.
fn play(
    environment: &dyn Environment,
    task_id: &str,
    spec: &serde_json::Value,
    random: f64,
    rng: &mut Rng,
    cap: u32,
) -> Result<Episode> {
    let mut ep = environment.reset(spec)?;
    let limit = ep.max_steps().min(cap);
    let mut steps = Vec::new();
    let mut screenshots = Vec::new();
    while (steps.len() as u32) < limit {
        screenshots.extend(ep.screenshot()?);
        let obs = ep.observation().clone();
        let planned = ep.oracle_action().ok_or_else(|| {
            Error::Environment(format!(
                "pretrain: the {} planner has no action for task {task_id} at step {}",
                environment.name(),
                steps.len()
            ))
        })?;
        let explore = random > 0.0 && rng.unit() < random;
        let action = if explore {
            obs.admissible[(rng.next_u64() % obs.admissible.len() as u64) as usize].clone()
        } else {
            planned.clone()
        };
        let st = ep.step(&action)?;
        steps.push(Demo {
            planner: action == planned,
            oracle: st.oracle_progress,
            row: StepRow {
                step_idx: steps.len() as u32,
                observation: obs.text,
                action,
                next_observation: ep.observation().text.clone(),
                admissible: obs.admissible,
                response: None,
            },
        });
        if st.done {
            break;
        }
    }
    screenshots.extend(ep.screenshot()?);
    Ok(Episode {
        task_id: task_id.to_string(),
        spec: canonical(spec),
        steps,
        screenshots,
    })
}

/// The demonstration tasks: drawn from the easier level, none of them a training, held-out or
/// OOD task.
fn demonstration_tasks(
    cfg: &Config,
    environment: &dyn Environment,
    count: u32,
) -> Result<Vec<(String, serde_json::Value)>> {
    let main = env::pool_from_config(&cfg.env)?;
    let mut exclude: std::collections::BTreeSet<String> =
        super::pool::distinct_tasks(main.as_ref(), cfg.run.seed, cfg.env.initial_tasks)?
            .into_iter()
            .map(|t| t.0)
            .collect();
    for (_, _, tasks) in super::evaluate::eval_sets(cfg)? {
        exclude.extend(tasks.into_iter().map(|t| t.0));
    }
    let mut seen = std::collections::BTreeSet::new();
    let tasks: Vec<(String, serde_json::Value)> = environment
        .generate(derive_seed(cfg.pretrain.seed, &["pretrain"]), count.max(1))?
        .into_iter()
        .map(|s| (env::task_id(environment.name(), &s), s))
        .filter(|(id, _)| !exclude.contains(id) && seen.insert(id.clone()))
        .collect();
    if tasks.is_empty() {
        return Err(Error::Environment(format!(
            "pretrain: every task drawn from the easier {} distribution is a training, held-out or OOD task",
            environment.name()
        )));
    }
    Ok(tasks)
}

fn settings(cfg: &Config, samples: usize, epochs: u32) -> PpoSettings {
    let mb = cfg.pretrain.minibatch.max(1) as usize;
    PpoSettings {
        clip_eps: cfg.reward.clip_eps,
        kl_beta: 0.0,
        log_ratio_clamp: cfg.update.log_ratio_clamp,
        lr: cfg.pretrain.lr,
        weight_decay: cfg.update.weight_decay,
        adam_eps: cfg.update.adam_eps,
        grad_clip: cfg.update.grad_clip,
        steps: (samples * epochs as usize).div_ceil(mb) as u32,
        minibatch: mb,
        schedule: Schedule::Fixed,
        micro_tokens: cfg.update.micro_tokens(cfg.run.device),
        // One device queue on `cuda` (as the update stage).
        threads: match cfg.run.device {
            crate::model::Device::Cuda => 1,
            _ => cfg.update.threads,
        }, // Behaviour cloning: no snapshot to stay near.
        target_kl: 0.0,
        gpu: cfg.run.device == crate::model::Device::Cuda,
        checkpoint_layers: cfg.update.checkpoints_layers(cfg.run.device),
    }
}

impl Stage for Pretrain {
    fn name(&self) -> &'static str {
        "pretrain"
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["demonstrations"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &[
            "env",
            "policy",
            "reward_model",
            "reward.clip_eps",
            "update",
            "eval",
            "pretrain",
        ]
    }
    /// The seeded initial models it starts from.
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[POLICY, RM]
    }
    fn checkpoints_out(&self) -> &'static [&'static str] {
        &[POLICY, RM]
    }
    fn runs_at(&self, iter: u32) -> bool {
        iter == 0
    }
    fn assets_in(&self, config: &crate::config::Config) -> bool {
        super::env_assets(config)
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            super::install_assets(ctx).await?;
            let cfg = &ctx.config;
            let p = &cfg.pretrain;
            // One level below the training pool's.
            let environment = env::at_level(&cfg.env, cfg.env.pool_level - 1)?.ok_or_else(|| {
            Error::config(format!(
                "key `pretrain.enabled`: the {:?} environment has no planner to imitate; set pretrain.enabled = false",
                cfg.env.name
            ))
        })?;
            let tasks =
                demonstration_tasks(cfg, environment.as_ref(), p.policy_episodes.max(p.tasks))?;
            super::emit_assets(ctx, environment.as_ref(), tasks.iter().map(|(_, s)| s))?;
            let cap = cfg.env.max_steps;
            // The planner's episodes (the policy's), then the RM's until rm_steps steps.
            let mut policy_eps = Vec::new();
            let mut rng = Rng::new(derive_seed(ctx.seed, &["policy"]));
            for k in 0..p.policy_episodes as usize {
                let (id, spec) = &tasks[k % tasks.len()];
                policy_eps.push(play(environment.as_ref(), id, spec, 0.0, &mut rng, cap)?);
            }
            let mut rm_eps = Vec::new();
            let mut rng = Rng::new(derive_seed(ctx.seed, &["rm"]));
            let mut gathered = 0usize;
            let mut k = p.policy_episodes as usize;
            while gathered < p.rm_steps as usize {
                let (id, spec) = &tasks[k % tasks.len()];
                let mut ep = play(
                    environment.as_ref(),
                    id,
                    spec,
                    p.random_action_prob,
                    &mut rng,
                    cap,
                )?;
                ep.steps.truncate(p.rm_steps as usize - gathered);
                // The screen after the last step kept is the one before the first dropped.
                ep.screenshots.truncate(ep.steps.len() + 1);
                gathered += ep.steps.len();
                rm_eps.push(ep);
                k += 1;
            }

            for (purpose, eps) in [("policy", &mut policy_eps), ("rm", &mut rm_eps)] {
                for (e, ep) in eps.iter_mut().enumerate() {
                    let of = format!("demo-{purpose}-{e}");
                    for (k, png) in std::mem::take(&mut ep.screenshots).into_iter().enumerate() {
                        ctx.emit_screenshot(&of, k, png);
                    }
                }
            }
            let mut out = TableBuilder::new("demonstrations")?;
            for (purpose, eps) in [("policy", &policy_eps), ("rm", &rm_eps)] {
                for (e, ep) in eps.iter().enumerate() {
                    for d in &ep.steps {
                        out.push_str(purpose)
                            .push_str(&ep.task_id)
                            .push_u32(e as u32)
                            .push_u32(d.row.step_idx)
                            .push_str(&d.row.observation)
                            .push_str(&d.row.action)
                            .push_bool(d.planner)
                            .push_opt_i8(d.oracle)
                            .push_str(&d.row.next_observation)
                            .push_str(&serde_json::to_string(&d.row.admissible).expect("strings"))
                            .push_str(&ep.spec);
                    }
                }
            }
            let batch = out.finish_with(&ctx.run_id, ctx.iter)?;
            let device = cfg.run.device;

            // Policy: behaviour cloning on the planner's steps.
            let policy_in = ctx.checkpoint(POLICY).await?;
            let policy_out = if cfg.policy.kind == PolicyKind::Uniform || policy_eps.is_empty() {
                policy_in
            } else {
                let spec = super::model_spec(cfg, POLICY)?;
                let ck = spec.load(&policy_in)?;
                // `score` mode: decisions among the admissible actions; `generate` mode: the reply
                // naming the planner's action, token by token.
                let generating = spec.generating().map(|(_, h)| h);
                let (mut decisions, mut chosen): (Vec<Decision>, Vec<usize>) = (vec![], vec![]);
                let (mut prompts, mut replies) = (vec![], vec![]);
                for ep in &policy_eps {
                    let t = trajectory(ep);
                    for (i, d) in ep.steps.iter().enumerate() {
                        let k = d
                        .row
                        .admissible
                        .iter()
                        .position(|a| *a == d.row.action)
                        .ok_or_else(|| {
                            Error::Environment(format!(
                                "pretrain: the planner's action {:?} for task {} step {i} is not admissible",
                                d.row.action, ep.task_id
                            ))
                        })?;
                        let (task, past, obs, adm) =
                            (t.task(), t.past(i), &d.row.observation, &d.row.admissible);
                        match generating {
                            Some(h) => {
                                prompts.push(spec.reply_prompt(task, &past, obs, adm)?);
                                replies
                                    .push(crate::model::hf::prompt::choice_reply(&h.tokenizer, k)?);
                            }
                            None => decisions.push(spec.decision(task, &past, obs, adm)?),
                        }
                        chosen.push(k);
                    }
                }
                let s = settings(cfg, chosen.len(), p.policy_epochs);
                let seed = derive_seed(ctx.seed, &["train", POLICY]);
                let (ck, metrics) = super::counted(ctx, || {
                    if generating.is_some() {
                        crate::on_backend!(
                            device,
                            train,
                            teach_responses(&spec, &ck, &prompts, &replies, &s, seed)
                        )
                    } else {
                        crate::on_backend!(
                            device,
                            train,
                            clone_policy(&spec, &ck, &decisions, &chosen, &s, seed)
                        )
                    }
                })?;
                report(POLICY, &metrics);
                ck.encode()
            };

            // Reward model: the oracle's verdict on every labelled step.
            let rm_in = ctx.checkpoint(RM).await?;
            let rm_out = if !cfg.reward_model.enabled || rm_eps.is_empty() {
                rm_in
            } else {
                let spec = super::model_spec(cfg, RM)?;
                let ck = spec.load(&rm_in)?;
                let max = cfg.reward_model.max_tokens;
                let (good, bad) = (
                    spec.taught_verdict(true, max)?,
                    spec.taught_verdict(false, max)?,
                );
                let mut labelled = vec![];
                for ep in &rm_eps {
                    let t = trajectory(ep);
                    for (i, d) in ep.steps.iter().enumerate() {
                        let Some(label) = d.oracle else { continue };
                        labelled.push((spec.rm_prompt(max, &t, i)?, label > 0));
                    }
                }
                if p.rm_balance {
                    let keep = balanced(&labelled.iter().map(|l| l.1).collect::<Vec<_>>());
                    labelled = keep.into_iter().map(|k| labelled[k].clone()).collect();
                }
                let (mut prompts, mut responses) = (vec![], vec![]);
                for (prompt, good_step) in labelled {
                    prompts.push(prompt);
                    responses.push(if good_step { good.clone() } else { bad.clone() });
                }
                if prompts.is_empty() {
                    rm_in
                } else {
                    let s = settings(cfg, prompts.len(), p.rm_epochs);
                    let seed = derive_seed(ctx.seed, &["train", RM]);
                    let (ck, metrics) = super::counted(ctx, || {
                        crate::on_backend!(
                            device,
                            train,
                            teach_responses(&spec, &ck, &prompts, &responses, &s, seed)
                        )
                    })?;
                    report(RM, &metrics);
                    ck.encode()
                }
            };
            ctx.emit_artifact(POLICY, policy_out);
            ctx.emit_artifact(RM, rm_out);
            Ok(vec![(
                "demonstrations",
                TableOutput::Frame(ctx.session.read_batch(batch)?),
            )])
        })
    }
}

fn trajectory(ep: &Episode) -> Trajectory {
    Trajectory {
        task_id: ep.task_id.clone(),
        traj_id: String::new(),
        steps: ep.steps.iter().map(|d| d.row.clone()).collect(),
    }
}

fn report(model: &str, metrics: &[crate::model::ppo::StepMetrics]) {
    if let (Some(first), Some(last)) = (metrics.first(), metrics.last()) {
        tracing::info!(
            model,
            steps = metrics.len(),
            first_loss = first.loss,
            last_loss = last.loss,
            "pretrain: supervised warm start"
        );
    }
}

/// `pretrain.rm_balance`: the indices of the labels kept — every label of the rarer class and
/// as many of the other, evenly spaced over their order (deterministic), in the original order.
pub(crate) fn balanced(good: &[bool]) -> Vec<usize> {
    let (pos, neg): (Vec<usize>, Vec<usize>) = (0..good.len()).partition(|&i| good[i]);
    let (rare, common) = if pos.len() <= neg.len() {
        (pos, neg)
    } else {
        (neg, pos)
    };
    let k = rare.len();
    let mut keep: Vec<usize> = rare;
    keep.extend((0..k).map(|j| common[j * common.len() / k.max(1)]));
    keep.sort_unstable();
    keep
}

#[cfg(test)]
mod tests {
    use super::balanced;

    /// Equal counts of each verdict, the rarer kept whole, the other spread over its order.
    #[test]
    fn balancing_keeps_the_rarer_verdict_and_as_many_of_the_other() {
        let good = [true, true, false, true, true, true, false, true];
        let keep = balanced(&good);
        assert_eq!(keep, vec![0, 2, 4, 6]);
        assert_eq!(keep.iter().filter(|&&i| good[i]).count(), 2);
        assert_eq!(
            balanced(&[true, true]),
            Vec::<usize>::new(),
            "no bad step: nothing"
        );
        assert_eq!(balanced(&[false, true]), vec![0, 1]);
    }
}
