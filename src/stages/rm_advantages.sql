-- advantage (reward model): the consistency reward of each verdict sample,
--   R_S(τ,i,j) = R(τ,i) · S(τ,i,j), or ${unparsable} when S is unparsable (0),
-- standardized over the m samples of the same (task, τ, i) with population std.
-- Zero-variance groups (std <= 1e-8) get advantage 0 and are not included; only tasks with
-- rm_acc_min <= acc <= rm_acc_max train the RM.
-- Group sums use DECIMAL(38,18) so they are exact and independent of execution order.
WITH acc AS (
    SELECT task_id,
           CAST(SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS DOUBLE) / CAST(COUNT(*) AS DOUBLE) AS task_acc
    FROM trajectories
    GROUP BY task_id
),
scored AS (
    SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, s.sample_idx, s.score,
           CASE WHEN s.score = 0 THEN ${unparsable}
                ELSE r.reward * CAST(s.score AS DOUBLE) END AS consistency_reward
    FROM rm_samples s
    JOIN step_rewards r
      ON s.task_id = r.task_id AND s.traj_id = r.traj_id AND s.step_idx = r.step_idx
),
grp AS (
    SELECT task_id, traj_id, step_idx, COUNT(*) AS n,
           CAST(SUM(CAST(consistency_reward AS DECIMAL(38, 18))) AS DOUBLE) AS total
    FROM scored
    GROUP BY task_id, traj_id, step_idx
),
centered AS (
    SELECT x.*, g.n, g.total / CAST(g.n AS DOUBLE) AS mean
    FROM scored x
    JOIN grp g ON x.task_id = g.task_id AND x.traj_id = g.traj_id AND x.step_idx = g.step_idx
),
spread AS (
    SELECT task_id, traj_id, step_idx,
           CAST(SUM(CAST((consistency_reward - mean) * (consistency_reward - mean) AS DECIMAL(38, 18))) AS DOUBLE) AS sq
    FROM centered
    GROUP BY task_id, traj_id, step_idx
),
stats AS (
    SELECT c.*, sqrt(s.sq / CAST(c.n AS DOUBLE)) AS std, a.task_acc
    FROM centered c
    JOIN spread s ON c.task_id = s.task_id AND c.traj_id = s.traj_id AND c.step_idx = s.step_idx
    JOIN acc a ON c.task_id = a.task_id
)
SELECT run_id, iter, task_id, traj_id, step_idx, sample_idx, score, consistency_reward,
       CAST(n AS INT UNSIGNED) AS group_size,
       std AS group_std,
       task_acc,
       CASE WHEN std <= ${min_std} THEN CAST(0 AS DOUBLE) ELSE (consistency_reward - mean) / std END AS advantage,
       (std > ${min_std} AND task_acc >= ${acc_min} AND task_acc <= ${acc_max}) AS included
FROM stats
