-- advantage (policy): standardize R over the trajectories of the same task at the same step index.
--   reference: population std; std <= 1e-8 → 0; a group of one keeps its raw R;
--              rows with advantage exactly 0 are not included in the update.
--   verl:      unbiased std; (R − mean)/(std + 1e-6); a group of one → R/(1 + 1e-6).
-- Tasks whose accuracy is outside [policy_acc_min, policy_acc_max] are not included, nor are
-- the samples of a pending candidate that `judge` rejected in this iteration (only active tasks
-- and accepted candidates train, as in the reference implementation).
--
-- Exact group statistics in one aggregation: R is taken on a 1e-9 grid (DECIMAL(38, 9)), so
-- Σ R, Σ R² and n·Σ R² − (Σ R)² are exact decimal arithmetic. The result does not depend on how
-- rows are partitioned across threads (replay reproduces it bit for bit), a constant group has
-- variance exactly 0, and a row equal to its group mean has advantage exactly 0.
WITH acc AS (
    SELECT task_id,
           CAST(SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS DOUBLE) / CAST(COUNT(*) AS DOUBLE) AS task_acc
    FROM trajectories
    GROUP BY task_id
),
trained AS (
    ${trained}
),
quantized AS (
    SELECT run_id, iter, task_id, traj_id, step_idx, reward,
           CAST(reward AS DECIMAL(38, 9)) AS r
    FROM step_rewards
),
grp AS (
    SELECT task_id, step_idx,
           COUNT(*) AS n,
           SUM(r) AS s1,
           SUM(r * r) AS s2
    FROM quantized
    GROUP BY task_id, step_idx
),
stats AS (
    SELECT task_id, step_idx, n,
           CAST(s1 AS DOUBLE) / CAST(n AS DOUBLE) AS mean,
           -- n² · population variance, exact
           CAST(CAST(n AS DECIMAL(20, 0)) * s2 - s1 * s1 AS DOUBLE) AS m2
    FROM grp
),
joined AS (
    SELECT q.run_id, q.iter, q.task_id, q.traj_id, q.step_idx, q.reward,
           CAST(q.r AS DOUBLE) AS r, g.n, g.mean, a.task_acc, tr.task_id IS NOT NULL AS trained,
           CASE WHEN ${mode} = 'verl' AND g.n > 1
                THEN sqrt(g.m2 / (CAST(g.n AS DOUBLE) * CAST(g.n - 1 AS DOUBLE)))
                ELSE sqrt(g.m2 / (CAST(g.n AS DOUBLE) * CAST(g.n AS DOUBLE))) END AS std
    -- stats first: DataFusion hashes the smaller per-(task, step) side and streams the sorted
    -- step rows through it, so they come out in key order and need no sort.
    FROM stats g
    JOIN quantized q ON q.task_id = g.task_id AND q.step_idx = g.step_idx
    JOIN acc a ON q.task_id = a.task_id
    LEFT JOIN trained tr ON q.task_id = tr.task_id
),
adv AS (
    SELECT *,
           CASE WHEN ${mode} = 'verl' THEN
                    CASE WHEN n = 1 THEN reward / (1.0 + ${verl_eps})
                         ELSE (r - mean) / (std + ${verl_eps}) END
                ELSE
                    CASE WHEN n = 1 THEN reward
                         WHEN std <= ${min_std} THEN CAST(0 AS DOUBLE)
                         ELSE (r - mean) / std END
           END AS advantage
    FROM joined
)
SELECT run_id, iter, task_id, traj_id, step_idx, reward,
       CAST(n AS INT UNSIGNED) AS group_size,
       mean AS group_mean,
       std AS group_std,
       task_acc,
       advantage,
       (trained AND task_acc >= ${acc_min} AND task_acc <= ${acc_max}
        AND (${mode} = 'verl' OR advantage <> 0)) AS included
FROM adv
