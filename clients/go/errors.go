// This file owns the errors the client returns and the advice added to them: a test that
// cannot get a database should say why and what to do, not just "connection refused".

package pglease

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"unicode/utf8"
)

// Error is an answer of the daemon other than the expected success: its HTTP status and the
// code and message of its JSON error body ({"error": {"code", "message"}}).
type Error struct {
	// Method and URL are the request that failed.
	Method string
	URL    string
	// StatusCode is the HTTP status, such as 404.
	StatusCode int
	// Code is the daemon's error code, such as "unknown_template" or "timeout"; empty when
	// the body was not pglease's error JSON (then Message holds the start of the body).
	Code string
	// Message is the daemon's explanation.
	Message string
}

func (e *Error) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("pglease: %s %s answered %d, not as a pglease daemon would: %s",
			e.Method, e.URL, e.StatusCode, e.Message)
	}
	return fmt.Sprintf("pglease: %s %s answered %d %s: %s", e.Method, e.URL, e.StatusCode, e.Code, e.Message)
}

// UnreachableError means no daemon answered at URL: nothing listens there, or the name does
// not resolve.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("pglease: no daemon answers at %s (%v); start one with "+
		"`pglease serve --template NAME=migrations:DIR` and wait for it with `pglease ready`, "+
		"or set PGLEASE_URL to the address of a running one", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// requestError explains a request that got no answer at all.
func requestError(baseURL, method, path string, err error) error {
	var opError *net.OpError
	var dnsError *net.DNSError
	// The network error alone: the *url.Error around it would repeat the URL.
	if errors.As(err, &opError) && opError.Op == "dial" {
		return &UnreachableError{URL: baseURL, Err: opError}
	}
	if errors.As(err, &dnsError) {
		return &UnreachableError{URL: baseURL, Err: dnsError}
	}
	return fmt.Errorf("pglease: %s %s%s: %w", method, baseURL, path, err)
}

// answerError turns an unexpected answer into an *Error.
func answerError(baseURL, method, path string, status int, raw []byte) *Error {
	result := &Error{Method: method, URL: baseURL + path, StatusCode: status}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil && body.Error.Code != "" {
		result.Code = body.Error.Code
		result.Message = body.Error.Message
	} else {
		// Something else answers there (another service, a proxy's error page).
		result.Message = snippet(raw)
	}
	return result
}

// snippet is the start of a body, for error messages.
func snippet(raw []byte) string {
	const max = 200
	text := strings.TrimSpace(string(raw))
	if text == "" {
		return "(empty body)"
	}
	if len(text) <= max {
		return text
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut] + "…"
}

// leaseHint is advice for a failed lease, by what the daemon said; empty when the error
// speaks for itself.
func leaseHint(err error) string {
	var apiError *Error
	if !errors.As(err, &apiError) {
		return ""
	}
	switch apiError.Code {
	case "unknown_template":
		// The daemon's own message says how to define the template (since 0.1.0); an older
		// one's does not, and then the hint says it, once either way.
		if strings.Contains(apiError.Message, "--template") {
			return "or lease another with pglease.Template / PGLEASE_TEMPLATE"
		}
		return "start the daemon with --template NAME=migrations:DIR (or register it with PUT /templates/NAME), " +
			"or lease another with pglease.Template / PGLEASE_TEMPLATE"
	case "unauthorized":
		return "the daemon has a token: set PGLEASE_TOKEN (or pglease.Token) to it"
	case "timeout":
		return "no clone was ready in time: raise pglease.Wait, or the daemon's --max-total / --min-ready"
	}
	return ""
}

// connectHint is advice for a database/sql connection to a lease that failed, by the
// driver's message; empty when there is none.
func connectHint(err error) string {
	text := err.Error()
	switch {
	case strings.Contains(text, "SCRAM-SHA-256 iteration count"):
		// lib/pq checks that the count has at least four digits (scram.go, len("i=NNNN") >= 6):
		// it refuses anything below 1000, and pglease's lease roles use 16 by default.
		return "lib/pq refuses SCRAM iteration counts below 1000: start the daemon with " +
			"--scram-iterations 4096 (or --lease-auth trust), or use pgx (driver \"pgx\", github.com/jackc/pgx/v5/stdlib)"
	case strings.Contains(text, "SSL is not enabled on the server"):
		return "pglease's postgres has no TLS: add sslmode=disable to the URL"
	case strings.Contains(text, "unknown driver"):
		return "import the driver for its side effect, e.g. _ \"github.com/jackc/pgx/v5/stdlib\" (\"pgx\") " +
			"or _ \"github.com/lib/pq\" (\"postgres\")"
	}
	return ""
}
