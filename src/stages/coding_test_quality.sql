-- test_quality (coding): per task, the reference's `syn_ut_acc` (tests every program of G
-- passes, over the task's tests, where G is not empty) and `perfect_ut_rate` (tests all of G
-- pass and all of N fail, where neither is empty); `reward/llm_rl_reward.py:186-202`.
WITH programs AS (
    ${programs}
),
generated AS (
    ${generated}
),
sizes AS (
    SELECT MIN(run_id) AS run_id, MIN(iter) AS iter, task_id, COUNT(*) AS programs,
           SUM(CASE WHEN in_g THEN 1 ELSE 0 END) AS g
    FROM programs
    GROUP BY task_id
),
per_task AS (
    SELECT task_id, COUNT(*) AS tests,
           SUM(CASE WHEN valid THEN 1 ELSE 0 END) AS valid_tests,
           SUM(CASE WHEN g > 0 AND valid AND g_fail = 0 THEN 1 ELSE 0 END) AS consistent,
           SUM(CASE WHEN g > 0 AND n > 0 AND valid AND g_fail = 0 AND n_pass = 0 THEN 1 ELSE 0 END) AS perfect
    FROM generated
    GROUP BY task_id
)
SELECT s.run_id, s.iter, s.task_id,
       CAST(s.programs AS INT UNSIGNED) AS programs,
       CAST(s.g AS INT UNSIGNED) AS passing,
       CAST(COALESCE(t.tests, 0) AS INT UNSIGNED) AS tests,
       CAST(COALESCE(t.valid_tests, 0) AS INT UNSIGNED) AS valid_tests,
       CAST(COALESCE(t.consistent, 0) AS INT UNSIGNED) AS consistent,
       CAST(COALESCE(t.perfect, 0) AS INT UNSIGNED) AS perfect,
       CASE WHEN s.g > 0 AND COALESCE(t.tests, 0) > 0
            THEN CAST(t.consistent AS DOUBLE) / CAST(t.tests AS DOUBLE) END AS syn_ut_acc,
       CASE WHEN s.g > 0 AND s.programs > s.g AND COALESCE(t.tests, 0) > 0
            THEN CAST(t.perfect AS DOUBLE) / CAST(t.tests AS DOUBLE) END AS perfect_ut_rate
FROM sizes s
LEFT JOIN per_task t ON t.task_id = s.task_id
