-- adapt (slots): every task of this iteration's pool with its accuracy, whether it was rolled
-- out, and its slot's seed task (what `adapt.rewrite_from = "seed"` rewrites).
SELECT t.slot, t.task_id, t.status, t.spec,
       COALESCE(t.rolled_out, true) AS rolled_out,
       COALESCE(t.seed_spec, t.spec) AS seed_spec,
       COALESCE(ta.acc, CAST(0 AS DOUBLE)) AS acc,
       CAST(COALESCE(ta.rollouts, 0) AS INT UNSIGNED) AS rollouts
FROM tasks t
LEFT JOIN task_accuracy ta ON ta.task_id = t.task_id
ORDER BY t.slot, t.status, t.task_id
