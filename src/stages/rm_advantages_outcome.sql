-- reward.rm_balance = "outcome" (not in the reference; docs/src/rm-question.md): the included
-- samples of won and of lost trajectories carry equal total weight in the RM's update. Lost
-- trajectories run to the step budget and give the RM more steps to judge, so under the
-- consistency reward — which pays the verdict equal to the outcome at every step — the plain
-- update pushes the RM towards "bad" in proportion (pipelines/sql/rm_signal.sql). Each included
-- sample's advantage is multiplied by N / (2 · N_O): N the included samples of the iteration,
-- N_O those of its trajectory's outcome O; with one outcome only (or none) the weight is 1.
-- Counts are integers, so the weights do not depend on execution order.
outcomes AS (
    SELECT r.*, t.outcome
    FROM standardized r
    JOIN trajectories t ON r.traj_id = t.traj_id
),
counts AS (
    SELECT CAST(SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS DOUBLE) AS n_won,
           CAST(SUM(CASE WHEN outcome < 0 THEN 1 ELSE 0 END) AS DOUBLE) AS n_lost
    FROM outcomes
    WHERE included
)
SELECT o.run_id, o.iter, o.task_id, o.traj_id, o.step_idx, o.sample_idx, o.score,
       o.consistency_reward, o.group_size, o.group_std, o.task_acc,
       CASE WHEN o.included AND c.n_won > 0 AND c.n_lost > 0
            THEN o.advantage * (c.n_won + c.n_lost)
                 / (2.0 * CASE WHEN o.outcome > 0 THEN c.n_won ELSE c.n_lost END)
            ELSE o.advantage END AS advantage,
       o.included
FROM outcomes o
CROSS JOIN counts c
