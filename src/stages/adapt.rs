//! Stage 7, `adapt`: `tasks` + `task_accuracy` + this iteration's `judgements` + the RM's
//! `rm_samples` (and the observations of `steps` it judged, the outcomes of `trajectories`) →
//! `adaptations`, which the next iteration's `pool` applies.
//!
//! 1. The decisions `judge` made on this iteration's pending candidates are copied (an accepted
//!    candidate takes over its parent's slot in the next pool).
//! 2. Propose: for every active task rolled out in this iteration whose acc ≥ α_high or ≤ α_low,
//!    the adapter writes a candidate from the task's critic summary (`adapt_critic_*.sql`: per
//!    failed rollout its high-risk steps, the observations there and the RM's critique words;
//!    per task the verdict rates per step and frequent critique words). As in the reference
//!    implementation the candidate rewrites the slot's original seed task
//!    (`adapt.rewrite_from = "seed"`, or the occupant with `"current"`), and acc(q) is the
//!    occupant's accuracy. The candidate is recorded `pending`; the next iteration rolls it out
//!    (and not its parent) and judges it. A slot whose candidate was judged in this iteration
//!    was not rolled out, so it gets no new candidate before its next rollout.
//!
//! One candidate per slot at a time; a candidate must be new to the pool. With
//! `adapt.enabled = false` the stage commits an empty table (static tasks).

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::{Array, RecordBatch};
use serde_json::Value;

use crate::adapt::{
    self, CriticFrom, Decision, Request, RewriteFrom, direction_for, direction_name,
};
use crate::determinism::derive_seed;
use crate::env::{self, CriticSummary, FailedRollout, StepVerdicts};
use crate::error::{Error, Result};
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::{collect, render};
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

const SLOTS: &str = include_str!("adapt_slots.sql");
const CRITIC_STEPS: &str = include_str!("adapt_critic_steps.sql");
const CRITIC_OBSERVATIONS: &str = include_str!("adapt_critic_observations.sql");
const CRITIC_WORDS: &str = include_str!("adapt_critic_words.sql");
const CRITIC_FAILURES: &str = include_str!("adapt_critic_failures.sql");
const CRITIC_FAILURE_WORDS: &str = include_str!("adapt_critic_failure_words.sql");

/// High-risk observations kept per task, and the characters kept of each.
const OBSERVATIONS: u32 = 5;
const OBSERVATION_CHARS: usize = 400;

pub struct Adapt {
    /// Whether the configured adapter is deterministic (the procedural one is; an LLM is not).
    pub deterministic: bool,
    /// The coding setting: the environment model is also shown the root problem and the pass
    /// rates of each test (`executions`, `unit_tests`; `adapt_coding_rates.sql`), and the
    /// current problem is the one rewritten (`adapt.rewrite_from` is not read: the root is the
    /// anchor, as in the reference).
    pub coding: bool,
}

const CODING_RATES: &str = include_str!("adapt_coding_rates.sql");

/// The coding evidence of every task with executions this iteration (the root is filled in per
/// request).
async fn coding_evidence(
    ctx: &StageContext,
) -> Result<BTreeMap<String, crate::env::coding::curate::Evidence>> {
    let mut out: BTreeMap<String, crate::env::coding::curate::Evidence> = BTreeMap::new();
    for b in collect(&ctx.session, CODING_RATES).await? {
        let c = Columns::new(&b, "stages/adapt_coding_rates.sql");
        let (id, kind, idx) = (c.str("task_id")?, c.str("test_kind")?, c.u32("test_idx")?);
        let (rate, input, output) = (c.f64("pass_rate")?, c.str("input")?, c.str("output")?);
        for i in 0..b.num_rows() {
            let ev = out.entry(id.value(i).to_string()).or_default();
            if kind.value(i) == "truth" {
                let k = idx.value(i) as usize;
                if ev.truth_rates.len() <= k {
                    ev.truth_rates.resize(k + 1, 0.0);
                }
                ev.truth_rates[k] = rate.value(i);
            } else {
                ev.written.push((
                    input.value(i).to_string(),
                    output.value(i).to_string(),
                    rate.value(i),
                ));
            }
        }
    }
    Ok(out)
}

/// One row of `adaptations`.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub slot: u32,
    pub task_id: String,
    pub candidate_task_id: String,
    pub direction: String,
    pub prev_acc: f64,
    pub candidate_acc: Option<f64>,
    pub decision: Decision,
    pub candidate_spec: String,
    pub adapter: String,
    pub critic: Option<String>,
}

