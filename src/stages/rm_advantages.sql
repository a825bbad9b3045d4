-- advantage (reward model): the consistency reward of each verdict sample,
--   R_S(τ,i,j) = R(τ,i) · S(τ,i,j), or ${unparsable} when S is unparsable (0),
-- standardized over the m samples of the same (task, τ, i) with population std.
-- Zero-variance groups (std <= 1e-8) get advantage 0 and are not included; only tasks with
-- rm_acc_min <= acc <= rm_acc_max train the RM, and only active tasks and accepted candidates
-- (a candidate `judge` rejected never trains). In reference mode a sample whose advantage is
-- exactly 0 is not included either (the reference keeps `r != 0` only).
--
-- Within a step R is constant, so R_S takes at most three values (R, −R, unparsable): the group
-- mean and variance follow exactly from the step's verdict counts, which step_rewards carries
-- (rm_pos, rm_neg, rm_unparsable). One join, no float sums: the result does not depend on
-- execution order, and replay reproduces it bit for bit. traj_id is unique within an iteration
-- (schemas/trajectories.md), so (traj_id, step_idx) identifies a step.
WITH acc AS (
    SELECT task_id,
           CAST(SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS DOUBLE) / CAST(COUNT(*) AS DOUBLE) AS task_acc
    FROM trajectories
    GROUP BY task_id
),
trained AS (
    ${trained}
),
means AS (
    SELECT task_id, traj_id, step_idx, reward, rm_count,
           CAST(rm_pos AS DOUBLE) AS n_pos,
           CAST(rm_neg AS DOUBLE) AS n_neg,
           CAST(rm_unparsable AS DOUBLE) AS n_unp,
           (reward * (CAST(rm_pos AS DOUBLE) - CAST(rm_neg AS DOUBLE)) + ${unparsable} * CAST(rm_unparsable AS DOUBLE))
               / CAST(rm_count AS DOUBLE) AS mean
    FROM step_rewards
    WHERE rm_count > 0
),
stats AS (
    SELECT m.*, a.task_acc, tr.task_id IS NOT NULL AS trained,
           sqrt((n_pos * (reward - mean) * (reward - mean)
                 + n_neg * (-reward - mean) * (-reward - mean)
                 + n_unp * (${unparsable} - mean) * (${unparsable} - mean)) / CAST(rm_count AS DOUBLE)) AS std
    FROM means m
    JOIN acc a ON m.task_id = a.task_id
    LEFT JOIN trained tr ON m.task_id = tr.task_id
),
scored AS (
    SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, s.sample_idx, s.score,
           CASE WHEN s.score = 0 THEN ${unparsable}
                ELSE g.reward * CAST(s.score AS DOUBLE) END AS consistency_reward,
           g.rm_count, g.mean, g.std, g.task_acc, g.trained
    -- stats first: DataFusion hashes the per-step side and streams the sorted samples through
    -- it, so they come out in key order and need no sort.
    FROM stats g
    JOIN rm_samples s
      ON s.traj_id = g.traj_id AND s.step_idx = g.step_idx
),
standardized AS (
    SELECT run_id, iter, task_id, traj_id, step_idx, sample_idx, score, consistency_reward,
           rm_count AS group_size,
           std AS group_std,
           task_acc,
           advantage,
           (trained AND std > ${min_std} AND task_acc >= ${acc_min} AND task_acc <= ${acc_max}
            AND (${mode} = 'verl' OR advantage <> 0)) AS included
    FROM (
        SELECT *,
               CASE WHEN std <= ${min_std} THEN CAST(0 AS DOUBLE) ELSE (consistency_reward - mean) / std END AS advantage
        FROM scored
    ) s
)
-- reward.rm_balance: "none" (the reference) takes the rows as they are; "outcome" weights the
-- included samples so that won and lost trajectories carry equal weight in the update
-- (rm_advantages_outcome.sql).
${balance}
