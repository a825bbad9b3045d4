-- judge: the pending candidates of this iteration's pool, with the direction and acc(q) their
-- parent had when they were written (the previous iteration's `adaptations`), and acc(q′)
-- measured in this iteration (`task_accuracy`; 0 if the candidate got no rollout).
SELECT t.slot, t.task_id, a.task_id AS parent_task_id, a.direction,
       a.prev_acc AS parent_acc, COALESCE(ta.acc, CAST(0 AS DOUBLE)) AS acc,
       t.spec, a.adapter
FROM tasks t
JOIN adaptations a ON a.candidate_task_id = t.task_id AND a.slot = t.slot AND a.decision = 'pending'
LEFT JOIN task_accuracy ta ON ta.task_id = t.task_id
WHERE t.status = 'pending'
ORDER BY t.slot, t.task_id
