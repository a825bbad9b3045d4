-- The ablation table (benches/ablation.sh): one row per setting over its seeds, at each run's
-- last committed iteration. Runs are named abl-<setting>-s<seed>: setting `policy` (outcome
-- reward, static tasks), `rm` (+ reward model), `rmadapt` (+ reward model + adaptation).
-- Held-out / OOD: greedy success after the last update (mean ± sample std over seeds, and the
-- range), and held-out averaged over all iterations; RM process accuracy of the last iteration; accepted tasks over the run; wall time of
-- the whole run (sum of its stage times).
WITH runs AS (
    SELECT run_id, split_part(run_id, '-', 2) AS setting, MAX(iter) AS last
    FROM tasks
    WHERE run_id LIKE 'abl-%'
    GROUP BY run_id
),
ev AS (
    SELECT e.run_id,
           CAST(SUM(CASE WHEN e.split = 'held_out' THEN e.successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN e.split = 'held_out' THEN e.rollouts END) AS DOUBLE) AS held_out,
           CAST(SUM(CASE WHEN e.split = 'ood' THEN e.successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN e.split = 'ood' THEN e.rollouts END) AS DOUBLE) AS ood
    FROM evaluations e
    JOIN runs r ON r.run_id = e.run_id AND e.iter = r.last
    GROUP BY e.run_id
),
curve AS (
    -- Held-out success averaged over every iteration of the run (the area under its learning
    -- curve: less noisy than the last iteration alone).
    SELECT run_id, AVG(held_out) AS held_out_curve
    FROM (
        SELECT run_id, iter,
               CAST(SUM(successes) AS DOUBLE) / CAST(SUM(rollouts) AS DOUBLE) AS held_out
        FROM evaluations
        WHERE split = 'held_out' AND run_id LIKE 'abl-%'
        GROUP BY run_id, iter
    ) per_iter
    GROUP BY run_id
),
rm AS (
    SELECT ta.run_id,
           SUM(ta.rm_process_acc * CAST(ta.judged_steps AS DOUBLE)) / CAST(SUM(ta.judged_steps) AS DOUBLE) AS rm_process
    FROM task_accuracy ta
    JOIN runs r ON r.run_id = ta.run_id AND ta.iter = r.last
    WHERE ta.judged_steps > 0
    GROUP BY ta.run_id
),
accepted AS (
    SELECT run_id, SUM(CASE WHEN decision = 'accepted' THEN 1 ELSE 0 END) AS accepted
    FROM adaptations
    GROUP BY run_id
),
wall AS (
    SELECT run_id, SUM(seconds) AS seconds FROM stage_runs GROUP BY run_id
),
per_run AS (
    SELECT r.setting, r.run_id, r.last, ev.held_out, ev.ood, c.held_out_curve, rm.rm_process,
           COALESCE(a.accepted, 0) AS accepted, w.seconds
    FROM runs r
    LEFT JOIN ev ON ev.run_id = r.run_id
    LEFT JOIN curve c ON c.run_id = r.run_id
    LEFT JOIN rm ON rm.run_id = r.run_id
    LEFT JOIN accepted a ON a.run_id = r.run_id
    LEFT JOIN wall w ON w.run_id = r.run_id
)
SELECT CASE setting WHEN 'policy' THEN 'policy only' WHEN 'rm' THEN '+ reward model'
                    WHEN 'rmadapt' THEN '+ reward model + adaptation' ELSE setting END AS setting,
       COUNT(*) AS seeds,
       MIN(last) + 1 AS iterations,
       round(AVG(held_out), 3) AS held_out_mean,
       round(stddev(held_out), 3) AS held_out_std,
       concat(CAST(round(MIN(held_out), 3) AS VARCHAR), '–', CAST(round(MAX(held_out), 3) AS VARCHAR)) AS held_out_range,
       round(AVG(held_out_curve), 3) AS held_out_all_iters,
       round(AVG(ood), 3) AS ood_mean,
       round(stddev(ood), 3) AS ood_std,
       round(AVG(rm_process), 3) AS rm_process_acc,
       round(AVG(CAST(accepted AS DOUBLE)), 1) AS accepted_tasks,
       round(AVG(seconds), 0) AS wall_seconds
FROM per_run
GROUP BY per_run.setting
ORDER BY MIN(CASE per_run.setting WHEN 'policy' THEN 0 WHEN 'rm' THEN 1 WHEN 'rmadapt' THEN 2 ELSE 3 END)
