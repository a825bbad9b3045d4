//! The coding setting's relational stages (the reference's `reward/llm_rl_reward.py`), over
//! `trajectories` (one program per trajectory), `executions` (every program against every test)
//! and `unit_tests` (the tests the reward model wrote):
//! - [`CodingAccuracy`] (`task_accuracy`): each task's share of programs passing all of its
//!   ground-truth tests (`coding_task_accuracy.sql`) and the quality of the reward model's tests
//!   (`test_quality`: `syn_ut_acc`, `perfect_ut_rate`; `coding_test_quality.sql`);
//! - [`CodingAdvantage`] (`advantage`): the policy's pass-fraction reward standardized per task
//!   (`coding_policy_advantages.sql`) and CURE's discrimination reward of each written test
//!   (`coding_rm_advantages.sql`), for tasks whose pass-all share is in
//!   [`reward.rm_acc_min`, `rm_acc_max`] (the reference's band, [0.2, 0.8]: its band check skips
//!   the whole task).

use crate::stage::sql::{f64_lit, query, render};
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

const PROGRAMS_SQL: &str = include_str!("coding_programs.sql");
const GENERATED_SQL: &str = include_str!("coding_generated.sql");
const ACCURACY_SQL: &str = include_str!("coding_task_accuracy.sql");
const QUALITY_SQL: &str = include_str!("coding_test_quality.sql");
const POLICY_SQL: &str = include_str!("coding_policy_advantages.sql");
const RM_SQL: &str = include_str!("coding_rm_advantages.sql");

/// `task_accuracy` of the coding setting.
pub struct CodingAccuracy;

impl Stage for CodingAccuracy {
    fn name(&self) -> &'static str {
        "task_accuracy"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["trajectories", "executions", "unit_tests"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["task_accuracy", "test_quality"]
    }
    fn partition_column(&self) -> Option<&'static str> {
        Some("task_id")
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let accuracy = render(ACCURACY_SQL, &[("programs", PROGRAMS_SQL.to_string())])?;
            let quality = render(
                QUALITY_SQL,
                &[
                    ("programs", PROGRAMS_SQL.to_string()),
                    ("generated", GENERATED_SQL.to_string()),
                ],
            )?;
            Ok(vec![
                (
                    "task_accuracy",
                    TableOutput::Frame(query(&ctx.session, &accuracy).await?),
                ),
                (
                    "test_quality",
                    TableOutput::Frame(query(&ctx.session, &quality).await?),
                ),
            ])
        })
    }
}

/// `advantage` of the coding setting.
pub struct CodingAdvantage;

