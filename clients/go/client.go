// This file owns the HTTP side: one method per route the helper uses, the wire bodies, and
// turning answers into Go values or errors. It knows nothing of testing.TB (see testing.go).

package pglease

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultURL is where the daemon listens unless told otherwise (pglease serve's default).
const DefaultURL = "http://127.0.0.1:5480"

// Client talks to one pglease daemon. The zero value is not usable; use [NewClient].
type Client struct {
	// BaseURL is the daemon's address, such as "http://127.0.0.1:5480".
	BaseURL string
	// Token, when not empty, is sent as "Authorization: Bearer <token>".
	Token string
	// HTTP sends the requests. It has no overall timeout: a lease may wait for a clone as
	// long as its LeaseRequest.Wait says, so bound each call with its context instead.
	HTTP *http.Client
}

// NewClient returns a client of the daemon at baseURL (DefaultURL when empty) that sends
// token as a bearer token when it is not empty.
func NewClient(baseURL, token string) *Client {
	if baseURL == "" {
		baseURL = DefaultURL
	}
	return &Client{
		BaseURL: strings.TrimRight(baseURL, "/"),
		Token:   token,
		HTTP:    &http.Client{},
	}
}

// LeaseRequest says which database to lease. Zero fields take the daemon's defaults.
type LeaseRequest struct {
	// Template names the template to clone ("default" when empty).
	Template string
	// TTL is how long the lease lives unless renewed or released; rounded up to whole seconds.
	TTL time.Duration
	// Wait is how long the daemon may wait for a ready clone before answering 504.
	Wait time.Duration
	// MaxConnections is the lease role's connection limit.
	MaxConnections int
	// PostgresVersion ("17", "17.6") makes a daemon serving another version refuse at once.
	PostgresVersion string
	// Label names the lease in the daemon's /status and log (at most 256 characters, no
	// control characters; the daemon refuses others).
	Label string
}

// Database is a leased database: how to connect to it and which lease holds it.
type Database struct {
	// ID is the lease id, for Release and Renew.
	ID string
	// Template is the template the database is a clone of; Fingerprint its version.
	Template    string
	Fingerprint string
	// Name is the database's name; User and Password open it and nothing else.
	Name     string
	Host     string
	Port     int
	User     string
	Password string
	// URL is a postgresql:// URL with all of the above, as the daemon wrote it (with
	// sslmode=disable where the server has no SSL).
	URL string
	// ExpiresAt is when the daemon drops the database unless the lease is renewed.
	ExpiresAt time.Time
}

// ReleaseOptions say what happens to a released database. The zero value drops it.
type ReleaseOptions struct {
	// Reuse says the holder changed nothing, so the daemon may hand the database out again
	// as it is instead of dropping it.
	Reuse bool
	// Keep, when positive, keeps the database as it is (and openable with the lease's URL)
	// for this long, rounded up to whole seconds, so a failure can be inspected. It needs a
	// daemon that knows DELETE /leases/{id}?keep=SECS; older ones answer 400.
	Keep time.Duration
}

// KeptDatabase is a database the daemon keeps after a release with ReleaseOptions.Keep.
type KeptDatabase struct {
	ID        string    `json:"id"`
	Template  string    `json:"template"`
	Database  string    `json:"database"`
	Label     string    `json:"label"`
	URL       string    `json:"url"`
	KeptAt    time.Time `json:"kept_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// leaseBody is POST /lease's body; omitted fields take the daemon's defaults.
type leaseBody struct {
	Template        string `json:"template,omitempty"`
	TTLSecs         int64  `json:"ttl_secs,omitempty"`
	WaitMS          int64  `json:"wait_ms,omitempty"`
	MaxConnections  int    `json:"max_connections,omitempty"`
	PostgresVersion string `json:"postgres_version,omitempty"`
	Label           string `json:"label,omitempty"`
}

// leaseAnswer is POST /lease's 201 body.
type leaseAnswer struct {
	ID          string    `json:"id"`
	Template    string    `json:"template"`
	Fingerprint string    `json:"fingerprint"`
	Database    string    `json:"database"`
	Host        string    `json:"host"`
	Port        int       `json:"port"`
	User        string    `json:"user"`
	Password    string    `json:"password"`
	URL         string    `json:"url"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// Lease leases a database. The context bounds the whole call, including the daemon's wait
// for a clone: give it more time than req.Wait.
func (c *Client) Lease(ctx context.Context, req LeaseRequest) (*Database, error) {
	body := leaseBody{
		Template:        req.Template,
		TTLSecs:         ceilUnits(req.TTL, time.Second),
		WaitMS:          ceilUnits(req.Wait, time.Millisecond),
		MaxConnections:  req.MaxConnections,
		PostgresVersion: req.PostgresVersion,
		Label:           req.Label,
	}
	var answer leaseAnswer
	if err := c.do(ctx, http.MethodPost, "/lease", body, http.StatusCreated, &answer); err != nil {
		return nil, err
	}
	return &Database{
		ID:          answer.ID,
		Template:    answer.Template,
		Fingerprint: answer.Fingerprint,
		Name:        answer.Database,
		Host:        answer.Host,
		Port:        answer.Port,
		User:        answer.User,
		Password:    answer.Password,
		URL:         answer.URL,
		ExpiresAt:   answer.ExpiresAt,
	}, nil
}

// Release gives a leased database back: dropped (the default), recycled (Reuse) or kept for
// inspection (Keep). An unknown or expired lease is an *Error with code lease_not_found.
func (c *Client) Release(ctx context.Context, id string, opts ReleaseOptions) error {
	if opts.Reuse && opts.Keep > 0 {
		return fmt.Errorf("pglease: releasing lease %s: Reuse and Keep exclude each other", id)
	}
	query := url.Values{}
	if opts.Reuse {
		query.Set("reuse", "true")
	}
	if opts.Keep > 0 {
		query.Set("keep", strconv.FormatInt(ceilUnits(opts.Keep, time.Second), 10))
	}
	path := "/leases/" + url.PathEscape(id)
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	return c.do(ctx, http.MethodDelete, path, nil, http.StatusNoContent, nil)
}

// Renew extends a lease to ttl from now (the daemon's default TTL when ttl is zero) and
// returns its new expiry.
func (c *Client) Renew(ctx context.Context, id string, ttl time.Duration) (time.Time, error) {
	body := struct {
		TTLSecs int64 `json:"ttl_secs,omitempty"`
	}{ceilUnits(ttl, time.Second)}
	var answer struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	path := "/leases/" + url.PathEscape(id) + "/renew"
	if err := c.do(ctx, http.MethodPost, path, body, http.StatusOK, &answer); err != nil {
		return time.Time{}, err
	}
	return answer.ExpiresAt, nil
}

// Kept lists the databases the daemon keeps after releases with ReleaseOptions.Keep.
func (c *Client) Kept(ctx context.Context) ([]KeptDatabase, error) {
	var answer struct {
		Kept []KeptDatabase `json:"kept"`
	}
	if err := c.do(ctx, http.MethodGet, "/kept", nil, http.StatusOK, &answer); err != nil {
		return nil, err
	}
	return answer.Kept, nil
}

// do sends one request and decodes a `want` answer into out (when not nil); any other answer
// becomes an *Error, and a daemon that cannot be reached an *UnreachableError.
func (c *Client) do(ctx context.Context, method, path string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		encoded, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("pglease: encoding the body of %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(encoded)
	}
	request, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return fmt.Errorf("pglease: %s %s%s: %w", method, c.BaseURL, path, err)
	}
	if in != nil {
		request.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		request.Header.Set("Authorization", "Bearer "+c.Token)
	}
	response, err := c.HTTP.Do(request)
	if err != nil {
		return requestError(c.BaseURL, method, path, err)
	}
	defer response.Body.Close()
	// Answers are small; the cap only keeps a wrong server from feeding us forever.
	raw, err := io.ReadAll(io.LimitReader(response.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("pglease: reading the answer to %s %s%s: %w", method, c.BaseURL, path, err)
	}
	if response.StatusCode != want {
		return answerError(c.BaseURL, method, path, response.StatusCode, raw)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("pglease: %s %s%s answered %d with a body that is not what pglease sends (%v): %s",
			method, c.BaseURL, path, response.StatusCode, err, snippet(raw))
	}
	return nil
}

// ceilUnits converts d to whole units, rounding up so that a small positive duration does
// not become 0 (which the wire format reads as "the daemon's default").
func ceilUnits(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}
