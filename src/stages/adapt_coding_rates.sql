-- adapt (coding): how this iteration's programs fared on each test of each task — the share
-- passing each ground-truth test, and each readable test the reward model wrote with the share
-- passing it: what the environment model is shown beside the problem.
SELECT e.task_id, e.test_kind, e.test_idx,
       AVG(CASE WHEN e.passed THEN 1.0 ELSE 0.0 END) AS pass_rate,
       MAX(u.input) AS input, MAX(u.output) AS output
FROM executions e
LEFT JOIN unit_tests u
  ON e.test_kind = 'generated' AND u.task_id = e.task_id AND u.sample_idx = e.test_idx
WHERE e.test_kind = 'truth' OR u.valid
GROUP BY e.task_id, e.test_kind, e.test_idx
ORDER BY e.task_id, e.test_kind, e.test_idx
