-- The ablation (benches/ablation.sh): one row per run, at the last iteration every run
-- reached. Runs are named abl-<setting>-s<seed>: setting `policy` (outcome
-- reward, static tasks), `rm` (+ reward model), `rmadapt` (+ reward model + adaptation).
-- Held-out / OOD: success after the last update (eval.mode: 3 sampled rollouts per task at
-- T = 0.8 by default; mean ± sample std over seeds, and the range), and held-out averaged over
-- all iterations; RM process accuracy (first and last iteration) and balanced outcome accuracy
-- (last iteration: the mean of the sign-of-summed-verdicts hit rates on successes and on
-- failures, 0.5 = chance); accepted tasks over the run, the slope of their linear fit per
-- iteration and the share of harder rewrites among them; wall time of the whole run (sum of its
-- stage times).
WITH reached AS (
    SELECT run_id, MAX(iter) AS last
    FROM stage_runs
    WHERE run_id LIKE 'abl-%' AND stage = 'evaluate'
    GROUP BY run_id
),
-- Every run is compared at the last iteration ALL runs reached (a run extended further, or one
-- interrupted, does not skew the comparison); later iterations are ignored.
runs AS (
    SELECT run_id, split_part(run_id, '-', 2) AS setting,
           (SELECT MIN(last) FROM reached) AS last
    FROM reached
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
    WHERE iter <= (SELECT MIN(last) FROM reached)
    GROUP BY run_id
),
rm_iter AS (
    SELECT ta.run_id, ta.iter,
           SUM(ta.rm_process_acc * CAST(ta.judged_steps AS DOUBLE)) / CAST(SUM(ta.judged_steps) AS DOUBLE) AS rm_process
    FROM task_accuracy ta
    WHERE ta.judged_steps > 0 AND ta.run_id LIKE 'abl-%'
    GROUP BY ta.run_id, ta.iter
),
rm AS (
    SELECT r.run_id,
           MAX(CASE WHEN i.iter = 0 THEN i.rm_process END) AS rm_process_first,
           MAX(CASE WHEN i.iter = r.last THEN i.rm_process END) AS rm_process
    FROM runs r
    JOIN rm_iter i ON i.run_id = r.run_id
    GROUP BY r.run_id
),
votes AS (
    SELECT s.run_id, s.traj_id,
           SUM(CAST(s.rm_pos AS BIGINT) - CAST(s.rm_neg AS BIGINT)) AS vote,
           SUM(s.rm_count) AS samples
    FROM step_rewards s
    JOIN runs r ON r.run_id = s.run_id AND s.iter = r.last
    GROUP BY s.run_id, s.traj_id
),
recall AS (
    SELECT t.run_id, t.outcome,
           AVG(CASE WHEN signum(CAST(v.vote AS DOUBLE)) = CAST(t.outcome AS DOUBLE) THEN 1.0 ELSE 0.0 END) AS hit
    FROM trajectories t
    JOIN runs r ON r.run_id = t.run_id AND t.iter = r.last
    JOIN votes v ON v.run_id = t.run_id AND v.traj_id = t.traj_id
    WHERE v.samples > 0
    GROUP BY t.run_id, t.outcome
),
balanced AS (
    SELECT run_id, AVG(hit) AS rm_balanced_outcome FROM recall GROUP BY run_id
),
accepted AS (
    SELECT run_id,
           SUM(CASE WHEN decision = 'accepted' THEN 1 ELSE 0 END) AS accepted,
           SUM(CASE WHEN decision = 'accepted' AND direction = 'harder' THEN 1 ELSE 0 END) AS harder
    FROM adaptations
    WHERE iter <= (SELECT MIN(last) FROM reached)
    GROUP BY run_id
),
growth AS (
    SELECT t.run_id, t.iter,
           SUM(COALESCE(a.n, 0)) OVER (PARTITION BY t.run_id ORDER BY t.iter) AS cumulative
    FROM (SELECT DISTINCT run_id, iter FROM tasks
          WHERE run_id LIKE 'abl-%' AND iter <= (SELECT MIN(last) FROM reached)) t
    LEFT JOIN (
        SELECT run_id, iter, COUNT(*) AS n FROM adaptations WHERE decision = 'accepted' GROUP BY run_id, iter
    ) a ON a.run_id = t.run_id AND a.iter = t.iter
),
fit AS (
    SELECT run_id, regr_slope(CAST(cumulative AS DOUBLE), CAST(iter AS DOUBLE)) AS slope,
           regr_r2(CAST(cumulative AS DOUBLE), CAST(iter AS DOUBLE)) AS r2
    FROM growth
    GROUP BY run_id
),
wall AS (
    SELECT run_id, SUM(seconds) AS seconds
    FROM stage_runs
    WHERE iter <= (SELECT MIN(last) FROM reached)
    GROUP BY run_id
),
per_run AS (
    SELECT r.setting, r.run_id, r.last, ev.held_out, ev.ood, c.held_out_curve, rm.rm_process,
           rm.rm_process_first, b.rm_balanced_outcome,
           COALESCE(a.accepted, 0) AS accepted, a.harder, fit.slope, fit.r2, w.seconds
    FROM runs r
    LEFT JOIN ev ON ev.run_id = r.run_id
    LEFT JOIN curve c ON c.run_id = r.run_id
    LEFT JOIN rm ON rm.run_id = r.run_id
    LEFT JOIN balanced b ON b.run_id = r.run_id
    LEFT JOIN accepted a ON a.run_id = r.run_id
    LEFT JOIN fit ON fit.run_id = r.run_id
    LEFT JOIN wall w ON w.run_id = r.run_id
)
-- One row per run: benches/ablation.py aggregates them per setting (mean, sample std, bootstrap
-- 95% intervals) and pairs the settings per seed.
SELECT setting, CAST(split_part(run_id, '-s', 2) AS BIGINT) AS seed, run_id, last + 1 AS iterations,
       held_out, ood, held_out_curve, rm_process_first, rm_process, rm_balanced_outcome,
       accepted, harder, slope, r2, seconds
FROM per_run
ORDER BY CASE setting WHEN 'policy' THEN 0 WHEN 'rm' THEN 1 WHEN 'rmadapt' THEN 2 ELSE 3 END, seed
