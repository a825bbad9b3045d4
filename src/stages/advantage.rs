//! Stage 4, `advantage`: `step_rewards` + `rm_samples` + `trajectories` → `policy_advantages`
//! (`policy_advantages.sql`) and `rm_advantages` (`rm_advantages.sql`). The pool (`tasks`) and
//! this iteration's `judgements` decide which tasks may train at all: the active tasks rolled
//! out and the accepted candidates, never a rejected one.

use crate::stage::sql::{f64_lit, query, render, str_lit};
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

const POLICY_SQL: &str = include_str!("policy_advantages.sql");
const RM_SQL: &str = include_str!("rm_advantages.sql");
/// `reward.rm_balance = "outcome"`: the tail of [`RM_SQL`] that weights the included samples.
const RM_OUTCOME_SQL: &str = include_str!("rm_advantages_outcome.sql");
const TRAINED_SQL: &str = include_str!("advantage_trained.sql");

/// Groups whose standard deviation is at most this are "zero variance".
pub const MIN_STD: f64 = 1e-8;
/// The ε verl adds to the standard deviation.
pub const VERL_EPS: f64 = 1e-6;

/// The `trained` CTE both advantage queries splice in (this stage's and the coding setting's):
/// the tasks whose samples may train, with `reward.train_candidates` bound.
pub fn trained_sql(r: &crate::config::RewardConfig) -> crate::error::Result<String> {
    render(
        TRAINED_SQL,
        &[(
            "candidates",
            if r.train_candidates { "true" } else { "false" }.to_string(),
        )],
    )
}

pub struct Advantage {
    /// Whether a `judge` stage precedes this one in the DAG (environments with adaptation);
    /// without one nothing is ever pending and `judgements` is empty.
    pub judged: bool,
}

