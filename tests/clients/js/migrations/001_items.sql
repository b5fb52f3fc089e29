CREATE TABLE items (id serial PRIMARY KEY, label text NOT NULL);
INSERT INTO items (label) VALUES ('seed');
