-- coding (both reward stages): one row per program of a task (a trajectory: one policy sample)
-- with its ground-truth tests and how many it passed, and its runs against the valid tests the
-- reward model wrote. `in_g`: it passes every ground-truth test (the reference's G; a task
-- without tests has no G). Spliced into the coding queries as the CTE `programs`.
SELECT t.run_id, t.iter, t.task_id, t.traj_id,
       COALESCE(g.tests, 0) AS gt_tests,
       COALESCE(g.passed, 0) AS gt_passed,
       COALESCE(g.tests, 0) > 0 AND COALESCE(g.passed, 0) = COALESCE(g.tests, 0) AS in_g,
       COALESCE(s.tests, 0) AS gen_tests,
       COALESCE(s.passed, 0) AS gen_passed
FROM trajectories t
LEFT JOIN (
    SELECT task_id, traj_id, COUNT(*) AS tests,
           SUM(CASE WHEN passed THEN 1 ELSE 0 END) AS passed
    FROM executions
    WHERE test_kind = 'truth'
    GROUP BY task_id, traj_id
) g ON g.task_id = t.task_id AND g.traj_id = t.traj_id
LEFT JOIN (
    SELECT e.task_id, e.traj_id, COUNT(*) AS tests,
           SUM(CASE WHEN e.passed THEN 1 ELSE 0 END) AS passed
    FROM executions e
    JOIN unit_tests u ON u.task_id = e.task_id AND u.sample_idx = e.test_idx AND u.valid
    WHERE e.test_kind = 'generated'
    GROUP BY e.task_id, e.traj_id
) s ON s.task_id = t.task_id AND s.traj_id = t.traj_id
