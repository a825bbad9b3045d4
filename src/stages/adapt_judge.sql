-- adapt (judge): the pending candidates of this iteration's pool, with the direction and acc(q)
-- their parent had when they were written (the previous iteration's `adaptations`), and acc(q′)
-- measured in this iteration (`task_accuracy`; 0 if the candidate got no rollout).
SELECT t.slot, a.task_id, t.task_id AS candidate_task_id, a.direction,
       a.prev_acc, COALESCE(ta.acc, CAST(0 AS DOUBLE)) AS candidate_acc,
       t.spec AS candidate_spec, a.adapter
FROM tasks t
JOIN adaptations a ON a.candidate_task_id = t.task_id AND a.slot = t.slot AND a.decision = 'pending'
LEFT JOIN task_accuracy ta ON ta.task_id = t.task_id
WHERE t.status = 'pending'
ORDER BY t.slot, t.task_id
