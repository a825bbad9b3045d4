-- The warm start alone (benches/ablation.sh, runs `pre-s<seed>`: one iteration whose update takes
-- no optimizer step): training, held-out and OOD success of the pretrained policy, and the
-- pretrained reward model's process accuracy, mean over the seeds.
WITH ev AS (
    SELECT run_id,
           CAST(SUM(CASE WHEN split = 'held_out' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'held_out' THEN rollouts END) AS DOUBLE) AS held_out,
           CAST(SUM(CASE WHEN split = 'ood' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'ood' THEN rollouts END) AS DOUBLE) AS ood
    FROM evaluations
    WHERE run_id LIKE 'pre-%' AND iter = 0
    GROUP BY run_id
),
tr AS (
    SELECT run_id,
           CAST(SUM(successes) AS DOUBLE) / CAST(SUM(rollouts) AS DOUBLE) AS train,
           SUM(rm_process_acc * CAST(judged_steps AS DOUBLE)) / CAST(NULLIF(SUM(judged_steps), 0) AS DOUBLE) AS rm_process
    FROM task_accuracy
    WHERE run_id LIKE 'pre-%' AND iter = 0
    GROUP BY run_id
)
SELECT COUNT(*) AS seeds,
       round(AVG(tr.train), 3) AS train_success,
       round(AVG(ev.held_out), 3) AS held_out,
       round(stddev(ev.held_out), 3) AS held_out_std,
       round(AVG(ev.ood), 3) AS ood,
       round(AVG(tr.rm_process), 3) AS rm_process_acc
FROM ev JOIN tr ON tr.run_id = ev.run_id
