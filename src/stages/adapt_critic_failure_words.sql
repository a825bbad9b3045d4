-- adapt (critic, per failed rollout): the ${top} most frequent critique words of the RM's
-- reasoning on each failed trajectory.
WITH words AS (
    SELECT r.traj_id, unnest(string_to_array(r.reasoning, ' ')) AS word
    FROM rm_samples r
    JOIN trajectories t ON t.traj_id = r.traj_id
    WHERE t.outcome < 0 AND r.reasoning <> ''
),
counts AS (
    SELECT traj_id, word, COUNT(*) AS n
    FROM words
    WHERE word <> ''
    GROUP BY traj_id, word
),
ranked AS (
    SELECT traj_id, word, n,
           ROW_NUMBER() OVER (PARTITION BY traj_id ORDER BY n DESC, word) AS rank
    FROM counts
)
SELECT traj_id, word, CAST(n AS INT UNSIGNED) AS n
FROM ranked
WHERE rank <= ${top}
ORDER BY traj_id, rank
