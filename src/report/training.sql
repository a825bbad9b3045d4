-- The training signal per iteration: the mean integrated step reward, the spread of the policy
-- advantages (population std over the rows the update trains on, and the share of rows it
-- trains on), and the mean episode length of the sampled rollouts. NULL where a run has none.
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
           AVG(CASE WHEN included THEN 1.0 ELSE 0.0 END) AS trained_share
    FROM policy_advantages
    WHERE run_id IN (${runs})
    GROUP BY run_id, iter
)
SELECT e.run_id, e.iter, r.mean_reward, a.advantage_std, a.trained_share, e.episode_length
FROM episodes e
LEFT JOIN rewards r ON r.run_id = e.run_id AND r.iter = e.iter
LEFT JOIN advantages a ON a.run_id = e.run_id AND a.iter = e.iter
ORDER BY e.run_id, e.iter
