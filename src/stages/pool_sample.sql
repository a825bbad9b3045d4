-- pool (every iteration): which tasks of the pool (`pool_all`) are rolled out, as the reference
-- implementation samples them: every pending candidate, plus ${slots} slots drawn from the slots
-- WITHOUT a pending candidate (a parent and its candidate are never both rolled out in one
-- iteration). The draw orders those slots by `slot_draws.draw`, a seeded random key per slot
-- (derived from the stage seed and the slot): the same seed draws the same slots.
WITH pending_slots AS (
    SELECT DISTINCT slot FROM pool_all WHERE status = 'pending'
),
free AS (
    SELECT p.slot,
           ROW_NUMBER() OVER (ORDER BY d.draw, p.slot) AS draw
    FROM pool_all p
    JOIN slot_draws d ON d.slot = p.slot
    WHERE p.status = 'active' AND p.slot NOT IN (SELECT slot FROM pending_slots)
)
SELECT p.run_id, p.iter, p.task_id, p.slot, p.status, p.spec, p.parent_task_id,
       (p.status = 'pending' OR COALESCE(f.draw <= ${slots}, false)) AS rolled_out,
       p.seed_task_id, p.seed_spec
FROM pool_all p
LEFT JOIN free f ON p.slot = f.slot AND p.status = 'active'
