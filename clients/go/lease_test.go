// Leasing and releasing through the testing.TB helper and the Client, against the daemon:
// what a lease holds, that it is released when its test ends, its label, and the errors a
// test sees when it cannot get a database.

package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	pglease "github.com/pglease/pglease/clients/go"
)

func TestLeaseGivesConnectionDetails(t *testing.T) {
	t.Parallel()
	db := pglease.Lease(t, pglease.Template(template))
	if db.Template != template {
		t.Errorf("template: got %q, want %q", db.Template, template)
	}
	for field, value := range map[string]string{
		"ID": db.ID, "Name": db.Name, "Host": db.Host, "User": db.User,
		"Password": db.Password, "URL": db.URL, "Fingerprint": db.Fingerprint,
	} {
		if value == "" {
			t.Errorf("%s is empty", field)
		}
	}
	if db.Port <= 0 {
		t.Errorf("port: got %d", db.Port)
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatalf("URL %q: %v", db.URL, err)
	}
	password, _ := u.User.Password()
	if u.Scheme != "postgresql" || u.Path != "/"+db.Name || u.User.Username() != db.User || password != db.Password {
		t.Errorf("URL %q does not name database %s as user %s", db.URL, db.Name, db.User)
	}
	// lib/pq requires SSL unless told; pglease's postgres has none.
	if u.Query().Get("sslmode") != "disable" {
		t.Errorf("URL %q does not say sslmode=disable", db.URL)
	}
	if until := time.Until(db.ExpiresAt); until <= 0 || until > 24*time.Hour {
		t.Errorf("expires at %s: not within a day from now", db.ExpiresAt)
	}
}

func TestLeaseIsReleasedWhenItsTestEnds(t *testing.T) {
	t.Parallel()
	var ids []string
	// The subtests' cleanups have run when t.Run returns.
	t.Run("plain", func(t *testing.T) {
		db := pglease.Lease(t, pglease.Template(template))
		ids = append(ids, db.ID)
		if _, open := openLeases(t)[db.ID]; !open {
			t.Errorf("lease %s is not in /status while its test runs", db.ID)
		}
	})
	t.Run("keep_failed_but_passed", func(t *testing.T) {
		// Keeping is for failed tests: a passing one is dropped as usual.
		db := pglease.Lease(t, pglease.Template(template), pglease.KeepFailed(time.Minute))
		ids = append(ids, db.ID)
	})
	t.Run("open_db", func(t *testing.T) {
		// No driver in this module: opening fails, and the lease must be released anyway.
		// Its label is this run's own, so that leases left by other runs do not count.
		label := fmt.Sprintf("%s@%d", t.Name(), time.Now().UnixNano())
		f := runFake(t.Name(), func(tb testing.TB) {
			pglease.OpenDB(tb, "no-such-driver", pglease.Template(template), pglease.Label(label))
		})
		if !strings.Contains(f.fatal, `unknown driver "no-such-driver"`) || !strings.Contains(f.fatal, "import the driver") {
			t.Errorf("OpenDB with an unknown driver: want the driver named and advice, got %q", f.fatal)
		}
		leased := false
		for _, lease := range openLeases(t) {
			leased = leased || lease.Label == label
		}
		if leased {
			t.Errorf("the lease of a failed OpenDB is still open")
		}
	})
	for _, id := range ids {
		assertReleased(t, id)
	}
}

func TestLabelIsTheTestNameInStatus(t *testing.T) {
	t.Parallel()
	db := pglease.Lease(t, pglease.Template(template))
	lease, open := openLeases(t)[db.ID]
	if !open {
		t.Fatalf("lease %s is not in /status while its test runs", db.ID)
	}
	if lease.Label != t.Name() {
		t.Errorf("label: got %q, want the test's name %q", lease.Label, t.Name())
	}
	if lease.Database != db.Name || lease.Template != template {
		t.Errorf("/status lists %+v for lease %+v", lease, db)
	}
}

func TestLabelIsCleanedForTheDaemon(t *testing.T) {
	t.Parallel()
	// The daemon refuses labels over 256 characters or with control characters (422): the
	// helper drops control characters and keeps the end, where subtest names differ.
	given := "start\t" + strings.Repeat("x", 300) + "\nend"
	db := pglease.Lease(t, pglease.Template(template), pglease.Label(given))
	label := openLeases(t)[db.ID].Label
	want := strings.Repeat("x", 253) + "end"
	if label != want {
		t.Errorf("label in /status: got %q (%d characters), want %q", label, len(label), want)
	}
}

