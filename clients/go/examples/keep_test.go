// Keeping a failed test's database (PGLEASE_KEEP_FAILED / pglease.KeepFailed). This needs a
// daemon with DELETE /leases/{id}?keep=SECS and GET /kept; against an older one it fails
// saying so. (The helper's fallback on such a daemon is tested in the parent module.)

package examples

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	pglease "github.com/pglease/pglease/clients/go"
)

// keptMarker is what the failing test leaves in its database.
const keptMarker = "left-by-the-failed-test"

// TestDeliberatelyFailingKept is the failing test TestKeepFailedKeepsTheDatabase runs in a
// child process with PGLEASE_KEEP_FAILED set.
func TestDeliberatelyFailingKept(t *testing.T) {
	if os.Getenv(subprocessEnv) == "" {
		t.Log("runs only as the child process of TestKeepFailedKeepsTheDatabase")
		return
	}
	lease := pglease.Lease(t, pglease.Template(template))
	if _, err := openURL(t, lease.URL).Exec("INSERT INTO customers (name) VALUES ($1)", keptMarker); err != nil {
		t.Fatal(err)
	}
	t.Logf("lease-id: %s", lease.ID)
	t.Error("deliberate failure")
}

// keptLog is the helper's line about a kept database; the URL is its last word.
var keptLog = regexp.MustCompile(`lease-id: ([0-9a-f]{32})(?s:.*)failed: its database \S+ is kept as the test left it until about \S+: (postgresql://\S+)`)

func TestKeepFailedKeepsTheDatabase(t *testing.T) {
	t.Parallel()
	const keep = 90 * time.Second
	output, failed := runSelf(t, "TestDeliberatelyFailingKept", "PGLEASE_KEEP_FAILED=90")
	if !failed || !strings.Contains(output, "deliberate failure") {
		t.Fatalf("the deliberately failing test did not fail:\n%s", output)
	}
	if strings.Contains(output, "too old to keep databases") {
		t.Fatalf("this test needs a daemon that keeps databases (DELETE /leases/{id}?keep=SECS, GET /kept); "+
			"the one at %s is older:\n%s", daemon().BaseURL, output)
	}
	match := keptLog.FindStringSubmatch(output)
	if match == nil {
		t.Fatalf("the child logged no kept database URL:\n%s", output)
	}
	id, url := match[1], match[2]

	kept, err := daemon().Kept(context.Background())
	if err != nil {
		t.Fatalf("GET /kept: %v", err)
	}
	var found *pglease.KeptDatabase
	for i := range kept {
		if kept[i].ID == id {
			found = &kept[i]
		}
	}
	if found == nil {
		t.Fatalf("lease %s is not in GET /kept: %+v", id, kept)
	}
	if found.Label != "TestDeliberatelyFailingKept" || found.Template != template || found.URL != url {
		t.Errorf("GET /kept lists %+v; want label TestDeliberatelyFailingKept, template %s, URL %s", *found, template, url)
	}
	if held := found.ExpiresAt.Sub(found.KeptAt); held < keep-2*time.Second || held > keep+2*time.Second {
		t.Errorf("kept from %s to %s: want %s", found.KeptAt, found.ExpiresAt, keep)
	}

	// Openable with the lease's URL, as the test left it.
	if names := strings.Join(customerNames(t, openURL(t, url)), ","); names != "alice,bob,"+keptMarker {
		t.Errorf("the kept database's customers: got %s, want alice,bob,%s", names, keptMarker)
	}
}
