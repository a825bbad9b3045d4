-- advantage (both tables): the tasks whose samples may train this iteration — the active tasks
-- rolled out and the pending candidates `judge` accepted; a rejected candidate never trains
-- (the reference implementation's order). With `reward.train_candidates = false`
-- (${candidates} is false) no candidate trains, accepted or not: its rollouts only decide its
-- verdict. Spliced into both queries as the CTE `trained`.
SELECT t.task_id
FROM tasks t
LEFT JOIN judgements j ON j.task_id = t.task_id
WHERE COALESCE(t.rolled_out, true)
  AND (t.status = 'active' OR (${candidates} AND j.decision = 'accepted'))
