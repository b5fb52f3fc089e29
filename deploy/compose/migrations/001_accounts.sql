-- The example app's schema, step 1. pglease runs every *.sql here in lexical order, each in
-- one transaction, once per template version; every leased database is a copy of the result.
CREATE TABLE schema_migrations (
    version text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE accounts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email text NOT NULL UNIQUE
);

INSERT INTO schema_migrations (version) VALUES ('001_accounts');
