-- The coding policy's PPO samples: every included program (filters and zero advantages already
-- applied by `advantage`) with its reply and its task's problem, in key order.
SELECT a.traj_id AS sample_key, a.advantage, s.response, t.spec
FROM policy_advantages a
JOIN steps s ON a.traj_id = s.traj_id AND a.step_idx = s.step_idx
JOIN (SELECT DISTINCT task_id, spec FROM tasks) t ON a.task_id = t.task_id
WHERE a.included
ORDER BY a.task_id, a.traj_id, a.step_idx
