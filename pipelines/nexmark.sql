-- Nexmark, the streaming benchmark of an online auction (people, auctions, bids), with the
-- queries of its suite that Spark SQL expresses, each one a maintained table. Feed it, then run it:
--   lockstep datagen nexmark --rate 5000
--   lockstep run pipelines/nexmark.sql
-- `lockstep explain pipelines/nexmark.sql` says how each table is maintained, and why a table
-- is recomputed at each barrier when it is. People and auctions are kept by id; bids only grow.
CREATE TABLE person (id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, state STRING,
                     date_time TIMESTAMP, extra STRING)
  WITH ('source' = 'kafka:nexmark_person', 'primary_key' = 'id');
CREATE TABLE auction (id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT,
                      date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING)
  WITH ('source' = 'kafka:nexmark_auction', 'primary_key' = 'id');
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, date_time TIMESTAMP,
                  extra STRING)
  WITH ('source' = 'kafka:nexmark_bid');

-- q0 pass-through
CREATE TABLE q0 AS SELECT auction, bidder, price, date_time, extra FROM bid;

-- q1 currency conversion (dollars to euros)
CREATE TABLE q1 AS SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid;

-- q2 selection of some auctions
CREATE TABLE q2 AS SELECT auction, price FROM bid WHERE auction % 123 = 0;

-- q3 local item suggestion: sellers in some states with an auction in category 10; kept by key in
-- Spark's state store (auctions by seller, people by id)
CREATE TABLE q3 WITH ('state' = 'keyed') AS
  SELECT p.name, p.city, p.state, a.id
  FROM auction a JOIN person p ON a.seller = p.id
  WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA');

-- q5 hot items: the auctions with the most bids in each sliding window (with the window, which
-- Nexmark leaves out: a window's rows are then found by it and replaced when its bids change)
CREATE TABLE q5 AS
  SELECT c.auction, c.num, c.w
  FROM (SELECT auction, COUNT(*) AS num, window(date_time, '10 seconds', '2 seconds') AS w
        FROM bid GROUP BY auction, window(date_time, '10 seconds', '2 seconds')) c
  JOIN (SELECT MAX(num) AS max_num, w
        FROM (SELECT COUNT(*) AS num, window(date_time, '10 seconds', '2 seconds') AS w
              FROM bid GROUP BY auction, window(date_time, '10 seconds', '2 seconds')) counts
        GROUP BY w) m
  ON c.w = m.w AND c.num >= m.max_num;

-- q7 the highest bid in each 10-second window (joined by window, not by a time range, so the
-- window groups its rows)
CREATE TABLE q7 AS
  SELECT b.auction, b.price, b.bidder, b.date_time, b.w
  FROM (SELECT *, window(date_time, '10 seconds') AS w FROM bid) b
  JOIN (SELECT MAX(price) AS max_price, window(date_time, '10 seconds') AS w
        FROM bid GROUP BY window(date_time, '10 seconds')) m
  ON b.w = m.w AND b.price = m.max_price;

-- q8 people who opened an auction in the 10-second window they registered in
CREATE TABLE q8 AS
  SELECT p.id, p.name, p.w.start AS starttime
  FROM (SELECT id, name, window(date_time, '10 seconds') AS w FROM person
        GROUP BY id, name, window(date_time, '10 seconds')) p
  JOIN (SELECT seller, window(date_time, '10 seconds') AS w FROM auction
        GROUP BY seller, window(date_time, '10 seconds')) a
  ON p.id = a.seller AND p.w = a.w;

-- q9 winning bids: each auction's highest bid within its time, in two keyed tables: the bids
-- within their auction's time (a keyed join), then each auction's first of them (a keyed Top-N
-- over the join's table; Spark's update mode keeps no join before an aggregate), appended in
-- the changelog layout (in place, its MERGE or rewrite cost more than the rest of its barrier)
CREATE TABLE auction_bids WITH ('state' = 'keyed') AS
  SELECT a.id, a.item_name, a.seller, a.category, b.bidder, b.price, b.date_time AS bid_time
  FROM auction a JOIN bid b ON a.id = b.auction
  WHERE b.date_time BETWEEN a.date_time AND a.expires;
CREATE TABLE q9 WITH ('state' = 'keyed', 'layout' = 'changelog') AS
  SELECT * FROM (
    SELECT id, item_name, seller, category, bidder, price, bid_time,
           ROW_NUMBER() OVER (PARTITION BY id ORDER BY price DESC, bid_time) AS rownum
    FROM auction_bids)
  WHERE rownum <= 1;

-- q4 average closing price per category: an auction's closing price is its winning bid's,
-- averaged from q9's changes (each barrier's appended rows, and the rows they replace: a table
-- that reads a changelog table keeps each key's last two rows in Spark's state store)
CREATE TABLE q4 AS SELECT category, AVG(price) AS avg_final FROM q9 GROUP BY category;

