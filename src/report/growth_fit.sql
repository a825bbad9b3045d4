-- Linear fit of the cumulative accepted-task curve: cumulative = intercept + slope · iter.
-- (The paper reports that accepted tasks grow about linearly.)
WITH growth AS (
    ${adaptation}
)
SELECT run_id,
       regr_slope(CAST(cumulative AS DOUBLE), CAST(iter AS DOUBLE)) AS slope,
       regr_intercept(CAST(cumulative AS DOUBLE), CAST(iter AS DOUBLE)) AS intercept,
       regr_r2(CAST(cumulative AS DOUBLE), CAST(iter AS DOUBLE)) AS r2,
       CAST(MAX(cumulative) AS BIGINT) AS total
FROM growth
GROUP BY run_id
ORDER BY run_id
