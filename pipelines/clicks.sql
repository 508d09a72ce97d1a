-- The README's quick start: page views from a topic of your own, counted per page.
-- Records: one JSON object per click, e.g. {"user": "ann", "page": "/home", "ms": 120}
-- (pipelines/clicks.jsonl; send them with `lockstep datagen lines clicks < pipelines/clicks.jsonl`).
CREATE TABLE clicks (user STRING, page STRING, ms BIGINT)
  WITH ('source' = 'kafka:clicks', 'format' = 'json');

CREATE TABLE views_per_page AS
  SELECT page, COUNT(*) AS views, COUNT(DISTINCT user) AS users, AVG(ms) AS avg_ms
  FROM clicks GROUP BY page;
