-- adapt (critic): the observations the policy faced at high-risk steps (every RM sample −1) of
-- the task's rollouts (the failed ones only unless ${all}), the ${top} most frequent per task.
-- `steps` gives the observation the RM was shown; its oracle column is not read.
WITH risky AS (
    SELECT r.task_id, r.traj_id, r.step_idx
    FROM rm_samples r
    JOIN trajectories t ON t.traj_id = r.traj_id
    WHERE ${all} OR t.outcome < 0
    GROUP BY r.task_id, r.traj_id, r.step_idx
    HAVING SUM(CASE WHEN r.score < 0 THEN 1 ELSE 0 END) = COUNT(*)
),
seen AS (
    SELECT r.task_id, s.observation, COUNT(*) AS n
    FROM risky r
    JOIN steps s ON s.traj_id = r.traj_id AND s.step_idx = r.step_idx
    GROUP BY r.task_id, s.observation
),
ranked AS (
    SELECT task_id, observation, n,
           ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY n DESC, observation) AS rank
    FROM seen
)
SELECT task_id, observation, CAST(n AS INT UNSIGNED) AS n
FROM ranked
WHERE rank <= ${top}
ORDER BY task_id, rank
