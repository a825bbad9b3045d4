-- The ablation's fingerprint (benches/ablation.sh writes it to `docs/src/ablation/<env>/fingerprint.csv`;
-- the test `ablation_tables_are_current` recomputes it): what iteration 0 of the full-loop run of
-- seed 0 (`abl-rmadapt-s0`) computed — the warm start's demonstrations, the rollout, the RM's
-- verdicts, the advantages, both updates, the adaptation and the evaluation — as counts and sums
-- rounded to 6 decimals. A change to the code that moves the ablation tables (sample order,
-- kernels, masks, formulas) moves these numbers in the first iteration, so the test fails and
-- says to re-run the ablation, instead of the README's tables going silently stale.
WITH r AS (SELECT 'abl-rmadapt-s0' AS run_id, CAST(0 AS INT) AS iter)
SELECT 'demonstrations' AS part, CAST(COUNT(*) AS DOUBLE) AS value
FROM demonstrations d JOIN r ON d.run_id = r.run_id
UNION ALL
SELECT 'trajectories.successes', CAST(SUM(CASE WHEN t.outcome > 0 THEN 1 ELSE 0 END) AS DOUBLE)
FROM trajectories t JOIN r ON t.run_id = r.run_id AND t.iter = r.iter
UNION ALL
SELECT 'steps', CAST(COUNT(*) AS DOUBLE)
FROM steps s JOIN r ON s.run_id = r.run_id AND s.iter = r.iter
UNION ALL
SELECT 'rm_samples.good', CAST(SUM(CASE WHEN m.score > 0 THEN 1 ELSE 0 END) AS DOUBLE)
FROM rm_samples m JOIN r ON m.run_id = r.run_id AND m.iter = r.iter
UNION ALL
SELECT 'policy_advantages.abs_sum', round(SUM(ABS(a.advantage)), 6) + 0.0
FROM policy_advantages a JOIN r ON a.run_id = r.run_id AND a.iter = r.iter
UNION ALL
SELECT 'rm_advantages.abs_sum', round(SUM(ABS(a.advantage)), 6) + 0.0
FROM rm_advantages a JOIN r ON a.run_id = r.run_id AND a.iter = r.iter
UNION ALL
SELECT 'rm_advantages.included', CAST(SUM(CASE WHEN a.included THEN 1 ELSE 0 END) AS DOUBLE)
FROM rm_advantages a JOIN r ON a.run_id = r.run_id AND a.iter = r.iter
UNION ALL
SELECT concat('update.', u.model, '.loss'), round(SUM(u.loss), 6) + 0.0
FROM update_metrics u JOIN r ON u.run_id = r.run_id AND u.iter = r.iter
GROUP BY u.model
UNION ALL
SELECT concat('adaptations.', a.decision), CAST(COUNT(*) AS DOUBLE)
FROM adaptations a JOIN r ON a.run_id = r.run_id AND a.iter = r.iter
GROUP BY a.decision
UNION ALL
SELECT concat('evaluations.', e.split), CAST(SUM(e.successes) AS DOUBLE)
FROM evaluations e JOIN r ON e.run_id = r.run_id AND e.iter = r.iter
GROUP BY e.split
ORDER BY part
