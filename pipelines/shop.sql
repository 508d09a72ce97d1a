-- A shop's PostgreSQL tables, kept as Delta tables and joined (TiDB's demo: change data capture
-- into Kafka, a stream processor, the lake). Start the source, then run this pipeline:
--   lockstep dev up --postgres --connect
--   psql postgresql://postgres@127.0.0.1:5432/lockstep -f pipelines/shop/postgres.sql
--   curl -X POST -H 'Content-Type: application/json' -d @pipelines/shop/connector.json http://127.0.0.1:8083/connectors
--   LOCKSTEP_SCHEMA_REGISTRY_URL=http://127.0.0.1:8081/apis/ccompat/v7 lockstep run pipelines/shop.sql
CREATE TABLE customers (id INT, name STRING, region STRING)
  WITH ('source' = 'kafka:shop.public.customers', 'format' = 'debezium-avro-confluent', 'primary_key' = 'id');
CREATE TABLE products (id INT, name STRING, price DECIMAL(10, 2))
  WITH ('source' = 'kafka:shop.public.products', 'format' = 'debezium-avro-confluent', 'primary_key' = 'id');
CREATE TABLE orders (id BIGINT, customer_id INT, product_id INT, quantity INT, status STRING, placed_at TIMESTAMP)
  WITH ('source' = 'kafka:shop.public.orders', 'format' = 'debezium-avro-confluent', 'primary_key' = 'id');

-- revenue per product: a join and an aggregate, maintained incrementally
CREATE TABLE product_revenue AS
  SELECT o.product_id, p.name, SUM(o.quantity * p.price) AS revenue, COUNT(*) AS orders
  FROM orders o JOIN products p ON o.product_id = p.id
  GROUP BY o.product_id, p.name;

-- orders and items per region, by order status
CREATE TABLE region_orders AS
  SELECT c.region, o.status, COUNT(*) AS orders, SUM(o.quantity) AS items
  FROM orders o JOIN customers c ON o.customer_id = c.id
  GROUP BY c.region, o.status;
