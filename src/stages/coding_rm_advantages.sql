-- advantage (coding, reward model): CURE's discrimination reward for each test the reward model
-- wrote (`reward/llm_rl_reward.py:254-318`). With G / N the task's programs that pass / fail its
-- ground-truth tests: a test every program of G passes earns +#(N it fails), otherwise
-- −#(N that pass it); with N empty, ±1. An invalid test fails every program. Standardized over
-- the task's tests (population std, 0 when std <= min_std). Only tasks with |G| >= 1 that may
-- train this iteration and whose pass-all share is in [rm_acc_min, rm_acc_max] train the reward
-- model: the reference's band check (`llm_rl_reward.py:224-225`, [0.2, 0.8] inclusive) skips
-- the whole task, its tests included (`reward.rm_acc_min = 0`, `rm_acc_max = 1`: every task with
-- a passing program). Zero-variance groups are not included (the reference keeps them: their
-- only effect there is the KL term). The sample is task-level:
-- `traj_id` is '' and `step_idx` 0; `score` is +1 for a test all of G pass, −1 for one some of
-- G fail, 0 for an invalid one; `consistency_reward` is the raw reward.
WITH programs AS (
    ${programs}
),
generated AS (
    ${generated}
),
trained AS (
    ${trained}
),
raw AS (
    SELECT run_id, iter, task_id, sample_idx, valid, g, n AS n_size,
           CASE WHEN valid AND g_fail = 0 THEN (CASE WHEN n = 0 THEN 1 ELSE n_fail END)
                ELSE (CASE WHEN n = 0 THEN -1 ELSE -n_pass END) END AS reward,
           CASE WHEN NOT valid THEN 0 WHEN g_fail = 0 THEN 1 ELSE -1 END AS score
    FROM generated
),
grp AS (
    SELECT task_id, COUNT(*) AS n,
           CAST(SUM(reward) AS DOUBLE) / CAST(COUNT(*) AS DOUBLE) AS mean,
           sqrt(CAST(COUNT(*) * SUM(reward * reward) - SUM(reward) * SUM(reward) AS DOUBLE)
                / (CAST(COUNT(*) AS DOUBLE) * CAST(COUNT(*) AS DOUBLE))) AS std
    FROM raw
    GROUP BY task_id
)
SELECT r.run_id, r.iter, r.task_id, '' AS traj_id, CAST(0 AS INT UNSIGNED) AS step_idx,
       r.sample_idx, CAST(r.score AS TINYINT) AS score,
       CAST(r.reward AS DOUBLE) AS consistency_reward, CAST(g.n AS INT UNSIGNED) AS group_size,
       g.std AS group_std, CAST(r.g AS DOUBLE) / CAST(r.g + r.n_size AS DOUBLE) AS task_acc,
       CASE WHEN g.std <= ${min_std} THEN 0.0 ELSE (CAST(r.reward AS DOUBLE) - g.mean) / g.std END AS advantage,
       r.g >= 1 AND tr.task_id IS NOT NULL AND g.std > ${min_std}
           AND CAST(r.g AS DOUBLE) / CAST(r.g + r.n_size AS DOUBLE) >= ${acc_min}
           AND CAST(r.g AS DOUBLE) / CAST(r.g + r.n_size AS DOUBLE) <= ${acc_max} AS included
FROM raw r
JOIN grp g ON g.task_id = r.task_id
LEFT JOIN trained tr ON tr.task_id = r.task_id
