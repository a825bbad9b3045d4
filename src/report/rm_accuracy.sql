-- The reward model's agreement with the environment per iteration: process accuracy (majority
-- verdict vs the step oracle, over all judged steps) and outcome accuracy (sign of a
-- trajectory's summed verdicts vs its outcome, over all judged trajectories). NULL when the RM
-- is disabled.
SELECT run_id, iter,
       SUM(rm_process_acc * CAST(judged_steps AS DOUBLE))
         / CAST(NULLIF(SUM(CASE WHEN rm_process_acc IS NOT NULL THEN judged_steps ELSE 0 END), 0) AS DOUBLE) AS process,
       SUM(rm_outcome_acc * CAST(judged_trajectories AS DOUBLE))
         / CAST(NULLIF(SUM(CASE WHEN rm_outcome_acc IS NOT NULL THEN judged_trajectories ELSE 0 END), 0) AS DOUBLE) AS outcome
FROM task_accuracy
WHERE run_id IN (${runs})
GROUP BY run_id, iter
ORDER BY run_id, iter
