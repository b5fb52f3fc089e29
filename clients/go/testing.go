// This file owns the testing.TB side: lease for a test, release (or keep) in its cleanup, and
// fail the test with a message that says what to do. The HTTP calls are client.go's.

package pglease

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// Lease leases a database for the test and releases it when the test and its subtests end
// (t.Cleanup), whether the test passed, failed or panicked. Cleanups the test registers
// after Lease run before the release, so connections closed there close before the drop.
//
// It fails the test at once (t.Fatalf) when no database can be leased, with the daemon's
// error code and message, or with how to start a daemon when none answers.
//
// When the test has failed and KeepFailed (or PGLEASE_KEEP_FAILED) is set, the database is
// kept as the test left it and its URL logged, instead of being dropped.
func Lease(t testing.TB, opts ...Option) *Database {
	t.Helper()
	s, err := resolve(opts, t.Name(), os.Getenv)
	if err != nil {
		t.Fatalf("pglease: %v", err)
	}
	client := NewClient(s.server, s.token)
	ctx, cancel := context.WithTimeout(context.Background(), leaseTimeout(s.request.Wait))
	defer cancel()
	db, err := client.Lease(ctx, s.request)
	if err != nil {
		t.Fatalf("pglease: cannot lease a database of template %q for %s: %s%s",
			s.request.Template, t.Name(), unprefixed(err), hinted(leaseHint(err)))
	}
	keep := *s.keepFailed
	t.Cleanup(func() {
		t.Helper()
		release(t, client, db, keep)
	})
	return db
}

// OpenDB leases a database like [Lease] and opens it with database/sql's driverName ("pgx"
// for github.com/jackc/pgx/v5/stdlib, "postgres" for github.com/lib/pq; import the driver).
// It checks that a connection succeeds, so a driver that cannot log in fails the test here
// with advice, and it closes the *sql.DB before the database is released.
//
// For "postgres" (lib/pq) it adds sslmode=disable to a URL without one: lib/pq asks for
// TLS by default, which pglease's postgres does not offer. lib/pq also needs lease roles of
// at least 1000 SCRAM iterations (the default is 4096) or --lease-auth trust.
//
// With MaxConnections, the pool opens at most that many connections, the lease's limit.
func OpenDB(t testing.TB, driverName string, opts ...Option) *sql.DB {
	t.Helper()
	lease := Lease(t, opts...)
	dsn := lease.URL
	if driverName == "postgres" {
		dsn = withQuery(dsn, "sslmode", "disable")
	}
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatalf("pglease: opening database %s with driver %q: %v%s", lease.Name, driverName, err, hinted(connectHint(err)))
	}
	// Registered after Lease's release, so it runs before it.
	t.Cleanup(func() { _ = db.Close() })
	var s settings
	for _, opt := range opts {
		opt(&s)
	}
	if s.request.MaxConnections > 0 {
		db.SetMaxOpenConns(s.request.MaxConnections)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("pglease: connecting to leased database %s with driver %q: %v%s", lease.Name, driverName, err, hinted(connectHint(err)))
	}
	return db
}

// release runs in the test's cleanup: keep the database if the test failed and keeping is
// on, else drop it. A failed release fails the test: its database was gone before the end
// (TTL) or the daemon went away, and either casts doubt on what the test saw.
func release(t testing.TB, client *Client, db *Database, keep time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if keep > 0 && t.Failed() {
		err := client.Release(ctx, db.ID, ReleaseOptions{Keep: keep})
		if err == nil {
			t.Logf("pglease: %s failed: its database %s is kept as the test left it until about %s: %s",
				t.Name(), db.Name, time.Now().Add(keep).Format(time.TimeOnly), db.URL)
			return
		}
		var apiError *Error
		if !errors.As(err, &apiError) || apiError.StatusCode >= 500 || apiError.Code == "lease_not_found" {
			t.Errorf("pglease: keeping the database of %s (lease %s): %s%s", t.Name(), db.ID, unprefixed(err), hinted(releaseHint(err, db)))
			return
		}
		// A daemon without ?keep refuses the parameter (400 malformed_request): the test
		// still deserves a released database.
		t.Logf("pglease: the daemon at %s is too old to keep databases (it answered %d %s: %s); dropping %s instead",
			client.BaseURL, apiError.StatusCode, apiError.Code, apiError.Message, db.Name)
	}
	if err := client.Release(ctx, db.ID, ReleaseOptions{}); err != nil {
		t.Errorf("pglease: releasing the database of %s (lease %s): %s%s", t.Name(), db.ID, unprefixed(err), hinted(releaseHint(err, db)))
	}
}

// releaseHint explains a release the daemon did not know.
func releaseHint(err error, db *Database) string {
	var apiError *Error
	if !errors.As(err, &apiError) || apiError.Code != "lease_not_found" {
		return ""
	}
	if time.Now().After(db.ExpiresAt) {
		return "the lease expired at " + db.ExpiresAt.Format(time.RFC3339) +
			" and its database was dropped while the test ran: give it a longer pglease.TTL"
	}
	return "something else released the lease before the test ended"
}

// leaseTimeout bounds a lease request: the daemon's wait (60 s unless the request names one)
// and time for the answer to come back.
func leaseTimeout(wait time.Duration) time.Duration {
	if wait <= 0 {
		wait = 60 * time.Second
	}
	return wait + 30*time.Second
}

// withQuery sets one query parameter of a URL unless the URL already has it.
func withQuery(raw, key, value string) string {
	parsed, err := url.Parse(raw)
	if err != nil {
		return raw // the driver will say what is wrong with it
	}
	query := parsed.Query()
	if query.Has(key) {
		return raw
	}
	query.Set(key, value)
	parsed.RawQuery = query.Encode()
	return parsed.String()
}

// unprefixed is an error of this package without its "pglease: ", for messages that already
// start with one.
func unprefixed(err error) string {
	return strings.TrimPrefix(err.Error(), "pglease: ")
}

// hinted formats advice as a sentence after an error, or nothing.
func hinted(hint string) string {
	if hint == "" {
		return ""
	}
	return " — " + hint
}
