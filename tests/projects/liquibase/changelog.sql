--liquibase formatted sql

--changeset example:1
CREATE TABLE users (id bigserial PRIMARY KEY, email text UNIQUE NOT NULL);

--changeset example:2
CREATE TABLE posts (id bigserial PRIMARY KEY, user_id bigint NOT NULL REFERENCES users (id), title text NOT NULL);
