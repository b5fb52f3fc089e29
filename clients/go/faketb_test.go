// A stand-in testing.TB for the tests that must read the helper's failure messages: a real
// *testing.T would fail the test that checks them. It fakes the testing package only; the
// daemon behind it is real.

package pglease_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// fakeTB records what the helper reports. Methods it does not override belong to the nil
// embedded TB and panic, which shows a call the tests did not expect.
type fakeTB struct {
	testing.TB
	name string

	mu       sync.Mutex
	failed   bool
	fatal    string
	errors   []string
	logs     []string
	cleanups []func()
}

func (f *fakeTB) Helper()      {}
func (f *fakeTB) Name() string { return f.name }

func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.failed = true
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit() // as testing.T.FailNow does: nothing after Fatalf runs
}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = true
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Logf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

// runFake runs body as a test named name on its own goroutine (Fatalf ends it with
// runtime.Goexit, as in a real test), then the cleanups last-registered first.
func runFake(name string, body func(tb testing.TB)) *fakeTB {
	f := &fakeTB{name: name}
	done := make(chan struct{})
	go func() {
		defer close(done)
		body(f)
	}()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f
}
