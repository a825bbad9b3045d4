-- Whether a policy learned a loop, and who paid for it: per (run, iteration), the share of
-- sampled steps that repeat the action of two steps before but not the previous one (A, B, A:
-- going back and forth, putting an object back and taking it again), and on those repeats and
-- on the other steps, how often the step oracle calls the step progress and the reward
-- model's mean verdict (-1..+1; NULL without an RM). A repeat share that grows while the RM
-- rates repeats as well as other steps and the oracle does not: the RM's step rewards pay for
-- the loop (docs/src/ablation.md, "The grid, started").
-- rla-pipe sql --run RUN --file pipelines/sql/step_loops.sql
WITH s AS (
    SELECT run_id, iter, traj_id, step_idx, action, oracle_progress,
           lag(action, 1) OVER (PARTITION BY run_id, iter, traj_id ORDER BY step_idx) AS p1,
           lag(action, 2) OVER (PARTITION BY run_id, iter, traj_id ORDER BY step_idx) AS p2
    FROM steps
), flagged AS (
    SELECT run_id, iter, traj_id, step_idx, oracle_progress,
           CASE WHEN action = p2 AND action <> p1 THEN 1.0 ELSE 0.0 END AS repeat
    FROM s
), verdicts AS (
    SELECT run_id, iter, traj_id, step_idx, avg(score) AS verdict
    FROM rm_samples GROUP BY run_id, iter, traj_id, step_idx
)
SELECT f.run_id, f.iter,
       count(*) AS steps,
       round(avg(f.repeat), 3) AS repeat_share,
       round(avg(CASE WHEN f.repeat = 1 THEN CAST(f.oracle_progress AS DOUBLE) END), 3) AS oracle_progress_repeats,
       round(avg(CASE WHEN f.repeat = 0 THEN CAST(f.oracle_progress AS DOUBLE) END), 3) AS oracle_progress_others,
       round(avg(CASE WHEN f.repeat = 1 THEN v.verdict END), 3) AS rm_verdict_repeats,
       round(avg(CASE WHEN f.repeat = 0 THEN v.verdict END), 3) AS rm_verdict_others
FROM flagged f
LEFT JOIN verdicts v
  ON v.run_id = f.run_id AND v.iter = f.iter AND v.traj_id = f.traj_id AND v.step_idx = f.step_idx
GROUP BY f.run_id, f.iter
ORDER BY f.run_id, f.iter
