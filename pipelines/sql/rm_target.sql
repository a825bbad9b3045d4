-- What the consistency reward pays the reward model for (docs/src/rm-question.md, the cause): its
-- trained samples (included, parsable) grouped by the trajectory's outcome, the step oracle's
-- label and the sample's verdict — how many, the mean consistency reward R·S and the mean
-- advantage. If the target were "judge this step", verdicts equal to the oracle would be paid
-- in failed and in successful trajectories alike; if it is "predict the outcome", verdicts
-- equal to the outcome are paid whatever the oracle says. Parent runs of the grid only
-- (`grid-s<seed>`, or the ablation's full-loop runs `abl-rmadapt-s<seed>` where they are the parents).
SELECT CASE WHEN t.outcome > 0 THEN 'success' ELSE 'failure' END AS trajectory,
       CASE WHEN s.oracle_progress > 0 THEN 'good' ELSE 'bad' END AS oracle,
       CASE WHEN a.score > 0 THEN 'good' ELSE 'bad' END AS verdict,
       COUNT(*) AS samples,
       round(AVG(a.consistency_reward), 3) AS mean_rs,
       round(AVG(a.advantage), 3) AS mean_advantage,
       round(AVG(CASE WHEN a.advantage > 0 THEN 1.0 ELSE 0.0 END), 3) AS paid_share
FROM rm_advantages a
JOIN steps s ON s.run_id = a.run_id AND s.iter = a.iter AND s.traj_id = a.traj_id AND s.step_idx = a.step_idx
JOIN trajectories t ON t.run_id = a.run_id AND t.iter = a.iter AND t.traj_id = a.traj_id
WHERE a.included AND a.score <> 0 AND s.oracle_progress IS NOT NULL
  AND regexp_like(a.run_id, '^(grid-s|abl-rmadapt-s)[0-9]+$')
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3
