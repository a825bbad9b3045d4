//! Stage 7, `adapt`: `tasks` + `task_accuracy` + the RM's `rm_samples` (and the observations of
//! `steps` it judged) → `adaptations`, which the next iteration's `pool` applies.
//!
//! 1. Judge: every pending candidate of this pool (written by the previous iteration) is
//!    accepted or rejected with this iteration's acc(q′) and the acc(q) it was written at
//!    ([`adapt::accept`], `adapt_judge.sql`). An accepted candidate takes over its parent's slot.
//! 2. Propose: for every slot whose (new) occupant has acc ≥ α_high or ≤ α_low, the adapter
//!    writes a candidate from the occupant's critic summary (`adapt_critic_*.sql`: high-risk
//!    steps and their observations, verdict rates per step, frequent critique words). The
//!    candidate is recorded `pending` and is rolled out next iteration like every other task.
//!
//! One candidate per slot at a time; a candidate must be new to the pool. With
//! `adapt.enabled = false` the stage commits an empty table (static tasks).

use std::collections::{BTreeMap, BTreeSet};

use arrow::array::RecordBatch;
use async_trait::async_trait;
use serde_json::Value;

use crate::adapt::{self, Decision, Request, direction_for, direction_name, parse_direction};
use crate::determinism::derive_seed;
use crate::env::{self, CriticSummary, StepVerdicts};
use crate::error::{Error, Result};
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::{query, render};
use crate::stage::{Stage, StageContext, TableOutput};

const JUDGE: &str = include_str!("adapt_judge.sql");
const SLOTS: &str = include_str!("adapt_slots.sql");
const CRITIC_STEPS: &str = include_str!("adapt_critic_steps.sql");
const CRITIC_OBSERVATIONS: &str = include_str!("adapt_critic_observations.sql");
const CRITIC_WORDS: &str = include_str!("adapt_critic_words.sql");

/// High-risk observations kept per task, and the characters kept of each.
const OBSERVATIONS: u32 = 5;
const OBSERVATION_CHARS: usize = 400;

pub struct Adapt {
    /// Whether the configured adapter is deterministic (the procedural one is; an LLM is not).
    pub deterministic: bool,
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

#[async_trait]
impl Stage for Adapt {
    fn name(&self) -> &'static str {
        "adapt"
    }
    /// This iteration's pool, accuracies, RM samples and steps; the previous iteration's
    /// `adaptations` (what the pending candidates were written for).
    fn inputs(&self) -> &'static [&'static str] {
        &[
            "tasks",
            "task_accuracy",
            "rm_samples",
            "steps",
            "adaptations",
        ]
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
    async fn run(&self, ctx: &StageContext) -> Result<Vec<(&'static str, TableOutput)>> {
        let rows = if ctx.config.adapt.enabled {
            adapt_pool(ctx).await?
        } else {
            Vec::new()
        };
        let batch = to_batch(ctx, &rows)?;
        Ok(vec![(
            "adaptations",
            TableOutput::Frame(ctx.session.read_batch(batch)?),
        )])
    }
}

async fn collect(ctx: &StageContext, sql: &str) -> Result<Vec<RecordBatch>> {
    query(&ctx.session, sql)
        .await?
        .collect()
        .await
        .map_err(Error::from)
}

/// A pool task with its accuracy this iteration.
struct PoolTask {
    slot: u32,
    task_id: String,
    active: bool,
    spec: String,
    acc: f64,
    rollouts: u32,
}

