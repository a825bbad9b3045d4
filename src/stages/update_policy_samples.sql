-- The policy's PPO samples: every included step (filters and zero advantages already applied by
-- `advantage`), in key order.
SELECT traj_id, step_idx, advantage
FROM policy_advantages
WHERE included
ORDER BY task_id, traj_id, step_idx
