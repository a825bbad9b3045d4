-- DuckDB equivalent of reward_join + advantage + task_accuracy (src/stages/*.sql, same plan
-- shape: verdict counts computed once in step_rewards and reused), with the
-- defaults λ = 1, reference mode, policy filter [1/8, 7/8], RM filter [0.2, 0.8], unparsable −2.
-- ${steps}, ${trajectories}, ${rm_samples}: lists of the committed Parquet files; ${out}: a directory.
-- Each table is written sorted by its key as zstd Parquet, like rla-pipe does.
SET preserve_insertion_order = true;

CREATE VIEW steps AS SELECT * FROM read_parquet(${steps});
CREATE VIEW trajectories AS SELECT * FROM read_parquet(${trajectories});
CREATE VIEW rm_samples AS SELECT * FROM read_parquet(${rm_samples});

COPY (
    WITH rm AS (
        SELECT task_id, traj_id, step_idx,
               SUM(CASE WHEN score > 0 THEN 1 ELSE 0 END) AS n_pos,
               SUM(CASE WHEN score < 0 THEN 1 ELSE 0 END) AS n_neg,
               SUM(CASE WHEN score = 0 THEN 1 ELSE 0 END) AS n_unp
        FROM rm_samples GROUP BY task_id, traj_id, step_idx
    ),
    j AS (
        SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, t.outcome,
               COALESCE(rm.n_pos, 0) AS n_pos, COALESCE(rm.n_neg, 0) AS n_neg, COALESCE(rm.n_unp, 0) AS n_unp
        FROM steps s
        JOIN trajectories t ON s.task_id = t.task_id AND s.traj_id = t.traj_id
        LEFT JOIN rm ON s.task_id = rm.task_id AND s.traj_id = rm.traj_id AND s.step_idx = rm.step_idx
    )
    SELECT run_id, iter, task_id, traj_id, step_idx, outcome,
           CASE WHEN n_pos + n_neg + n_unp > 0 THEN (n_pos - n_neg) / (n_pos + n_neg + n_unp) END AS rm_mean,
           CAST(n_pos + n_neg + n_unp AS UINTEGER) AS rm_count,
           CAST(n_pos AS UINTEGER) AS rm_pos, CAST(n_neg AS UINTEGER) AS rm_neg, CAST(n_unp AS UINTEGER) AS rm_unparsable,
           CAST(outcome AS DOUBLE) + 1.0 * COALESCE(CASE WHEN n_pos + n_neg + n_unp > 0 THEN (n_pos - n_neg) / (n_pos + n_neg + n_unp) END, 0.0) AS reward
    FROM j
    ORDER BY task_id, traj_id, step_idx
) TO '${out}/step_rewards.parquet' (FORMAT parquet, COMPRESSION zstd);

CREATE VIEW step_rewards AS SELECT * FROM read_parquet('${out}/step_rewards.parquet');
CREATE VIEW acc AS
    SELECT task_id, SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) / COUNT(*) AS task_acc
    FROM trajectories GROUP BY task_id;

COPY (
    WITH g AS (
        SELECT task_id, step_idx, COUNT(*) AS n, AVG(reward) AS mean, STDDEV_POP(reward) AS std
        FROM step_rewards GROUP BY task_id, step_idx
    )
    SELECT r.run_id, r.iter, r.task_id, r.traj_id, r.step_idx, r.reward,
           CAST(g.n AS UINTEGER) AS group_size, g.mean AS group_mean, g.std AS group_std, a.task_acc,
           CASE WHEN g.n = 1 THEN r.reward WHEN g.std <= 1e-8 THEN 0.0 ELSE (r.reward - g.mean) / g.std END AS advantage,
           (a.task_acc >= 0.125 AND a.task_acc <= 0.875
            AND (CASE WHEN g.n = 1 THEN r.reward WHEN g.std <= 1e-8 THEN 0.0 ELSE (r.reward - g.mean) / g.std END) <> 0) AS included
    FROM step_rewards r
    JOIN g ON r.task_id = g.task_id AND r.step_idx = g.step_idx
    JOIN acc a ON r.task_id = a.task_id
    ORDER BY r.task_id, r.traj_id, r.step_idx
) TO '${out}/policy_advantages.parquet' (FORMAT parquet, COMPRESSION zstd);

COPY (
    WITH m AS (
        SELECT task_id, traj_id, step_idx, reward, rm_count, rm_pos AS p, rm_neg AS q, rm_unparsable AS u,
               (reward * (CAST(rm_pos AS BIGINT) - rm_neg) - 2.0 * rm_unparsable) / rm_count AS mean
        FROM step_rewards WHERE rm_count > 0
    ),
    g AS (
        SELECT m.*, a.task_acc,
               sqrt((p * (reward - mean) ^ 2 + q * (-reward - mean) ^ 2 + u * (-2.0 - mean) ^ 2) / rm_count) AS std
        FROM m JOIN acc a ON m.task_id = a.task_id
    ),
    x AS (
        SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, s.sample_idx, s.score,
               CASE WHEN s.score = 0 THEN -2.0 ELSE g.reward * s.score END AS consistency_reward,
               g.rm_count, g.mean, g.std, g.task_acc
        FROM rm_samples s
        JOIN g ON s.task_id = g.task_id AND s.traj_id = g.traj_id AND s.step_idx = g.step_idx
    )
    SELECT run_id, iter, task_id, traj_id, step_idx, sample_idx, score, consistency_reward,
           rm_count AS group_size, std AS group_std, task_acc,
           CASE WHEN std <= 1e-8 THEN 0.0 ELSE (consistency_reward - mean) / std END AS advantage,
           (std > 1e-8 AND task_acc >= 0.2 AND task_acc <= 0.8) AS included
    FROM x
    ORDER BY task_id, traj_id, step_idx, sample_idx
) TO '${out}/rm_advantages.parquet' (FORMAT parquet, COMPRESSION zstd);

COPY (
    WITH tv AS (
        SELECT r.task_id, r.traj_id,
               SUM(CAST(r.rm_pos AS BIGINT) - r.rm_neg) AS vote,
               SUM(CASE WHEN r.rm_count > 0 THEN 1 ELSE 0 END) AS sampled,
               SUM(CASE WHEN r.rm_count > 0 AND s.oracle_progress IS NOT NULL THEN 1 ELSE 0 END) AS judged,
               SUM(CASE WHEN r.rm_count > 0 AND sign(CAST(r.rm_pos AS BIGINT) - r.rm_neg) = s.oracle_progress THEN 1 ELSE 0 END) AS agree
        FROM step_rewards r
        JOIN steps s ON r.task_id = s.task_id AND r.traj_id = s.traj_id AND r.step_idx = s.step_idx
        GROUP BY r.task_id, r.traj_id
    ),
    pt AS (
        SELECT t.run_id, t.iter, t.task_id, COUNT(*) AS rollouts,
               SUM(CASE WHEN t.outcome > 0 THEN 1 ELSE 0 END) AS successes,
               SUM(COALESCE(tv.judged, 0)) AS judged_steps, SUM(COALESCE(tv.agree, 0)) AS agree_steps,
               SUM(CASE WHEN tv.sampled > 0 THEN 1 ELSE 0 END) AS judged_trajectories,
               SUM(CASE WHEN tv.sampled > 0 AND sign(tv.vote) = t.outcome THEN 1 ELSE 0 END) AS agree_trajectories
        FROM trajectories t LEFT JOIN tv ON t.task_id = tv.task_id AND t.traj_id = tv.traj_id
        GROUP BY t.run_id, t.iter, t.task_id
    )
    SELECT run_id, iter, task_id, CAST(rollouts AS UINTEGER) AS rollouts, CAST(successes AS UINTEGER) AS successes,
           successes / rollouts AS acc,
           CAST(judged_steps AS UINTEGER) AS judged_steps,
           CASE WHEN judged_steps > 0 THEN agree_steps / judged_steps END AS rm_process_acc,
           CAST(judged_trajectories AS UINTEGER) AS judged_trajectories,
           CASE WHEN judged_trajectories > 0 THEN agree_trajectories / judged_trajectories END AS rm_outcome_acc
    FROM pt
    ORDER BY task_id
) TO '${out}/task_accuracy.parquet' (FORMAT parquet, COMPRESSION zstd);
