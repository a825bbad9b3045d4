-- One row per run: its iterations, the held-out and OOD success of its last iteration and the
-- best of any, the reward model's process accuracy in its last iteration, the tasks accepted
-- by adaptation, and the wall time of its own stages (`${own}`: a branch's shared iterations
-- are its parent's).
WITH success AS (${success}),
rm AS (${rm}),
adaptation AS (${adaptation}),
last AS (
    SELECT run_id, MAX(iter) AS iter, COUNT(*) AS iterations,
           MAX(held_out) AS best_held_out, MAX(ood) AS best_ood
    FROM success
    GROUP BY run_id
),
accepted AS (
    SELECT run_id, CAST(SUM(accepted) AS BIGINT) AS accepted FROM adaptation GROUP BY run_id
),
wall AS (
    SELECT run_id, SUM(seconds) AS wall_seconds
    FROM stage_runs
    WHERE run_id IN (${runs}) AND ${own}
    GROUP BY run_id
)
SELECT l.run_id, l.iterations, s.held_out AS last_held_out, l.best_held_out,
       s.ood AS last_ood, l.best_ood, r.process AS last_rm_process, a.accepted,
       w.wall_seconds
FROM last l
JOIN success s ON s.run_id = l.run_id AND s.iter = l.iter
LEFT JOIN rm r ON r.run_id = l.run_id AND r.iter = l.iter
LEFT JOIN accepted a ON a.run_id = l.run_id
LEFT JOIN wall w ON w.run_id = l.run_id
ORDER BY l.run_id
