-- adapt (critic): the ${top} most frequent critique words of the RM's reasoning per task, over
-- its rollouts (the failed ones only unless ${all}).
WITH words AS (
    SELECT r.task_id, unnest(string_to_array(r.reasoning, ' ')) AS word
    FROM rm_samples r
    JOIN trajectories t ON t.traj_id = r.traj_id
    WHERE r.reasoning <> '' AND (${all} OR t.outcome < 0)
),
counts AS (
    SELECT task_id, word, COUNT(*) AS n
    FROM words
    WHERE word <> ''
    GROUP BY task_id, word
),
ranked AS (
    SELECT task_id, word, n,
           ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY n DESC, word) AS rank
    FROM counts
)
SELECT task_id, word, CAST(n AS INT UNSIGNED) AS n
FROM ranked
WHERE rank <= ${top}
ORDER BY task_id, rank
