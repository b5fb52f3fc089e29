-- Step 2. A second run of any migration would fail on the primary key of schema_migrations
-- (and the tests count its rows).
CREATE TABLE orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES accounts (id),
    total_cents integer NOT NULL CHECK (total_cents >= 0)
);

INSERT INTO schema_migrations (version) VALUES ('002_orders');
