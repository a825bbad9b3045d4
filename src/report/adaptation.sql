-- Adaptation per iteration: candidates accepted, rejected (judged this iteration) and written
-- (pending), and the cumulative accepted count. One row per committed iteration.
WITH iters AS (
    SELECT DISTINCT run_id, iter FROM tasks WHERE run_id IN (${runs})
),
decisions AS (
    SELECT run_id, iter,
           SUM(CASE WHEN decision = 'accepted' THEN 1 ELSE 0 END) AS accepted,
           SUM(CASE WHEN decision = 'rejected' THEN 1 ELSE 0 END) AS rejected,
           SUM(CASE WHEN decision = 'pending' THEN 1 ELSE 0 END) AS pending
    FROM adaptations
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
)
SELECT i.run_id, i.iter,
       CAST(COALESCE(d.accepted, 0) AS BIGINT) AS accepted,
       CAST(COALESCE(d.rejected, 0) AS BIGINT) AS rejected,
       CAST(COALESCE(d.pending, 0) AS BIGINT) AS pending,
       CAST(SUM(COALESCE(d.accepted, 0)) OVER (PARTITION BY i.run_id ORDER BY i.iter) AS BIGINT) AS cumulative
FROM iters i
LEFT JOIN decisions d ON d.run_id = i.run_id AND d.iter = i.iter
ORDER BY i.run_id, i.iter
