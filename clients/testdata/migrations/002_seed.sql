-- Every fresh database starts with these two customers and no orders.
INSERT INTO customers (name) VALUES ('alice'), ('bob');
