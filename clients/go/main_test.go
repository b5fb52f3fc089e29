// The helper's tests run against a real pglease daemon (PGLEASE_URL) serving the template
// "app" of clients/testdata/migrations. This file checks that one is there before any test
// runs and holds the helpers the tests share; the driver examples are in ./examples.

package pglease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	pglease "github.com/pglease/pglease/clients/go"
)

// template is the template the tests lease: customers (alice, bob) and no orders.
const template = "app"

// howToRun is printed when the tests cannot find their daemon.
const howToRun = `Run them against a daemon serving the template "app", from clients/go:
  pglease serve --listen 127.0.0.1:55482 --template app=migrations:$PWD/../testdata/migrations &
  pglease ready --server http://127.0.0.1:55482 --timeout 60
  PGLEASE_URL=http://127.0.0.1:55482 go test ./...`

func TestMain(m *testing.M) {
	if err := preflight(); err != nil {
		fmt.Fprintf(os.Stderr, "pglease helper tests: %v\n%s\n", err, howToRun)
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
	db, err := daemon().Lease(ctx, pglease.LeaseRequest{Template: template, Label: "clients/go preflight"})
	if err != nil {
		return err
	}
	return daemon().Release(ctx, db.ID, pglease.ReleaseOptions{})
}

// daemon is a client of the daemon under test.
func daemon() *pglease.Client {
	return pglease.NewClient(os.Getenv("PGLEASE_URL"), os.Getenv("PGLEASE_TOKEN"))
}

// statusLease is one open lease as GET /status lists it.
type statusLease struct {
	ID       string `json:"id"`
	Template string `json:"template"`
	Database string `json:"database"`
	Label    string `json:"label"`
}

// openLeases reads the open leases from GET /status.
func openLeases(t *testing.T) map[string]statusLease {
	t.Helper()
	request, err := http.NewRequest(http.MethodGet, daemon().BaseURL+"/status", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token := os.Getenv("PGLEASE_TOKEN"); token != "" {
		request.Header.Set("Authorization", "Bearer "+token)
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	defer response.Body.Close()
	var status struct {
		Leases []statusLease `json:"leases"`
	}
	if response.StatusCode != http.StatusOK {
		t.Fatalf("GET /status answered %d", response.StatusCode)
	}
	if err := json.NewDecoder(response.Body).Decode(&status); err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	leases := make(map[string]statusLease, len(status.Leases))
	for _, lease := range status.Leases {
		leases[lease.ID] = lease
	}
	return leases
}

// assertReleased checks that the daemon no longer knows the lease: it is not in /status,
// and releasing it again answers 404 lease_not_found.
func assertReleased(t *testing.T, id string) {
	t.Helper()
	if lease, open := openLeases(t)[id]; open {
		t.Errorf("lease %s (%s, label %q) is still open after its test ended", id, lease.Database, lease.Label)
	}
	err := daemon().Release(context.Background(), id, pglease.ReleaseOptions{})
	var apiError *pglease.Error
	if !errors.As(err, &apiError) || apiError.StatusCode != http.StatusNotFound || apiError.Code != "lease_not_found" {
		t.Errorf("releasing lease %s again: want 404 lease_not_found, got %v", id, err)
	}
}

// subprocessEnv marks a run of this test binary by runSelf; the deliberately failing tests
// run only then.
const subprocessEnv = "PGLEASE_HELPER_SUBPROCESS"

// runSelf runs one test of this binary in a child process with extra environment, and
// returns its output and whether it failed. It is how a test that must fail is watched
// failing, with the real testing package's cleanup and Failed().
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

// inSubprocess says whether this is runSelf's child; other runs of the deliberately failing
// tests pass at once and say why.
func inSubprocess(t *testing.T) bool {
	if os.Getenv(subprocessEnv) == "" {
		t.Log("runs only as the child process of another test (runSelf)")
		return false
	}
	return true
}

// leaseIDIn finds the lease id a child process logged as "lease-id: ID".
func leaseIDIn(t *testing.T, output string) string {
	t.Helper()
	_, rest, found := strings.Cut(output, "lease-id: ")
	if !found || len(rest) < 32 {
		t.Fatalf("the child process logged no lease id:\n%s", output)
	}
	return rest[:32]
}
