-- advantage (policy): standardize R over the trajectories of the same task at the same step index.
--   reference: population std; std <= 1e-8 → 0; a group of one keeps its raw R;
--              rows with advantage exactly 0 are not included in the update.
--   verl:      unbiased std; (R − mean)/(std + 1e-6); a group of one → R/(1 + 1e-6).
-- Tasks whose accuracy is outside [policy_acc_min, policy_acc_max] are not included.
--
-- Determinism: group sums are taken over DECIMAL(38,18) (exact integer arithmetic), so they do not
-- depend on how rows are partitioned across threads; replay reproduces them bit for bit.
WITH acc AS (
    SELECT task_id,
           CAST(SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS DOUBLE) / CAST(COUNT(*) AS DOUBLE) AS task_acc
    FROM trajectories
    GROUP BY task_id
),
grp AS (
    SELECT task_id, step_idx, COUNT(*) AS n,
           CAST(SUM(CAST(reward AS DECIMAL(38, 18))) AS DOUBLE) AS total
    FROM step_rewards
    GROUP BY task_id, step_idx
),
centered AS (
    SELECT r.run_id, r.iter, r.task_id, r.traj_id, r.step_idx, r.reward, g.n,
           g.total / CAST(g.n AS DOUBLE) AS mean
    FROM step_rewards r
    JOIN grp g ON r.task_id = g.task_id AND r.step_idx = g.step_idx
),
spread AS (
    SELECT task_id, step_idx,
           CAST(SUM(CAST((reward - mean) * (reward - mean) AS DECIMAL(38, 18))) AS DOUBLE) AS sq
    FROM centered
    GROUP BY task_id, step_idx
),
stats AS (
    SELECT c.*, a.task_acc,
           CASE WHEN ${mode} = 'verl' AND c.n > 1 THEN sqrt(s.sq / CAST(c.n - 1 AS DOUBLE))
                ELSE sqrt(s.sq / CAST(c.n AS DOUBLE)) END AS std
    FROM centered c
    JOIN spread s ON c.task_id = s.task_id AND c.step_idx = s.step_idx
    JOIN acc a ON c.task_id = a.task_id
),
adv AS (
    SELECT *,
           CASE WHEN ${mode} = 'verl' THEN
                    CASE WHEN n = 1 THEN reward / (1.0 + ${verl_eps})
                         ELSE (reward - mean) / (std + ${verl_eps}) END
                ELSE
                    CASE WHEN n = 1 THEN reward
                         WHEN std <= ${min_std} THEN CAST(0 AS DOUBLE)
                         ELSE (reward - mean) / std END
           END AS advantage
    FROM stats
)
SELECT run_id, iter, task_id, traj_id, step_idx, reward,
       CAST(n AS INT UNSIGNED) AS group_size,
       mean AS group_mean,
       std AS group_std,
       task_acc,
       advantage,
       (task_acc >= ${acc_min} AND task_acc <= ${acc_max}
        AND (${mode} = 'verl' OR advantage <> 0)) AS included
FROM adv
