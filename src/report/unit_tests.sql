-- The coding setting: how good the reward model's unit tests were per iteration (the reference's
-- metrics over all of the iteration's written tests, `reward/llm_rl_reward.py:186-202`).
-- readable: tests a test could be read from; syn_ut_acc: tests every passing program (G)
-- passes, over the tests of tasks with G non-empty; perfect_ut_rate: tests every program of G
-- passes and every other program fails, over the tests of tasks with both kinds of program.
-- No rows for the other environments.
SELECT run_id, iter,
       SUM(tests) AS tests,
       CAST(SUM(valid_tests) AS DOUBLE) / CAST(NULLIF(SUM(tests), 0) AS DOUBLE) AS readable,
       CAST(SUM(CASE WHEN passing > 0 THEN consistent ELSE 0 END) AS DOUBLE)
         / CAST(NULLIF(SUM(CASE WHEN passing > 0 THEN tests ELSE 0 END), 0) AS DOUBLE) AS syn_ut_acc,
       CAST(SUM(CASE WHEN passing > 0 AND passing < programs THEN perfect ELSE 0 END) AS DOUBLE)
         / CAST(NULLIF(SUM(CASE WHEN passing > 0 AND passing < programs THEN tests ELSE 0 END), 0) AS DOUBLE) AS perfect_ut_rate
FROM test_quality
WHERE run_id IN (${runs})
GROUP BY run_id, iter
ORDER BY run_id, iter
