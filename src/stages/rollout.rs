//! Stage 1, `rollout`: `tasks` → `trajectories`, `steps`. Every distinct task of the pool (active
//! and pending) gets `rollout.n` rollouts, each with its own seed derived from (stage seed, task id,
//! rollout index), run in parallel on all cores and written in key order.
//!
//! Policy `transformer` (default): the learned policy of the checkpoint the engine hands in (the
//! previous iteration's update, or the seeded initial model), sampled at `policy.temperature`;
//! all live episodes advance in lockstep so that every step scores the admissible actions of all
//! of them in one batch (with a pretrained model: one packed row per episode, its new prompt
//! tokens and every admissible action as a leaf of a prefix tree; each episode keeps its
//! prompt's keys/values between steps, and the next prompt computes only what it does not
//! share with the last one, checked token by token: `model::tree`) — or, with
//! `policy.action_mode = "generate"` (pretrained models), every
//! live episode's reply is generated in one batch with the KV cache and its `\boxed{index}`
//! names the action (a reply without one: `(invalid reply)`, "Nothing happens.", a step used;
//! `steps.response` keeps the reply, `action_logprob` is the reply's log-probability). Policy `uniform`: uniform over the admissible actions, `action_logprob
//! = −ln #admissible` — the floor for ablations. An episode ends when the environment says so or
//! after `min(task budget, env.max_steps)` steps; the outcome is +1 if it was won.
//!
//! Screenshots (`env.web.screenshots`, off by default): each step's screen as its observation
//! shows it, and the screen after the last step, as artifacts `screenshot-<traj_id>-<step_idx>`
//! (the last one's `step_idx` is the trajectory's step count); the stage then runs whole (a
//! cluster's shards store no artifacts).

use std::sync::Arc;

use crate::determinism::Rng;
use crate::determinism::derive_seed;
use crate::env::{self, Environment};
use crate::error::{Error, Result};
use crate::model::count::halves;
use crate::model::hf::{self, Sampling};
use crate::model::tree::{SeqCache, encode_reusing};
use crate::model::{ModelSpec, Weights, policy};
use crate::schema;
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::collect;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

pub struct Rollout;

/// One step of a rollout, as `steps` stores it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepRecord {
    pub(crate) observation: String,
    pub(crate) action: String,
    pub(crate) logprob: f64,
    pub(crate) oracle: Option<i8>,
    pub(crate) next_observation: String,
    pub(crate) admissible: Vec<String>,
    /// `generate` mode: the policy's whole reply.
    pub(crate) response: Option<String>,
}

impl StepRecord {
    /// The step's columns from `observation` to `response`, in the order `steps` and
    /// `eval_steps` hold them (after their keys and `step_idx`).
    pub(crate) fn push_columns(&self, b: &mut TableBuilder) {
        let admissible = serde_json::to_string(&self.admissible).expect("strings serialize");
        b.push_str(&self.observation)
            .push_str(&self.action)
            .push_f64(self.logprob)
            .push_opt_i8(self.oracle)
            .push_str(&self.next_observation)
            .push_str(&admissible)
            .push_opt_str(self.response.as_deref());
    }
}

/// One finished rollout.
pub(crate) struct Rolled {
    pub(crate) outcome: i8,
    pub(crate) steps: Vec<StepRecord>,
    /// The episode's screenshots ([`crate::env::Episode::screenshot`]; empty where it keeps
    /// none): the screen before each step, then the screen after the last one.
    pub(crate) screenshots: Vec<Vec<u8>>,
}

/// Keep the episode's screenshot of its screen now, if it takes one.
fn shoot(episode: &mut dyn crate::env::Episode, into: &mut Vec<Vec<u8>>) -> Result<()> {
    if let Some(png) = episode.screenshot()? {
        into.push(png);
    }
    Ok(())
}

