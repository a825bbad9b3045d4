-- Accepted-task growth: candidates accepted per iteration and the running total, one row per
-- committed iteration of every run (0 where adaptation is off or nothing was accepted).
-- rla-pipe sql --run gridnav "$(cat pipelines/sql/accepted_growth.sql)"
SELECT t.run_id, t.iter,
       COALESCE(a.accepted, 0) AS accepted,
       SUM(COALESCE(a.accepted, 0)) OVER (PARTITION BY t.run_id ORDER BY t.iter) AS cumulative
FROM (SELECT DISTINCT run_id, iter FROM tasks) t
LEFT JOIN (
    SELECT run_id, iter, COUNT(*) AS accepted
    FROM adaptations
    WHERE decision = 'accepted'
    GROUP BY run_id, iter
) a ON a.run_id = t.run_id AND a.iter = t.iter
ORDER BY t.run_id, t.iter
