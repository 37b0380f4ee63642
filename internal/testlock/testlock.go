// Package testlock keeps the tests that measure time apart from the tests
// that load the machine. A test that asserts a figure bounded by time (a
// load test's window, timeouts under a stall) takes the lock exclusively;
// a real Slurm cluster (internal/slurmtest) holds it shared while it runs.
// So on a 2-core machine `go test ./...` never runs a timing test beside a
// set of Slurm daemons, whatever the packages' order, across test
// binaries (flock on one file; the kernel drops a dead process's lock).
package testlock

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

// Path is the lock file, shared by every test binary on the machine.
const Path = "/tmp/allot-test-load.lock"

func lock(how int) (*os.File, error) {
	f, err := os.OpenFile(Path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("testlock: %w", err)
	}
	_ = f.Chmod(0o666) // other accounts' test binaries share it
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("testlock: %w", err)
	}
	return f, nil
}

// Shared takes the lock shared (a load on the machine) and returns its
// release.
func Shared() (func(), error) {
	f, err := lock(syscall.LOCK_SH)
	if err != nil {
		return nil, err
	}
	return func() { f.Close() }, nil
}

// Exclusive waits until nothing holds the lock shared, holds it for the
// rest of t, and logs how long it waited. Call it after t.Parallel (or a
// helper that calls it): held while the test is paused, it would stop the
// package's sequential tests that start Slurm clusters.
func Exclusive(t testing.TB) {
	t.Helper()
	start := time.Now() // a stopwatch
	f, err := lock(syscall.LOCK_EX)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("testlock: waited %v for the machine's load tests (Slurm clusters) to finish", d.Round(time.Second))
	}
	t.Cleanup(func() { f.Close() })
}
