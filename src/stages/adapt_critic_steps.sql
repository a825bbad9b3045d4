-- adapt (critic): the reward model's verdicts per (task, step index) over the task's rollouts
-- (the failed ones only unless ${all}): sample count, shares judged good / bad, and how many
-- rollouts had the step judged bad by every sample ("high-risk"). Only RM outputs (and the
-- outcome that selects failed rollouts): never the environment's step oracle.
WITH per_step AS (
    SELECT r.task_id, r.traj_id, r.step_idx,
           COUNT(*) AS samples,
           SUM(CASE WHEN r.score > 0 THEN 1 ELSE 0 END) AS good,
           SUM(CASE WHEN r.score < 0 THEN 1 ELSE 0 END) AS bad
    FROM rm_samples r
    JOIN trajectories t ON t.traj_id = r.traj_id
    WHERE ${all} OR t.outcome < 0
    GROUP BY r.task_id, r.traj_id, r.step_idx
)
SELECT task_id, step_idx,
       CAST(SUM(samples) AS INT UNSIGNED) AS samples,
       CAST(SUM(good) AS DOUBLE) / CAST(SUM(samples) AS DOUBLE) AS good,
       CAST(SUM(bad) AS DOUBLE) / CAST(SUM(samples) AS DOUBLE) AS bad,
       CAST(SUM(CASE WHEN bad = samples THEN 1 ELSE 0 END) AS INT UNSIGNED) AS high_risk
FROM per_step
GROUP BY task_id, step_idx
ORDER BY task_id, step_idx
