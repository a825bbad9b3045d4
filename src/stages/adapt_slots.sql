-- adapt (slots): every active task of this iteration's pool with its accuracy, and the
-- accuracy of every pool task (active or pending) by id, for the slots' new occupants.
SELECT t.slot, t.task_id, t.status, t.spec, COALESCE(ta.acc, CAST(0 AS DOUBLE)) AS acc,
       CAST(COALESCE(ta.rollouts, 0) AS INT UNSIGNED) AS rollouts
FROM tasks t
LEFT JOIN task_accuracy ta ON ta.task_id = t.task_id
ORDER BY t.slot, t.status, t.task_id
