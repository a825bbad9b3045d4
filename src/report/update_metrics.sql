-- PPO per iteration and model: mean loss, KL (k3, vs the pre-update snapshot) and clip
-- fraction over the iteration's optimizer steps.
SELECT run_id, iter, model,
       AVG(loss) AS loss, AVG(kl) AS kl, AVG(clip_frac) AS clip_frac
FROM update_metrics
WHERE run_id IN (${runs})
GROUP BY run_id, iter, model
ORDER BY run_id, model, iter
