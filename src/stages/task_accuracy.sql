-- task_accuracy: per task of this iteration
--   rollouts, successes, acc = successes / rollouts;
--   rm_process_acc: share of judged steps (oracle label present, ≥ 1 RM sample) whose majority
--     verdict sign(#(+1) − #(−1)) equals the oracle label (a tie counts as disagreement);
--   rm_outcome_acc: share of judged trajectories (≥ 1 RM sample) whose mean verdict sign equals O.
-- NULL when nothing could be judged (no oracle, RM disabled).
-- The per-step verdict counts come from step_rewards (reward_join aggregated rm_samples once).
-- traj_id is unique within an iteration (schemas/trajectories.md).
WITH traj_votes AS (
    SELECT r.task_id, r.traj_id,
           SUM(CAST(r.rm_pos AS BIGINT) - CAST(r.rm_neg AS BIGINT)) AS vote,
           SUM(CASE WHEN r.rm_count > 0 THEN 1 ELSE 0 END) AS sampled_steps,
           SUM(CASE WHEN r.rm_count > 0 AND s.oracle_progress IS NOT NULL THEN 1 ELSE 0 END) AS judged_steps,
           SUM(CASE WHEN r.rm_count > 0
                     AND signum(CAST(CAST(r.rm_pos AS BIGINT) - CAST(r.rm_neg AS BIGINT) AS DOUBLE)) = CAST(s.oracle_progress AS DOUBLE)
                    THEN 1 ELSE 0 END) AS agree_steps
    FROM step_rewards r
    JOIN steps s ON r.traj_id = s.traj_id AND r.step_idx = s.step_idx
    GROUP BY r.task_id, r.traj_id
),
per_task AS (
    SELECT t.run_id, t.iter, t.task_id,
           COUNT(*) AS rollouts,
           SUM(CASE WHEN t.outcome > 0 THEN 1 ELSE 0 END) AS successes,
           SUM(COALESCE(tv.judged_steps, 0)) AS judged_steps,
           SUM(COALESCE(tv.agree_steps, 0)) AS agree_steps,
           SUM(CASE WHEN tv.sampled_steps > 0 THEN 1 ELSE 0 END) AS judged_trajectories,
           SUM(CASE WHEN tv.sampled_steps > 0 AND signum(CAST(tv.vote AS DOUBLE)) = CAST(t.outcome AS DOUBLE)
                    THEN 1 ELSE 0 END) AS agree_trajectories
    FROM trajectories t
    LEFT JOIN traj_votes tv ON t.traj_id = tv.traj_id
    GROUP BY t.run_id, t.iter, t.task_id
)
SELECT run_id, iter, task_id,
       CAST(rollouts AS INT UNSIGNED) AS rollouts,
       CAST(successes AS INT UNSIGNED) AS successes,
       CAST(successes AS DOUBLE) / CAST(rollouts AS DOUBLE) AS acc,
       CAST(judged_steps AS INT UNSIGNED) AS judged_steps,
       CASE WHEN judged_steps > 0 THEN CAST(agree_steps AS DOUBLE) / CAST(judged_steps AS DOUBLE) END AS rm_process_acc,
       CAST(judged_trajectories AS INT UNSIGNED) AS judged_trajectories,
       CASE WHEN judged_trajectories > 0 THEN CAST(agree_trajectories AS DOUBLE) / CAST(judged_trajectories AS DOUBLE) END AS rm_outcome_acc
FROM per_task
