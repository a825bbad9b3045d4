-- DuckDB equivalent of reward_join + advantage + task_accuracy (src/stages/*.sql), with the
-- defaults λ = 1, reference mode, policy filter [1/8, 7/8], RM filter [0.2, 0.8], unparsable −2.
-- ${steps}, ${trajectories}, ${rm_samples}: lists of the committed Parquet files; ${out}: a directory.
-- Each table is written sorted by its key as zstd Parquet, like rla-pipe does.
SET preserve_insertion_order = true;

CREATE VIEW steps AS SELECT * FROM read_parquet(${steps});
CREATE VIEW trajectories AS SELECT * FROM read_parquet(${trajectories});
CREATE VIEW rm_samples AS SELECT * FROM read_parquet(${rm_samples});

COPY (
    WITH rm AS (
        SELECT task_id, traj_id, step_idx, SUM(CAST(score AS BIGINT)) AS score_sum, COUNT(*) AS n_samples
        FROM rm_samples GROUP BY task_id, traj_id, step_idx
    )
    SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, t.outcome,
           CAST(rm.score_sum AS DOUBLE) / rm.n_samples AS rm_mean,
           CAST(COALESCE(rm.n_samples, 0) AS UINTEGER) AS rm_count,
           CAST(t.outcome AS DOUBLE) + 1.0 * COALESCE(CAST(rm.score_sum AS DOUBLE) / rm.n_samples, 0.0) AS reward
    FROM steps s
    JOIN trajectories t ON s.task_id = t.task_id AND s.traj_id = t.traj_id
    LEFT JOIN rm ON s.task_id = rm.task_id AND s.traj_id = rm.traj_id AND s.step_idx = rm.step_idx
    ORDER BY s.task_id, s.traj_id, s.step_idx
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
    WITH x AS (
        SELECT s.run_id, s.iter, s.task_id, s.traj_id, s.step_idx, s.sample_idx, s.score,
               CASE WHEN s.score = 0 THEN -2.0 ELSE r.reward * s.score END AS consistency_reward
        FROM rm_samples s
        JOIN step_rewards r ON s.task_id = r.task_id AND s.traj_id = r.traj_id AND s.step_idx = r.step_idx
    ),
    g AS (
        SELECT task_id, traj_id, step_idx, COUNT(*) AS n, AVG(consistency_reward) AS mean,
               STDDEV_POP(consistency_reward) AS std
        FROM x GROUP BY task_id, traj_id, step_idx
    )
    SELECT x.*, CAST(g.n AS UINTEGER) AS group_size, g.std AS group_std, a.task_acc,
           CASE WHEN g.std <= 1e-8 THEN 0.0 ELSE (x.consistency_reward - g.mean) / g.std END AS advantage,
           (g.std > 1e-8 AND a.task_acc >= 0.2 AND a.task_acc <= 0.8) AS included
    FROM x
    JOIN g ON x.task_id = g.task_id AND x.traj_id = g.traj_id AND x.step_idx = g.step_idx
    JOIN acc a ON x.task_id = a.task_id
    ORDER BY x.task_id, x.traj_id, x.step_idx, x.sample_idx
) TO '${out}/rm_advantages.parquet' (FORMAT parquet, COMPRESSION zstd);

COPY (
    WITH traj AS (
        SELECT run_id, iter, task_id, COUNT(*) AS rollouts, SUM(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS successes
        FROM trajectories GROUP BY run_id, iter, task_id
    ),
    votes AS (
        SELECT task_id, traj_id, step_idx, SUM(CAST(score AS BIGINT)) AS vote
        FROM rm_samples GROUP BY task_id, traj_id, step_idx
    ),
    process AS (
        SELECT v.task_id, COUNT(*) AS judged, SUM(CASE WHEN sign(v.vote) = s.oracle_progress THEN 1 ELSE 0 END) AS agree
        FROM votes v JOIN steps s ON v.task_id = s.task_id AND v.traj_id = s.traj_id AND v.step_idx = s.step_idx
        WHERE s.oracle_progress IS NOT NULL GROUP BY v.task_id
    ),
    tv AS (SELECT task_id, traj_id, SUM(vote) AS vote FROM votes GROUP BY task_id, traj_id),
    outcome AS (
        SELECT tv.task_id, COUNT(*) AS judged, SUM(CASE WHEN sign(tv.vote) = t.outcome THEN 1 ELSE 0 END) AS agree
        FROM tv JOIN trajectories t ON tv.task_id = t.task_id AND tv.traj_id = t.traj_id GROUP BY tv.task_id
    )
    SELECT t.run_id, t.iter, t.task_id, CAST(t.rollouts AS UINTEGER) AS rollouts, CAST(t.successes AS UINTEGER) AS successes,
           t.successes / t.rollouts AS acc,
           CAST(COALESCE(p.judged, 0) AS UINTEGER) AS judged_steps, p.agree / p.judged AS rm_process_acc,
           CAST(COALESCE(o.judged, 0) AS UINTEGER) AS judged_trajectories, o.agree / o.judged AS rm_outcome_acc
    FROM traj t LEFT JOIN process p ON t.task_id = p.task_id LEFT JOIN outcome o ON t.task_id = o.task_id
    ORDER BY t.task_id
) TO '${out}/task_accuracy.parquet' (FORMAT parquet, COMPRESSION zstd);
