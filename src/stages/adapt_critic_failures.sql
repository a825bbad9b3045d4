-- adapt (critic, per failed rollout, as the reference's failure summaries): every failed
-- trajectory of a task with each of its high-risk steps (every one of the RM's samples −1) and
-- the observation the RM was shown there; a failed rollout without high-risk steps has one row
-- with a null step. Only RM outputs and the outcome: never the environment's step oracle.
WITH failed AS (
    SELECT task_id, traj_id, rollout_idx, num_steps
    FROM trajectories
    WHERE outcome < 0
),
risky AS (
    SELECT traj_id, step_idx
    FROM rm_samples
    GROUP BY traj_id, step_idx
    HAVING SUM(CASE WHEN score < 0 THEN 1 ELSE 0 END) = COUNT(*)
)
SELECT f.task_id, f.traj_id, f.rollout_idx, f.num_steps, k.step_idx, s.observation
FROM failed f
LEFT JOIN risky k ON k.traj_id = f.traj_id
LEFT JOIN steps s ON s.traj_id = k.traj_id AND s.step_idx = k.step_idx
ORDER BY f.task_id, f.rollout_idx, k.step_idx