/// One uniform-policy rollout.
pub(crate) fn roll(
    environment: &dyn Environment,
    spec: &serde_json::Value,
    seed: u64,
    cap: u32,
    task_id: &str,
    r: u32,
) -> Result<Rolled> {
    let mut rng = Rng::new(seed);
    let mut episode = environment
        .reset(spec)
        .map_err(|e| context(e, task_id, r, None))?;
    let limit = episode.max_steps().min(cap);
    let mut steps = Vec::new();
    let mut screenshots = Vec::new();
    let mut won = false;
    for i in 0..limit {
        let obs = episode.observation();
        if obs.admissible.is_empty() {
            return Err(Error::Environment(format!(
                "task {task_id} rollout {r} step {i}: no admissible action"
            )));
        }
        let k = (rng.next_u64() % obs.admissible.len() as u64) as usize;
        let action = obs.admissible[k].clone();
        let logprob = -(obs.admissible.len() as f64).ln();
        let (text, admissible) = (obs.text.clone(), obs.admissible.clone());
        shoot(episode.as_mut(), &mut screenshots).map_err(|e| context(e, task_id, r, Some(i)))?;
        let step = episode
            .step(&action)
            .map_err(|e| context(e, task_id, r, Some(i)))?;
        steps.push(StepRecord {
            observation: text,
            action,
            logprob,
            oracle: step.oracle_progress,
            next_observation: episode.observation().text.clone(),
            admissible,
            response: None,
        });
        if step.done {
            won = step.won;
            break;
        }
    }
    shoot(episode.as_mut(), &mut screenshots)
        .map_err(|e| context(e, task_id, r, Some(steps.len() as u32)))?;
    Ok(Rolled {
        outcome: if won { 1 } else { -1 },
        steps,
        screenshots,
    })
}

/// `steps.action` of a `generate`-mode reply that names no admissible action.
pub(crate) const INVALID_ACTION: &str = "(invalid reply)";
/// What an invalid reply observes (AlfWorld's answer to a command it cannot carry out).
pub(crate) const NOTHING_HAPPENS: &str = "Nothing happens.";

/// The (observation, action) pairs of the steps so far (the prompts' history).
fn past(steps: &[StepRecord]) -> Vec<(&str, &str)> {
    steps
        .iter()
        .map(|s| (s.observation.as_str(), s.action.as_str()))
        .collect()
}

/// Episodes to play: (task id, spec, rollout index, seed).
pub(crate) type Job<'a> = (&'a str, &'a serde_json::Value, u32, u64);

/// Decisions scored per model call.
const DECISION_BATCH: usize = 512;

