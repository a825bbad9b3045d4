-- The reward model's agreement with the environment per iteration: process accuracy (majority
-- verdict vs the step oracle, over all judged steps), outcome accuracy (sign of a
-- trajectory's summed verdicts vs its outcome, over all judged trajectories), and — because
-- outcome accuracy moves with the success rate when the RM leans to one verdict — the balanced
-- outcome accuracy (the mean of the hit rates on successes and on failures; 0.5 is chance
-- whatever the success rate) and the score of an RM that always says `bad` (the failure share).
-- NULL when the RM is disabled.
WITH headline AS (
    SELECT run_id, iter,
           SUM(rm_process_acc * CAST(judged_steps AS DOUBLE))
             / CAST(NULLIF(SUM(CASE WHEN rm_process_acc IS NOT NULL THEN judged_steps ELSE 0 END), 0) AS DOUBLE) AS process,
           SUM(rm_outcome_acc * CAST(judged_trajectories AS DOUBLE))
             / CAST(NULLIF(SUM(CASE WHEN rm_outcome_acc IS NOT NULL THEN judged_trajectories ELSE 0 END), 0) AS DOUBLE) AS outcome
    FROM task_accuracy
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
),
votes AS (
    SELECT run_id, iter, traj_id,
           SUM(CAST(rm_pos AS BIGINT) - CAST(rm_neg AS BIGINT)) AS vote,
           SUM(rm_count) AS samples
    FROM step_rewards
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter, traj_id
),
per_class AS (
    SELECT t.run_id, t.iter, t.outcome, COUNT(*) AS n,
           AVG(CASE WHEN signum(CAST(v.vote AS DOUBLE)) = CAST(t.outcome AS DOUBLE) THEN 1.0 ELSE 0.0 END) AS recall
    FROM trajectories t
    JOIN votes v ON v.run_id = t.run_id AND v.iter = t.iter AND v.traj_id = t.traj_id
    WHERE v.samples > 0
    GROUP BY t.run_id, t.iter, t.outcome
),
balanced AS (
    SELECT run_id, iter,
           AVG(recall) AS balanced_outcome,
           CAST(SUM(CASE WHEN outcome < 0 THEN n ELSE 0 END) AS DOUBLE) / CAST(SUM(n) AS DOUBLE) AS always_bad_outcome
    FROM per_class
    GROUP BY run_id, iter
)
SELECT h.run_id, h.iter, h.process, h.outcome, b.balanced_outcome, b.always_bad_outcome
FROM headline h
LEFT JOIN balanced b ON b.run_id = h.run_id AND b.iter = h.iter
ORDER BY h.run_id, h.iter
