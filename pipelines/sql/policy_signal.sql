-- Who sets the sign of what the policy update trains on, and whether that sign teaches
-- progress, per iteration. The update's samples are the policy advantages it uses (`included`,
-- non-zero). A sample's sign is the reward model's when its group (task, step) holds more than
-- one trajectory and all of them won or all lost (the outcome alone standardizes to 0: only the
-- verdicts move it), or when it goes against its own trajectory's outcome; otherwise the
-- outcome set it. For each kind, the share whose sign agrees with the environment's step
-- oracle (`steps.oracle_progress`: a positive advantage on a progress step, a negative one on
-- any other; NULL where the environment has no oracle), beside the share of progress steps
-- among the samples (what always-positive signs would score). A reward model that judges steps
-- gives signs that agree more often than the outcome's; a blind one gives a coin. Without a
-- reward model every sign is the outcome's (`rm_*` NULL).
-- rla-pipe sql --run RUN --file pipelines/sql/policy_signal.sql
WITH samples AS (
    SELECT p.run_id, p.iter, p.included, p.advantage, t.outcome, s.oracle_progress,
           count(*) OVER w AS group_size,
           sum(CASE WHEN t.outcome > 0 THEN 1 ELSE 0 END) OVER w AS group_won
    FROM policy_advantages p
    JOIN trajectories t ON p.run_id = t.run_id AND p.iter = t.iter AND p.traj_id = t.traj_id
    JOIN steps s ON p.run_id = s.run_id AND p.iter = s.iter AND p.traj_id = s.traj_id
                AND p.step_idx = s.step_idx
    WINDOW w AS (PARTITION BY p.run_id, p.iter, p.task_id, p.step_idx)
), used AS (
    SELECT run_id, iter, oracle_progress, advantage > 0 AS up,
           group_size > 1 AND (group_won = 0 OR group_won = group_size) AS pure,
           (advantage > 0) <> (outcome > 0) AS against
    FROM samples
    WHERE included AND advantage <> 0
)
SELECT run_id, iter,
       count(*) AS samples,
       sum(CASE WHEN pure OR against THEN 1 ELSE 0 END) AS rm_signs,
       round(avg(CASE WHEN pure THEN 1.0 ELSE 0.0 END), 3) AS rm_pure_share,
       round(avg(CASE WHEN against AND NOT pure THEN 1.0 ELSE 0.0 END), 3) AS rm_against_share,
       round(avg(CASE WHEN (pure OR against) AND oracle_progress IS NOT NULL
                      THEN CASE WHEN up = (oracle_progress > 0) THEN 1.0 ELSE 0.0 END END), 3)
           AS rm_signs_agree_oracle,
       round(avg(CASE WHEN NOT (pure OR against) AND oracle_progress IS NOT NULL
                      THEN CASE WHEN up = (oracle_progress > 0) THEN 1.0 ELSE 0.0 END END), 3)
           AS outcome_signs_agree_oracle,
       round(avg(CASE WHEN oracle_progress IS NULL THEN NULL
                      WHEN oracle_progress > 0 THEN 1.0 ELSE 0.0 END), 3) AS progress_share
FROM used
GROUP BY run_id, iter
ORDER BY run_id, iter