/// Play episodes with a learned policy, all in lockstep: each round scores the admissible
/// actions of every live episode (in batches) and advances each by one step. `greedy` takes the
/// most likely action (evaluation); otherwise actions are sampled at `temperature` with each
/// episode's own seed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn play<B: burn::tensor::backend::Backend>(
    device: &B::Device,
    spec: &ModelSpec,
    checkpoint: &Weights,
    environment: &dyn Environment,
    jobs: &[Job<'_>],
    cap: u32,
    temperature: f64,
    greedy: bool,
    dump: Option<&str>,
) -> Result<Vec<Rolled>> {
    struct Live {
        episode: Box<dyn crate::env::Episode>,
        rng: Rng,
        task: String,
        steps: Vec<StepRecord>,
        screenshots: Vec<Vec<u8>>,
        limit: u32,
        won: Option<bool>,
    }
    let model = spec.inference_model::<B>(checkpoint, device)?;
    // `RLA_PIPE_BENCH_GENERATE` (`benches/torch_generate.py`): every scoring call with its
    // decisions, log π and seconds, as `<dump>.json`.
    let mut bench = dump
        .filter(|_| super::bench::enabled(super::bench::GENERATE))
        .map(|name| (name, Vec::new()));
    let mut live = Vec::with_capacity(jobs.len());
    // Each episode's last prompt and its keys/values: the next step's prompt computes only what
    // it does not share with it (`model::tree`). Pretrained models only: rla-pipe's small
    // transformer keeps every episode's bits
    // independent of its batch-mates (its rollouts shard across workers), which a reused prefix
    // padded to the batch's longest would not (the padding sits between the prefix and the new
    // tokens), and its short prompts have little to reuse.
    let mut caches: Vec<Option<SeqCache<B>>> = (0..jobs.len()).map(|_| None).collect();
    let reuse = matches!(model, crate::model::AnyLm::Hf(_));
    for (task_id, task_spec, r, seed) in jobs {
        let episode = environment
            .reset(task_spec)
            .map_err(|e| context(e, task_id, *r, None))?;
        live.push(Live {
            limit: episode.max_steps().min(cap),
            task: episode.observation().text.clone(),
            episode,
            rng: Rng::new(*seed),
            steps: Vec::new(),
            screenshots: Vec::new(),
            won: None,
        });
    }
    loop {
        let running: Vec<usize> = (0..live.len()).filter(|i| live[*i].won.is_none()).collect();
        if running.is_empty() {
            break;
        }
        for chunk in running.chunks(DECISION_BATCH) {
            for &i in chunk {
                let obs = live[i].episode.observation();
                if obs.admissible.is_empty() {
                    let (task_id, _, r, _) = jobs[i];
                    return Err(Error::Environment(format!(
                        "task {task_id} rollout {r} step {}: no admissible action",
                        live[i].steps.len()
                    )));
                }
            }
            // The action each episode takes: (admissible index or None for an invalid reply,
            // its log-probability, the reply in generate mode).
            let mut picks: Vec<(Option<usize>, f64, Option<String>)> =
                Vec::with_capacity(chunk.len());
            if let Some((g, h)) = spec.generating() {
                let mut prompts = Vec::with_capacity(chunk.len());
                let mut seeds = Vec::with_capacity(chunk.len());
                for &i in chunk {
                    let l = &mut live[i];
                    let obs = l.episode.observation();
                    let past = past(&l.steps);
                    prompts.push(spec.reply_prompt(&l.task, &past, &obs.text, &obs.admissible)?);
                    seeds.push(l.rng.next_u64());
                }
                let sampling = Sampling {
                    temperature: if greedy { 0.0 } else { temperature },
                    top_p: g.top_p,
                    max_tokens: g.max_tokens,
                    seed: 0,
                };
                let (last, cache) =
                    encode_chunk(&model, chunk, &prompts, &mut caches, reuse, device);
                let replies = hf::generate::sample_encoded(
                    &model,
                    &prompts,
                    Some((last, cache)),
                    &seeds,
                    &h.tokenizer.eos_ids,
                    &sampling,
                    device,
                )?;
                for (&i, (ids, logprob)) in chunk.iter().zip(replies) {
                    let admissible = &live[i].episode.observation().admissible;
                    let text = h.tokenizer.decode(&ids, true)?;
                    let pick = hf::prompt::parse_choice(&text, admissible);
                    picks.push((pick, logprob, Some(h.tokenizer.decode(&ids, false)?)));
                }
            } else {
                let mut decisions = Vec::with_capacity(chunk.len());
                for &i in chunk {
                    let l = &live[i];
                    let obs = l.episode.observation();
                    let past = past(&l.steps);
                    decisions.push(spec.decision(&l.task, &past, &obs.text, &obs.admissible)?);
                }
                let t0 = std::time::Instant::now();
                let past: Vec<Option<&SeqCache<B>>> =
                    chunk.iter().map(|&i| caches[i].as_ref()).collect();
                let score = |r: std::ops::Range<usize>| {
                    let (lp, own) = policy::log_probs_reusing(
                        &model,
                        &decisions[r.clone()],
                        &past[r],
                        temperature,
                        spec.action_mean,
                        device,
                    );
                    (policy::to_host(lp), own)
                };
                // A pretrained model's decisions in two halves on two threads (each row's
                // numbers depend on its own prompt, actions and cache only up to the padding
                // its batch-mates add); the small transformer's stay as committed.
                let parts = if reuse {
                    halves(decisions.len(), score)
                } else {
                    vec![score(0..decisions.len())]
                };
                let mut lp = Vec::with_capacity(decisions.len());
                let mut own = Vec::with_capacity(decisions.len());
                for (l, o) in parts {
                    lp.extend(l);
                    own.extend(o);
                }
                if reuse {
                    for (&i, c) in chunk.iter().zip(own) {
                        caches[i] = Some(c);
                    }
                }
                if let Some((_, calls)) = bench.as_mut() {
                    calls.push(serde_json::json!({
                        "seconds": t0.elapsed().as_secs_f64(),
                        "decisions": super::bench::decisions(&decisions),
                        "logprobs": decisions.iter().zip(&lp).map(|(d, row)| row[..d.actions.len()].to_vec()).collect::<Vec<_>>(),
                    }));
                }
                for (k, &i) in chunk.iter().enumerate() {
                    let l = &mut live[i];
                    let n = l.episode.observation().admissible.len();
                    let pick = if greedy {
                        policy::greedy(&lp[k][..n])
                    } else {
                        policy::sample(&lp[k][..n], l.rng.unit())
                    };
                    picks.push((Some(pick), f64::from(lp[k][pick]), None));
                }
            }
            for (&i, (pick, logprob, response)) in chunk.iter().zip(picks) {
                let l = &mut live[i];
                let obs = l.episode.observation();
                let (text, admissible) = (obs.text.clone(), obs.admissible.clone());
                let (task_id, _, r, _) = jobs[i];
                let at = Some(l.steps.len() as u32);
                shoot(l.episode.as_mut(), &mut l.screenshots)
                    .map_err(|e| context(e, task_id, r, at))?;
                let (action, oracle, next, done, won) = match pick {
                    Some(k) => {
                        let action = admissible[k].clone();
                        let step = l
                            .episode
                            .step(&action)
                            .map_err(|e| context(e, task_id, r, Some(l.steps.len() as u32)))?;
                        let next = l.episode.observation().text.clone();
                        (action, step.oracle_progress, next, step.done, step.won)
                    }
                    // A reply naming no admissible action changes nothing and uses a step.
                    None => (
                        INVALID_ACTION.to_string(),
                        None,
                        NOTHING_HAPPENS.to_string(),
                        false,
                        false,
                    ),
                };
                l.steps.push(StepRecord {
                    observation: text,
                    action,
                    logprob,
                    oracle,
                    next_observation: next,
                    admissible,
                    response,
                });
                if done {
                    l.won = Some(won);
                } else if l.steps.len() as u32 >= l.limit {
                    l.won = Some(false);
                }
                if l.won.is_some() {
                    caches[i] = None;
                    let at = Some(l.steps.len() as u32);
                    shoot(l.episode.as_mut(), &mut l.screenshots)
                        .map_err(|e| context(e, task_id, r, at))?;
                }
            }
        }
    }
    if let Some((name, calls)) = bench {
        let data = serde_json::json!({
            "kind": "decisions",
            "temperature": temperature,
            "action_mean": spec.action_mean,
            "calls": calls,
        });
        super::bench::write(super::bench::GENERATE, name, checkpoint, data)?;
    }
    Ok(live
        .into_iter()
        .map(|l| Rolled {
            outcome: if l.won == Some(true) { 1 } else { -1 },
            steps: l.steps,
            screenshots: l.screenshots,
        })
        .collect())
}