impl Stage for Adapt {
    fn name(&self) -> &'static str {
        "adapt"
    }
    /// This iteration's pool, accuracies, decisions, rollouts, RM samples and steps.
    fn inputs(&self) -> &'static [&'static str] {
        // The coding setting also reads how each test fared (`adapt_coding_rates.sql`).
        const ALL: [&str; 8] = [
            "tasks",
            "task_accuracy",
            "judgements",
            "trajectories",
            "rm_samples",
            "steps",
            "executions",
            "unit_tests",
        ];
        if self.coding { &ALL } else { &ALL[..6] }
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["adaptations"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["env", "adapt"]
    }
    fn deterministic(&self) -> bool {
        self.deterministic
    }
    fn assets_in(&self, config: &crate::config::Config) -> bool {
        super::env_assets(config)
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            super::install_assets(ctx).await?;
            let rows = if ctx.config.adapt.enabled {
                adapt_pool(ctx, self.coding).await?
            } else {
                Vec::new()
            };
            let batch = to_batch(ctx, &rows)?;
            Ok(vec![(
                "adaptations",
                TableOutput::Frame(ctx.session.read_batch(batch)?),
            )])
        })
    }
}

/// A pool task with its accuracy this iteration.
struct PoolTask {
    slot: u32,
    task_id: String,
    active: bool,
    rolled_out: bool,
    spec: String,
    seed_spec: String,
    acc: f64,
    rollouts: u32,
}

/// This iteration's judged candidates (`judgements`), as `adaptations` rows.
async fn judged(ctx: &StageContext) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let sql = "SELECT slot, parent_task_id, task_id, direction, parent_acc, acc, decision, spec, \
               adapter FROM judgements ORDER BY slot, task_id";
    for b in collect(&ctx.session, sql).await? {
        let c = Columns::new(&b, "the adapt stage's judgements");
        let slot = c.u32("slot")?;
        let (parent, cand, dir) = (
            c.str("parent_task_id")?,
            c.str("task_id")?,
            c.str("direction")?,
        );
        let (prev, cacc, decision) = (c.f64("parent_acc")?, c.f64("acc")?, c.str("decision")?);
        let (spec, adapter) = (c.str("spec")?, c.str("adapter")?);
        for i in 0..b.num_rows() {
            let decision = match decision.value(i) {
                "accepted" => Decision::Accepted,
                "rejected" => Decision::Rejected,
                other => {
                    return Err(Error::data(format!(
                        "judgements of iteration {}: decision {other:?} is neither accepted nor rejected",
                        ctx.iter
                    )));
                }
            };
            rows.push(Row {
                slot: slot.value(i),
                task_id: parent.value(i).to_string(),
                candidate_task_id: cand.value(i).to_string(),
                direction: dir.value(i).to_string(),
                prev_acc: prev.value(i),
                candidate_acc: Some(cacc.value(i)),
                decision,
                candidate_spec: spec.value(i).to_string(),
                adapter: adapter.value(i).to_string(),
                critic: None,
            });
        }
    }
    Ok(rows)
}

