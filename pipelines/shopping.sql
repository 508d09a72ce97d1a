-- FLIP-276's example topology: one root table fed from Kafka, two tables derived from it.
CREATE TABLE shopping (user_id BIGINT, item_id BIGINT, amount BIGINT, price DOUBLE)
  WITH ('source' = 'kafka:shopping_source', 'format' = 'json');

CREATE TABLE user_item_amount AS
  SELECT user_id, item_id, SUM(amount) AS total_amount FROM shopping GROUP BY user_id, item_id;

CREATE TABLE user_item_price AS
  SELECT user_id, item_id, SUM(price) AS total_price FROM shopping GROUP BY user_id, item_id;