/// Encode the prompts of a chunk of live episodes, each reusing the keys/values its previous
/// prompt left (`caches[i]`, replaced by this prompt's when `reuse`): the next-token logits and
/// the batch cache in [`crate::model::Lm::encode`]'s layout.
fn encode_chunk<B: burn::tensor::backend::Backend>(
    model: &crate::model::AnyLm<B>,
    chunk: &[usize],
    prompts: &[Vec<u32>],
    caches: &mut [Option<SeqCache<B>>],
    reuse: bool,
    device: &B::Device,
) -> (
    burn::tensor::Tensor<B, 2>,
    crate::model::transformer::KvCache<B>,
) {
    let past: Vec<Option<&SeqCache<B>>> = chunk.iter().map(|&i| caches[i].as_ref()).collect();
    let (last, cache, _, own) = encode_reusing(model, prompts, &past, device);
    if reuse {
        for (&i, c) in chunk.iter().zip(own) {
            caches[i] = Some(c);
        }
    }
    (last, cache)
}

/// Play `jobs` with the policy a config names: the learned one from `checkpoint`, or uniform.
/// `temperature`: sample at it; `None`: greedy (the most likely admissible action). `dump`:
/// the name of the benchmark dump its model calls are written to (see [`super::bench`]).
pub(crate) fn play_policy(
    config: &crate::config::Config,
    checkpoint: &bytes::Bytes,
    environment: &Arc<dyn Environment>,
    jobs: &[Job<'_>],
    temperature: Option<f64>,
    dump: Option<&str>,
) -> Result<Vec<Rolled>> {
    let cap = config.env.max_steps;
    if config.policy.kind == crate::config::PolicyKind::Uniform {
        return uniform_parallel(environment, jobs, cap);
    }
    let spec = super::model_spec(config, crate::model::POLICY)?;
    let ck = spec.load(checkpoint)?;
    let (greedy, temperature) = match temperature {
        Some(t) => (false, t),
        None => (true, config.policy.temperature),
    };
    crate::on_backend!(
        config.run.device,
        infer,
        play(
            &spec,
            &ck,
            environment.as_ref(),
            jobs,
            cap,
            temperature,
            greedy,
            dump
        )
    )
}

/// Uniform rollouts on all cores, in indexed slots.
fn uniform_parallel(
    environment: &Arc<dyn Environment>,
    jobs: &[Job<'_>],
    cap: u32,
) -> Result<Vec<Rolled>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(jobs.len().max(1));
    let per = jobs.len().div_ceil(threads).max(1);
    let mut slots: Vec<Option<Result<Rolled>>> = (0..jobs.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        for (w, chunk) in slots.chunks_mut(per).enumerate() {
            scope.spawn(move || {
                for (k, slot) in chunk.iter_mut().enumerate() {
                    let (task_id, spec, r, seed) = jobs[w * per + k];
                    *slot = Some(roll(environment.as_ref(), spec, seed, cap, task_id, r));
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|s| s.expect("every slot filled"))
        .collect()
}

fn context(e: Error, task_id: &str, rollout: u32, step: Option<u32>) -> Error {
    let at = step.map_or(String::from("reset"), |s| format!("step {s}"));
    Error::Environment(format!("task {task_id} rollout {rollout} {at}: {e}"))
}

impl Stage for Rollout {
    fn name(&self) -> &'static str {
        "rollout"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["trajectories", "steps"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "rollout", "policy"]
    }
    fn checkpoints_in(&self) -> &'static [&'static str] {
        &[crate::model::POLICY]
    }
    /// Sharded where its numbers are exact in any batch: the uniform policy, rla-pipe's small
    /// transformer (`learned_rollouts_do_not_depend_on_the_batch`), or any model on a GPU (not
    /// bit-reproducible anyway). A pretrained model on CPU is not: the padding a batch-mate adds
    /// changes the last bits of its log-probabilities (`tests/it/hf.rs`), so it stays whole in
    /// the coordinator and the run keeps a single node's bytes. Nor with screenshots
    /// (`env.web.screenshots`): they are artifacts, which a shard cannot store.
    fn shard_column(&self, config: &crate::config::Config) -> Option<&'static str> {
        let exact = config.policy.kind == crate::config::PolicyKind::Uniform
            || !config.policy.pretrained()
            || !config.run.device.is_deterministic();
        (exact && !config.env.screenshots()).then_some("task_id")
    }
    fn assets_in(&self, config: &crate::config::Config) -> bool {
        super::env_assets(config)
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            super::install_assets(ctx).await?;
            let tasks = collect(
            &ctx.session,
            // Runs made before slot sampling have no `rolled_out`: every task was rolled out.
            "SELECT DISTINCT task_id, spec FROM tasks WHERE COALESCE(rolled_out, true) ORDER BY task_id",
        )
        .await?;
            let mut pool: Vec<(String, serde_json::Value)> = Vec::new();
            for b in &tasks {
                let c = Columns::new(b, "the rollout stage's tasks");
                let (ids, specs) = (c.str("task_id")?, c.str("spec")?);
                for i in 0..b.num_rows() {
                    let spec = serde_json::from_str(specs.value(i)).map_err(|e| {
                        Error::Environment(format!("task {}: spec is not JSON: {e}", ids.value(i)))
                    })?;
                    pool.push((ids.value(i).to_string(), spec));
                }
            }
            let environment: Arc<dyn Environment> = Arc::from(env::from_config(&ctx.config.env)?);
            let n = ctx.config.rollout.n;
            let seeds: Vec<(usize, u32, u64)> = (0..pool.len())
                .flat_map(|t| (0..n).map(move |r| (t, r)))
                .map(|(t, r)| (t, r, derive_seed(ctx.seed, &[&pool[t].0, &r.to_string()])))
                .collect();
            let jobs: Vec<Job<'_>> = seeds
                .iter()
                .map(|(t, r, seed)| (pool[*t].0.as_str(), &pool[*t].1, *r, *seed))
                .collect();
            let policy_ck = if ctx.config.policy.kind == crate::config::PolicyKind::Uniform {
                bytes::Bytes::new()
            } else {
                ctx.checkpoint(crate::model::POLICY).await?
            };
            let policy_ck = &policy_ck;
            let rolled = super::counted(ctx, || {
                play_policy(
                    &ctx.config,
                    policy_ck,
                    &environment,
                    &jobs,
                    Some(ctx.config.policy.temperature),
                    Some("rollout"),
                )
            })?;
            let mut trajectories = TableBuilder::new("trajectories")?;
            let mut steps = TableBuilder::new("steps")?;
            for ((task_id, _, r, _), rolled) in jobs.iter().zip(rolled) {
                let traj_id = schema::traj_id(task_id, *r);
                trajectories
                    .push_str(task_id)
                    .push_str(&traj_id)
                    .push_u32(*r)
                    .push_i8(rolled.outcome)
                    .push_u32(rolled.steps.len() as u32);
                for (i, png) in rolled.screenshots.into_iter().enumerate() {
                    ctx.emit_screenshot(&traj_id, i, png);
                }
                for (i, st) in rolled.steps.iter().enumerate() {
                    steps
                        .push_str(task_id)
                        .push_str(&traj_id)
                        .push_u32(i as u32);
                    st.push_columns(&mut steps);
                }
            }
            let trajectories = trajectories.finish_with(&ctx.run_id, ctx.iter)?;
            let steps = steps.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![
                (
                    "trajectories",
                    TableOutput::Frame(ctx.session.read_batch(trajectories)?),
                ),
                ("steps", TableOutput::Frame(ctx.session.read_batch(steps)?)),
            ])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GridNavConfig;
    use crate::env::gridnav::GridNav;

    /// Uniform-policy success rate on 200 tasks × 8 rollouts of a gridnav difficulty.
    fn uniform_success(size: u32, walls: f64, min_d: u32, max_d: u32, factor: f64) -> f64 {
        let cfg = GridNavConfig {
            size,
            wall_density: walls,
            min_distance: min_d,
            max_distance: max_d,
            budget_factor: factor,
        };
        let env = GridNav::new(cfg);
        let mut won = 0;
        let mut total = 0;
        for (t, spec) in env.generate(5, 200).unwrap().iter().enumerate() {
            for r in 0..8 {
                let rolled = roll(
                    &env,
                    spec,
                    derive_seed(9, &[&t.to_string(), &r.to_string()]),
                    1000,
                    "t",
                    r,
                )
                .unwrap();
                won += usize::from(rolled.outcome > 0);
                total += 1;
            }
        }
        won as f64 / total as f64
    }

    /// The difficulty knobs move the uniform policy's success across a useful range.
    #[test]
    fn uniform_success_spans_difficulties() {
        let levels = [
            (
                "easy: 4×4, no walls, distance 1–2, budget ×8",
                (4, 0.0, 1, 2, 8.0),
            ),
            (
                "default: 6×6, 20% walls, distance 2–4, budget ×4",
                (6, 0.2, 2, 4, 4.0),
            ),
            (
                "hard: 10×10, 30% walls, distance 8–14, budget ×1.5",
                (10, 0.3, 8, 14, 1.5),
            ),
        ];
        let rates: Vec<f64> = levels
            .iter()
            .map(|(name, (s, w, lo, hi, f))| {
                let rate = uniform_success(*s, *w, *lo, *hi, *f);
                println!("| {name} | {rate:.3} |");
                rate
            })
            .collect();
        let (easy, medium, hard) = (rates[0], rates[1], rates[2]);
        assert!(easy > 0.5, "easy {easy}");
        assert!(easy > medium && medium > hard, "{easy} {medium} {hard}");
        assert!(hard < 0.05, "hard {hard}");
    }

    /// A learned policy's rollouts do not depend on which episodes share their batches: a
    /// range of the tasks rolled out alone (as a cluster worker does) gives the records of those
    /// tasks rolled out with all the others, bit for bit.
    #[test]
    fn learned_rollouts_do_not_depend_on_the_batch() {
        for toml in [
            "[run]\nname='t'\n[env]\nname='gridnav'\n",
            // Prompts of different lengths in one batch (history), a wider model.
            "[run]\nname='t'\n[env]\nname='gridnav'\n[policy]\nhistory=3\ncontext=192\nd_model=64\n",
            // Observations of different lengths.
            "[run]\nname='t'\n[env]\nname='household'\n[policy]\ncontext=256\nhistory=2\n",
        ] {
            rollouts_in_parts_equal_rollouts_together(toml);
        }
    }

    fn rollouts_in_parts_equal_rollouts_together(toml: &str) {
        let cfg = crate::config::Config::from_toml(toml, "test").unwrap();
        let spec = crate::stages::model_spec(&cfg, crate::model::POLICY).unwrap();
        let ck = crate::model::initial_checkpoint(&spec, 7).unwrap();
        let environment: Arc<dyn Environment> = Arc::from(env::from_config(&cfg.env).unwrap());
        let specs = environment.generate(3, 12).unwrap();
        let ids: Vec<String> = (0..12).map(|t| format!("t{t:02}")).collect();
        let jobs: Vec<Job<'_>> = (0..12)
            .flat_map(|t| (0..4u32).map(move |r| (t, r)))
            .map(|(t, r)| {
                let seed = derive_seed(5, &[&ids[t], &r.to_string()]);
                (ids[t].as_str(), &specs[t], r, seed)
            })
            .collect();
        let play =
            |jobs: &[Job<'_>]| play_policy(&cfg, &ck, &environment, jobs, Some(1.0), None).unwrap();
        let together = play(&jobs);
        let (a, b) = jobs.split_at(20);
        let mut apart = play(a);
        apart.extend(play(b));
        assert!(together.iter().any(|r| r.steps.len() > 1));
        for (i, (x, y)) in together.iter().zip(&apart).enumerate() {
            assert_eq!(x.steps, y.steps, "{toml}: episode {i}");
            assert_eq!(x.outcome, y.outcome, "{toml}: episode {i}");
        }
        // Each episode alone, too.
        for (i, job) in jobs.iter().enumerate().step_by(7) {
            let alone = play(std::slice::from_ref(job));
            assert_eq!(
                alone[0].steps, together[i].steps,
                "{toml}: episode {i} alone"
            );
        }
    }

    /// The model stages run as shards only where their numbers are exact in any batch.
    #[test]
    fn model_stages_shard_only_where_exact() {
        use crate::model::Device;
        let base =
            crate::config::Config::from_toml("[run]\nname='t'\n[env]\nname='gridnav'\n", "test")
                .unwrap();
        let rm = super::super::rm_score::RmScore;
        let shards = |edit: &dyn Fn(&mut crate::config::Config)| {
            let mut cfg = base.clone();
            edit(&mut cfg);
            (Rollout.shard_column(&cfg), rm.shard_column(&cfg))
        };
        assert_eq!(shards(&|_| {}), (Some("task_id"), Some("task_id")));
        let pretrained = |c: &mut crate::config::Config| {
            c.policy.init = "hf:models/x".into();
            c.reward_model.init = "hf:models/y".into();
        };
        assert_eq!(shards(&pretrained), (None, None));
        assert_eq!(
            shards(&|c| {
                pretrained(c);
                c.run.device = Device::Cuda;
            }),
            (Some("task_id"), Some("task_id"))
        );
        assert_eq!(
            shards(&|c| {
                pretrained(c);
                c.policy.kind = crate::config::PolicyKind::Uniform;
                c.reward_model.enabled = false;
            }),
            (Some("task_id"), Some("task_id"))
        );
    }

    /// GridNav whose episodes "screenshot" their observation's text: what a step's screenshot
    /// shows can be checked against the step's committed observation.
    struct Shooting(GridNav);
    struct ShootingEpisode(Box<dyn crate::env::Episode>);

    impl crate::env::Episode for ShootingEpisode {
        fn observation(&self) -> &crate::env::Observation {
            self.0.observation()
        }
        fn step(&mut self, action: &str) -> Result<crate::env::Step> {
            self.0.step(action)
        }
        fn max_steps(&self) -> u32 {
            self.0.max_steps()
        }
        fn screenshot(&mut self) -> Result<Option<Vec<u8>>> {
            Ok(Some(self.0.observation().text.clone().into_bytes()))
        }
    }

    impl Environment for Shooting {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn generate(&self, seed: u64, count: u32) -> Result<Vec<serde_json::Value>> {
            self.0.generate(seed, count)
        }
        fn reset(&self, spec: &serde_json::Value) -> Result<Box<dyn crate::env::Episode>> {
            Ok(Box::new(ShootingEpisode(self.0.reset(spec)?)))
        }
        fn mutate(
            &self,
            spec: &serde_json::Value,
            direction: crate::env::Direction,
            critic: &crate::env::CriticSummary,
            seed: u64,
        ) -> Result<Vec<serde_json::Value>> {
            self.0.mutate(spec, direction, critic, seed)
        }
        fn vocabulary(&self) -> Vec<String> {
            self.0.vocabulary()
        }
    }

    /// Both paths (uniform `roll`, the learned policy's `play`) keep one screenshot per step,
    /// taken where the step's observation was read, and one after the last step; an
    /// environment that keeps none gives none.
    #[test]
    fn screenshots_show_each_steps_observation_then_the_last_page() {
        let cfg =
            crate::config::Config::from_toml("[run]\nname='t'\n[env]\nname='gridnav'\n", "test")
                .unwrap();
        let spec = crate::stages::model_spec(&cfg, crate::model::POLICY).unwrap();
        let ck = crate::model::initial_checkpoint(&spec, 7).unwrap();
        let shooting: Arc<dyn Environment> =
            Arc::new(Shooting(GridNav::new(cfg.env.gridnav.clone())));
        let plain: Arc<dyn Environment> = Arc::new(GridNav::new(cfg.env.gridnav.clone()));
        let specs = shooting.generate(3, 4).unwrap();
        let ids: Vec<String> = (0..4).map(|t| format!("t{t}")).collect();
        let jobs: Vec<Job<'_>> = (0..4)
            .map(|t| (ids[t].as_str(), &specs[t], 0, derive_seed(5, &[&ids[t]])))
            .collect();
        let mut uniform = cfg.clone();
        uniform.policy.kind = crate::config::PolicyKind::Uniform;
        for cfg in [&cfg, &uniform] {
            let play = |env: &Arc<dyn Environment>| {
                play_policy(cfg, &ck, env, &jobs, Some(1.0), None).unwrap()
            };
            let (shot, unshot) = (play(&shooting), play(&plain));
            for (a, b) in shot.iter().zip(&unshot) {
                assert_eq!(a.steps, b.steps, "screenshots change no step");
                assert!(b.screenshots.is_empty());
                let n = a.steps.len();
                assert_eq!(a.screenshots.len(), n + 1);
                for (png, st) in a.screenshots.iter().zip(&a.steps) {
                    assert_eq!(png, st.observation.as_bytes());
                }
                assert_eq!(a.screenshots[n], a.steps[n - 1].next_observation.as_bytes());
            }
        }
    }

    /// With screenshots (artifacts, which a shard cannot store) the rollout runs whole; the
    /// key means nothing outside the web environment.
    #[test]
    fn screenshots_keep_the_rollout_whole() {
        let cfg = |env: &str| {
            let toml = format!(
                "[run]\nname='t'\n[env]\nname='{env}'\n[env.web]\nscreenshots=true\n[policy]\nkind='uniform'\n"
            );
            crate::config::Config::from_toml(&toml, "test").unwrap()
        };
        assert_eq!(Rollout.shard_column(&cfg("web")), None);
        assert_eq!(Rollout.shard_column(&cfg("gridnav")), Some("task_id"));
        let mut off = cfg("web");
        off.env.web.screenshots = false;
        assert_eq!(Rollout.shard_column(&off), Some("task_id"));
        assert!(!cfg("web").env.without_screenshots().screenshots());
    }

    #[test]
    fn rollouts_are_deterministic_and_consistent() {
        let env = GridNav::new(GridNavConfig::default());
        let spec = &env.generate(1, 1).unwrap()[0];
        let a = roll(&env, spec, 42, 64, "t", 0).unwrap();
        let b = roll(&env, spec, 42, 64, "t", 0).unwrap();
        assert_eq!(a.steps, b.steps);
        assert_eq!(a.outcome, b.outcome);
        assert!(
            a.steps.iter().all(|s| s.logprob == -(4f64).ln()
                && s.oracle.is_some()
                && s.admissible.len() == 4)
        );
        for w in a.steps.windows(2) {
            assert_eq!(w[0].next_observation, w[1].observation);
        }
        // The step cap ends an episode early, as a loss.
        let capped = roll(&env, spec, 42, 1, "t", 0).unwrap();
        assert_eq!(capped.steps.len(), 1);
    }
}
