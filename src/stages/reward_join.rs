//! Stage 3, `reward_join`: `steps` × `trajectories` × `rm_samples` → `step_rewards`
//! (SQL in `reward_join.sql`).

use crate::stage::sql::{f64_lit, query, render};
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

const SQL: &str = include_str!("reward_join.sql");

pub struct RewardJoin;

impl Stage for RewardJoin {
    fn name(&self) -> &'static str {
        "reward_join"
    }
    fn inputs(&self) -> &'static [&'static str] {
        &["steps", "trajectories", "rm_samples"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["step_rewards"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["reward"]
    }
    fn partition_column(&self) -> Option<&'static str> {
        Some("task_id")
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let sql = render(SQL, &[("lambda", f64_lit(ctx.config.reward.lambda))])?;
            Ok(vec![(
                "step_rewards",
                TableOutput::Frame(query(&ctx.session, &sql).await?),
            )])
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, Float64Array, Int8Array, StringArray, UInt32Array};

    use super::*;
    use crate::config::Config;
    use crate::stages::testutil::{ctx, i8s, output, register, s, u};

    /// Golden table, computed by hand: two trajectories of task A (won, lost), one step each plus
    /// a second step for the winner; m = 3 samples, one unparsable; one step without samples.
    #[tokio::test]
    async fn golden_step_rewards() {
        let cfg =
            Config::from_toml_with_sets("[run]\nname='t'\n", "t", &["reward.lambda=0.5".into()])
                .unwrap();
        let c = ctx(cfg);
        register(
            &c,
            "trajectories",
            vec![
                s(&["A", "A"]),
                s(&["A-0", "A-1"]),
                u(&[0, 1]),
                i8s(&[1, -1]),
                u(&[2, 1]),
            ],
        );
        register(
            &c,
            "steps",
            vec![
                s(&["A", "A", "A"]),
                s(&["A-0", "A-0", "A-1"]),
                u(&[0, 1, 0]),
                s(&["o", "o", "o"]),
                s(&["a", "a", "a"]),
                Arc::new(Float64Array::from(vec![-1.0; 3])),
                Arc::new(Int8Array::from(vec![Some(1), None, Some(-1)])),
            ],
        );
        // A-0 step 0: verdicts +1 +1 -1 → mean 1/3; A-1 step 0: +1 0 -1 → mean 0; A-0 step 1: none.
        register(
            &c,
            "rm_samples",
            vec![
                s(&["A"; 6]),
                s(&["A-0", "A-0", "A-0", "A-1", "A-1", "A-1"]),
                u(&[0; 6]),
                u(&[0, 1, 2, 0, 1, 2]),
                s(&["r"; 6]),
                i8s(&[1, 1, -1, 1, 0, -1]),
            ],
        );
        let b = output(&RewardJoin, &c, "step_rewards").await;
        assert_eq!(b.num_rows(), 3);
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        let traj = col("traj_id");
        let traj = traj.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(
            traj.iter().flatten().collect::<Vec<_>>(),
            vec!["A-0", "A-0", "A-1"]
        );
        let rm_mean = col("rm_mean");
        let rm_mean = rm_mean.as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!(rm_mean.value(0), 1.0 / 3.0);
        assert!(rm_mean.is_null(1));
        assert_eq!(rm_mean.value(2), 0.0);
        let count = col("rm_count");
        assert_eq!(
            count
                .as_any()
                .downcast_ref::<UInt32Array>()
                .unwrap()
                .values()
                .to_vec(),
            vec![3, 0, 3]
        );
        for (name, want) in [
            ("rm_pos", [2, 0, 1]),
            ("rm_neg", [1, 0, 1]),
            ("rm_unparsable", [0, 0, 1]),
        ] {
            let got = col(name);
            let got = got
                .as_any()
                .downcast_ref::<UInt32Array>()
                .unwrap()
                .values()
                .to_vec();
            assert_eq!(got, want.to_vec(), "{name}");
        }
        let r = col("reward");
        let r = r.as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!(r.values().to_vec(), vec![1.0 + 0.5 / 3.0, 1.0, -1.0]);
    }
}
