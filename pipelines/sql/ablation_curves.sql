-- Per setting and iteration (benches/ablation.sh): held-out success (mean over seeds) and the
-- RM's process accuracy (mean over seeds), for the learning curves, up to the last iteration
-- every run reached (as the table).
WITH reached AS (
    SELECT MIN(last) AS last
    FROM (SELECT run_id, MAX(iter) AS last FROM stage_runs
          WHERE run_id LIKE 'abl-%' AND stage = 'evaluate' GROUP BY run_id) r
),
ev AS (
    SELECT run_id, iter,
           CAST(SUM(successes) AS DOUBLE) / CAST(SUM(rollouts) AS DOUBLE) AS held_out
    FROM evaluations
    WHERE split = 'held_out' AND run_id LIKE 'abl-%' AND iter <= (SELECT last FROM reached)
    GROUP BY run_id, iter
),
rm AS (
    SELECT run_id, iter,
           SUM(rm_process_acc * CAST(judged_steps AS DOUBLE)) / CAST(NULLIF(SUM(judged_steps), 0) AS DOUBLE) AS rm_process
    FROM task_accuracy
    WHERE run_id LIKE 'abl-%'
    GROUP BY run_id, iter
)
SELECT split_part(ev.run_id, '-', 2) AS setting, ev.iter,
       round(AVG(ev.held_out), 3) AS held_out,
       round(AVG(rm.rm_process), 3) AS rm_process
FROM ev
LEFT JOIN rm ON rm.run_id = ev.run_id AND rm.iter = ev.iter
GROUP BY split_part(ev.run_id, '-', 2), ev.iter
ORDER BY MIN(CASE split_part(ev.run_id, '-', 2) WHEN 'policy' THEN 0 WHEN 'rm' THEN 1 ELSE 2 END), ev.iter
