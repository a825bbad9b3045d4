-- pool (iteration > 0): the previous iteration's pool with its `adaptations` applied.
-- Every active task stays in its slot unless its candidate was accepted, which takes the slot
-- over (its parent recorded); candidates written in the previous iteration join as `pending`.
-- Rejected candidates and judged pending rows are gone. Every row keeps its slot's seed task.
-- Which rows are rolled out is decided next (`pool_sample.sql`).
SELECT t.run_id, CAST(${iter} AS INT UNSIGNED) AS iter,
       COALESCE(a.candidate_task_id, t.task_id) AS task_id,
       t.slot,
       'active' AS status,
       COALESCE(a.candidate_spec, t.spec) AS spec,
       CASE WHEN a.candidate_task_id IS NULL THEN t.parent_task_id ELSE t.task_id END AS parent_task_id,
       t.seed_task_id,
       t.seed_spec
FROM tasks t
LEFT JOIN adaptations a
       ON a.task_id = t.task_id AND a.slot = t.slot AND a.decision = 'accepted'
WHERE t.status = 'active'
UNION ALL
SELECT a.run_id, CAST(${iter} AS INT UNSIGNED) AS iter,
       a.candidate_task_id AS task_id,
       a.slot,
       'pending' AS status,
       a.candidate_spec AS spec,
       a.task_id AS parent_task_id,
       t.seed_task_id,
       t.seed_spec
FROM adaptations a
JOIN tasks t ON t.slot = a.slot AND t.status = 'active'
WHERE a.decision = 'pending'
