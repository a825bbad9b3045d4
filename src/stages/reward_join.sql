-- reward_join: the integrated step reward  R(τ,i) = O(τ) + λ · mean_j S(τ,i,j).
-- One row per step of `steps`. Steps without RM samples (RM disabled) have rm_mean NULL and R = O.
-- mean_j S is an integer sum over a count, so it is exact and independent of execution order.
WITH rm AS (
    SELECT task_id, traj_id, step_idx,
           SUM(CAST(score AS BIGINT)) AS score_sum,
           COUNT(*) AS n_samples
    FROM rm_samples
    GROUP BY task_id, traj_id, step_idx
),
joined AS (
    SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, t.outcome,
           CAST(rm.score_sum AS DOUBLE) / CAST(rm.n_samples AS DOUBLE) AS rm_mean,
           COALESCE(rm.n_samples, 0) AS n_samples
    FROM steps s
    JOIN trajectories t
      ON s.task_id = t.task_id AND s.traj_id = t.traj_id
    LEFT JOIN rm
      ON s.task_id = rm.task_id AND s.traj_id = rm.traj_id AND s.step_idx = rm.step_idx
)
SELECT run_id, iter, task_id, traj_id, step_idx, outcome, rm_mean,
       CAST(n_samples AS INT UNSIGNED) AS rm_count,
       CAST(outcome AS DOUBLE) + ${lambda} * COALESCE(rm_mean, CAST(0 AS DOUBLE)) AS reward
FROM joined
