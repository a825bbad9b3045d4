-- The training signal per iteration: the mean integrated step reward, the spread of the policy
-- advantages (population std over the rows the update trains on, the share of rows it trains
-- on and the share of tasks with any), the reward model's verdict rate (samples with a
-- parsable verdict), the policy's reply-format error rate (`generate` mode: the share of sampled
-- steps whose reply named no admissible action; 0 in `score` mode), the policy's entropy over the
-- admissible actions (the mean -log pi(a|s) of the sampled actions, an unbiased estimate of it;
-- `score` mode only: a `generate` reply's log-probability is a whole token sequence's) and the
-- mean episode length of the sampled rollouts; the share of steps that repeat the action of two
-- steps before but not the previous one (A, B, A: a loop) in the sampled rollouts, in the
-- held-out evaluation episodes sampled and greedy (`eval_steps`; pipelines/sql/step_loops.sql
-- and eval_loops.sql have more); the share of the update's samples whose advantage's sign the
-- reward model's verdicts decide (an outcome-pure group, or against their trajectory's outcome:
-- `rm_signs` of pipelines/sql/policy_signal.sql, which is bound here). NULL where a run has none
-- (pipelines/sql/learning_signal.sql has more).
WITH episodes AS (
    SELECT run_id, iter, AVG(CAST(num_steps AS DOUBLE)) AS episode_length
    FROM trajectories
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
),
rewards AS (
    SELECT run_id, iter, AVG(reward) AS mean_reward
    FROM step_rewards
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
),
advantages AS (
    SELECT run_id, iter,
           STDDEV_POP(CASE WHEN included THEN advantage END) AS advantage_std,
           AVG(CASE WHEN included THEN 1.0 ELSE 0.0 END) AS trained_share,
           CAST(COUNT(DISTINCT CASE WHEN included THEN task_id END) AS DOUBLE)
             / CAST(NULLIF(COUNT(DISTINCT task_id), 0) AS DOUBLE) AS trained_task_share
    FROM policy_advantages
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
),
decided AS (
    SELECT run_id, iter, CAST(rm_signs AS DOUBLE) / CAST(samples AS DOUBLE) AS rm_decided
    FROM (${policy_signal}) s
    WHERE run_id IN (${runs})
),
verdicts AS (
    SELECT run_id, iter, AVG(CASE WHEN score <> 0 THEN 1.0 ELSE 0.0 END) AS rm_verdict_rate
    FROM rm_samples
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
),
rollout_loops AS (
    SELECT run_id, iter, AVG(CASE WHEN action = p2 AND action <> p1 THEN 1.0 ELSE 0.0 END) AS repeat_share
    FROM (
        SELECT run_id, iter, action,
               lag(action, 1) OVER (PARTITION BY run_id, iter, traj_id ORDER BY step_idx) AS p1,
               lag(action, 2) OVER (PARTITION BY run_id, iter, traj_id ORDER BY step_idx) AS p2
        FROM steps
        WHERE run_id IN (${runs})
    ) s
    GROUP BY run_id, iter
),
eval_loops AS (
    SELECT run_id, iter,
           AVG(CASE WHEN split = 'held_out' THEN CASE WHEN action = p2 AND action <> p1 THEN 1.0 ELSE 0.0 END END) AS eval_repeat_share,
           AVG(CASE WHEN split = 'held_out_greedy' THEN CASE WHEN action = p2 AND action <> p1 THEN 1.0 ELSE 0.0 END END) AS greedy_repeat_share
    FROM (
        SELECT run_id, iter, split, action,
               lag(action, 1) OVER (PARTITION BY run_id, iter, split, task_id, rollout_idx ORDER BY step_idx) AS p1,
               lag(action, 2) OVER (PARTITION BY run_id, iter, split, task_id, rollout_idx ORDER BY step_idx) AS p2
        FROM eval_steps
        WHERE run_id IN (${runs})
    ) s
    GROUP BY run_id, iter
),
replies AS (
    SELECT run_id, iter,
           AVG(CASE WHEN action = '(invalid reply)' THEN 1.0 ELSE 0.0 END) AS reply_error_rate,
           AVG(CASE WHEN response IS NULL THEN -action_logprob END) AS policy_entropy
    FROM steps
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
)
SELECT e.run_id, e.iter, r.mean_reward, a.advantage_std, a.trained_share, a.trained_task_share,
       v.rm_verdict_rate, d.rm_decided, p.reply_error_rate, p.policy_entropy, e.episode_length,
       l.repeat_share, el.eval_repeat_share, el.greedy_repeat_share
FROM episodes e
LEFT JOIN rewards r ON r.run_id = e.run_id AND r.iter = e.iter
LEFT JOIN advantages a ON a.run_id = e.run_id AND a.iter = e.iter
LEFT JOIN decided d ON d.run_id = e.run_id AND d.iter = e.iter
LEFT JOIN verdicts v ON v.run_id = e.run_id AND v.iter = e.iter
LEFT JOIN replies p ON p.run_id = e.run_id AND p.iter = e.iter
LEFT JOIN rollout_loops l ON l.run_id = e.run_id AND l.iter = e.iter
LEFT JOIN eval_loops el ON el.run_id = e.run_id AND el.iter = e.iter
ORDER BY e.run_id, e.iter
