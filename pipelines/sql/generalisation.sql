-- Does what the policy learns on its training games carry over to games it never saw? Per run
-- and iteration: the training rollouts' success on the pool's seed tasks (`parent_task_id IS
-- NULL`: drawn from the same distribution as the held-out set), on the tasks adaptation
-- brought in (accepted rewrites and candidates being judged), and the held-out success of the
-- policy that rolled them out — the evaluation of the iteration before (iteration i's rollouts
-- use the policy updated at i − 1, which `evaluate` measured at i − 1). A seed-task success
-- that climbs while the held-out one stays flat is a policy learning its few training games,
-- not the task family. `gap` = seed tasks − held-out (held-out sampled at `eval.temperature`,
-- which may differ from the rollouts' `policy.temperature`). E.g.
-- rla-pipe sql --store docs/src/ablation/textworld-smollm2-s8/kept --file pipelines/sql/generalisation.sql
WITH rolled AS (
    SELECT t.run_id, t.iter, t.parent_task_id IS NULL AS seed_task, a.rollouts, a.successes
    FROM tasks t
    JOIN task_accuracy a ON a.run_id = t.run_id AND a.iter = t.iter AND a.task_id = t.task_id
    WHERE COALESCE(t.rolled_out, true)
), train AS (
    SELECT run_id, iter,
           CAST(SUM(CASE WHEN seed_task THEN successes END) AS DOUBLE)
             / CAST(NULLIF(SUM(CASE WHEN seed_task THEN rollouts END), 0) AS DOUBLE) AS seed_tasks,
           SUM(CASE WHEN seed_task THEN rollouts ELSE 0 END) AS seed_rollouts,
           CAST(SUM(CASE WHEN NOT seed_task THEN successes END) AS DOUBLE)
             / CAST(NULLIF(SUM(CASE WHEN NOT seed_task THEN rollouts END), 0) AS DOUBLE) AS adapted_tasks,
           SUM(CASE WHEN NOT seed_task THEN rollouts ELSE 0 END) AS adapted_rollouts
    FROM rolled GROUP BY run_id, iter
), held AS (
    SELECT run_id, iter,
           CAST(SUM(successes) AS DOUBLE) / CAST(SUM(rollouts) AS DOUBLE) AS held_out
    FROM evaluations WHERE split = 'held_out' GROUP BY run_id, iter
)
SELECT t.run_id, t.iter,
       round(t.seed_tasks, 3) AS seed_tasks, t.seed_rollouts,
       round(t.adapted_tasks, 3) AS adapted_tasks, t.adapted_rollouts,
       round(h.held_out, 3) AS held_out_before,
       round(t.seed_tasks - h.held_out, 3) AS gap
FROM train t
LEFT JOIN held h ON h.run_id = t.run_id AND h.iter + 1 = t.iter
ORDER BY t.run_id, t.iter