async fn adapt_pool(ctx: &StageContext, coding: bool) -> Result<Vec<Row>> {
    let cfg = &ctx.config.adapt;
    let mut pool = Vec::new();
    for b in collect(&ctx.session, SLOTS).await? {
        let c = Columns::new(&b, "stages/adapt_slots.sql");
        let (slot, id, status, spec) = (
            c.u32("slot")?,
            c.str("task_id")?,
            c.str("status")?,
            c.str("spec")?,
        );
        let (rolled_out, seed_spec) = (c.bool("rolled_out")?, c.str("seed_spec")?);
        let (acc, rollouts) = (c.f64("acc")?, c.u32("rollouts")?);
        for i in 0..b.num_rows() {
            pool.push(PoolTask {
                slot: slot.value(i),
                task_id: id.value(i).to_string(),
                active: status.value(i) == "active",
                rolled_out: rolled_out.value(i),
                spec: spec.value(i).to_string(),
                seed_spec: seed_spec.value(i).to_string(),
                acc: acc.value(i),
                rollouts: rollouts.value(i),
            });
        }
    }
    let mut exclude: BTreeSet<String> = pool.iter().map(|t| t.task_id.clone()).collect();

    // 1. The decisions on this iteration's pending candidates.
    let mut rows = judged(ctx).await?;

    // 2. Propose candidates for the active tasks rolled out now whose accuracy is outside the
    // band (a slot with a pending candidate had only that candidate rolled out).
    let wanted: Vec<(&PoolTask, env::Direction)> = pool
        .iter()
        .filter(|t| t.active && t.rolled_out && t.rollouts > 0)
        .filter_map(|t| direction_for(t.acc, cfg).map(|d| (t, d)))
        .collect();
    if wanted.is_empty() {
        return Ok(rows);
    }
    let mut critics = critic_summaries(ctx).await?;
    let mut evidence = if coding {
        coding_evidence(ctx).await?
    } else {
        BTreeMap::new()
    };
    let environment = env::from_config(&ctx.config.env)?;
    let adapter = adapt::from_config(cfg)?;
    // (task, direction, spec, critic, seed) of every request, in slot order.
    let mut asks = Vec::new();
    for (task, direction) in wanted {
        let mut critic = critics.remove(&task.task_id).unwrap_or_default();
        critic.accuracy = task.acc;
        critic.rollouts = task.rollouts;
        let source = match cfg.rewrite_from {
            _ if coding => &task.spec,
            RewriteFrom::Seed => &task.seed_spec,
            RewriteFrom::Current => &task.spec,
        };
        let ev = if coding {
            let mut ev = evidence.remove(&task.task_id).unwrap_or_default();
            ev.root = serde_json::from_str(&task.seed_spec).map_err(|e| {
                Error::data(format!(
                    "tasks: the seed spec of slot {} is not JSON: {e}",
                    task.slot
                ))
            })?;
            ev.min_tests = crate::env::coding::curate::MIN_TESTS;
            Some(ev)
        } else {
            None
        };
        let spec: Value = serde_json::from_str(source).map_err(|e| {
            Error::data(format!(
                "tasks: the spec rewritten for {} (slot {}) is not JSON: {e}",
                task.task_id, task.slot
            ))
        })?;
        let seed = derive_seed(ctx.seed, &[&task.task_id]);
        asks.push((task, direction, spec, critic, seed, ev));
    }
    // Requests run `adapter.concurrency()` at a time, each chunk against the pool and the
    // candidates of the chunks before it; within a chunk a candidate another slot (earlier in
    // slot order) already took is dropped. With concurrency 1 (the procedural adapter) every
    // request sees every earlier candidate.
    for chunk in asks.chunks_mut(adapter.concurrency().max(1)) {
        let requests: Vec<Request<'_>> = chunk
            .iter()
            .map(|(task, direction, spec, critic, seed, ev)| Request {
                env: environment.as_ref(),
                task_id: &task.task_id,
                spec,
                direction: *direction,
                critic,
                seed: *seed,
                exclude: &exclude,
                evidence: ev.as_ref(),
            })
            .collect();
        let answers = futures::future::join_all(requests.iter().map(|r| adapter.propose(r))).await;
        drop(requests);
        for ((task, direction, _, critic, _, _), answer) in chunk.iter_mut().zip(answers) {
            let Some(candidate) = answer? else {
                tracing::info!(task = %task.task_id, "adapt: no new candidate");
                continue;
            };
            // The adapter may have annotated the critic (e.g. the failure summaries an LLM
            // wrote); what it was given is what is recorded.
            if let Some(notes) = candidate.critic {
                *critic = notes;
            }
            let candidate = candidate.spec;
            let candidate_id = env::task_id(environment.name(), &candidate);
            if !exclude.insert(candidate_id.clone()) {
                tracing::info!(task = %task.task_id, "adapt: candidate taken by another slot");
                continue;
            }
            super::emit_assets(ctx, environment.as_ref(), [&candidate])?;
            rows.push(Row {
                slot: task.slot,
                task_id: task.task_id.clone(),
                candidate_task_id: candidate_id,
                direction: direction_name(*direction).to_string(),
                prev_acc: task.acc,
                candidate_acc: None,
                decision: Decision::Pending,
                candidate_spec: crate::determinism::canonical(&candidate),
                adapter: adapter.name().to_string(),
                critic: Some(serde_json::to_string(critic).expect("critic serializes")),
            });
        }
    }
    Ok(rows)
}

