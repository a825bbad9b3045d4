-- Wall time of every stage a run executed, per iteration (seconds, from the stage manifests; a
-- branch's stages shared with its parent are the parent's time).
SELECT run_id, iter, stage, seconds
FROM stage_runs
WHERE run_id IN (${runs}) AND status <> 'shared'
ORDER BY run_id, iter, stage
