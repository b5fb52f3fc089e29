// Connects through the PostgreSQL front (tests/it/front_drivers.rs) with Go's drivers: pgx
// (pgx.Connect) and lib/pq (database/sql). PGLEASE_FRONT_URL is
// `postgres://<user>@<host>:<port>/<template>`, given to pgx as it is; lib/pq gets it with
// `?sslmode=disable`, which docs/front.md tells its users to add when the front has no TLS
// (lib/pq's default is `require`). `lib/pq-tls` is lib/pq on the URL as it is, on its
// default sslmode, for a front with TLS (`--front-tls`). Each driver opens two
// connections, one after the other, and checks what docs/front.md promises: a clone of its
// own, the lease's role, a table round trip, a query with a parameter.
//
// Arguments name the drivers to run (pgx and lib/pq when none). Prints
// `ok <driver> <first database> <second database>` or `FAIL <driver>: <error>` per driver;
// exits 1 if any failed.
// Run: PGLEASE_FRONT_URL=postgres://... go run . [pgx|lib/pq]
package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/lib/pq" // database/sql driver "postgres"
)

// runFunc runs a statement with `$n` parameters and returns its rows' first columns as text.
type runFunc func(ctx context.Context, query string, args ...any) ([][]string, error)

func main() {
	frontURL := os.Getenv("PGLEASE_FRONT_URL")
	checks := map[string]func(context.Context, string) (string, error){
		"pgx":        func(ctx context.Context, u string) (string, error) { return twoConnections(ctx, u, pgxSession) },
		"lib/pq":     pqChecks("?sslmode=disable"),
		"lib/pq-tls": pqChecks(""),
	}
	names := os.Args[1:]
	if len(names) == 0 {
		names = []string{"pgx", "lib/pq"}
	}
	failed := false
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		detail, err := func() (string, error) {
			check, ok := checks[name]
			if !ok {
				return "", fmt.Errorf("no driver %s", name)
			}
			return check(ctx, frontURL)
		}()
		cancel()
		if err != nil {
			failed = true
			fmt.Printf("FAIL %s: %v\n", name, err)
		} else {
			fmt.Printf("ok %s %s\n", name, detail)
		}
	}
	if failed {
		os.Exit(1)
	}
}

// twoConnections runs probe on two connections, one after the other; the second must get
// another database.
func twoConnections(ctx context.Context, frontURL string, session func(context.Context, string, func(runFunc) (string, error)) (string, error)) (string, error) {
	check := func(run runFunc) (string, error) { return probe(ctx, frontURL, run) }
	first, err := session(ctx, frontURL, check)
	if err != nil {
		return "", err
	}
	second, err := session(ctx, frontURL, check)
	if err != nil {
		return "", err
	}
	if first == second {
		return "", fmt.Errorf("both connections got %s", first)
	}
	return first + " " + second, nil
}

// probe runs the front's checks on one connection and returns its database.
func probe(ctx context.Context, frontURL string, run runFunc) (string, error) {
	parsed, err := url.Parse(frontURL)
	if err != nil {
		return "", err
	}
	rows, err := run(ctx, "SELECT current_user, current_database()")
	if err != nil {
		return "", err
	}
	user, database := rows[0][0], rows[0][1]
	if database == strings.TrimPrefix(parsed.Path, "/") {
		return "", fmt.Errorf("connected to the template's name %s, not a clone", database)
	}
	// The front logs in as the lease's role, which pglease names after its database; the
	// user the client named is only the front's.
	if user != database || user == parsed.User.Username() {
		return "", fmt.Errorf("current_user is %s: not the lease's role of %s", user, database)
	}
	// A fresh clone: the table is not there yet (a reused connection would fail here).
	if _, err := run(ctx, "CREATE TABLE front_check (id int PRIMARY KEY, name text)"); err != nil {
		return "", err
	}
	if _, err := run(ctx, "INSERT INTO front_check VALUES ($1, $2)", 1, "one"); err != nil {
		return "", err
	}
	rows, err = run(ctx, "SELECT name FROM front_check WHERE id = $1", 1)
	if err != nil {
		return "", err
	}
	if len(rows) != 1 || rows[0][0] != "one" {
		return "", fmt.Errorf("round trip: %v", rows)
	}
	for n := range 7 {
		rows, err = run(ctx, "SELECT ($1::int + 1)::text", 41+n)
		if err != nil {
			return "", err
		}
		if rows[0][0] != fmt.Sprint(42+n) {
			return "", fmt.Errorf("a query with a parameter: %v", rows)
		}
	}
	return database, nil
}

// pgxSession runs check on a pgx connection, which prepares and caches each statement
// (named statements, extended protocol) by default.
func pgxSession(ctx context.Context, frontURL string, check func(runFunc) (string, error)) (string, error) {
	conn, err := pgx.Connect(ctx, frontURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	return check(func(ctx context.Context, query string, args ...any) ([][]string, error) {
		rows, err := conn.Query(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out [][]string
		for rows.Next() {
			values, err := rows.Values()
			if err != nil {
				return nil, err
			}
			row := make([]string, len(values))
			for i, value := range values {
				row[i] = fmt.Sprint(value)
			}
			out = append(out, row)
		}
		return out, rows.Err()
	})
}

// pqChecks checks lib/pq on the front's URL with query added (`?sslmode=…`, or nothing).
func pqChecks(query string) func(context.Context, string) (string, error) {
	return func(ctx context.Context, u string) (string, error) {
		return twoConnections(ctx, u, pqSession(u+query))
	}
}

// pqSession runs check on one connection of a database/sql pool over lib/pq, opened with
// dsn (a pool may open several, each a lease of its own at the front: db.Conn keeps the
// checks on one).
func pqSession(dsn string) func(context.Context, string, func(runFunc) (string, error)) (string, error) {
	return func(ctx context.Context, _ string, check func(runFunc) (string, error)) (string, error) {
		return pqCheck(ctx, dsn, check)
	}
}

// pqCheck runs check on one lib/pq connection to dsn.
func pqCheck(ctx context.Context, dsn string, check func(runFunc) (string, error)) (string, error) {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return "", err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return check(func(ctx context.Context, query string, args ...any) ([][]string, error) {
		rows, err := conn.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		columns, err := rows.Columns()
		if err != nil {
			return nil, err
		}
		var out [][]string
		for rows.Next() {
			row := make([]string, len(columns))
			pointers := make([]any, len(columns))
			for i := range row {
				pointers[i] = &row[i]
			}
			if err := rows.Scan(pointers...); err != nil {
				return nil, err
			}
			out = append(out, row)
		}
		return out, rows.Err()
	})
}
