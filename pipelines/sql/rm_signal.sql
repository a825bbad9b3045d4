-- What the reward model's update teaches it, per iteration: its included samples (the
-- consistency reward's non-zero advantages, `rm_advantages.included`) split by the outcome of
-- their trajectory; the verdict each sample's update reinforces (a positive advantage
-- reinforces the sample's own verdict, a negative one the other verdict) — the share of
-- included samples that push the RM towards "good", the same share weighted by |advantage|
-- (what the update's loss sees; with `reward.rm_balance = "outcome"` won and lost trajectories
-- weigh the same), and the share whose reinforced verdict
-- agrees with the environment's step oracle (`steps.oracle_progress`; NULL where the env has
-- none); and the won and lost trajectories' mean length. With m samples per step the
-- consistency reward standardizes within a step, so a mixed step of a won trajectory pushes
-- "good" and one of a lost trajectory pushes "bad": the outcome, not the step, is the target,
-- and lost trajectories, being longer, contribute more steps. A process accuracy that falls
-- while the policy improves shows here first (push_good well under the won share of steps).
-- rla-pipe sql --run RUN --file pipelines/sql/rm_signal.sql
WITH samples AS (
    SELECT a.run_id, a.iter, t.outcome,
           -- the verdict the update makes more likely: the sample's own if its advantage is
           -- positive, the opposite one if negative (unparsable samples push no verdict)
           CASE WHEN a.score = 0 THEN NULL
                WHEN a.advantage > 0 THEN CAST(a.score AS INT)
                ELSE -CAST(a.score AS INT) END AS pushed,
           abs(a.advantage) AS weight,
           s.oracle_progress
    FROM rm_advantages a
    JOIN trajectories t ON a.run_id = t.run_id AND a.iter = t.iter AND a.traj_id = t.traj_id
    JOIN steps s ON a.run_id = s.run_id AND a.iter = s.iter AND a.traj_id = s.traj_id
                AND a.step_idx = s.step_idx
    WHERE a.included
), pushed AS (
    SELECT run_id, iter,
           count(*) AS samples,
           sum(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS from_won,
           sum(CASE WHEN outcome < 0 THEN 1 ELSE 0 END) AS from_lost,
           avg(CASE WHEN pushed = 1 THEN 1.0 WHEN pushed = -1 THEN 0.0 END) AS push_good,
           sum(CASE WHEN pushed = 1 THEN weight ELSE 0.0 END)
               / sum(CASE WHEN pushed IS NOT NULL THEN weight END) AS push_good_weighted,
           avg(CASE WHEN pushed IS NULL OR oracle_progress IS NULL THEN NULL
                    WHEN pushed = oracle_progress THEN 1.0 ELSE 0.0 END) AS push_agrees_oracle
    FROM samples GROUP BY run_id, iter
), lengths AS (
    SELECT run_id, iter,
           avg(CASE WHEN outcome > 0 THEN CAST(num_steps AS DOUBLE) END) AS won_steps,
           avg(CASE WHEN outcome < 0 THEN CAST(num_steps AS DOUBLE) END) AS lost_steps,
           avg(CASE WHEN outcome > 0 THEN 1.0 ELSE 0.0 END) AS won_share
    FROM trajectories GROUP BY run_id, iter
)
SELECT l.run_id, l.iter, p.samples, p.from_won, p.from_lost,
       round(p.push_good, 3) AS push_good,
       round(p.push_good_weighted, 3) AS push_good_weighted,
       round(p.push_agrees_oracle, 3) AS push_agrees_oracle,
       round(l.won_share, 3) AS won_share,
       round(l.won_steps, 2) AS won_steps,
       round(l.lost_steps, 2) AS lost_steps
FROM lengths l LEFT JOIN pushed p ON l.run_id = p.run_id AND l.iter = p.iter
ORDER BY l.run_id, l.iter
