-- advantage (coding, policy): the reference's `reward/llm_rl_reward.py:207-225`. A program's
-- reward is the share of the task's ground-truth tests it passes (0 without tests), plus
-- λ · its pass rate on the reward model's valid tests (λ = `reward.lambda`; the reference has no
-- such term: set 0). Advantage: standardized over the task's programs, population std, 0 when
-- std <= min_std (a group of one included). A task trains when the share of its programs
-- passing every ground-truth test is in [acc_min, acc_max] (the reference: [0.2, 0.8]) and it
-- may train this iteration (`trained`); rows with advantage exactly 0 are not included.
-- Statistics are exact as in policy_advantages.sql (rewards on a 1e-9 grid, decimal sums).
WITH programs AS (
    ${programs}
),
trained AS (
    ${trained}
),
quantized AS (
    SELECT run_id, iter, task_id, traj_id, in_g,
           CAST(
               CASE WHEN gt_tests > 0 THEN CAST(gt_passed AS DOUBLE) / CAST(gt_tests AS DOUBLE) ELSE 0.0 END
               + ${lambda} * CASE WHEN gen_tests > 0 THEN CAST(gen_passed AS DOUBLE) / CAST(gen_tests AS DOUBLE) ELSE 0.0 END
           AS DECIMAL(38, 9)) AS r
    FROM programs
),
grp AS (
    SELECT task_id, COUNT(*) AS n, SUM(r) AS s1, SUM(r * r) AS s2,
           CAST(SUM(CASE WHEN in_g THEN 1 ELSE 0 END) AS DOUBLE) / CAST(COUNT(*) AS DOUBLE) AS task_acc
    FROM quantized
    GROUP BY task_id
),
stats AS (
    SELECT task_id, n, task_acc,
           CAST(s1 AS DOUBLE) / CAST(n AS DOUBLE) AS mean,
           sqrt(CAST(CAST(n AS DECIMAL(20, 0)) * s2 - s1 * s1 AS DOUBLE) / (CAST(n AS DOUBLE) * CAST(n AS DOUBLE))) AS std
    FROM grp
),
adv AS (
    SELECT q.run_id, q.iter, q.task_id, q.traj_id, CAST(q.r AS DOUBLE) AS reward, g.n, g.mean,
           g.std, g.task_acc, tr.task_id IS NOT NULL AS trained,
           CASE WHEN g.std <= ${min_std} THEN 0.0 ELSE (CAST(q.r AS DOUBLE) - g.mean) / g.std END AS advantage
    FROM quantized q
    JOIN stats g ON g.task_id = q.task_id
    LEFT JOIN trained tr ON tr.task_id = q.task_id
)
SELECT run_id, iter, task_id, traj_id, CAST(0 AS INT UNSIGNED) AS step_idx, reward,
       CAST(n AS INT UNSIGNED) AS group_size, mean AS group_mean, std AS group_std, task_acc,
       advantage,
       trained AND task_acc >= ${acc_min} AND task_acc <= ${acc_max} AND advantage <> 0.0 AS included
FROM adv
