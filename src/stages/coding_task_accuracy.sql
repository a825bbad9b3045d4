-- task_accuracy (coding): a task's accuracy is the share of its programs that pass every
-- ground-truth test (the reference's `acc`, `reward/llm_rl_reward.py:96-98`). The reward model
-- judges no steps here: its quality is in `test_quality`.
WITH programs AS (
    ${programs}
)
SELECT MIN(run_id) AS run_id, MIN(iter) AS iter, task_id,
       CAST(COUNT(*) AS INT UNSIGNED) AS rollouts,
       CAST(SUM(CASE WHEN in_g THEN 1 ELSE 0 END) AS INT UNSIGNED) AS successes,
       CAST(SUM(CASE WHEN in_g THEN 1 ELSE 0 END) AS DOUBLE) / CAST(COUNT(*) AS DOUBLE) AS acc,
       CAST(0 AS INT UNSIGNED) AS judged_steps,
       CAST(NULL AS DOUBLE) AS rm_process_acc,
       CAST(0 AS INT UNSIGNED) AS judged_trajectories,
       CAST(NULL AS DOUBLE) AS rm_outcome_acc
FROM programs
GROUP BY task_id
