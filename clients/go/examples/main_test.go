// The examples run against a real pglease daemon (PGLEASE_URL) serving the template "app"
// of clients/testdata/migrations, with lease roles lib/pq can log in as. This file checks
// that one is there before any test runs and holds what the tests share.

package examples

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"

	pglease "github.com/pglease/pglease/clients/go"
)

// template is the template the examples lease: customers alice and bob, no orders.
const template = "app"

// howToRun is printed when the examples cannot find their daemon.
const howToRun = `Run them against a daemon serving the template "app", from clients/go/examples:
  pglease serve --listen 127.0.0.1:55482 --template app=migrations:$PWD/../../testdata/migrations &
  pglease ready --server http://127.0.0.1:55482 --timeout 60
  PGLEASE_URL=http://127.0.0.1:55482 go test ./...
(lib/pq refuses --scram-iterations under 1000, see TestLibPQRefusesFewerThan1000SCRAMIterations.)`

func TestMain(m *testing.M) {
	if err := preflight(); err != nil {
		fmt.Fprintf(os.Stderr, "pglease examples: %v\n%s\n", err, howToRun)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// preflight leases and releases one database, so that a missing daemon or template is one
// clear message instead of every test failing with it.
func preflight() error {
	if os.Getenv("PGLEASE_URL") == "" {
		return errors.New("PGLEASE_URL is not set; these tests need a real daemon and skip nothing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	db, err := daemon().Lease(ctx, pglease.LeaseRequest{Template: template, Label: "clients/go/examples preflight"})
	if err != nil {
		return err
	}
	return daemon().Release(ctx, db.ID, pglease.ReleaseOptions{})
}

// daemon is a client of the daemon under test.
func daemon() *pglease.Client {
	return pglease.NewClient(os.Getenv("PGLEASE_URL"), os.Getenv("PGLEASE_TOKEN"))
}

// openURL opens a lease's URL with pgx's database/sql driver, closed when the test ends
// (before the release, when the lease was taken first).
func openURL(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// customerNames lists the customers, in the order they were added.
func customerNames(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query("SELECT name FROM customers ORDER BY id")
	if err != nil {
		t.Fatalf("listing customers: %v", err)
	}
	defer rows.Close()
	var names []string
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
	return names
}

// assertFresh checks the template's seed: alice and bob, and no orders.
func assertFresh(t *testing.T, db *sql.DB) {
	t.Helper()
	if names := strings.Join(customerNames(t, db), ","); names != "alice,bob" {
		t.Errorf("customers: got %s, want alice,bob", names)
	}
	var orders int
	if err := db.QueryRow("SELECT count(*) FROM orders").Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if orders != 0 {
		t.Errorf("a fresh database has %d orders", orders)
	}
}

// subprocessEnv marks a run of this test binary by runSelf; the deliberately failing tests
// run only then.
const subprocessEnv = "PGLEASE_EXAMPLES_SUBPROCESS"

// runSelf runs one test of this binary in a child process with extra environment and
// returns its output and whether it failed: a test that must fail, watched failing.
func runSelf(t *testing.T, test string, env ...string) (output string, failed bool) {
	t.Helper()
	command := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	command.Env = append(append(os.Environ(), subprocessEnv+"=1"), env...)
	out, err := command.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running %s in a child process: %v", test, err)
	}
	return string(out), err != nil
}
