-- How the evaluated policy plays, episode by episode (the `eval_steps` table): per (run,
-- iteration, split), the episodes and how many were won, their mean length, and the share of
-- steps that repeat the action of two steps before but not the previous one (A, B, A: the loop
-- of step_loops.sql) in won and in lost episodes; `lost_in_loop` counts the lost episodes of
-- which at least a third of the steps are such repeats. A greedy split that drops to zero
-- while its lost episodes loop: the most likely action went back and forth until the budget
-- ran out (docs/src/ablation.md, "The grid, started").
-- rla-pipe sql --run RUN --file pipelines/sql/eval_loops.sql
WITH s AS (
    SELECT run_id, iter, split, task_id, rollout_idx, step_idx, outcome, action,
           lag(action, 1) OVER (PARTITION BY run_id, iter, split, task_id, rollout_idx ORDER BY step_idx) AS p1,
           lag(action, 2) OVER (PARTITION BY run_id, iter, split, task_id, rollout_idx ORDER BY step_idx) AS p2
    FROM eval_steps
), episodes AS (
    SELECT run_id, iter, split, task_id, rollout_idx,
           max(outcome) AS outcome,
           count(*) AS steps,
           avg(CASE WHEN action = p2 AND action <> p1 THEN 1.0 ELSE 0.0 END) AS repeat_share
    FROM s
    GROUP BY run_id, iter, split, task_id, rollout_idx
)
SELECT run_id, iter, split,
       count(*) AS episodes,
       sum(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS won,
       round(avg(CAST(steps AS DOUBLE)), 2) AS mean_steps,
       round(avg(CASE WHEN outcome > 0 THEN repeat_share END), 3) AS repeat_share_won,
       round(avg(CASE WHEN outcome <= 0 THEN repeat_share END), 3) AS repeat_share_lost,
       sum(CASE WHEN outcome <= 0 AND repeat_share >= 1.0 / 3 THEN 1 ELSE 0 END) AS lost_in_loop
FROM episodes
GROUP BY run_id, iter, split
ORDER BY run_id, iter, split
