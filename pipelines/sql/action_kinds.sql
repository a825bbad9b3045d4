-- What the update pushes up and down, by kind of action: per (run, iteration, verb — the
-- action's first word: go, take, put, open in household and TextWorld; click, type in web) and
-- the step oracle's verdict on the step (+1 progress, -1 none, NULL without an oracle): how
-- often the policy took such actions in its rollouts (their share of the iteration's steps),
-- their mean log-probability under the acting policy (falling over the iterations: the policy
-- is unlearning them), and the advantages the update trains them with (rows it trains on, and
-- the advantages' sum over them: negative pushes the verb down). A verb whose wrong uses
-- (oracle -1) carry far more negative advantage than its right uses carry positive is unlearned
-- as a whole by a model that cannot tell the two apart (docs/src/ablation.md, "The grid,
-- started": the policy stops putting objects down).
-- rla-pipe sql --run RUN --file pipelines/sql/action_kinds.sql
SELECT s.run_id, s.iter,
       split_part(s.action, ' ', 1) AS verb,
       s.oracle_progress AS oracle,
       count(*) AS steps,
       round(CAST(count(*) AS DOUBLE) / CAST(sum(count(*)) OVER (PARTITION BY s.run_id, s.iter) AS DOUBLE), 3) AS share,
       round(avg(s.action_logprob), 3) AS mean_logprob,
       sum(CASE WHEN a.included THEN 1 ELSE 0 END) AS trained,
       round(sum(CASE WHEN a.included THEN a.advantage ELSE 0.0 END), 3) AS advantage_sum
FROM steps s
LEFT JOIN policy_advantages a
  ON a.run_id = s.run_id AND a.iter = s.iter AND a.traj_id = s.traj_id AND a.step_idx = s.step_idx
GROUP BY s.run_id, s.iter, split_part(s.action, ' ', 1), s.oracle_progress
ORDER BY s.run_id, s.iter, verb, oracle
