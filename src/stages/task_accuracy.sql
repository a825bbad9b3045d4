-- task_accuracy: per task of this iteration
--   rollouts, successes, acc = successes / rollouts;
--   rm_process_acc: share of judged steps (oracle label present, ≥ 1 RM sample) whose majority
--     verdict sign(Σ_j S) equals the oracle label (a tie counts as disagreement);
--   rm_outcome_acc: share of judged trajectories (≥ 1 RM sample) whose mean verdict sign equals O.
-- NULL when nothing could be judged (no oracle, RM disabled).
WITH traj AS (
    SELECT run_id, iter, task_id, COUNT(*) AS rollouts,
           SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS successes
    FROM trajectories
    GROUP BY run_id, iter, task_id
),
votes AS (
    SELECT task_id, traj_id, step_idx, SUM(CAST(score AS BIGINT)) AS vote
    FROM rm_samples
    GROUP BY task_id, traj_id, step_idx
),
process AS (
    SELECT v.task_id, COUNT(*) AS judged,
           SUM(CASE WHEN signum(CAST(v.vote AS DOUBLE)) = CAST(s.oracle_progress AS DOUBLE) THEN 1 ELSE 0 END) AS agree
    FROM votes v
    JOIN steps s ON v.task_id = s.task_id AND v.traj_id = s.traj_id AND v.step_idx = s.step_idx
    WHERE s.oracle_progress IS NOT NULL
    GROUP BY v.task_id
),
traj_votes AS (
    SELECT task_id, traj_id, SUM(vote) AS vote
    FROM votes
    GROUP BY task_id, traj_id
),
outcome AS (
    SELECT tv.task_id, COUNT(*) AS judged,
           SUM(CASE WHEN signum(CAST(tv.vote AS DOUBLE)) = CAST(t.outcome AS DOUBLE) THEN 1 ELSE 0 END) AS agree
    FROM traj_votes tv
    JOIN trajectories t ON tv.task_id = t.task_id AND tv.traj_id = t.traj_id
    GROUP BY tv.task_id
)
SELECT t.run_id, t.iter, t.task_id,
       CAST(t.rollouts AS INT UNSIGNED) AS rollouts,
       CAST(t.successes AS INT UNSIGNED) AS successes,
       CAST(t.successes AS DOUBLE) / CAST(t.rollouts AS DOUBLE) AS acc,
       CAST(COALESCE(p.judged, 0) AS INT UNSIGNED) AS judged_steps,
       CAST(p.agree AS DOUBLE) / CAST(p.judged AS DOUBLE) AS rm_process_acc,
       CAST(COALESCE(o.judged, 0) AS INT UNSIGNED) AS judged_trajectories,
       CAST(o.agree AS DOUBLE) / CAST(o.judged AS DOUBLE) AS rm_outcome_acc
FROM traj t
LEFT JOIN process p ON t.task_id = p.task_id
LEFT JOIN outcome o ON t.task_id = o.task_id
