module github.com/pglease/pglease/clients/go

// The helper uses only the standard library; the driver examples (pgx, lib/pq) live in the
// nested module ./examples so that their requirements, and pgx's newer Go floor, are not
// imposed on suites that import this package.
go 1.22