/// The critic summary of every task with RM samples or failed rollouts (accuracy filled in by
/// the caller).
async fn critic_summaries(ctx: &StageContext) -> Result<BTreeMap<String, CriticSummary>> {
    let mut out: BTreeMap<String, CriticSummary> = BTreeMap::new();
    let all = (ctx.config.adapt.critic_from == CriticFrom::All).to_string();
    let with = |sql: &str, top: Option<u32>| {
        let mut params = vec![("all", all.clone())];
        if let Some(n) = top {
            params.push(("top", n.to_string()));
        }
        render(sql, &params)
    };
    for b in collect(&ctx.session, &with(CRITIC_STEPS, None)?).await? {
        let c = Columns::new(&b, "stages/adapt_critic_steps.sql");
        let (id, step, samples) = (c.str("task_id")?, c.u32("step_idx")?, c.u32("samples")?);
        let (good, bad) = (c.f64("good")?, c.f64("bad")?);
        let risky = c.u32("high_risk")?;
        for i in 0..b.num_rows() {
            let c = out.entry(id.value(i).to_string()).or_default();
            c.step_verdicts.push(StepVerdicts {
                step_idx: step.value(i),
                samples: samples.value(i),
                good: good.value(i),
                bad: bad.value(i),
            });
            if risky.value(i) > 0 {
                c.high_risk_steps.push(step.value(i));
            }
        }
    }
    for b in collect(
        &ctx.session,
        &with(CRITIC_OBSERVATIONS, Some(OBSERVATIONS))?,
    )
    .await?
    {
        let c = Columns::new(&b, "stages/adapt_critic_observations.sql");
        let (id, obs) = (c.str("task_id")?, c.str("observation")?);
        for i in 0..b.num_rows() {
            out.entry(id.value(i).to_string())
                .or_default()
                .high_risk_observations
                .push(truncate(obs.value(i)));
        }
    }
    let words = ctx.config.adapt.critic_words;
    if words > 0 {
        for b in collect(&ctx.session, &with(CRITIC_WORDS, Some(words))?).await? {
            let c = Columns::new(&b, "stages/adapt_critic_words.sql");
            let (id, word, n) = (c.str("task_id")?, c.str("word")?, c.u32("n")?);
            for i in 0..b.num_rows() {
                out.entry(id.value(i).to_string())
                    .or_default()
                    .critique_words
                    .push((word.value(i).to_string(), n.value(i)));
            }
        }
    }
    // Per failed rollout: its high-risk steps and observations, then its critique words.
    let mut by_traj: BTreeMap<String, (String, usize)> = BTreeMap::new();
    for b in collect(&ctx.session, CRITIC_FAILURES).await? {
        let c = Columns::new(&b, "stages/adapt_critic_failures.sql");
        let (id, traj) = (c.str("task_id")?, c.str("traj_id")?);
        let (rollout, steps) = (c.u32("rollout_idx")?, c.u32("num_steps")?);
        let (step, obs) = (c.u32("step_idx")?, c.str("observation")?);
        for i in 0..b.num_rows() {
            let summary = out.entry(id.value(i).to_string()).or_default();
            let at = match by_traj.get(traj.value(i)) {
                Some((_, at)) => *at,
                None => {
                    summary.failed_rollouts.push(FailedRollout {
                        rollout_idx: rollout.value(i),
                        steps: steps.value(i),
                        ..Default::default()
                    });
                    let at = summary.failed_rollouts.len() - 1;
                    by_traj.insert(traj.value(i).to_string(), (id.value(i).to_string(), at));
                    at
                }
            };
            if !step.is_null(i) {
                let f = &mut summary.failed_rollouts[at];
                f.high_risk_steps.push(step.value(i));
                f.high_risk_observations.push(if obs.is_null(i) {
                    String::new()
                } else {
                    truncate(obs.value(i))
                });
            }
        }
    }
    if words > 0 {
        let sql = render(CRITIC_FAILURE_WORDS, &[("top", words.to_string())])?;
        for b in collect(&ctx.session, &sql).await? {
            let c = Columns::new(&b, "stages/adapt_critic_failure_words.sql");
            let (traj, word, n) = (c.str("traj_id")?, c.str("word")?, c.u32("n")?);
            for i in 0..b.num_rows() {
                if let Some((task, at)) = by_traj.get(traj.value(i))
                    && let Some(summary) = out.get_mut(task)
                {
                    summary.failed_rollouts[*at]
                        .critique_words
                        .push((word.value(i).to_string(), n.value(i)));
                }
            }
        }
    }
    Ok(out)
}

/// The first [`OBSERVATION_CHARS`] characters of an observation.
fn truncate(text: &str) -> String {
    text.chars().take(OBSERVATION_CHARS).collect()
}

