// Tests that fail on purpose, watched from a child process (runSelf): a failed test's
// database is still released, and keeping it falls back to releasing on a daemon that cannot
// keep. Keeping itself is tested in ./examples, which can open the kept database.

package pglease_test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	pglease "github.com/pglease/pglease/clients/go"
)

// TestDeliberatelyFailing is the failing test the others run in a child process.
func TestDeliberatelyFailing(t *testing.T) {
	if !inSubprocess(t) {
		return
	}
	db := pglease.Lease(t, pglease.Template(template))
	t.Logf("lease-id: %s", db.ID)
	t.Error("deliberate failure")
}

func TestFailedTestStillReleases(t *testing.T) {
	t.Parallel()
	output, failed := runSelf(t, "TestDeliberatelyFailing", "PGLEASE_KEEP_FAILED=")
	if !failed || !strings.Contains(output, "deliberate failure") {
		t.Fatalf("the deliberately failing test did not fail:\n%s", output)
	}
	assertReleased(t, leaseIDIn(t, output))
}

func TestKeepFailedOnAnOldDaemonReleases(t *testing.T) {
	t.Parallel()
	// The real daemon behind a proxy that refuses ?keep exactly as a daemon from before
	// keeping does; whatever the daemon under test knows, this is the old one's answer.
	target, err := url.Parse(daemon().BaseURL)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	oldDaemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && r.URL.Query().Has("keep") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":{"code":"malformed_request","message":"Failed to deserialize query string: keep: unknown field ` +
				"`keep`, expected `reuse`" + `"}}`))
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(oldDaemon.Close)

	output, failed := runSelf(t, "TestDeliberatelyFailing", "PGLEASE_URL="+oldDaemon.URL, "PGLEASE_KEEP_FAILED=60")
	if !failed || !strings.Contains(output, "deliberate failure") {
		t.Fatalf("the deliberately failing test did not fail:\n%s", output)
	}
	if !strings.Contains(output, "too old to keep databases (it answered 400 malformed_request") {
		t.Errorf("the child did not say the daemon is too old to keep:\n%s", output)
	}
	if strings.Contains(output, "pglease: releasing") {
		t.Errorf("the fallback release failed:\n%s", output)
	}
	assertReleased(t, leaseIDIn(t, output))
}
