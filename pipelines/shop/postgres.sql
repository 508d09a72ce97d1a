-- The source database of pipelines/shop.sql: a shop's orders, customers and products in
-- PostgreSQL, captured by Debezium (pipelines/shop/connector.json). Run it once:
--   psql postgresql://postgres@127.0.0.1:5432/lockstep -f pipelines/shop/postgres.sql
CREATE TYPE order_status AS ENUM ('placed', 'paid', 'shipped');
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, region text NOT NULL);
CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2) NOT NULL);
CREATE TABLE orders (
  id bigint PRIMARY KEY,
  customer_id int NOT NULL REFERENCES customers,
  product_id int NOT NULL REFERENCES products,
  quantity int NOT NULL,
  status order_status NOT NULL DEFAULT 'placed',
  placed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO customers SELECT i, 'customer ' || i, (ARRAY['north', 'south', 'east', 'west'])[1 + i % 4]
  FROM generate_series(1, 20) AS i;
INSERT INTO products SELECT i, 'product ' || i, (i * 1.25)::numeric(10,2) FROM generate_series(1, 10) AS i;
INSERT INTO orders (id, customer_id, product_id, quantity)
  SELECT i, 1 + i % 20, 1 + i % 10, 1 + i % 3 FROM generate_series(1, 100) AS i;
