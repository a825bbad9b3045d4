-- advantage (reward model): the consistency reward of each verdict sample,
--   R_S(τ,i,j) = R(τ,i) · S(τ,i,j), or ${unparsable} when S is unparsable (0),
-- standardized over the m samples of the same (task, τ, i) with population std.
-- Zero-variance groups (std <= 1e-8) get advantage 0 and are not included; only tasks with
-- rm_acc_min <= acc <= rm_acc_max train the RM.
--
-- Within a group R is constant, so R_S takes at most three values (R, −R, unparsable); the group
-- mean and variance follow exactly from the three counts. One aggregation, no float sums: the
-- result does not depend on execution order, and replay reproduces it bit for bit.
WITH acc AS (
    SELECT task_id,
           CAST(SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS DOUBLE) / CAST(COUNT(*) AS DOUBLE) AS task_acc
    FROM trajectories
    GROUP BY task_id
),
counts AS (
    SELECT task_id, traj_id, step_idx,
           CAST(SUM(CASE WHEN score > 0 THEN 1 ELSE 0 END) AS DOUBLE) AS n_pos,
           CAST(SUM(CASE WHEN score < 0 THEN 1 ELSE 0 END) AS DOUBLE) AS n_neg,
           CAST(SUM(CASE WHEN score = 0 THEN 1 ELSE 0 END) AS DOUBLE) AS n_unp
    FROM rm_samples
    GROUP BY task_id, traj_id, step_idx
),
means AS (
    SELECT c.task_id, c.traj_id, c.step_idx, c.n_pos, c.n_neg, c.n_unp, r.reward,
           c.n_pos + c.n_neg + c.n_unp AS n,
           (r.reward * (c.n_pos - c.n_neg) + ${unparsable} * c.n_unp) / (c.n_pos + c.n_neg + c.n_unp) AS mean
    FROM counts c
    JOIN step_rewards r
      ON c.task_id = r.task_id AND c.traj_id = r.traj_id AND c.step_idx = r.step_idx
),
stats AS (
    SELECT m.*, a.task_acc,
           sqrt((n_pos * (reward - mean) * (reward - mean)
                 + n_neg * (-reward - mean) * (-reward - mean)
                 + n_unp * (${unparsable} - mean) * (${unparsable} - mean)) / n) AS std
    FROM means m
    JOIN acc a ON m.task_id = a.task_id
),
scored AS (
    SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, s.sample_idx, s.score,
           CASE WHEN s.score = 0 THEN ${unparsable}
                ELSE g.reward * CAST(s.score AS DOUBLE) END AS consistency_reward,
           g.n, g.mean, g.std, g.task_acc
    FROM rm_samples s
    JOIN stats g
      ON s.task_id = g.task_id AND s.traj_id = g.traj_id AND s.step_idx = g.step_idx
)
SELECT run_id, iter, task_id, traj_id, step_idx, sample_idx, score, consistency_reward,
       CAST(n AS INT UNSIGNED) AS group_size,
       std AS group_std,
       task_acc,
       CASE WHEN std <= ${min_std} THEN CAST(0 AS DOUBLE) ELSE (consistency_reward - mean) / std END AS advantage,
       (std > ${min_std} AND task_acc >= ${acc_min} AND task_acc <= ${acc_max}) AS included
FROM scored