async fn adapt_pool(ctx: &StageContext) -> Result<Vec<Row>> {
    let cfg = &ctx.config.adapt;
    let mut pool = Vec::new();
    for b in collect(ctx, SLOTS).await? {
        let c = Columns::new(&b, "stages/adapt_slots.sql");
        let (slot, id, status, spec) = (
            c.u32("slot")?,
            c.str("task_id")?,
            c.str("status")?,
            c.str("spec")?,
        );
        let (acc, rollouts) = (c.f64("acc")?, c.u32("rollouts")?);
        for i in 0..b.num_rows() {
            pool.push(PoolTask {
                slot: slot.value(i),
                task_id: id.value(i).to_string(),
                active: status.value(i) == "active",
                spec: spec.value(i).to_string(),
                acc: acc.value(i),
                rollouts: rollouts.value(i),
            });
        }
    }
    let mut exclude: BTreeSet<String> = pool.iter().map(|t| t.task_id.clone()).collect();

    // 1. Judge the pending candidates.
    let mut rows = Vec::new();
    for b in collect(ctx, JUDGE).await? {
        let c = Columns::new(&b, "stages/adapt_judge.sql");
        let slot = c.u32("slot")?;
        let (parent, cand, dir) = (
            c.str("task_id")?,
            c.str("candidate_task_id")?,
            c.str("direction")?,
        );
        let (prev, cacc) = (c.f64("prev_acc")?, c.f64("candidate_acc")?);
        let (spec, adapter) = (c.str("candidate_spec")?, c.str("adapter")?);
        for i in 0..b.num_rows() {
            let direction = parse_direction(dir.value(i)).ok_or_else(|| {
                Error::data(format!(
                    "adaptations of iteration {}: unknown direction {:?}",
                    ctx.iter - 1,
                    dir.value(i)
                ))
            })?;
            let accepted = adapt::accept(direction, prev.value(i), cacc.value(i), cfg);
            rows.push(Row {
                slot: slot.value(i),
                task_id: parent.value(i).to_string(),
                candidate_task_id: cand.value(i).to_string(),
                direction: dir.value(i).to_string(),
                prev_acc: prev.value(i),
                candidate_acc: Some(cacc.value(i)),
                decision: if accepted {
                    Decision::Accepted
                } else {
                    Decision::Rejected
                },
                candidate_spec: spec.value(i).to_string(),
                adapter: adapter.value(i).to_string(),
                critic: None,
            });
        }
    }

    // Each slot's occupant for the next iteration: the active task, or its accepted candidate.
    let by_id: BTreeMap<&str, &PoolTask> = pool.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let mut occupants: BTreeMap<u32, &PoolTask> = pool
        .iter()
        .filter(|t| t.active)
        .map(|t| (t.slot, t))
        .collect();
    for r in rows.iter().filter(|r| r.decision == Decision::Accepted) {
        if let Some(t) = by_id.get(r.candidate_task_id.as_str()) {
            occupants.insert(r.slot, t);
        }
    }

    // 2. Propose candidates for the occupants outside the band.
    let wanted: Vec<(&PoolTask, env::Direction)> = occupants
        .values()
        .filter_map(|t| direction_for(t.acc, cfg).map(|d| (*t, d)))
        .filter(|(t, _)| t.rollouts > 0)
        .collect();
    if wanted.is_empty() {
        return Ok(rows);
    }
    let mut critics = critic_summaries(ctx).await?;
    let environment = env::from_config(&ctx.config.env)?;
    let adapter = adapt::from_config(cfg)?;
    // (task, direction, spec, critic, seed) of every request, in slot order.
    let mut asks = Vec::new();
    for (task, direction) in wanted {
        let mut critic = critics.remove(&task.task_id).unwrap_or_default();
        critic.accuracy = task.acc;
        critic.rollouts = task.rollouts;
        let spec: Value = serde_json::from_str(&task.spec).map_err(|e| {
            Error::data(format!("tasks: spec of {} is not JSON: {e}", task.task_id))
        })?;
        let seed = derive_seed(ctx.seed, &[&task.task_id]);
        asks.push((task, direction, spec, critic, seed));
    }
    // Requests run `adapter.concurrency()` at a time, each chunk against the pool and the
    // candidates of the chunks before it; within a chunk a candidate another slot (earlier in
    // slot order) already took is dropped. With concurrency 1 (the procedural adapter) every
    // request sees every earlier candidate.
    for chunk in asks.chunks(adapter.concurrency().max(1)) {
        let requests: Vec<Request<'_>> = chunk
            .iter()
            .map(|(task, direction, spec, critic, seed)| Request {
                env: environment.as_ref(),
                task_id: &task.task_id,
                spec,
                direction: *direction,
                critic,
                seed: *seed,
                exclude: &exclude,
            })
            .collect();
        let answers = futures::future::join_all(requests.iter().map(|r| adapter.propose(r))).await;
        drop(requests);
        for ((task, direction, _, critic, _), answer) in chunk.iter().zip(answers) {
            let Some(candidate) = answer? else {
                tracing::info!(task = %task.task_id, "adapt: no new candidate");
                continue;
            };
            let candidate_id = env::task_id(environment.name(), &candidate);
            if !exclude.insert(candidate_id.clone()) {
                tracing::info!(task = %task.task_id, "adapt: candidate taken by another slot");
                continue;
            }
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

/// The critic summary of every task with RM samples (accuracy filled in by the caller).
async fn critic_summaries(ctx: &StageContext) -> Result<BTreeMap<String, CriticSummary>> {
    let mut out: BTreeMap<String, CriticSummary> = BTreeMap::new();
    for b in collect(ctx, CRITIC_STEPS).await? {
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
    let top = |sql: &str, n: u32| render(sql, &[("top", n.to_string())]);
    for b in collect(ctx, &top(CRITIC_OBSERVATIONS, OBSERVATIONS)?).await? {
        let c = Columns::new(&b, "stages/adapt_critic_observations.sql");
        let (id, obs) = (c.str("task_id")?, c.str("observation")?);
        for i in 0..b.num_rows() {
            let text: String = obs.value(i).chars().take(OBSERVATION_CHARS).collect();
            out.entry(id.value(i).to_string())
                .or_default()
                .high_risk_observations
                .push(text);
        }
    }
    let words = ctx.config.adapt.critic_words;
    if words > 0 {
        for b in collect(ctx, &top(CRITIC_WORDS, words)?).await? {
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
    Ok(out)
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

    fn ctx(iter: u32) -> StageContext {
        StageContext::detached("r".into(), iter, 7, config(), SessionContext::new())
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

    /// Run `adapt` on a pool with given accuracies (no RM samples).
    async fn adapt_with(
        iter: u32,
        tasks: &RecordBatch,
        prev: &RecordBatch,
        acc: &[(&str, f64)],
    ) -> RecordBatch {
        let c = ctx(iter);
        input(&c, "tasks", tasks);
        input(&c, "adaptations", prev);
        input(&c, "rm_samples", &empty("rm_samples"));
        input(&c, "steps", &empty("steps"));
        let ids: Vec<&str> = acc.iter().map(|a| a.0).collect();
        let accs: Vec<f64> = acc.iter().map(|a| a.1).collect();
        let succ: Vec<u32> = accs.iter().map(|a| (a * 8.0) as u32).collect();
        register(
            &c,
            "task_accuracy",
            vec![s(&ids), u(&vec![8; ids.len()]), u(&succ), f(&accs)],
        );
        output(
            &Adapt {
                deterministic: true,
            },
            &c,
            "adaptations",
        )
        .await
    }

    async fn pool_at(iter: u32, tasks: &RecordBatch, adaptations: &RecordBatch) -> RecordBatch {
        let c = ctx(iter);
        input(&c, "tasks", tasks);
        input(&c, "adaptations", adaptations);
        output(&Pool, &c, "tasks").await
    }

    /// Three iterations of pool bookkeeping: candidates join as pending in their parent's slot,
    /// an accepted one takes the slot over (parent recorded), a rejected one disappears and the
    /// parent stays; one candidate per slot; candidates are valid, new tasks.
    #[tokio::test]
    async fn slots_and_pending_candidates_over_iterations() {
        let tasks0 = pool_at(0, &empty("tasks"), &empty("adaptations")).await;
        let p0 = pool_rows(&tasks0);
        assert_eq!(p0.len(), 4);
        let id = |slot: usize| p0[slot].1.clone();
        // Iteration 0: slot 0 too easy, slot 1 too hard, slot 2 in the band, slot 3 too easy.
        let a0 = adapt_with(
            0,
            &tasks0,
            &empty("adaptations"),
            &[(&id(0), 1.0), (&id(1), 0.0), (&id(2), 0.5), (&id(3), 0.875)],
        )
        .await;
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

        // Iteration 1's pool: the 4 tasks + 3 pending candidates in their parents' slots.
        let tasks1 = pool_at(1, &tasks0, &a0).await;
        let p1 = pool_rows(&tasks1);
        let cand = |slot: u32| d0.iter().find(|d| d.0 == slot).unwrap().2.clone();
        let mut want: Vec<_> = p0.clone();
        for slot in [0, 1, 3] {
            want.push((slot, cand(slot), "pending".into(), Some(id(slot as usize))));
        }
        want.sort_by_key(|r| (r.0, r.2.clone(), r.1.clone()));
        assert_eq!(p1, want);

        // Iteration 1: slot 0's candidate lands in the band (accepted); slot 1's is still
        // unsolved (rejected; its parent stays and gets a new candidate); slot 3's is no harder
        // than its parent was (rejected; the parent is now in the band: no new candidate).
        let a1 = adapt_with(
            1,
            &tasks1,
            &a0,
            &[
                (&id(0), 1.0),
                (&id(1), 0.0),
                (&id(2), 0.5),
                (&id(3), 0.5),
                (&cand(0), 0.5),
                (&cand(1), 0.0),
                (&cand(3), 0.875),
            ],
        )
        .await;
        let d1 = decisions(&a1);
        let judged: Vec<_> = d1
            .iter()
            .map(|d| (d.0, d.2.clone(), d.5, d.6.as_str()))
            .collect();
        assert_eq!(judged.len(), 4, "{judged:?}");
        assert!(judged.contains(&(0, cand(0), Some(0.5), "accepted")));
        assert!(judged.contains(&(1, cand(1), Some(0.0), "rejected")));
        assert!(judged.contains(&(3, cand(3), Some(0.875), "rejected")));
        let fresh: Vec<_> = d1.iter().filter(|d| d.6 == "pending").collect();
        assert_eq!(fresh.len(), 1);
        assert_eq!((fresh[0].0, &fresh[0].1), (1, &id(1)));
        assert_ne!(
            fresh[0].2,
            cand(1),
            "a rejected candidate is not proposed again"
        );

        // Iteration 2's pool: slot 0 is the accepted candidate (parent recorded), slot 1 keeps
        // its task plus the new pending candidate, slots 2 and 3 are unchanged.
        let p2 = pool_rows(&pool_at(2, &tasks1, &a1).await);
        let mut want = vec![
            (0, cand(0), "active".to_string(), Some(id(0))),
            (1, id(1), "active".into(), None),
            (1, fresh[0].2.clone(), "pending".into(), Some(id(1))),
            (2, id(2), "active".into(), None),
            (3, id(3), "active".into(), None),
        ];
        want.sort_by_key(|r| (r.0, r.2.clone(), r.1.clone()));
        assert_eq!(p2, want);
    }

    #[tokio::test]
    async fn disabled_adaptation_commits_an_empty_table() {
        let tasks0 = pool_at(0, &empty("tasks"), &empty("adaptations")).await;
        let mut cfg = (*config()).clone();
        cfg.adapt.enabled = false;
        let c = StageContext::detached("r".into(), 0, 7, Arc::new(cfg), SessionContext::new());
        input(&c, "tasks", &tasks0);
        for t in ["adaptations", "rm_samples", "steps", "task_accuracy"] {
            input(&c, t, &empty(t));
        }
        let out = output(
            &Adapt {
                deterministic: true,
            },
            &c,
            "adaptations",
        )
        .await;
        assert_eq!(out.num_rows(), 0);
    }

    /// Golden critic summary: task A, two rollouts, m = 2. Step 0 of A-0 is judged bad by both
    /// samples (high-risk), step 0 of A-1 once good, once bad; step 1 of A-0 good twice.
    #[tokio::test]
    async fn critic_summary_from_rm_samples() {
        let c = ctx(0);
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
        assert_eq!(a.high_risk_steps, vec![0]);
        assert_eq!(
            a.high_risk_observations,
            vec!["at 1 1 goal east".to_string()]
        );
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
    }
}
