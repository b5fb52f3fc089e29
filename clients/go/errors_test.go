// Unit tests of the advice added to errors, with the texts the drivers and the daemon really
// send (the driver texts are pinned by clients/go/examples' scram_test.go).

package pglease

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConnectHint(t *testing.T) {
	cases := map[string]string{
		`pq: SCRAM-SHA-256 error: server sent an invalid SCRAM-SHA-256 iteration count: "i=16"`:  "--scram-iterations 4096",
		`pq: SSL is not enabled on the server`:                                                   "sslmode=disable",
		`sql: unknown driver "pgx" (forgotten import?)`:                                          `_ "github.com/jackc/pgx/v5/stdlib"`,
		`failed to connect to host=127.0.0.1: server error (FATAL: database "x" does not exist)`: "",
	}
	for text, want := range cases {
		hint := connectHint(errors.New(text))
		if (want == "") != (hint == "") || !strings.Contains(hint, want) {
			t.Errorf("connectHint(%q) = %q, want it to mention %q", text, hint, want)
		}
	}
}

func TestAnswerError(t *testing.T) {
	err := answerError("http://d", "POST", "/lease", 504,
		[]byte(`{"error":{"code":"timeout","message":"no database of \"app\" became ready within 100 ms"}}`))
	if err.Code != "timeout" || err.StatusCode != 504 || !strings.Contains(err.Message, "within 100 ms") {
		t.Errorf("decoded %+v", err)
	}
	if want := `pglease: POST http://d/lease answered 504 timeout: no database of "app" became ready within 100 ms`; err.Error() != want {
		t.Errorf("got  %s\nwant %s", err.Error(), want)
	}
	if hint := leaseHint(err); !strings.Contains(hint, "pglease.Wait") {
		t.Errorf("a timeout's hint: %q", hint)
	}
	long := answerError("http://d", "GET", "/kept", 404, []byte(strings.Repeat("é", 300)))
	if long.Code != "" || len([]rune(long.Message)) > 101 || !strings.HasSuffix(long.Message, "…") {
		t.Errorf("a long non-pglease body: %+v", long)
	}
}

func TestReleaseHint(t *testing.T) {
	gone := &Error{StatusCode: 404, Code: "lease_not_found"}
	expired := &Database{ExpiresAt: time.Now().Add(-time.Minute)}
	if hint := releaseHint(gone, expired); !strings.Contains(hint, "longer pglease.TTL") {
		t.Errorf("an expired lease's hint: %q", hint)
	}
	if hint := releaseHint(gone, &Database{ExpiresAt: time.Now().Add(time.Hour)}); !strings.Contains(hint, "something else released") {
		t.Errorf("a lease released elsewhere: %q", hint)
	}
}
