// Unit tests of what needs no daemon: options over the environment, labels, durations on
// the wire, URLs.

package pglease

import (
	"strings"
	"testing"
	"time"
)

func TestResolveDefaults(t *testing.T) {
	s, err := resolve(nil, "TestX/sub", func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if s.server != DefaultURL || s.token != "" || s.request.Template != "default" ||
		s.request.Label != "TestX/sub" || *s.keepFailed != 0 {
		t.Errorf("defaults: %+v keep %v", s, *s.keepFailed)
	}
}

func TestResolveEnvironmentThenOptions(t *testing.T) {
	env := map[string]string{
		"PGLEASE_URL":         "http://pglease:5480",
		"PGLEASE_TOKEN":       "secret",
		"PGLEASE_TEMPLATE":    "app",
		"PGLEASE_KEEP_FAILED": "600",
	}
	getenv := func(key string) string { return env[key] }
	s, err := resolve(nil, "TestX", getenv)
	if err != nil {
		t.Fatal(err)
	}
	if s.server != "http://pglease:5480" || s.token != "secret" || s.request.Template != "app" || *s.keepFailed != 10*time.Minute {
		t.Errorf("from the environment: %+v keep %v", s, *s.keepFailed)
	}
	s, err = resolve([]Option{
		Server("http://other:1"), Token("t2"), Template("billing"), KeepFailed(0), Label("mine"),
		TTL(time.Minute), Wait(time.Second), MaxConnections(3), PostgresVersion("17"),
	}, "TestX", getenv)
	if err != nil {
		t.Fatal(err)
	}
	want := LeaseRequest{Template: "billing", TTL: time.Minute, Wait: time.Second, MaxConnections: 3, PostgresVersion: "17", Label: "mine"}
	if s.server != "http://other:1" || s.token != "t2" || s.request != want || *s.keepFailed != 0 {
		t.Errorf("options win: %+v keep %v", s, *s.keepFailed)
	}
}

func TestKeepFromEnvRefusesWhatIsNotSeconds(t *testing.T) {
	for _, value := range []string{"10m", "-5", "1.5", "forever"} {
		if _, err := keepFromEnv(value); err == nil || !strings.Contains(err.Error(), "PGLEASE_KEEP_FAILED") {
			t.Errorf("PGLEASE_KEEP_FAILED=%q: want an error naming the variable, got %v", value, err)
		}
	}
	for value, want := range map[string]time.Duration{"": 0, "0": 0, " 30 ": 30 * time.Second} {
		if got, err := keepFromEnv(value); err != nil || got != want {
			t.Errorf("PGLEASE_KEEP_FAILED=%q: got %v, %v; want %v", value, got, err, want)
		}
	}
}

func TestCleanLabel(t *testing.T) {
	long := strings.Repeat("a", 300) + "é/last"
	cases := map[string]string{
		"TestOrders/refund":     "TestOrders/refund",
		"tab\there\nnew\x7fdel": "tabherenewdel",
		"c1\u0085control":       "c1control",
		long:                    long[len(long)-257:], // 256 characters; é is two bytes
	}
	for in, want := range cases {
		if got := cleanLabel(in); got != want {
			t.Errorf("cleanLabel(%q) = %q, want %q", in, got, want)
		}
	}
	if n := len([]rune(cleanLabel(long))); n != maxLabelChars {
		t.Errorf("a long label keeps %d characters, want %d", n, maxLabelChars)
	}
}

func TestCeilUnits(t *testing.T) {
	cases := []struct {
		d, unit time.Duration
		want    int64
	}{
		{0, time.Second, 0},
		{-time.Second, time.Second, 0},
		{time.Millisecond, time.Second, 1}, // not 0, which would mean "the default"
		{90 * time.Second, time.Second, 90},
		{1500 * time.Microsecond, time.Millisecond, 2},
	}
	for _, c := range cases {
		if got := ceilUnits(c.d, c.unit); got != c.want {
			t.Errorf("ceilUnits(%v, %v) = %d, want %d", c.d, c.unit, got, c.want)
		}
	}
}

func TestWithQuery(t *testing.T) {
	base := "postgres://u:p@127.0.0.1:5433/db"
	if got := withQuery(base, "sslmode", "disable"); got != base+"?sslmode=disable" {
		t.Errorf("got %q", got)
	}
	if got := withQuery(base+"?sslmode=require", "sslmode", "disable"); got != base+"?sslmode=require" {
		t.Errorf("an explicit sslmode was changed: %q", got)
	}
}
