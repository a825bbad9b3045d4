-- Wall time per stage over a run's own iterations (a branch's shared iterations were spent by
-- its parent: `${own}` leaves them out): iterations, total and mean seconds, and the stage's
-- share of the run's time.
WITH own AS (
    SELECT run_id, iter, stage, seconds
    FROM stage_runs
    WHERE run_id IN (${runs}) AND ${own}
)
SELECT run_id, stage, COUNT(*) AS iterations, SUM(seconds) AS total_seconds,
       AVG(seconds) AS mean_seconds,
       SUM(seconds) / SUM(SUM(seconds)) OVER (PARTITION BY run_id) AS share
FROM own
GROUP BY run_id, stage
ORDER BY run_id, total_seconds DESC, stage