impl Stage for Advantage {
    fn name(&self) -> &'static str {
        "advantage"
    }
    fn inputs(&self) -> &'static [&'static str] {
        if self.judged {
            &[
                "step_rewards",
                "rm_samples",
                "trajectories",
                "tasks",
                "judgements",
            ]
        } else {
            &["step_rewards", "rm_samples", "trajectories", "tasks"]
        }
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["policy_advantages", "rm_advantages"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["reward"]
    }
    fn partition_column(&self) -> Option<&'static str> {
        Some("task_id")
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            if !self.judged {
                let def = crate::schema::table_def("judgements").expect("a table of the schema");
                let empty = datafusion::catalog::MemTable::try_new(def.schema, vec![vec![]])?;
                let _ = ctx.session.deregister_table("judgements")?;
                ctx.session
                    .register_table("judgements", std::sync::Arc::new(empty))?;
            }
            let r = &ctx.config.reward;
            let trained = trained_sql(r)?;
            let policy = render(
                POLICY_SQL,
                &[
                    ("mode", str_lit(r.advantage_mode.as_str())),
                    ("verl_eps", f64_lit(VERL_EPS)),
                    ("min_std", f64_lit(MIN_STD)),
                    ("acc_min", f64_lit(r.policy_acc_min)),
                    ("acc_max", f64_lit(r.policy_acc_max)),
                    ("trained", trained.clone()),
                ],
            )?;
            let rm = render(
                RM_SQL,
                &[
                    ("mode", str_lit(r.advantage_mode.as_str())),
                    ("unparsable", f64_lit(r.unparsable_reward)),
                    ("min_std", f64_lit(MIN_STD)),
                    ("acc_min", f64_lit(r.rm_acc_min)),
                    ("acc_max", f64_lit(r.rm_acc_max)),
                    ("trained", trained),
                    (
                        "balance",
                        match r.rm_balance {
                            crate::config::RmBalance::None => {
                                "SELECT * FROM standardized".to_string()
                            }
                            crate::config::RmBalance::Outcome => format!(",\n{RM_OUTCOME_SQL}"),
                        },
                    ),
                ],
            )?;
            Ok(vec![
                (
                    "policy_advantages",
                    TableOutput::Frame(query(&ctx.session, &policy).await?),
                ),
                (
                    "rm_advantages",
                    TableOutput::Frame(query(&ctx.session, &rm).await?),
                ),
            ])
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use arrow::array::{Array, BooleanArray, Float64Array, RecordBatch, StringArray, UInt32Array};
    use proptest::prelude::*;

    use super::*;
    use crate::config::Config;
    use crate::stages::testutil::{ctx, f, i8s, output, register, s, u};

    /// Without a `judge` stage: the stage supplies an empty `judgements` itself.
    const ADV: Advantage = Advantage { judged: false };

    /// Register `tasks`: every id active and rolled out.
    fn pool(c: &crate::stage::StageContext, ids: &[&str]) {
        let n = ids.len();
        register(
            c,
            "tasks",
            vec![
                s(ids),
                u(&(0..n as u32).collect::<Vec<_>>()),
                s(&vec!["active"; n]),
                s(&vec!["{}"; n]),
                s(&vec![""; n]),
                Arc::new(BooleanArray::from(vec![true; n])),
            ],
        );
    }

    /// `step_rewards` rows (task, traj, step, outcome, R, verdict counts [+1, −1, unparsable]).
    type StepRow<'a> = (&'a str, &'a str, u32, i8, f64, [u32; 3]);

    fn register_steps(c: &crate::stage::StageContext, rows: &[StepRow]) {
        let count = |k: usize| u(&rows.iter().map(|r| r.5[k]).collect::<Vec<_>>());
        register(
            c,
            "step_rewards",
            vec![
                s(&rows.iter().map(|r| r.0).collect::<Vec<_>>()),
                s(&rows.iter().map(|r| r.1).collect::<Vec<_>>()),
                u(&rows.iter().map(|r| r.2).collect::<Vec<_>>()),
                i8s(&rows.iter().map(|r| r.3).collect::<Vec<_>>()),
                Arc::new(Float64Array::from(vec![None; rows.len()])),
                u(&rows.iter().map(|r| r.5.iter().sum()).collect::<Vec<_>>()),
                count(0),
                count(1),
                count(2),
                f(&rows.iter().map(|r| r.4).collect::<Vec<_>>()),
            ],
        );
    }

    /// `rm_samples` of step 0 (task, traj, sample, verdict).
    fn register_samples(c: &crate::stage::StageContext, samples: &[(&str, &str, u32, i8)]) {
        register(
            c,
            "rm_samples",
            vec![
                s(&samples.iter().map(|r| r.0).collect::<Vec<_>>()),
                s(&samples.iter().map(|r| r.1).collect::<Vec<_>>()),
                u(&vec![0; samples.len()]),
                u(&samples.iter().map(|r| r.2).collect::<Vec<_>>()),
                s(&vec!["r"; samples.len()]),
                i8s(&samples.iter().map(|r| r.3).collect::<Vec<_>>()),
            ],
        );
    }

    /// The golden `step_rewards` (task, traj, step, R): A step 0: 1.5, 1.0, -1.0, -0.5 (mean
    /// 0.25, pop var 1.0625); A step 1: only A-0 (group of one); A step 2: A-0, A-1 both 1.0
    /// (zero variance); B step 0: 1.0, 1.5. Then the step's verdict counts (+1, −1,
    /// unparsable) of [`GOLDEN_SAMPLES`].
    const GOLDEN_STEPS: &[StepRow] = &[
        ("A", "A-0", 0, 1, 1.5, [2, 1, 0]),
        ("A", "A-0", 1, 1, 1.0, [0, 0, 0]),
        ("A", "A-0", 2, 1, 1.0, [0, 0, 0]),
        ("A", "A-1", 0, 1, 1.0, [1, 1, 1]),
        ("A", "A-1", 2, 1, 1.0, [0, 0, 0]),
        ("A", "A-2", 0, -1, -1.0, [0, 3, 0]),
        ("A", "A-3", 0, -1, -0.5, [0, 0, 0]),
        ("B", "B-0", 0, 1, 1.0, [2, 1, 0]),
        ("B", "B-1", 0, 1, 1.5, [0, 0, 0]),
    ];

    /// The golden `rm_samples`: A-0/0 (R 1.5): +1 +1 -1; A-1/0 (R 1.0): +1 0 -1; A-2/0 (R -1):
    /// -1 -1 -1; B-0/0 (R 1.0): +1 -1 +1.
    const GOLDEN_SAMPLES: &[(&str, &str, u32, i8)] = &[
        ("A", "A-0", 0, 1),
        ("A", "A-0", 1, 1),
        ("A", "A-0", 2, -1),
        ("A", "A-1", 0, 1),
        ("A", "A-1", 1, 0),
        ("A", "A-1", 2, -1),
        ("A", "A-2", 0, -1),
        ("A", "A-2", 1, -1),
        ("A", "A-2", 2, -1),
        ("B", "B-0", 0, 1),
        ("B", "B-0", 1, -1),
        ("B", "B-0", 2, 1),
    ];

    /// Inputs: task A (acc 0.5) with 4 trajectories; task B (acc 1.0, outside both filters).
    /// step_rewards as in the comments; rm_samples for the RM golden table.
    fn golden_ctx(sets: &[&str]) -> crate::stage::StageContext {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let c = ctx(Config::from_toml_with_sets("[run]\nname='t'\n", "t", &sets).unwrap());
        pool(&c, &["A", "B"]);
        register(
            &c,
            "trajectories",
            vec![
                s(&["A", "A", "A", "A", "B", "B"]),
                s(&["A-0", "A-1", "A-2", "A-3", "B-0", "B-1"]),
                u(&[0, 1, 2, 3, 0, 1]),
                i8s(&[1, 1, -1, -1, 1, 1]),
                u(&[3, 3, 1, 1, 1, 1]),
            ],
        );
        register_steps(&c, GOLDEN_STEPS);
        register_samples(&c, GOLDEN_SAMPLES);
        c
    }

    fn floats(b: &RecordBatch, name: &str) -> Vec<f64> {
        b.column_by_name(name)
            .unwrap()
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap()
            .values()
            .to_vec()
    }
    fn bools(b: &RecordBatch, name: &str) -> Vec<bool> {
        let a = b.column_by_name(name).unwrap();
        let a = a.as_any().downcast_ref::<BooleanArray>().unwrap();
        (0..a.len()).map(|i| a.value(i)).collect()
    }
    fn u32s(b: &RecordBatch, name: &str) -> Vec<u32> {
        b.column_by_name(name)
            .unwrap()
            .as_any()
            .downcast_ref::<UInt32Array>()
            .unwrap()
            .values()
            .to_vec()
    }
    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-12, "{got:?} vs {want:?}");
        }
    }

    #[tokio::test]
    async fn golden_policy_reference() {
        let c = golden_ctx(&[]);
        let b = output(&ADV, &c, "policy_advantages").await;
        // Row order (task, traj, step): A-0/0 A-0/1 A-0/2 A-1/0 A-1/2 A-2/0 A-3/0 B-0/0 B-1/0.
        let std = 1.0625f64.sqrt();
        assert_eq!(u32s(&b, "group_size"), vec![4, 1, 2, 4, 2, 4, 4, 2, 2]);
        assert_close(
            &floats(&b, "advantage"),
            &[
                1.25 / std,
                1.0,
                0.0,
                0.75 / std,
                0.0,
                -1.25 / std,
                -0.75 / std,
                -1.0,
                1.0,
            ],
        );
        assert_close(
            &floats(&b, "task_acc"),
            &[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0],
        );
        // Zero-variance rows and task B (acc 1 > 7/8) are excluded.
        assert_eq!(
            bools(&b, "included"),
            vec![true, true, false, true, false, true, true, false, false]
        );
    }

    #[tokio::test]
    async fn golden_policy_verl() {
        let c = golden_ctx(&["reward.advantage_mode=verl", "reward.policy_acc_max=1.0"]);
        let b = output(&ADV, &c, "policy_advantages").await;
        let std = (4.25f64 / 3.0).sqrt();
        let e = VERL_EPS;
        let std_b = (0.125f64).sqrt(); // devs ±0.25 → Σ = 0.125, n − 1 = 1
        assert_close(
            &floats(&b, "advantage"),
            &[
                1.25 / (std + e),
                1.0 / (1.0 + e),
                0.0,
                0.75 / (std + e),
                0.0,
                -1.25 / (std + e),
                -0.75 / (std + e),
                -0.25 / (std_b + e),
                0.25 / (std_b + e),
            ],
        );
        // verl keeps zero advantages; the filter now admits task B.
        assert_eq!(bools(&b, "included"), vec![true; 9]);
    }

    #[tokio::test]
    async fn golden_rm_advantages() {
        let c = golden_ctx(&[]);
        let b = output(&ADV, &c, "rm_advantages").await;
        // A-0/0: R_S = 1.5, 1.5, -1.5 → mean 0.5, pop std √2.
        // A-1/0: R_S = 1.0, -2 (unparsable), -1.0 → mean -2/3, pop std √14/3.
        // A-2/0: R_S = 1, 1, 1 → zero variance. B-0/0: filtered out (acc 1.0 > 0.8).
        assert_close(
            &floats(&b, "consistency_reward"),
            &[
                1.5, 1.5, -1.5, 1.0, -2.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 1.0,
            ],
        );
        let s2 = 2f64.sqrt();
        let s14 = 14f64.sqrt() / 3.0;
        let m = -2.0 / 3.0;
        let adv = floats(&b, "advantage");
        let want = [
            1.0 / s2,
            1.0 / s2,
            -2.0 / s2,
            (1.0 - m) / s14,
            (-2.0 - m) / s14,
            (-1.0 - m) / s14,
            0.0,
            0.0,
            0.0,
        ];
        for (g, w) in adv.iter().zip(want.iter()) {
            assert!((g - w).abs() < 1e-9, "{adv:?} vs {want:?}");
        }
        assert_eq!(
            bools(&b, "included"),
            vec![
                true, true, true, true, true, true, false, false, false, false, false, false
            ]
        );
    }

    /// `reward.rm_balance = "outcome"`: A-2/0 (a lost trajectory, R = −1) given mixed verdicts
    /// −1 +1 −1 (R_S = 1, −1, 1: mean 1/3, pop std √8/3, every advantage nonzero), so 6 included
    /// samples come from won trajectories (A-0/0, A-1/0) and 3 from a lost one: the won ones'
    /// advantages × 9/12 = 0.75, the lost ones' × 9/6 = 1.5; rows not included keep theirs.
    /// With one outcome only (the golden inputs: A-2/0 all −1, zero variance) nothing changes.
    #[tokio::test]
    async fn rm_balance_outcome_weights_won_and_lost_equally() {
        let mixed = |sets: &[&str]| {
            let c = golden_ctx(sets);
            let mut rows = GOLDEN_STEPS.to_vec();
            let mut samples = GOLDEN_SAMPLES.to_vec();
            for r in rows.iter_mut().filter(|r| r.1 == "A-2" && r.2 == 0) {
                r.5 = [1, 2, 0];
            }
            for v in samples.iter_mut().filter(|v| v.1 == "A-2" && v.2 == 1) {
                v.3 = 1;
            }
            register_steps(&c, &rows);
            register_samples(&c, &samples);
            c
        };
        let plain = output(&ADV, &mixed(&[]), "rm_advantages").await;
        let balanced = output(
            &ADV,
            &mixed(&["reward.rm_balance=\"outcome\""]),
            "rm_advantages",
        )
        .await;
        let inc = bools(&plain, "included");
        assert_eq!(inc, bools(&balanced, "included"));
        assert_eq!(inc.iter().filter(|x| **x).count(), 9, "{inc:?}");
        let (p, b) = (floats(&plain, "advantage"), floats(&balanced, "advantage"));
        let s8 = 8f64.sqrt() / 3.0;
        let lost = [
            (1.0 - 1.0 / 3.0) / s8,
            (-1.0 - 1.0 / 3.0) / s8,
            (1.0 - 1.0 / 3.0) / s8,
        ];
        for (k, w) in lost.iter().enumerate() {
            assert!((p[6 + k] - w).abs() < 1e-9, "{p:?}");
        }
        let weights = [
            0.75, 0.75, 0.75, 0.75, 0.75, 0.75, 1.5, 1.5, 1.5, 1.0, 1.0, 1.0,
        ];
        for i in 0..p.len() {
            assert!(
                (b[i] - p[i] * weights[i]).abs() < 1e-12,
                "row {i}: {b:?} vs {p:?}"
            );
        }
        // One outcome among the included samples: the weights are all 1.
        let golden = output(&ADV, &golden_ctx(&[]), "rm_advantages").await;
        let one = output(
            &ADV,
            &golden_ctx(&["reward.rm_balance=\"outcome\""]),
            "rm_advantages",
        )
        .await;
        assert_eq!(floats(&golden, "advantage"), floats(&one, "advantage"));
    }

    /// Judge before training: task A is a pending candidate. Rejected, none of its rows is
    /// included in either table (B, an active task, still is); accepted, A trains exactly as an
    /// active task would (the golden tables above) — unless `reward.train_candidates = false`,
    /// where an accepted candidate does not train either.
    #[tokio::test]
    async fn rejected_candidates_never_train() {
        let judged = Advantage { judged: true };
        for (decision, train, want_a) in [
            ("rejected", "true", false),
            ("accepted", "true", true),
            ("accepted", "false", false),
            ("rejected", "false", false),
        ] {
            let c = golden_ctx(&[
                "reward.policy_acc_max=1.0",
                "reward.rm_acc_max=1.0",
                &format!("reward.train_candidates={train}"),
            ]);
            register(
                &c,
                "tasks",
                vec![
                    s(&["A", "B"]),
                    u(&[0, 1]),
                    s(&["pending", "active"]),
                    s(&["{}", "{}"]),
                    s(&["P", ""]),
                    Arc::new(BooleanArray::from(vec![true, true])),
                ],
            );
            register(
                &c,
                "judgements",
                vec![
                    s(&["A"]),
                    s(&["P"]),
                    s(&["harder"]),
                    f(&[1.0]),
                    f(&[0.5]),
                    s(&[decision]),
                ],
            );
            let tasks = |b: &RecordBatch| -> Vec<String> {
                let t = b.column_by_name("task_id").unwrap();
                let t = t.as_any().downcast_ref::<StringArray>().unwrap();
                (0..t.len()).map(|i| t.value(i).to_string()).collect()
            };
            let p = output(&judged, &c, "policy_advantages").await;
            let r = output(&judged, &c, "rm_advantages").await;
            for b in [&p, &r] {
                let ids = tasks(b);
                let inc = bools(b, "included");
                let a_rows: Vec<bool> = (0..ids.len())
                    .filter(|i| ids[*i] == "A")
                    .map(|i| inc[i])
                    .collect();
                assert!(!a_rows.is_empty());
                if want_a {
                    assert!(a_rows.iter().any(|x| *x), "{decision}: {a_rows:?}");
                } else {
                    assert!(a_rows.iter().all(|x| !x), "{decision}: {a_rows:?}");
                }
                assert!(
                    (0..ids.len()).any(|i| ids[i] == "B" && inc[i]),
                    "{decision}: the active task trains"
                );
            }
            if want_a {
                let golden = output(&ADV, &golden_ctx(&[]), "policy_advantages").await;
                assert_eq!(bools(&p, "included")[..7], bools(&golden, "included")[..7]);
            }
        }
    }

    /// The reference keeps only RM samples with a nonzero advantage: with an unparsable reward
    /// of 0, A-1/0's R_S are 1, 0, −1 (mean 0), so its unparsable sample's advantage is exactly
    /// 0 — excluded in reference mode, kept in verl mode.
    #[tokio::test]
    async fn zero_rm_advantages_are_dropped_in_reference_mode() {
        for (mode, want) in [("reference", false), ("verl", true)] {
            let c = golden_ctx(&[
                "reward.unparsable_reward=0.0",
                &format!("reward.advantage_mode=\"{mode}\""),
            ]);
            let b = output(&ADV, &c, "rm_advantages").await;
            let adv = floats(&b, "advantage");
            assert_eq!(adv[4], 0.0, "A-1/0 sample 1");
            assert!(adv[3] != 0.0 && adv[5] != 0.0);
            let inc = bools(&b, "included");
            assert_eq!((inc[3], inc[4], inc[5]), (true, want, true), "{mode}");
        }
    }

    fn policy_stats(groups: &[Vec<f64>]) -> RecordBatch {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let c = ctx(Config::from_toml("[run]\nname='t'\n", "t").unwrap());
        let mut rows = Vec::new();
        for (g, rewards) in groups.iter().enumerate() {
            for (t, r) in rewards.iter().enumerate() {
                rows.push((format!("T{g:03}"), format!("T{g:03}-{t:03}"), *r));
            }
        }
        let task: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let mut ids = task.clone();
        ids.dedup();
        pool(&c, &ids);
        let traj: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        let outcome: Vec<i8> = rows
            .iter()
            .map(|r| if r.2 > 0.0 { 1 } else { -1 })
            .collect();
        register(
            &c,
            "trajectories",
            vec![
                s(&task),
                s(&traj),
                u(&vec![0; rows.len()]),
                i8s(&outcome),
                u(&vec![1; rows.len()]),
            ],
        );
        register(
            &c,
            "step_rewards",
            vec![
                s(&task),
                s(&traj),
                u(&vec![0; rows.len()]),
                i8s(&outcome),
                Arc::new(Float64Array::from(vec![None; rows.len()])),
                u(&vec![0; rows.len()]),
                u(&vec![0; rows.len()]),
                u(&vec![0; rows.len()]),
                u(&vec![0; rows.len()]),
                f(&rows.iter().map(|r| r.2).collect::<Vec<_>>()),
            ],
        );
        register(
            &c,
            "rm_samples",
            vec![s(&[]), s(&[]), u(&[]), u(&[]), s(&[]), i8s(&[])],
        );
        rt.block_on(output(&ADV, &c, "policy_advantages"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Reference mode: in every (task, step) group of ≥ 2 with nonzero std, advantages have
        /// mean 0 and population std 1.
        #[test]
        fn reference_advantages_are_standardized(
            groups in proptest::collection::vec(proptest::collection::vec(-3.0f64..3.0, 1..9), 1..12)
        ) {
            let b = policy_stats(&groups);
            let tasks = b.column_by_name("task_id").unwrap();
            let tasks = tasks.as_any().downcast_ref::<StringArray>().unwrap();
            let adv = floats(&b, "advantage");
            let std = floats(&b, "group_std");
            let mut by_task: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
            for i in 0..b.num_rows() {
                by_task.entry(tasks.value(i)).or_default().push((adv[i], std[i]));
            }
            prop_assert_eq!(by_task.len(), groups.len());
            for rows in by_task.values() {
                let n = rows.len() as f64;
                if rows.len() < 2 || rows[0].1 <= MIN_STD {
                    continue;
                }
                let mean = rows.iter().map(|r| r.0).sum::<f64>() / n;
                let var = rows.iter().map(|r| (r.0 - mean).powi(2)).sum::<f64>() / n;
                prop_assert!(mean.abs() < 1e-9, "mean {}", mean);
                prop_assert!((var.sqrt() - 1.0).abs() < 1e-9, "std {}", var.sqrt());
            }
        }
    }
}
