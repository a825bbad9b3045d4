-- PPO per iteration and model: mean loss, KL (k3, vs the pre-update snapshot), clip fraction
-- and gradient norm (before clipping) over the iteration's optimizer steps.
SELECT run_id, iter, model,
       AVG(loss) AS loss, AVG(kl) AS kl, AVG(clip_frac) AS clip_frac, AVG(grad_norm) AS grad_norm
FROM update_metrics
WHERE run_id IN (${runs})
GROUP BY run_id, iter, model
ORDER BY run_id, model, iter
