-- The RM-question grid (docs/src/rm-question.md): per run and iteration, the reward model's process
-- accuracy (majority verdict vs the step oracle), balanced outcome accuracy (mean hit rate of a
-- trajectory's summed verdicts on successes and on failures), verdict base rate (share of
-- parsable samples saying good), separation (mean S on oracle-good steps minus on oracle-bad
-- steps) and the policy's held-out success. Every run in the store.
WITH process AS (
    SELECT run_id, iter,
           SUM(rm_process_acc * CAST(judged_steps AS DOUBLE))
             / CAST(NULLIF(SUM(CASE WHEN rm_process_acc IS NOT NULL THEN judged_steps ELSE 0 END), 0) AS DOUBLE) AS process
    FROM task_accuracy
    GROUP BY run_id, iter
),
votes AS (
    SELECT run_id, iter, traj_id,
           SUM(CAST(rm_pos AS BIGINT) - CAST(rm_neg AS BIGINT)) AS vote, SUM(rm_count) AS samples
    FROM step_rewards
    GROUP BY run_id, iter, traj_id
),
per_class AS (
    SELECT t.run_id, t.iter, t.outcome,
           AVG(CASE WHEN signum(CAST(v.vote AS DOUBLE)) = CAST(t.outcome AS DOUBLE) THEN 1.0 ELSE 0.0 END) AS recall
    FROM trajectories t
    JOIN votes v ON v.run_id = t.run_id AND v.iter = t.iter AND v.traj_id = t.traj_id
    WHERE v.samples > 0
    GROUP BY t.run_id, t.iter, t.outcome
),
balanced AS (
    SELECT run_id, iter, AVG(recall) AS balanced_outcome FROM per_class GROUP BY run_id, iter
),
base AS (
    SELECT run_id, iter,
           AVG(CASE WHEN score > 0 THEN 1.0 ELSE 0.0 END) AS base_rate
    FROM rm_samples
    WHERE score <> 0
    GROUP BY run_id, iter
),
sep AS (
    SELECT r.run_id, r.iter,
           AVG(CASE WHEN s.oracle_progress > 0 THEN (CAST(r.rm_pos AS DOUBLE) - CAST(r.rm_neg AS DOUBLE)) / CAST(r.rm_pos + r.rm_neg AS DOUBLE) END)
           - AVG(CASE WHEN s.oracle_progress < 0 THEN (CAST(r.rm_pos AS DOUBLE) - CAST(r.rm_neg AS DOUBLE)) / CAST(r.rm_pos + r.rm_neg AS DOUBLE) END) AS separation
    FROM step_rewards r
    JOIN steps s ON s.run_id = r.run_id AND s.iter = r.iter AND s.traj_id = r.traj_id AND s.step_idx = r.step_idx
    WHERE r.rm_pos + r.rm_neg > 0
    GROUP BY r.run_id, r.iter
),
held AS (
    SELECT run_id, iter, CAST(SUM(successes) AS DOUBLE) / CAST(SUM(rollouts) AS DOUBLE) AS held_out
    FROM evaluations
    WHERE split = 'held_out'
    GROUP BY run_id, iter
)
SELECT p.run_id, p.iter,
       round(p.process, 4) AS process, round(b.balanced_outcome, 4) AS balanced_outcome,
       round(br.base_rate, 4) AS base_rate, round(sp.separation, 4) AS separation,
       round(h.held_out, 4) AS held_out
FROM process p
LEFT JOIN balanced b ON b.run_id = p.run_id AND b.iter = p.iter
LEFT JOIN base br ON br.run_id = p.run_id AND br.iter = p.iter
LEFT JOIN sep sp ON sp.run_id = p.run_id AND sp.iter = p.iter
LEFT JOIN held h ON h.run_id = p.run_id AND h.iter = p.iter
ORDER BY p.run_id, p.iter
