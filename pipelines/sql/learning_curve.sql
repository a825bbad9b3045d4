-- The learning curve (benches/ablation.sh; runs `pre-s<seed>`: the warm start alone, one
-- iteration whose update takes no step; `abl-<setting>-s<seed>`: the loop): one row per run and
-- iteration with held-out and OOD success, sampled (splits `held_out`, `ood`) and greedy
-- (`held_out_greedy`, `ood_greedy`: runs with eval.mode = "both"; NULL otherwise), and the
-- reward model's process accuracy. benches/learning_curve.py turns it into the curves with
-- their intervals over seeds and the RL gain (last iteration minus the warm start, per seed).
WITH ev AS (
    SELECT run_id, iter,
           CAST(SUM(CASE WHEN split = 'held_out' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'held_out' THEN rollouts END) AS DOUBLE) AS held_out,
           CAST(SUM(CASE WHEN split = 'held_out_greedy' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'held_out_greedy' THEN rollouts END) AS DOUBLE) AS held_out_greedy,
           CAST(SUM(CASE WHEN split = 'ood' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'ood' THEN rollouts END) AS DOUBLE) AS ood,
           CAST(SUM(CASE WHEN split = 'ood_greedy' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'ood_greedy' THEN rollouts END) AS DOUBLE) AS ood_greedy
    FROM evaluations
    WHERE run_id LIKE 'pre-s%' OR run_id LIKE 'abl-%'
    GROUP BY run_id, iter
),
rm AS (
    SELECT run_id, iter,
           SUM(rm_process_acc * CAST(judged_steps AS DOUBLE))
             / CAST(NULLIF(SUM(judged_steps), 0) AS DOUBLE) AS rm_process
    FROM task_accuracy
    WHERE run_id LIKE 'pre-s%' OR run_id LIKE 'abl-%'
    GROUP BY run_id, iter
)
SELECT CASE WHEN ev.run_id LIKE 'pre-s%' THEN 'warm' ELSE split_part(ev.run_id, '-', 2) END AS setting,
       CAST(split_part(ev.run_id, '-s', 2) AS BIGINT) AS seed,
       ev.run_id, ev.iter, ev.held_out, ev.held_out_greedy, ev.ood, ev.ood_greedy, rm.rm_process
FROM ev
LEFT JOIN rm ON rm.run_id = ev.run_id AND rm.iter = ev.iter
ORDER BY ev.run_id, ev.iter
