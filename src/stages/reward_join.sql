-- reward_join: the integrated step reward  R(τ,i) = O(τ) + λ · mean_j S(τ,i,j).
-- One row per step of `steps`, with the step's verdict counts (+1, −1, unparsable), which the
-- advantage and task_accuracy stages reuse instead of re-aggregating rm_samples.
-- Steps without RM samples (RM disabled) have rm_mean NULL and R = O.
-- mean_j S is an integer sum over a count: exact, whatever the execution order.
-- traj_id is unique within an iteration (schemas/trajectories.md): (traj_id, step_idx) is a step.
WITH rm AS (
    SELECT task_id, traj_id, step_idx,
           SUM(CASE WHEN score > 0 THEN 1 ELSE 0 END) AS n_pos,
           SUM(CASE WHEN score < 0 THEN 1 ELSE 0 END) AS n_neg,
           SUM(CASE WHEN score = 0 THEN 1 ELSE 0 END) AS n_unp
    FROM rm_samples
    GROUP BY task_id, traj_id, step_idx
),
joined AS (
    SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, t.outcome,
           COALESCE(rm.n_pos, 0) AS n_pos,
           COALESCE(rm.n_neg, 0) AS n_neg,
           COALESCE(rm.n_unp, 0) AS n_unp
    FROM steps s
    JOIN trajectories t
      ON s.traj_id = t.traj_id
    LEFT JOIN rm
      ON s.traj_id = rm.traj_id AND s.step_idx = rm.step_idx
),
means AS (
    SELECT *,
           CASE WHEN n_pos + n_neg + n_unp > 0
                THEN CAST(n_pos - n_neg AS DOUBLE) / CAST(n_pos + n_neg + n_unp AS DOUBLE) END AS rm_mean
    FROM joined
)
SELECT run_id, iter, task_id, traj_id, step_idx, outcome, rm_mean,
       CAST(n_pos + n_neg + n_unp AS INT UNSIGNED) AS rm_count,
       CAST(n_pos AS INT UNSIGNED) AS rm_pos,
       CAST(n_neg AS INT UNSIGNED) AS rm_neg,
       CAST(n_unp AS INT UNSIGNED) AS rm_unparsable,
       CAST(outcome AS DOUBLE) + ${lambda} * COALESCE(rm_mean, CAST(0 AS DOUBLE)) AS reward
FROM means
