-- Success per iteration: training (mean acc of the active tasks' sampled rollouts), held-out
-- and out-of-distribution (the evaluation rollouts after the update: eval.rollouts sampled at
-- eval.temperature, or one greedy rollout with eval.mode = "greedy"; NULL where a run has no
-- such set); with eval.mode = "both", also the greedy rollouts' (held_out_greedy, ood_greedy).
WITH train AS (
    SELECT ta.run_id, ta.iter, AVG(ta.acc) AS train
    FROM task_accuracy ta
    JOIN tasks t ON t.run_id = ta.run_id AND t.iter = ta.iter AND t.task_id = ta.task_id
    WHERE t.status = 'active' AND ta.run_id IN (${runs})
    GROUP BY ta.run_id, ta.iter
),
evals AS (
    SELECT run_id, iter,
           CAST(SUM(CASE WHEN split = 'held_out' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'held_out' THEN rollouts END) AS DOUBLE) AS held_out,
           CAST(SUM(CASE WHEN split = 'ood' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'ood' THEN rollouts END) AS DOUBLE) AS ood,
           CAST(SUM(CASE WHEN split = 'held_out_greedy' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'held_out_greedy' THEN rollouts END) AS DOUBLE) AS held_out_greedy,
           CAST(SUM(CASE WHEN split = 'ood_greedy' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'ood_greedy' THEN rollouts END) AS DOUBLE) AS ood_greedy
    FROM evaluations
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
)
SELECT t.run_id, t.iter, t.train, e.held_out, e.ood, e.held_out_greedy, e.ood_greedy
FROM train t
LEFT JOIN evals e ON e.run_id = t.run_id AND e.iter = t.iter
ORDER BY t.run_id, t.iter
