-- Wall time of every committed stage per iteration (seconds, from the stage manifests).
SELECT run_id, iter, stage, seconds
FROM stage_runs
WHERE run_id IN (${runs})
ORDER BY run_id, iter, stage