-- q15 bidding statistics per day
CREATE TABLE q15 AS
  SELECT date_format(date_time, 'yyyy-MM-dd') AS day,
         COUNT(*) AS total_bids,
         COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids,
         COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
         COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
         COUNT(DISTINCT bidder) AS total_bidders,
         COUNT(DISTINCT auction) AS total_auctions
  FROM bid GROUP BY date_format(date_time, 'yyyy-MM-dd');

-- q16 channel statistics per day
CREATE TABLE q16 AS
  SELECT channel, date_format(date_time, 'yyyy-MM-dd') AS day,
         MAX(date_format(date_time, 'HH:mm')) AS minute,
         COUNT(*) AS total_bids,
         COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids,
         COUNT(DISTINCT bidder) AS total_bidders,
         COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders
  FROM bid GROUP BY channel, date_format(date_time, 'yyyy-MM-dd');

-- q17 auction statistics per day; each group's running aggregates kept by key in Spark's state
-- store, so a barrier's bids on old auctions update their groups by a lookup, and the changed
-- groups appended (the changelog layout: readers see each group's newest row)
CREATE TABLE q17 WITH ('state' = 'keyed', 'layout' = 'changelog') AS
  SELECT auction, date_format(date_time, 'yyyy-MM-dd') AS day,
         COUNT(*) AS total_bids,
         COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids,
         MIN(price) AS min_price, MAX(price) AS max_price, AVG(price) AS avg_price, SUM(price) AS sum_price
  FROM bid GROUP BY auction, date_format(date_time, 'yyyy-MM-dd');

-- q18 each bidder's latest bid on each auction
CREATE TABLE q18 AS
  SELECT * FROM (
    SELECT auction, bidder, price, channel, date_time,
           ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC, price DESC) AS rank_number
    FROM bid)
  WHERE rank_number <= 1;

-- q19 the ten highest bids of each auction; each auction's ten kept by key in Spark's state store
-- (a running max_by), so a barrier's bids on old auctions update their ten by a lookup, and the
-- changed auctions' ranks appended (the changelog layout: readers see each rank's newest row)
CREATE TABLE q19 WITH ('state' = 'keyed', 'layout' = 'changelog') AS
  SELECT * FROM (
    SELECT auction, bidder, price, date_time,
           ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC, date_time, bidder) AS rank_number
    FROM bid)
  WHERE rank_number <= 10;

-- q20 bids with their auction, for auctions in category 10; kept by key in Spark's state store
-- (bids and auctions by auction id), so a barrier's bids find their auction by a lookup
CREATE TABLE q20 WITH ('state' = 'keyed') AS
  SELECT b.auction, b.bidder, b.price, b.date_time, a.item_name, a.seller, a.category
  FROM bid b JOIN auction a ON b.auction = a.id
  WHERE a.category = 10;

-- q21 the channel's id, from the channel or the bid's URL
CREATE TABLE q21 AS
  SELECT auction, bidder, price, channel,
         CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
              WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
              ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
  FROM bid WHERE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) != '' OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu');

-- q22 the directories of each bid's URL
CREATE TABLE q22 AS
  SELECT auction, bidder, price, channel,
         split(url, '/')[3] AS dir1, split(url, '/')[4] AS dir2, split(url, '/')[5] AS dir3
  FROM bid;
