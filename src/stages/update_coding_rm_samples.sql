-- The coding reward model's PPO samples: every included unit test it wrote (task-level samples)
-- with its reply and its task's problem, in key order.
SELECT a.task_id AS sample_key, a.advantage, s.response, t.spec
FROM rm_advantages a
JOIN rm_samples s
  ON a.task_id = s.task_id AND a.traj_id = s.traj_id AND a.step_idx = s.step_idx
 AND a.sample_idx = s.sample_idx
JOIN (SELECT DISTINCT task_id, spec FROM tasks) t ON a.task_id = t.task_id
WHERE a.included
ORDER BY a.task_id, a.traj_id, a.step_idx, a.sample_idx
