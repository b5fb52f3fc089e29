// Package examples holds copy-paste examples of the pglease Go helper with real drivers —
// database/sql over pgx's stdlib and over lib/pq, and pgxpool — as tests that run against a
// real daemon: `PGLEASE_URL=http://127.0.0.1:55482 go test ./...` from this directory, with
// the daemon serving template "app" from clients/testdata/migrations (lib/pq needs its
// default --scram-iterations, 4096, or any of 1000 or more).
//
// It is a module of its own so that pgx and lib/pq (and pgx's newer Go floor) stay out of
// the helper's go.mod: the helper needs only the standard library.
package examples
