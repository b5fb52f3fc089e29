// One example per way Go code talks to postgres: database/sql over pgx's stdlib, pgxpool,
// and database/sql over lib/pq. Each is what a suite would copy.

package examples

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	pglease "github.com/pglease/pglease/clients/go"
)

func TestPgxStdlib(t *testing.T) {
	t.Parallel()
	// import _ "github.com/jackc/pgx/v5/stdlib" registers the driver "pgx".
	db := pglease.OpenDB(t, "pgx", pglease.Template(template))
	assertFresh(t, db)
}

func TestPgxpool(t *testing.T) {
	t.Parallel()
	lease := pglease.Lease(t, pglease.Template(template))
	config, err := pgxpool.ParseConfig(lease.URL)
	if err != nil {
		t.Fatal(err)
	}
	// Stay under the lease's connection limit (the daemon's --lease-connections, 10).
	config.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after Lease, so it runs before the release drops the database.
	t.Cleanup(pool.Close)

	var names []string
	rows, err := pool.Query(context.Background(), "SELECT name FROM customers ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names, ","); got != "alice,bob" {
		t.Errorf("customers: got %s, want alice,bob", got)
	}
}

func TestLibPQ(t *testing.T) {
	t.Parallel()
	// import _ "github.com/lib/pq" registers the driver "postgres", which works on the
	// daemon's defaults (it refuses --scram-iterations under 1000).
	db := pglease.OpenDB(t, "postgres", pglease.Template(template))
	assertFresh(t, db)
}

func TestLibPQWithoutOpenDB(t *testing.T) {
	t.Parallel()
	// The same by hand, for suites that open their own connections: the URL as it is.
	lease := pglease.Lease(t, pglease.Template(template))
	db, err := sql.Open("postgres", lease.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	assertFresh(t, db)
}
