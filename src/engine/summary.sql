-- The line `rla-pipe run` prints after each iteration, over that iteration's committed tables:
-- train success (mean acc of the active tasks), held-out and out-of-distribution success
-- (greedy, after the update), RM process accuracy (over all judged steps), and the adaptation
-- decisions.
-- NULL where a table is empty (synthetic environment, RM or adaptation disabled).
WITH train AS (
    SELECT AVG(ta.acc) AS train_success
    FROM task_accuracy ta
    JOIN tasks t ON t.task_id = ta.task_id AND t.status = 'active'
),
held_out AS (
    SELECT CAST(SUM(CASE WHEN split = 'held_out' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'held_out' THEN rollouts END) AS DOUBLE) AS held_out_success,
           CAST(SUM(CASE WHEN split = 'ood' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'ood' THEN rollouts END) AS DOUBLE) AS ood_success
    FROM evaluations
),
rm AS (
    SELECT SUM(rm_process_acc * CAST(judged_steps AS DOUBLE)) / CAST(SUM(judged_steps) AS DOUBLE) AS rm_process_acc
    FROM task_accuracy
    WHERE judged_steps > 0
),
adapt AS (
    SELECT CAST(COALESCE(SUM(CASE WHEN decision = 'accepted' THEN 1 ELSE 0 END), 0) AS BIGINT) AS accepted,
           CAST(COALESCE(SUM(CASE WHEN decision = 'rejected' THEN 1 ELSE 0 END), 0) AS BIGINT) AS rejected,
           CAST(COALESCE(SUM(CASE WHEN decision = 'pending' THEN 1 ELSE 0 END), 0) AS BIGINT) AS pending
    FROM adaptations
)
SELECT train_success, held_out_success, ood_success, rm_process_acc, accepted, rejected, pending
FROM train, held_out, rm, adapt
