-- The RL gain measured again with more evaluation episodes: runs `e4-pre-s<seed>` (the warm
-- start, a branch of `pre-s<seed>` from iteration 0) and `e4-<setting>-s<seed>` (a branch of
-- `abl-<setting>-s<seed>` from its last iteration: the full loop `rmadapt`, or a variant), made by
--   rla-pipe replay --run pre-s<seed> --from 0 --set eval.rollouts=4 --into e4-pre-s<seed> --iterations 1
--   rla-pipe replay --run abl-rmadapt-s<seed> --from 9 --set eval.rollouts=4 --into e4-rmadapt-s<seed> --iterations 10
-- (or by `REEVAL=4 benches/ablation.sh ...`, which keeps them with each seed's runs), share
-- everything with their parents but the evaluation. Per setting and seed: the sampled
-- held-out success after the warm start and at the last iteration, their episodes, and the
-- gain; the greedy success beside it (deterministic: it equals the parent's). E.g.
-- rla-pipe sql --store docs/src/ablation/textworld-smollm2-s8/kept --file pipelines/sql/reeval_gain.sql
-- The warm start is always `e4-pre-s<seed>`'s; another warm start evaluated on its own (e.g.
-- `e4-pre-g32-s<seed>`, a variant's, where it was computed on another CPU) is not a row here.
WITH e AS (
    SELECT run_id, iter,
           CAST(SUM(CASE WHEN split = 'held_out' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'held_out' THEN rollouts END) AS DOUBLE) AS sampled,
           SUM(CASE WHEN split = 'held_out' THEN rollouts END) AS episodes,
           CAST(SUM(CASE WHEN split = 'held_out_greedy' THEN successes END) AS DOUBLE)
             / CAST(SUM(CASE WHEN split = 'held_out_greedy' THEN rollouts END) AS DOUBLE) AS greedy
    FROM evaluations WHERE run_id LIKE 'e4-%' GROUP BY run_id, iter
), last AS (
    SELECT run_id, MAX(iter) AS iter FROM e WHERE run_id NOT LIKE 'e4-pre-%' GROUP BY run_id
)
SELECT split_part(l.run_id, '-', 2) AS setting,
       CAST(split_part(w.run_id, '-s', 2) AS BIGINT) AS seed, l.iter AS last_iter,
       w.episodes AS episodes_warm, l.episodes AS episodes_last,
       round(w.sampled, 4) AS warm, round(l.sampled, 4) AS last, round(l.sampled - w.sampled, 4) AS gain,
       round(w.greedy, 4) AS warm_greedy, round(l.greedy, 4) AS last_greedy
FROM e w
JOIN e l ON split_part(w.run_id, '-s', 2) = split_part(l.run_id, '-s', 2)
JOIN last ON last.run_id = l.run_id AND last.iter = l.iter
WHERE w.run_id LIKE 'e4-pre-s%' AND w.iter = 0
ORDER BY setting, seed
