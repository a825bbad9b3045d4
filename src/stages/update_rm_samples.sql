-- The reward model's PPO samples: every included RM sample with its advantage and the response
-- the RM generated (critique tokens, then the verdict), in key order.
SELECT a.traj_id, a.step_idx, a.sample_idx, a.advantage, s.response
FROM rm_advantages a
JOIN rm_samples s
  ON a.traj_id = s.traj_id AND a.step_idx = s.step_idx AND a.sample_idx = s.sample_idx
WHERE a.included
ORDER BY a.task_id, a.traj_id, a.step_idx, a.sample_idx
