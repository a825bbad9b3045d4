-- Where a run's learning signal lives or dies, per iteration: how much of the rollout the
-- policy update can use (steps and tasks the accuracy filter keeps), how strong the signal is
-- (the spread of the advantages it trains on), how far each update moves its model (KL against
-- the pre-update snapshot, clipped share, gradient norm), how often the reward model gives a
-- verdict at all and how often the policy's reply names no admissible action (`generate` mode;
-- 0 in `score` mode), and how much the policy still explores (its entropy over the admissible
-- actions, estimated as the mean -log pi(a|s) of the actions it sampled; `score` mode). Who
-- sets the sign of what the policy trains on, the outcome or the reward model's verdicts, is
-- pipelines/sql/policy_signal.sql. One row per (run, iteration); NULL where a table has no rows
-- for it.
-- rla-pipe sql --run gridnav --file pipelines/sql/learning_signal.sql
WITH acc AS (
    SELECT run_id, iter, count(*) AS tasks, avg(acc) AS mean_task_acc,
           avg(CASE WHEN acc = 0 THEN 1.0 ELSE 0.0 END) AS tasks_never_won,
           avg(CASE WHEN acc = 1 THEN 1.0 ELSE 0.0 END) AS tasks_always_won
    FROM task_accuracy GROUP BY run_id, iter
), adv AS (
    SELECT run_id, iter,
           avg(CASE WHEN included THEN 1.0 ELSE 0.0 END) AS steps_used,
           count(DISTINCT CASE WHEN included THEN task_id END) AS tasks_used,
           stddev_pop(CASE WHEN included THEN advantage END) AS advantage_std,
           avg(CASE WHEN included THEN abs(advantage) END) AS advantage_abs_mean
    FROM policy_advantages GROUP BY run_id, iter
), upd AS (
    SELECT run_id, iter,
           avg(CASE WHEN model = 'policy' THEN kl END) AS policy_kl,
           avg(CASE WHEN model = 'policy' THEN clip_frac END) AS policy_clip_frac,
           avg(CASE WHEN model = 'policy' THEN grad_norm END) AS policy_grad_norm,
           avg(CASE WHEN model = 'rm' THEN kl END) AS rm_kl,
           avg(CASE WHEN model = 'rm' THEN grad_norm END) AS rm_grad_norm
    FROM update_metrics GROUP BY run_id, iter
), rm AS (
    SELECT run_id, iter,
           avg(CASE WHEN score <> 0 THEN 1.0 ELSE 0.0 END) AS rm_verdict_rate,
           avg(CASE WHEN score > 0 THEN 1.0 ELSE 0.0 END) AS rm_good_rate
    FROM rm_samples GROUP BY run_id, iter
), replies AS (
    SELECT run_id, iter,
           avg(CASE WHEN action = '(invalid reply)' THEN 1.0 ELSE 0.0 END) AS reply_error_rate,
           avg(CASE WHEN response IS NULL THEN -action_logprob END) AS policy_entropy
    FROM steps GROUP BY run_id, iter
)
SELECT acc.run_id, acc.iter, acc.tasks, round(acc.mean_task_acc, 3) AS mean_task_acc,
       round(acc.tasks_never_won, 3) AS tasks_never_won,
       round(acc.tasks_always_won, 3) AS tasks_always_won,
       adv.tasks_used, round(adv.steps_used, 3) AS steps_used,
       round(adv.advantage_std, 3) AS advantage_std,
       round(adv.advantage_abs_mean, 3) AS advantage_abs_mean,
       round(upd.policy_kl, 5) AS policy_kl, round(upd.policy_clip_frac, 3) AS policy_clip_frac,
       round(upd.policy_grad_norm, 3) AS policy_grad_norm,
       round(upd.rm_kl, 5) AS rm_kl, round(upd.rm_grad_norm, 3) AS rm_grad_norm,
       round(rm.rm_verdict_rate, 3) AS rm_verdict_rate, round(rm.rm_good_rate, 3) AS rm_good_rate,
       round(replies.reply_error_rate, 3) AS reply_error_rate,
       round(replies.policy_entropy, 3) AS policy_entropy
FROM acc
LEFT JOIN adv ON adv.run_id = acc.run_id AND adv.iter = acc.iter
LEFT JOIN upd ON upd.run_id = acc.run_id AND upd.iter = acc.iter
LEFT JOIN rm ON rm.run_id = acc.run_id AND rm.iter = acc.iter
LEFT JOIN replies ON replies.run_id = acc.run_id AND replies.iter = acc.iter
ORDER BY acc.run_id, acc.iter
