-- coding (both reward stages): one row per test the reward model wrote for a task, with how the
-- task's programs fared on it — G programs that failed it, N programs that passed / failed it —
-- and the task's |G| and |N|. An invalid test was run by nobody: it fails every program.
-- Spliced after the CTE `programs` as the CTE `generated`.
SELECT u.run_id, u.iter, u.task_id, u.sample_idx, u.valid, z.g, z.n,
       SUM(CASE WHEN p.in_g AND NOT COALESCE(e.passed, FALSE) THEN 1 ELSE 0 END) AS g_fail,
       SUM(CASE WHEN NOT p.in_g AND COALESCE(e.passed, FALSE) THEN 1 ELSE 0 END) AS n_pass,
       SUM(CASE WHEN NOT p.in_g AND NOT COALESCE(e.passed, FALSE) THEN 1 ELSE 0 END) AS n_fail
FROM unit_tests u
JOIN (
    SELECT task_id,
           SUM(CASE WHEN in_g THEN 1 ELSE 0 END) AS g,
           SUM(CASE WHEN in_g THEN 0 ELSE 1 END) AS n
    FROM programs
    GROUP BY task_id
) z ON z.task_id = u.task_id
JOIN programs p ON p.task_id = u.task_id
LEFT JOIN executions e
       ON e.task_id = u.task_id AND e.traj_id = p.traj_id
      AND e.test_kind = 'generated' AND e.test_idx = u.sample_idx
GROUP BY u.run_id, u.iter, u.task_id, u.sample_idx, u.valid, z.g, z.n
