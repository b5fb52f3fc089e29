// Package pglease leases throw-away, pre-migrated PostgreSQL databases from a pglease daemon
// for Go tests, and gives them back when the test ends.
//
// In a test:
//
//	func TestOrders(t *testing.T) {
//		t.Parallel()
//		db := pglease.OpenDB(t, "pgx", pglease.Template("app")) // *sql.DB, closed and released in t.Cleanup
//		// ... use db
//	}
//
// [Lease] returns the connection details ([Database]) for any driver; [OpenDB] opens them
// with database/sql. Both fail the test with the daemon's own error when no database can be
// leased, and release the database in t.Cleanup — also when the test fails or panics.
// [Client] is the same HTTP API without a testing.TB, for code outside tests.
//
// The daemon is found through the environment, so CI configures every suite in one place:
//
//	PGLEASE_URL          the daemon (default http://127.0.0.1:5480)
//	PGLEASE_TOKEN        sent as "Authorization: Bearer <token>" when set
//	PGLEASE_TEMPLATE     template leased when the test names none (default "default")
//	PGLEASE_KEEP_FAILED  seconds to keep the database of a failed test for inspection
//
// Options given to [Lease] win over the environment.
//
// Go's lib/pq refuses SCRAM iteration counts below 1000: pglease's lease roles use 4096 by
// default, and a daemon started with a lower --scram-iterations serves lib/pq only with
// --lease-auth trust. pgx accepts any count. lib/pq also asks for TLS by default, which
// pglease's postgres does not offer: the lease's URL says sslmode=disable, and [OpenDB]
// adds it for lib/pq to a URL without one.
package pglease