fn to_batch(ctx: &StageContext, rows: &[Row]) -> Result<RecordBatch> {
    let mut b = TableBuilder::new("adaptations")?;
    for r in rows {
        b.push_str(&r.task_id)
            .push_str(&r.candidate_task_id)
            .push_str(&r.direction)
            .push_f64(r.prev_acc)
            .push_opt_f64(r.candidate_acc)
            .push_str(r.decision.as_str())
            .push_u32(r.slot)
            .push_str(&r.candidate_spec)
            .push_str(&r.adapter)
            .push_opt_str(r.critic.as_deref());
    }
    b.finish_with(&ctx.run_id, ctx.iter)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::RecordBatch;
    use datafusion::catalog::MemTable;
    use datafusion::prelude::SessionContext;

    use arrow::array::AsArray;
    use arrow::datatypes::{Float64Type, UInt32Type};

    use super::*;
    use crate::config::Config;
    use crate::schema;
    use crate::stages::pool::Pool;
    use crate::stages::testutil::{f, i8s, output, register, s, u};

    fn config() -> Arc<Config> {
        Arc::new(
            Config::from_toml(
                "[run]\nname='t'\n[env]\nname='gridnav'\ninitial_tasks=4\n",
                "t",
            )
            .unwrap(),
        )
    }

    /// Register a whole committed batch (with its `run_id` / `iter`) as an input table.
    fn input(c: &StageContext, table: &str, batch: &RecordBatch) {
        let _ = c.session.deregister_table(table);
        c.session
            .register_table(
                table,
                Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch.clone()]]).unwrap()),
            )
            .unwrap();
    }

    fn empty(table: &str) -> RecordBatch {
        RecordBatch::new_empty(schema::table_def(table).unwrap().schema.clone())
    }

    /// (slot, task_id, status, parent_task_id) of a `tasks` batch, in key order.
    fn pool_rows(b: &RecordBatch) -> Vec<(u32, String, String, Option<String>)> {
        let (slot, id, status, parent) = (
            b.column(3).as_primitive::<UInt32Type>(),
            b.column(2).as_string::<i32>(),
            b.column(4).as_string::<i32>(),
            b.column(6).as_string::<i32>(),
        );
        (0..b.num_rows())
            .map(|i| {
                (
                    slot.value(i),
                    id.value(i).to_string(),
                    status.value(i).to_string(),
                    (!arrow::array::Array::is_null(parent, i)).then(|| parent.value(i).to_string()),
                )
            })
            .collect()
    }

    /// (slot, task_id, candidate_task_id, direction, prev_acc, candidate_acc, decision).
    type Decision = (u32, String, String, String, f64, Option<f64>, String);
    fn decisions(b: &RecordBatch) -> Vec<Decision> {
        let st = |i: usize| b.column(i).as_string::<i32>();
        let (prev, cacc) = (
            b.column(5).as_primitive::<Float64Type>(),
            b.column(6).as_primitive::<Float64Type>(),
        );
        let slot = b.column(8).as_primitive::<UInt32Type>();
        (0..b.num_rows())
            .map(|i| {
                (
                    slot.value(i),
                    st(2).value(i).to_string(),
                    st(3).value(i).to_string(),
                    st(4).value(i).to_string(),
                    prev.value(i),
                    (!arrow::array::Array::is_null(cacc, i)).then(|| cacc.value(i)),
                    st(7).value(i).to_string(),
                )
            })
            .collect()
    }

    /// Which tasks of a `tasks` batch are rolled out.
    fn rolled_out(b: &RecordBatch) -> BTreeSet<String> {
        let (id, r) = (b.column(2).as_string::<i32>(), b.column(7).as_boolean());
        (0..b.num_rows())
            .filter(|i| r.value(*i))
            .map(|i| id.value(i).to_string())
            .collect()
    }

    /// Run `judge`, then `adapt`, on a pool whose rolled-out tasks got the given accuracies (no
    /// RM samples): (judgements, adaptations).
    async fn adapt_with(
        cfg: Arc<Config>,
        iter: u32,
        tasks: &RecordBatch,
        prev: &RecordBatch,
        acc: &[(&str, f64)],
    ) -> (RecordBatch, RecordBatch) {
        let c = StageContext::detached("r".into(), iter, 7, cfg, SessionContext::new());
        input(&c, "tasks", tasks);
        input(&c, "adaptations", prev);
        for t in ["rm_samples", "steps", "trajectories"] {
            input(&c, t, &empty(t));
        }
        let live = rolled_out(tasks);
        let acc: Vec<_> = acc.iter().filter(|a| live.contains(a.0)).collect();
        let ids: Vec<&str> = acc.iter().map(|a| a.0).collect();
        let accs: Vec<f64> = acc.iter().map(|a| a.1).collect();
        let succ: Vec<u32> = accs.iter().map(|a| (a * 8.0) as u32).collect();
        register(
            &c,
            "task_accuracy",
            vec![s(&ids), u(&vec![8; ids.len()]), u(&succ), f(&accs)],
        );
        let judgements = output(&crate::stages::judge::Judge, &c, "judgements").await;
        input(&c, "judgements", &judgements);
        let adaptations = output(
            &Adapt {
                coding: false,
                deterministic: true,
            },
            &c,
            "adaptations",
        )
        .await;
        (judgements, adaptations)
    }

    async fn pool_with(
        cfg: Arc<Config>,
        iter: u32,
        tasks: &RecordBatch,
        adaptations: &RecordBatch,
    ) -> RecordBatch {
        let c = StageContext::detached(
            "r".into(),
            iter,
            7 + iter as u64,
            cfg,
            SessionContext::new(),
        );
        input(&c, "tasks", tasks);
        input(&c, "adaptations", adaptations);
        output(&Pool, &c, "tasks").await
    }

    async fn pool_at(iter: u32, tasks: &RecordBatch, adaptations: &RecordBatch) -> RecordBatch {
        pool_with(config(), iter, tasks, adaptations).await
    }

    /// Three iterations of pool bookkeeping, as the reference implementation keeps it:
    /// candidates join as pending in their parent's slot and are rolled out INSTEAD of the
    /// parent; they are judged (before training) in that iteration; an accepted one takes the
    /// slot over (parent recorded), a rejected one disappears and the parent stays; a slot gets
    /// a new candidate only from an iteration where its occupant was rolled out; candidates are
    /// valid, new tasks written from the slot's seed task.
    #[tokio::test]
    async fn slots_and_pending_candidates_over_iterations() {
        let tasks0 = pool_at(0, &empty("tasks"), &empty("adaptations")).await;
        let p0 = pool_rows(&tasks0);
        assert_eq!(p0.len(), 4);
        assert_eq!(
            rolled_out(&tasks0).len(),
            4,
            "slots_per_iter = 0: every slot"
        );
        let id = |slot: usize| p0[slot].1.clone();
        // Iteration 0: slot 0 too easy, slot 1 too hard, slot 2 in the band, slot 3 too easy.
        let (j0, a0) = adapt_with(
            config(),
            0,
            &tasks0,
            &empty("adaptations"),
            &[(&id(0), 1.0), (&id(1), 0.0), (&id(2), 0.5), (&id(3), 0.875)],
        )
        .await;
        assert_eq!(j0.num_rows(), 0, "nothing pending at iteration 0");
        let d0 = decisions(&a0);
        let shape: Vec<_> = d0
            .iter()
            .map(|d| (d.0, d.1.clone(), d.3.as_str(), d.4, d.5, d.6.as_str()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, id(0), "harder", 1.0, None, "pending"),
                (1, id(1), "easier", 0.0, None, "pending"),
                (3, id(3), "harder", 0.875, None, "pending"),
            ]
        );
        let env = env::from_config(&config().env).unwrap();
        let specs = a0.column(9).as_string::<i32>();
        for (i, d) in d0.iter().enumerate() {
            let spec: Value = serde_json::from_str(specs.value(i)).unwrap();
            env.validate(&spec).unwrap();
            assert_eq!(
                env::task_id("gridnav", &spec),
                d.2,
                "candidate id is its content hash"
            );
            assert!(!p0.iter().any(|t| t.1 == d.2), "candidates are new tasks");
        }
        let critic: CriticSummary =
            serde_json::from_str(a0.column(11).as_string::<i32>().value(0)).unwrap();
        assert_eq!((critic.accuracy, critic.rollouts), (1.0, 8));

        // Iteration 1's pool: the 4 tasks + 3 pending candidates in their parents' slots; only
        // the candidates and slot 2 (no candidate) are rolled out.
        let tasks1 = pool_at(1, &tasks0, &a0).await;
        let p1 = pool_rows(&tasks1);
        let cand = |slot: u32| d0.iter().find(|d| d.0 == slot).unwrap().2.clone();
        let mut want: Vec<_> = p0.clone();
        for slot in [0, 1, 3] {
            want.push((slot, cand(slot), "pending".into(), Some(id(slot as usize))));
        }
        want.sort_by_key(|r| (r.0, r.2.clone(), r.1.clone()));
        assert_eq!(p1, want);
        let live: BTreeSet<String> = [cand(0), cand(1), id(2), cand(3)].into_iter().collect();
        assert_eq!(rolled_out(&tasks1), live);

        // Iteration 1: slot 0's candidate lands in the band (accepted); slot 1's is still
        // unsolved (rejected; its parent stays); slot 3's is no harder than its parent was
        // (rejected). No parent was rolled out: no new candidate.
        let (j1, a1) = adapt_with(
            config(),
            1,
            &tasks1,
            &a0,
            &[
                (&id(2), 0.5),
                (&cand(0), 0.5),
                (&cand(1), 0.0),
                (&cand(3), 0.875),
            ],
        )
        .await;
        assert_eq!(j1.num_rows(), 3);
        let d1 = decisions(&a1);
        let judged: Vec<_> = d1
            .iter()
            .map(|d| (d.0, d.1.clone(), d.2.clone(), d.5, d.6.as_str()))
            .collect();
        assert_eq!(
            judged,
            vec![
                (0, id(0), cand(0), Some(0.5), "accepted"),
                (1, id(1), cand(1), Some(0.0), "rejected"),
                (3, id(3), cand(3), Some(0.875), "rejected"),
            ]
        );

        // Iteration 2's pool: slot 0 is the accepted candidate (parent recorded), the other
        // slots keep their tasks; nothing is pending, so every slot is rolled out.
        let tasks2 = pool_at(2, &tasks1, &a1).await;
        let p2 = pool_rows(&tasks2);
        let want = vec![
            (0, cand(0), "active".to_string(), Some(id(0))),
            (1, id(1), "active".into(), None),
            (2, id(2), "active".into(), None),
            (3, id(3), "active".into(), None),
        ];
        assert_eq!(p2, want);
        assert_eq!(rolled_out(&tasks2).len(), 4);

        // Iteration 2: slot 0's occupant (the accepted harder candidate) is solved every time:
        // the new candidate rewrites the slot's SEED task (id(0)), not the occupant; acc(q) is
        // the occupant's. With `rewrite_from = "current"` it rewrites the occupant.
        let seed_spec: Value =
            serde_json::from_str(tasks0.column(5).as_string::<i32>().value(0)).unwrap();
        let occupant_spec: Value =
            serde_json::from_str(tasks2.column(5).as_string::<i32>().value(0)).unwrap();
        for (from, source) in [("seed", &seed_spec), ("current", &occupant_spec)] {
            let mut cfg = (*config()).clone();
            cfg.adapt.rewrite_from = if from == "seed" {
                crate::adapt::RewriteFrom::Seed
            } else {
                crate::adapt::RewriteFrom::Current
            };
            let (_, a2) = adapt_with(
                Arc::new(cfg),
                2,
                &tasks2,
                &a1,
                &[(&cand(0), 1.0), (&id(1), 0.5), (&id(2), 0.5), (&id(3), 0.5)],
            )
            .await;
            let d2 = decisions(&a2);
            assert_eq!(d2.len(), 1, "{from}");
            assert_eq!((d2[0].0, &d2[0].1, d2[0].4), (0, &cand(0), 1.0), "{from}");
            let critic: CriticSummary =
                serde_json::from_str(a2.column(11).as_string::<i32>().value(0)).unwrap();
            let exclude: BTreeSet<String> = pool_rows(&tasks2).into_iter().map(|r| r.1).collect();
            let seed = derive_seed(7, &[&cand(0)]);
            let expected = env
                .mutate(source, env::Direction::Harder, &critic, seed)
                .unwrap()
                .into_iter()
                .map(|c| env::task_id("gridnav", &c))
                .find(|c| !exclude.contains(c))
                .unwrap();
            assert_eq!(d2[0].2, expected, "rewritten from the {from} task");
        }
    }

    /// Slot sampling: `rollout.slots_per_iter` slots drawn from those without a pending
    /// candidate, every pending candidate besides; seeded (same seed, same draw) and recorded
    /// in `tasks.rolled_out`.
    #[tokio::test]
    async fn slot_sampling_skips_pending_slots_and_is_seeded() {
        let cfg = Arc::new(
            Config::from_toml(
                "[run]\nname='t'\n[env]\nname='gridnav'\ninitial_tasks=8\n[rollout]\nslots_per_iter=3\n",
                "t",
            )
            .unwrap(),
        );
        let tasks0 = pool_with(cfg.clone(), 0, &empty("tasks"), &empty("adaptations")).await;
        assert_eq!(rolled_out(&tasks0).len(), 3);
        let again = pool_with(cfg.clone(), 0, &empty("tasks"), &empty("adaptations")).await;
        assert_eq!(rolled_out(&tasks0), rolled_out(&again), "seeded");
        // Candidates for two rolled-out slots (both solved every time).
        let p0 = pool_rows(&tasks0);
        let live0 = rolled_out(&tasks0);
        let solved: Vec<(&str, f64)> = p0
            .iter()
            .filter(|t| live0.contains(&t.1))
            .take(2)
            .map(|t| (t.1.as_str(), 1.0))
            .collect();
        let (_, a0) = adapt_with(cfg.clone(), 0, &tasks0, &empty("adaptations"), &solved).await;
        let pending_slots: BTreeSet<u32> = decisions(&a0).iter().map(|d| d.0).collect();
        assert_eq!(pending_slots.len(), 2);
        let mut draws = BTreeSet::new();
        for iter in 1..6 {
            let tasks = pool_with(cfg.clone(), iter, &tasks0, &a0).await;
            let rows = pool_rows(&tasks);
            let live = rolled_out(&tasks);
            let (pending, active): (Vec<_>, Vec<_>) = rows
                .iter()
                .filter(|r| live.contains(&r.1))
                .partition(|r| r.2 == "pending");
            assert_eq!(pending.len(), 2, "every pending candidate is rolled out");
            assert_eq!(active.len(), 3, "slots_per_iter slots besides");
            assert!(
                active.iter().all(|r| !pending_slots.contains(&r.0)),
                "a parent is never rolled out with its candidate"
            );
            draws.insert(active.iter().map(|r| r.0).collect::<Vec<_>>());
        }
        assert!(draws.len() > 1, "each iteration draws its own slots");
    }

    #[tokio::test]
    async fn disabled_adaptation_commits_an_empty_table() {
        let tasks0 = pool_at(0, &empty("tasks"), &empty("adaptations")).await;
        let mut cfg = (*config()).clone();
        cfg.adapt.enabled = false;
        let c = StageContext::detached("r".into(), 0, 7, Arc::new(cfg), SessionContext::new());
        input(&c, "tasks", &tasks0);
        for t in [
            "judgements",
            "trajectories",
            "rm_samples",
            "steps",
            "task_accuracy",
        ] {
            input(&c, t, &empty(t));
        }
        let out = output(
            &Adapt {
                coding: false,
                deterministic: true,
            },
            &c,
            "adaptations",
        )
        .await;
        assert_eq!(out.num_rows(), 0);
    }

    /// Golden critic summary: task A, two rollouts (A-0 failed after 2 steps, A-1 won in 1),
    /// m = 2. Step 0 of A-0 is judged bad by both samples (high-risk), step 0 of A-1 once good,
    /// once bad; step 1 of A-0 good twice. `critic_from = "all"` summarizes both rollouts;
    /// `"failed"` (the default, as the reference) only A-0, which also gets its own entry.
    #[tokio::test]
    async fn critic_summary_from_rm_samples() {
        for from in ["all", "failed"] {
            let mut cfg = (*config()).clone();
            if from == "all" {
                cfg.adapt.critic_from = crate::adapt::CriticFrom::All;
            }
            let c = StageContext::detached("r".into(), 0, 7, Arc::new(cfg), SessionContext::new());
            register(
                &c,
                "trajectories",
                vec![
                    s(&["A", "A"]),
                    s(&["A-0", "A-1"]),
                    u(&[0, 1]),
                    i8s(&[-1, 1]),
                    u(&[2, 1]),
                ],
            );
            register(
                &c,
                "rm_samples",
                vec![
                    s(&["A", "A", "A", "A", "A", "A"]),
                    s(&["A-0", "A-0", "A-0", "A-0", "A-1", "A-1"]),
                    u(&[0, 0, 1, 1, 0, 0]),
                    u(&[0, 1, 0, 1, 0, 1]),
                    s(&[
                        "stuck wasted",
                        "stuck",
                        "progress",
                        "progress closer",
                        "",
                        "stuck",
                    ]),
                    i8s(&[-1, -1, 1, 1, 1, -1]),
                ],
            );
            register(
                &c,
                "steps",
                vec![
                    s(&["A", "A", "A"]),
                    s(&["A-0", "A-0", "A-1"]),
                    u(&[0, 1, 0]),
                    s(&["at 1 1 goal east", "at 2 1 goal east", "at 1 1 goal east"]),
                ],
            );
            let summaries = critic_summaries(&c).await.unwrap();
            let a = &summaries["A"];
            assert_eq!(a.high_risk_steps, vec![0], "{from}");
            assert_eq!(
                a.high_risk_observations,
                vec!["at 1 1 goal east".to_string()]
            );
            let failed = FailedRollout {
                rollout_idx: 0,
                steps: 2,
                high_risk_steps: vec![0],
                high_risk_observations: vec!["at 1 1 goal east".into()],
                critique_words: vec![
                    ("progress".to_string(), 2),
                    ("stuck".to_string(), 2),
                    ("closer".to_string(), 1),
                    ("wasted".to_string(), 1),
                ],
                summary: None,
            };
            assert_eq!(a.failed_rollouts, vec![failed.clone()], "{from}");
            if from == "all" {
                assert_eq!(
                    a.step_verdicts,
                    vec![
                        StepVerdicts {
                            step_idx: 0,
                            samples: 4,
                            good: 0.25,
                            bad: 0.75
                        },
                        StepVerdicts {
                            step_idx: 1,
                            samples: 2,
                            good: 1.0,
                            bad: 0.0
                        },
                    ]
                );
                assert_eq!(
                    a.critique_words,
                    vec![
                        ("stuck".to_string(), 3),
                        ("progress".to_string(), 2),
                        ("closer".to_string(), 1),
                        ("wasted".to_string(), 1)
                    ]
                );
            } else {
                assert_eq!(
                    a.step_verdicts,
                    vec![
                        StepVerdicts {
                            step_idx: 0,
                            samples: 2,
                            good: 0.0,
                            bad: 1.0
                        },
                        StepVerdicts {
                            step_idx: 1,
                            samples: 2,
                            good: 1.0,
                            bad: 0.0
                        },
                    ]
                );
                assert_eq!(a.critique_words, failed.critique_words);
            }
        }
    }
}
