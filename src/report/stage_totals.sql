-- Wall time per stage over a run's own iterations (a branch's shared iterations were spent by
-- its parent: `${own}` leaves them out): iterations, total and mean seconds, the stage's share
-- of the run's time, the process's largest peak resident memory over those iterations and, on a
-- GPU, the largest device memory its models reserved (GiB; NULL where not recorded).
WITH own AS (
    SELECT run_id, iter, stage, seconds, peak_rss_bytes, peak_device_bytes
    FROM stage_runs
    WHERE run_id IN (${runs}) AND ${own}
)
SELECT run_id, stage, COUNT(*) AS iterations, SUM(seconds) AS total_seconds,
       AVG(seconds) AS mean_seconds,
       SUM(seconds) / SUM(SUM(seconds)) OVER (PARTITION BY run_id) AS share,
       CAST(MAX(peak_rss_bytes) AS DOUBLE) / 1073741824.0 AS peak_rss_gib,
       CAST(MAX(peak_device_bytes) AS DOUBLE) / 1073741824.0 AS peak_device_gib
FROM own
GROUP BY run_id, stage
ORDER BY run_id, total_seconds DESC, stage
