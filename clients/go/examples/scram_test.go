// What lib/pq asks of a lease's login, measured with real connections rather than read
// from its source: the defaults (4096 iterations, sslmode=disable in the URL) rest on this,
// and a lib/pq upgrade that changes it turns this test red.

package examples

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	pglease "github.com/pglease/pglease/clients/go"
)

func TestLibPQRefusesFewerThan1000SCRAMIterations(t *testing.T) {
	t.Parallel()
	lease := pglease.Lease(t, pglease.Template(template))
	ctx := context.Background()

	// lib/pq asks for TLS unless told otherwise; pglease's postgres has none, and the
	// lease's URL says so.
	if !strings.HasSuffix(lease.URL, "?sslmode=disable") {
		t.Errorf("the lease URL does not say sslmode=disable: %s", lease.URL)
	}
	withoutSSLMode := strings.TrimSuffix(lease.URL, "?sslmode=disable")
	if err := pingLibPQ(withoutSSLMode); err == nil || !strings.Contains(err.Error(), "SSL is not enabled on the server") {
		t.Errorf("lib/pq without sslmode: want \"SSL is not enabled on the server\", got %v", err)
	}

	// Under --lease-auth trust no password is checked, so no verifier is either: what can be
	// measured then is the README's other advice, that lib/pq logs in whatever the count.
	if trustsLeaseRoles(t, ctx, lease) {
		setVerifier(t, ctx, lease, 16)
		if err := pingLibPQ(lease.URL); err != nil {
			t.Errorf("lib/pq under --lease-auth trust with a 16-iteration verifier: %v", err)
		}
		t.Log("the daemon runs --lease-auth trust: lib/pq's iteration floor cannot be measured on it; " +
			"checked instead that trust lets lib/pq in")
		return
	}

	// A role may set its own password, verifier included: give the lease role verifiers of
	// chosen iteration counts, as the daemon's --scram-iterations would, and log in anew.
	for _, c := range []struct {
		iterations   int
		libpqAccepts bool
	}{{1, false}, {16, false}, {999, false}, {1000, true}, {4096, true}} {
		setVerifier(t, ctx, lease, c.iterations)
		conn, err := pgx.Connect(ctx, lease.URL)
		if err != nil {
			t.Errorf("pgx with %d iterations: %v", c.iterations, err)
		} else {
			conn.Close(ctx)
		}
		err = pingLibPQ(lease.URL)
		// The helper's advice (OpenDB) matches this text.
		refused := err != nil && strings.Contains(err.Error(),
			fmt.Sprintf(`server sent an invalid SCRAM-SHA-256 iteration count: "i=%d"`, c.iterations))
		switch {
		case c.libpqAccepts && err != nil:
			t.Errorf("lib/pq with %d iterations: want a login, got %v", c.iterations, err)
		case !c.libpqAccepts && !refused:
			t.Errorf("lib/pq with %d iterations: want the iteration count refused, got %v", c.iterations, err)
		}
	}
}

// trustsLeaseRoles says whether the daemon lets lease roles in without their password
// (--lease-auth trust): a wrong password logs in.
func trustsLeaseRoles(t *testing.T, ctx context.Context, lease *pglease.Database) bool {
	t.Helper()
	config, err := pgx.ParseConfig(lease.URL)
	if err != nil {
		t.Fatal(err)
	}
	config.Password = "not-" + lease.Password
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return false
	}
	conn.Close(ctx)
	return true
}

// setVerifier gives the lease's role a SCRAM-SHA-256 verifier of its password with the given
// PBKDF2 iteration count (RFC 5802 / RFC 7677, postgres' text form).
func setVerifier(t *testing.T, ctx context.Context, lease *pglease.Database, iterations int) {
	t.Helper()
	salt := make([]byte, 16)
	rand.Read(salt)
	salted, err := pbkdf2.Key(sha256.New, lease.Password, salt, iterations, sha256.Size)
	if err != nil {
		t.Fatal(err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	verifier := fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey))

	conn, err := pgx.Connect(ctx, lease.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// ALTER ROLE takes no parameters; the verifier is base64 and '$', ':' only.
	statement := fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", pgx.Identifier{lease.User}.Sanitize(), verifier)
	if _, err := conn.Exec(ctx, statement); err != nil {
		t.Fatalf("setting a %d-iteration verifier: %v", iterations, err)
	}
}

func hmacSHA256(key []byte, message string) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(message))
	return mac.Sum(nil)
}

// pingLibPQ logs in with lib/pq on a new connection.
func pingLibPQ(url string) error {
	db, err := sql.Open("postgres", url)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Ping()
}
