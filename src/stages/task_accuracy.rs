//! Stage 6, `task_accuracy`: `trajectories` + `step_rewards` (its per-step verdict counts) +
//! `steps` (oracle labels) → `task_accuracy`
//! (SQL in `task_accuracy.sql`).

use crate::stage::sql::query;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

const SQL: &str = include_str!("task_accuracy.sql");

pub struct TaskAccuracy;

impl Stage for TaskAccuracy {
    fn name(&self) -> &'static str {
        "task_accuracy"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["trajectories", "step_rewards", "steps"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["task_accuracy"]
    }
    fn partition_column(&self) -> Option<&'static str> {
        Some("task_id")
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            Ok(vec![(
                "task_accuracy",
                TableOutput::Frame(query(&ctx.session, SQL).await?),
            )])
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, Float64Array, Int8Array, UInt32Array};

    use super::*;
    use crate::config::Config;
    use crate::stages::testutil::{ctx, output, register, s, u};

    /// Golden: task A has 3 rollouts (2 won). Steps with oracle labels: A-0/0 (+1, votes +1+1-1 →
    /// +1 agree), A-0/1 (-1, votes +1 0 -1 → tie, disagree), A-1/0 (-1, votes -1-1-1 → agree),
    /// A-2/0 (no oracle, not judged for process). Trajectory votes: A-0 Σ = +1 (O=+1 agree),
    /// A-1 Σ = -3 (O=+1 disagree), A-2 Σ = -1 (O=-1 agree). Task B: no RM samples.
    #[tokio::test]
    async fn golden_task_accuracy() {
        let c = ctx(Config::from_toml("[run]\nname='t'\n", "t").unwrap());
        register(
            &c,
            "trajectories",
            vec![
                s(&["A", "A", "A", "B"]),
                s(&["A-0", "A-1", "A-2", "B-0"]),
                u(&[0, 1, 2, 0]),
                Arc::new(Int8Array::from(vec![1, 1, -1, -1])),
                u(&[2, 1, 1, 1]),
            ],
        );
        register(
            &c,
            "steps",
            vec![
                s(&["A", "A", "A", "A", "B"]),
                s(&["A-0", "A-0", "A-1", "A-2", "B-0"]),
                u(&[0, 1, 0, 0, 0]),
                s(&["o"; 5]),
                s(&["a"; 5]),
                Arc::new(Float64Array::from(vec![0.0; 5])),
                Arc::new(Int8Array::from(vec![
                    Some(1),
                    Some(-1),
                    Some(-1),
                    None,
                    Some(1),
                ])),
            ],
        );
        // step_rewards carries each step's verdict counts (+1, −1, unparsable):
        // A-0/0: +1 +1 −1; A-0/1: +1 0 −1; A-1/0: −1 −1 −1; A-2/0: −1; B-0/0: no samples.
        let steps: &[(&str, &str, u32, i8, [u32; 3])] = &[
            ("A", "A-0", 0, 1, [2, 1, 0]),
            ("A", "A-0", 1, 1, [1, 1, 1]),
            ("A", "A-1", 0, 1, [0, 3, 0]),
            ("A", "A-2", 0, -1, [0, 1, 0]),
            ("B", "B-0", 0, -1, [0, 0, 0]),
        ];
        let count = |k: usize| u(&steps.iter().map(|r| r.4[k]).collect::<Vec<_>>());
        register(
            &c,
            "step_rewards",
            vec![
                s(&steps.iter().map(|r| r.0).collect::<Vec<_>>()),
                s(&steps.iter().map(|r| r.1).collect::<Vec<_>>()),
                u(&steps.iter().map(|r| r.2).collect::<Vec<_>>()),
                Arc::new(Int8Array::from(
                    steps.iter().map(|r| r.3).collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(vec![None; steps.len()])),
                u(&steps.iter().map(|r| r.4.iter().sum()).collect::<Vec<_>>()),
                count(0),
                count(1),
                count(2),
                Arc::new(Float64Array::from(vec![0.0; steps.len()])),
            ],
        );
        let b = output(&TaskAccuracy, &c, "task_accuracy").await;
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        assert_eq!(
            col("rollouts")
                .as_any()
                .downcast_ref::<UInt32Array>()
                .unwrap()
                .values()
                .to_vec(),
            vec![3, 1]
        );
        assert_eq!(
            col("successes")
                .as_any()
                .downcast_ref::<UInt32Array>()
                .unwrap()
                .values()
                .to_vec(),
            vec![2, 0]
        );
        let acc = col("acc");
        assert_eq!(
            acc.as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .values()
                .to_vec(),
            vec![2.0 / 3.0, 0.0]
        );
        assert_eq!(
            col("judged_steps")
                .as_any()
                .downcast_ref::<UInt32Array>()
                .unwrap()
                .values()
                .to_vec(),
            vec![3, 0]
        );
        let p = col("rm_process_acc");
        let p = p.as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!(p.value(0), 2.0 / 3.0);
        assert!(p.is_null(1));
        let o = col("rm_outcome_acc");
        let o = o.as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!(o.value(0), 2.0 / 3.0);
        assert!(o.is_null(1));
    }
}
