-- What task adaptation does to the policy's update, per run (iterations from 1 on; iteration 0
-- has no candidate yet): the tasks rolled out per iteration (the sampled slots plus every
-- pending candidate), the training rollouts' success, the policy samples that passed the
-- filters (`included`) and the share of them from candidates being judged, how often the
-- update used each included sample (its optimizer steps' samples / included samples: with
-- `update.schedule = "fixed"` the update takes a fixed number, so more included samples means
-- each is used less), the policy's KL to its pre-update snapshot, and the judge's verdicts:
-- candidates judged, accepted, and accepted on the evidence of a single won rollout.
-- Compare a full loop with its branch without adaptation (`--set adapt.enabled=false`), e.g.
-- rla-pipe sql --store docs/src/ablation/household-smollm2/kept --file pipelines/sql/adapt_signal.sql
WITH rolled AS (
    SELECT t.run_id, t.iter, t.status, a.rollouts, a.successes
    FROM tasks t
    JOIN task_accuracy a ON a.run_id = t.run_id AND a.iter = t.iter AND a.task_id = t.task_id
    WHERE COALESCE(t.rolled_out, true) AND t.iter >= 1
), per_run AS (
    SELECT run_id, count(*) * 1.0 / count(DISTINCT iter) AS tasks_per_iter,
           sum(successes) * 1.0 / sum(rollouts) AS train_success
    FROM rolled GROUP BY run_id
), included AS (
    SELECT p.run_id, p.iter,
           sum(CASE WHEN p.included THEN 1 ELSE 0 END) AS samples,
           sum(CASE WHEN p.included AND t.status = 'pending' THEN 1 ELSE 0 END) AS from_candidates
    FROM policy_advantages p
    JOIN tasks t ON t.run_id = p.run_id AND t.iter = p.iter AND t.task_id = p.task_id
    WHERE p.iter >= 1 GROUP BY p.run_id, p.iter
), updates AS (
    SELECT run_id, iter, sum(samples) AS used, avg(kl) AS kl
    FROM update_metrics WHERE model = 'policy' AND iter >= 1 GROUP BY run_id, iter
), signal AS (
    SELECT i.run_id, avg(i.samples) AS included_per_iter,
           sum(i.from_candidates) * 1.0 / sum(i.samples) AS from_candidates,
           avg(CAST(u.used AS DOUBLE) / i.samples) AS uses_per_sample,
           avg(u.kl) AS policy_kl
    FROM included i JOIN updates u ON u.run_id = i.run_id AND u.iter = i.iter
    WHERE i.samples > 0
    GROUP BY i.run_id
), judged AS (
    SELECT j.run_id, count(*) AS judged,
           sum(CASE WHEN j.decision = 'accepted' THEN 1 ELSE 0 END) AS accepted,
           sum(CASE WHEN j.decision = 'accepted' AND a.successes = 1 THEN 1 ELSE 0 END)
             AS accepted_on_one_win
    FROM judgements j
    JOIN task_accuracy a ON a.run_id = j.run_id AND a.iter = j.iter AND a.task_id = j.task_id
    GROUP BY j.run_id
)
SELECT r.run_id, round(r.tasks_per_iter, 2) AS tasks_per_iter,
       round(r.train_success, 3) AS train_success,
       round(s.included_per_iter, 1) AS included_per_iter,
       round(s.from_candidates, 3) AS from_candidates,
       round(s.uses_per_sample, 2) AS uses_per_sample, round(s.policy_kl, 4) AS policy_kl,
       COALESCE(j.judged, 0) AS judged, COALESCE(j.accepted, 0) AS accepted,
       COALESCE(j.accepted_on_one_win, 0) AS accepted_on_one_win
FROM per_run r
JOIN signal s ON s.run_id = r.run_id
LEFT JOIN judged j ON j.run_id = r.run_id
ORDER BY r.run_id
