-- The template the client helpers' example suites run against (tests/it/helpers.rs).
CREATE TABLE customers (
    id   bigserial PRIMARY KEY,
    name text NOT NULL UNIQUE
);

CREATE TABLE orders (
    id          bigserial PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers (id),
    total_cents bigint NOT NULL CHECK (total_cents >= 0)
);
