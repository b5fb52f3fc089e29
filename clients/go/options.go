// This file owns the options of Lease and OpenDB and their defaults from the environment.
// Nothing here talks to the daemon.

package pglease

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Option changes how [Lease] and [OpenDB] lease a database.
type Option func(*settings)

// Server is the daemon's URL; default PGLEASE_URL, else DefaultURL.
func Server(url string) Option { return func(s *settings) { s.server = url } }

// Token is sent as "Authorization: Bearer <token>"; default PGLEASE_TOKEN.
func Token(token string) Option { return func(s *settings) { s.token = token } }

// Template names the template to lease a clone of; default PGLEASE_TEMPLATE, else "default".
func Template(name string) Option { return func(s *settings) { s.request.Template = name } }

// TTL is the lease's time to live (the daemon's --default-ttl, 30 minutes, when unset). The
// helper does not renew: give tests that run longer a longer TTL.
func TTL(ttl time.Duration) Option { return func(s *settings) { s.request.TTL = ttl } }

// Wait is how long the daemon may wait for a ready clone (its default: 60 s).
func Wait(wait time.Duration) Option { return func(s *settings) { s.request.Wait = wait } }

// MaxConnections is the lease role's connection limit (the daemon's --lease-connections,
// 10, when unset). Size connection pools below it.
func MaxConnections(n int) Option { return func(s *settings) { s.request.MaxConnections = n } }

// PostgresVersion ("17", "17.6") makes the lease fail at once unless the daemon runs that
// version.
func PostgresVersion(version string) Option {
	return func(s *settings) { s.request.PostgresVersion = version }
}

// Label names the lease in the daemon's /status and log; default the test's name. Control
// characters are removed and only the last 256 characters are kept.
func Label(label string) Option { return func(s *settings) { s.label = &label } }

// KeepFailed keeps the database of a failed test for the given time, as the test left it,
// and logs its URL; default PGLEASE_KEEP_FAILED (seconds). Zero turns it off. It needs a
// daemon that can keep databases; an older one drops it as usual and the helper says so.
func KeepFailed(keep time.Duration) Option { return func(s *settings) { s.keepFailed = &keep } }

// settings is everything Lease needs, once options and environment are combined.
type settings struct {
	server     string
	token      string
	request    LeaseRequest
	label      *string        // nil: the test's name
	keepFailed *time.Duration // nil: PGLEASE_KEEP_FAILED
}

// maxLabelChars is the daemon's limit on labels, in characters.
const maxLabelChars = 256

// resolve applies opts over the environment (read through getenv, so tests need not change
// the process environment). testName is the default label.
func resolve(opts []Option, testName string, getenv func(string) string) (settings, error) {
	var s settings
	for _, opt := range opts {
		opt(&s)
	}
	if s.server == "" {
		s.server = getenv("PGLEASE_URL")
	}
	if s.server == "" {
		s.server = DefaultURL
	}
	if s.token == "" {
		s.token = getenv("PGLEASE_TOKEN")
	}
	if s.request.Template == "" {
		s.request.Template = getenv("PGLEASE_TEMPLATE")
	}
	if s.request.Template == "" {
		s.request.Template = "default"
	}
	label := testName
	if s.label != nil {
		label = *s.label
	}
	s.request.Label = cleanLabel(label)
	if s.keepFailed == nil {
		keep, err := keepFromEnv(getenv("PGLEASE_KEEP_FAILED"))
		if err != nil {
			return s, err
		}
		s.keepFailed = &keep
	}
	return s, nil
}

// keepFromEnv reads PGLEASE_KEEP_FAILED: whole seconds, empty or 0 for off. A bad value is
// an error rather than ignored: someone asked to keep databases and would not get them.
func keepFromEnv(value string) (time.Duration, error) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, nil
	}
	secs, err := strconv.ParseUint(value, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("PGLEASE_KEEP_FAILED=%q: want whole seconds, such as 600", value)
	}
	return time.Duration(secs) * time.Second, nil
}

// cleanLabel makes a label the daemon accepts: no control characters, at most 256
// characters. It keeps the end, because subtest names grow at the end and their last part
// is what tells two labels apart.
func cleanLabel(label string) string {
	runes := make([]rune, 0, len(label))
	for _, r := range label {
		if !unicode.IsControl(r) {
			runes = append(runes, r)
		}
	}
	if len(runes) > maxLabelChars {
		runes = runes[len(runes)-maxLabelChars:]
	}
	return string(runes)
}