func TestRenewMovesTheExpiry(t *testing.T) {
	t.Parallel()
	db := pglease.Lease(t, pglease.Template(template), pglease.TTL(10*time.Minute))
	if until := time.Until(db.ExpiresAt); until > 11*time.Minute {
		t.Errorf("a 10-minute lease expires in %s", until)
	}
	expires, err := daemon().Renew(context.Background(), db.ID, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if until := time.Until(expires); until < 119*time.Minute || until > 121*time.Minute {
		t.Errorf("renewed for 2 hours, expires in %s", until)
	}
}

func TestUnknownTemplateIsAClearError(t *testing.T) {
	t.Parallel()
	_, err := daemon().Lease(context.Background(), pglease.LeaseRequest{Template: "no_such_template"})
	var apiError *pglease.Error
	if !errors.As(err, &apiError) {
		t.Fatalf("want a *pglease.Error, got %T: %v", err, err)
	}
	if apiError.StatusCode != http.StatusNotFound || apiError.Code != "unknown_template" ||
		!strings.Contains(apiError.Message, "no_such_template") {
		t.Errorf("want 404 unknown_template naming the template, got %+v", apiError)
	}

	// What a test sees: the code, the message, and what to do.
	f := runFake("TestOrders", func(tb testing.TB) {
		pglease.Lease(tb, pglease.Template("no_such_template"))
		tb.Errorf("Lease returned after failing")
	})
	for _, want := range []string{`template "no_such_template" for TestOrders`, "404 unknown_template", `unknown template "no_such_template"`, "--template no_such_template=migrations:DIR", "pglease.Template"} {
		if !strings.Contains(f.fatal, want) {
			t.Errorf("Fatalf message lacks %q:\n%s", want, f.fatal)
		}
	}
	// How to define a template is said once: by the daemon, not again by the helper.
	if n := strings.Count(f.fatal, "--template "); n != 1 {
		t.Errorf("Fatalf message says --template %d times, want once:\n%s", n, f.fatal)
	}
	if len(f.errors) > 0 || len(f.cleanups) > 0 {
		t.Errorf("after a failed lease: errors %q, %d cleanups (want none)", f.errors, len(f.cleanups))
	}
}

func TestNoDaemonIsAClearError(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: bound, then closed.
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := "http://" + listener.Addr().String()
	listener.Close()

	_, err = pglease.NewClient(nowhere, "").Lease(context.Background(), pglease.LeaseRequest{})
	var unreachable *pglease.UnreachableError
	if !errors.As(err, &unreachable) || unreachable.URL != nowhere {
		t.Fatalf("want an *UnreachableError for %s, got %T: %v", nowhere, err, err)
	}
	f := runFake("TestOrders", func(tb testing.TB) {
		pglease.Lease(tb, pglease.Server(nowhere))
	})
	for _, want := range []string{"no daemon answers at " + nowhere, "connection refused", "pglease serve", "PGLEASE_URL"} {
		if !strings.Contains(f.fatal, want) {
			t.Errorf("Fatalf message lacks %q:\n%s", want, f.fatal)
		}
	}
}

func TestSomethingElseAnsweringIsAClearError(t *testing.T) {
	t.Parallel()
	// The daemon's own 404 for a route it lacks is pglease JSON; a non-pglease server's is
	// not, and the error should show what came back instead of a JSON decoding error.
	server := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "<html>502 Bad Gateway</html>", http.StatusBadGateway)
	})}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go server.Serve(listener)
	t.Cleanup(func() { server.Close() })
	_, err = pglease.NewClient("http://"+listener.Addr().String(), "").Lease(context.Background(), pglease.LeaseRequest{})
	var apiError *pglease.Error
	if !errors.As(err, &apiError) || apiError.StatusCode != http.StatusBadGateway || apiError.Code != "" ||
		!strings.Contains(err.Error(), "not as a pglease daemon would: <html>502 Bad Gateway</html>") {
		t.Errorf("want a 502 shown as not pglease's, got %v", err)
	}
}
