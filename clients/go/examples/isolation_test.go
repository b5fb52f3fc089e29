// Every test gets a database of its own, fresh from the template: what one test writes no
// other test sees, however many run at once.

package examples

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	pglease "github.com/pglease/pglease/clients/go"
)

func TestSeededCustomersAndNoOrders(t *testing.T) {
	t.Parallel()
	assertFresh(t, pglease.OpenDB(t, "pgx", pglease.Template(template)))
}

func TestParallelTestsSeeOnlyTheirOwnRows(t *testing.T) {
	t.Parallel()
	// Which subtest holds which database right now: a database handed to two holders at
	// once is caught here by name, and by its rows below.
	var mu sync.Mutex
	holders := map[string]string{}

	for i := range 12 {
		t.Run(fmt.Sprintf("worker_%02d", i), func(t *testing.T) {
			t.Parallel()
			lease := pglease.Lease(t, pglease.Template(template))
			mu.Lock()
			other, taken := holders[lease.Name]
			holders[lease.Name] = t.Name()
			mu.Unlock()
			if taken {
				t.Fatalf("database %s was leased to %s while %s holds it", lease.Name, t.Name(), other)
			}
			// Runs before the release (cleanups run last-registered first), so the entry is
			// gone before the database can be anyone else's.
			t.Cleanup(func() {
				mu.Lock()
				delete(holders, lease.Name)
				mu.Unlock()
			})
			assertOnlyOwnRows(t, lease, i)
		})
	}
}

// assertOnlyOwnRows writes a marker customer and order into the lease's database, then
// checks that they are the only rows besides the seed. Every worker writes before it reads,
// so of two workers sharing a database the one that reads last sees the other's marker.
func assertOnlyOwnRows(t *testing.T, lease *pglease.Database, worker int) {
	t.Helper()
	db := openURL(t, lease.URL)
	marker := fmt.Sprintf("worker-%02d", worker)
	if _, err := db.Exec(`WITH c AS (INSERT INTO customers (name) VALUES ($1) RETURNING id)
		INSERT INTO orders (customer_id, total_cents) SELECT id, $2 FROM c`, marker, worker); err != nil {
		t.Fatalf("writing the marker: %v", err)
	}
	if names := strings.Join(customerNames(t, db), ","); names != "alice,bob,"+marker {
		t.Errorf("customers: got %s, want alice,bob,%s", names, marker)
	}
	var orders, total int
	if err := db.QueryRow("SELECT count(*), coalesce(sum(total_cents), 0) FROM orders").Scan(&orders, &total); err != nil {
		t.Fatal(err)
	}
	if orders != 1 || total != worker {
		t.Errorf("orders: got %d totalling %d, want only this worker's one of %d", orders, total, worker)
	}
}