impl Stage for CodingAdvantage {
    fn name(&self) -> &'static str {
        "advantage"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &[
            "trajectories",
            "executions",
            "unit_tests",
            "tasks",
            "judgements",
        ]
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
            let r = &ctx.config.reward;
            let trained = super::advantage::trained_sql(r)?;
            let min_std = f64_lit(super::advantage::MIN_STD);
            let policy = render(
                POLICY_SQL,
                &[
                    ("programs", PROGRAMS_SQL.to_string()),
                    ("trained", trained.clone()),
                    ("lambda", f64_lit(r.lambda)),
                    ("min_std", min_std.clone()),
                    ("acc_min", f64_lit(r.policy_acc_min)),
                    ("acc_max", f64_lit(r.policy_acc_max)),
                ],
            )?;
            let rm = render(
                RM_SQL,
                &[
                    ("programs", PROGRAMS_SQL.to_string()),
                    ("generated", GENERATED_SQL.to_string()),
                    ("trained", trained),
                    ("min_std", min_std),
                    ("acc_min", f64_lit(r.rm_acc_min)),
                    ("acc_max", f64_lit(r.rm_acc_max)),
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
    use std::sync::Arc;

    use arrow::array::{Array, BooleanArray, Float64Array, Int8Array, StringArray, UInt32Array};

    use super::*;
    use crate::config::Config;
    use crate::stages::testutil::{ctx, output, register, s, u};

    fn b(v: &[bool]) -> Arc<BooleanArray> {
        Arc::new(BooleanArray::from(v.to_vec()))
    }

    /// Three tasks, computed by hand (the reference's formulas):
    /// - A: 2 ground-truth tests; p1 and p4 pass both (G), p2 passes one, p3 none (N). Written
    ///   tests: k0 (G pass, p2 passes, p3 fails) → +1; k1 (p4 fails it, both of N pass) → −2;
    ///   k2 invalid (fails everyone) → −0 = 0; k3 (G pass, N fail) → +2.
    /// - B: 1 test, both programs pass it (N empty): k0 all pass → +1, k1 q1 fails → −1.
    /// - C: its one program fails its test (no G): nothing trains.
    fn inputs(lambda: f64) -> StageContext {
        inputs_with(lambda, |_| {})
    }

    fn inputs_with(lambda: f64, set: impl FnOnce(&mut Config)) -> StageContext {
        let mut cfg = Config::from_toml("[run]\nname='t'\n[env]\nname='gridnav'\n", "t").unwrap();
        cfg.reward.lambda = lambda;
        cfg.reward.policy_acc_min = 0.2;
        cfg.reward.policy_acc_max = 0.8;
        set(&mut cfg);
        let c = ctx(cfg);
        register(
            &c,
            "trajectories",
            vec![
                s(&["A", "A", "A", "A", "B", "B", "C"]),
                s(&["p1", "p2", "p3", "p4", "q1", "q2", "r1"]),
            ],
        );
        register(
            &c,
            "unit_tests",
            vec![
                s(&["A", "A", "A", "A", "B", "B", "C"]),
                u(&[0, 1, 2, 3, 0, 1, 0]),
                b(&[true, true, false, true, true, true, true]),
            ],
        );
        // (task, program, kind, idx, passed)
        let mut rows: Vec<(&str, &str, &str, u32, bool)> = Vec::new();
        for (p, gt) in [
            ("p1", [true, true]),
            ("p2", [true, false]),
            ("p3", [false, false]),
            ("p4", [true, true]),
        ] {
            for (i, ok) in gt.iter().enumerate() {
                rows.push(("A", p, "truth", i as u32, *ok));
            }
        }
        for (p, written) in [
            ("p1", [true, true, false, true]),
            ("p2", [true, true, false, false]),
            ("p3", [false, true, false, false]),
            ("p4", [true, false, false, true]),
        ] {
            for (k, ok) in written.iter().enumerate() {
                rows.push(("A", p, "generated", k as u32, *ok));
            }
        }
        rows.extend([
            ("B", "q1", "truth", 0, true),
            ("B", "q2", "truth", 0, true),
            ("B", "q1", "generated", 0, true),
            ("B", "q2", "generated", 0, true),
            ("B", "q1", "generated", 1, false),
            ("B", "q2", "generated", 1, true),
            ("C", "r1", "truth", 0, false),
            ("C", "r1", "generated", 0, true),
        ]);
        register(
            &c,
            "executions",
            vec![
                s(&rows.iter().map(|r| r.0).collect::<Vec<_>>()),
                s(&rows.iter().map(|r| r.1).collect::<Vec<_>>()),
                s(&rows.iter().map(|r| r.2).collect::<Vec<_>>()),
                u(&rows.iter().map(|r| r.3).collect::<Vec<_>>()),
                b(&rows.iter().map(|r| r.4).collect::<Vec<_>>()),
            ],
        );
        register(
            &c,
            "tasks",
            vec![
                s(&["A", "B", "C"]),
                u(&[0, 1, 2]),
                s(&["active", "active", "active"]),
                s(&["{}", "{}", "{}"]),
                s(&["", "", ""]),
                b(&[true, true, true]),
            ],
        );
        register(&c, "judgements", vec![]);
        c
    }

    fn col<'a, T: 'static>(b: &'a arrow::array::RecordBatch, name: &str) -> &'a T {
        b.column_by_name(name)
            .unwrap()
            .as_any()
            .downcast_ref::<T>()
            .unwrap()
    }

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-12, "{got} != {want}");
    }

    #[tokio::test]
    async fn the_rewards_match_the_reference_on_a_hand_computed_matrix() {
        let c = inputs(0.0);
        let p = output(&CodingAdvantage, &c, "policy_advantages").await;
        let ids = col::<StringArray>(&p, "traj_id");
        assert_eq!(
            (0..p.num_rows()).map(|i| ids.value(i)).collect::<Vec<_>>(),
            ["p1", "p2", "p3", "p4", "q1", "q2", "r1"]
        );
        let (r, adv, inc) = (
            col::<Float64Array>(&p, "reward"),
            col::<Float64Array>(&p, "advantage"),
            col::<BooleanArray>(&p, "included"),
        );
        // A: rewards 1, 0.5, 0, 1; mean 0.625; population std sqrt(0.171875).
        let std = 0.171875f64.sqrt();
        for (i, want) in [1.0, 0.5, 0.0, 1.0].iter().enumerate() {
            close(r.value(i), *want);
            close(adv.value(i), (want - 0.625) / std);
            assert!(inc.value(i), "A's accuracy 0.5 is in the band");
        }
        close(col::<Float64Array>(&p, "task_acc").value(0), 0.5);
        // B: all pass: std 0 → advantage 0, and accuracy 1 is out of the band. C: acc 0.
        for i in 4..7 {
            assert_eq!(adv.value(i), 0.0);
            assert!(!inc.value(i));
        }

        let rm = output(&CodingAdvantage, &c, "rm_advantages").await;
        let (raw, adv, inc, score) = (
            col::<Float64Array>(&rm, "consistency_reward"),
            col::<Float64Array>(&rm, "advantage"),
            col::<BooleanArray>(&rm, "included"),
            col::<Int8Array>(&rm, "score"),
        );
        assert_eq!(col::<StringArray>(&rm, "traj_id").value(0), "");
        // A: 1, −2, 0, 2: mean 0.25, population std sqrt(2.1875).
        let std = 2.1875f64.sqrt();
        for (i, (want, sc)) in [(1.0, 1), (-2.0, -1), (0.0, 0), (2.0, 1)]
            .iter()
            .enumerate()
        {
            close(raw.value(i), *want);
            close(adv.value(i), (want - 0.25) / std);
            assert_eq!(score.value(i), *sc);
            assert!(inc.value(i));
        }
        // B (N empty): +1, −1 → advantages +1, −1; its accuracy 1 is outside the band.
        close(raw.value(4), 1.0);
        close(raw.value(5), -1.0);
        close(adv.value(4), 1.0);
        close(adv.value(5), -1.0);
        assert!(!inc.value(4) && !inc.value(5));
        // C: no G, so nothing of it trains the reward model.
        assert!(!inc.value(6));
        assert_eq!(col::<UInt32Array>(&rm, "group_size").value(0), 4);
    }

    /// Issue 47, case 7: the reference's band check skips the whole task, so the reward model
    /// trains only on tests of tasks whose pass-all share is in [0.2, 0.8] (`reward.rm_acc_*`,
    /// defaults the reference's); widened to [0, 1], every task with a passing program trains it.
    #[tokio::test]
    async fn the_rm_trains_only_on_tasks_inside_the_band() {
        let included = |b: &arrow::array::RecordBatch| -> Vec<(String, bool)> {
            let (t, inc) = (
                col::<StringArray>(b, "task_id"),
                col::<BooleanArray>(b, "included"),
            );
            (0..b.num_rows())
                .map(|i| (t.value(i).to_string(), inc.value(i)))
                .collect()
        };
        let by_task = |rows: Vec<(String, bool)>| -> Vec<(String, usize)> {
            let mut out: Vec<(String, usize)> = Vec::new();
            for (t, inc) in rows {
                match out.last_mut() {
                    Some((last, n)) if *last == t => *n += usize::from(inc),
                    _ => out.push((t, usize::from(inc))),
                }
            }
            out
        };
        let c = inputs(0.0);
        let rm = output(&CodingAdvantage, &c, "rm_advantages").await;
        // A (0.5) trains; B (1.0, its two tests discriminate) is outside the band; C has no G.
        assert_eq!(
            by_task(included(&rm)),
            [("A".into(), 4), ("B".into(), 0), ("C".into(), 0)]
        );
        let c = inputs_with(0.0, |cfg| {
            cfg.reward.rm_acc_min = 0.0;
            cfg.reward.rm_acc_max = 1.0;
        });
        let rm = output(&CodingAdvantage, &c, "rm_advantages").await;
        assert_eq!(
            by_task(included(&rm)),
            [("A".into(), 4), ("B".into(), 2), ("C".into(), 0)]
        );
    }

    #[tokio::test]
    async fn lambda_adds_the_written_tests_pass_rate() {
        let c = inputs(0.5);
        let p = output(&CodingAdvantage, &c, "policy_advantages").await;
        let r = col::<Float64Array>(&p, "reward");
        // Valid written tests of A: k0, k1, k3. p1 passes 3 of 3, p2 2, p3 1, p4 2.
        for (i, want) in [1.5, 0.5 + 1.0 / 3.0, 1.0 / 6.0, 1.0 + 1.0 / 3.0]
            .iter()
            .enumerate()
        {
            assert!((r.value(i) - want).abs() < 1e-9, "{} != {want}", r.value(i));
        }
    }

    #[tokio::test]
    async fn accuracy_and_test_quality_are_the_references() {
        let c = inputs(0.0);
        let a = output(&CodingAccuracy, &c, "task_accuracy").await;
        let acc = col::<Float64Array>(&a, "acc");
        assert_eq!((acc.value(0), acc.value(1), acc.value(2)), (0.5, 1.0, 0.0));
        assert_eq!(col::<UInt32Array>(&a, "successes").value(0), 2);
        assert!(col::<Float64Array>(&a, "rm_process_acc").is_null(0));

        let q = output(&CodingAccuracy, &c, "test_quality").await;
        let n = |name: &str, i: usize| col::<UInt32Array>(&q, name).value(i);
        assert_eq!(
            (
                n("programs", 0),
                n("passing", 0),
                n("tests", 0),
                n("valid_tests", 0)
            ),
            (4, 2, 4, 3)
        );
        assert_eq!((n("consistent", 0), n("perfect", 0)), (2, 1));
        let (syn, perfect) = (
            col::<Float64Array>(&q, "syn_ut_acc"),
            col::<Float64Array>(&q, "perfect_ut_rate"),
        );
        assert_eq!((syn.value(0), perfect.value(0)), (0.5, 0.25));
        // B: N is empty: no perfect_ut_rate. C: G is empty: neither.
        assert_eq!(syn.value(1), 0.5);
        assert!(perfect.is_null(1));
        assert!(syn.is_null(2) && perfect.is_null(2));
    }
}
