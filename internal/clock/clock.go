// Package clock is the one clock of an Allot process: the real time,
// shifted by a fixed offset so that a whole demo or test run can live at a
// chosen instant (the first second of a month, a leap day, a year's end)
// while durations still pass at real speed.
//
// The offset comes from the environment when the process starts:
//
//   - ALLOT_CLOCK_OFFSET, a Go duration: the offset itself. A process that
//     computes its offset from an instant exports it here, so every child it
//     starts (agents, providers, test binaries) shares one timeline.
//   - ALLOT_NOW, an RFC 3339 instant: "now" is that instant when the process
//     starts (`allot dev --now` sets it).
//   - ALLOT_TEST_NOW, the same, read only by test binaries (`make test`
//     honours it).
//
// Business time (months, budgets, usage, leases, heartbeats as stored)
// comes from Now. Wall-clock measurements (durations, timeouts) and
// protocol time that other parties check against their own real clocks
// (OIDC token expiry, cookie expiry, River's scheduling) stay on time.Now.
package clock

import (
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// Environment variables the clock reads.
const (
	EnvOffset  = "ALLOT_CLOCK_OFFSET"
	EnvNow     = "ALLOT_NOW"
	EnvTestNow = "ALLOT_TEST_NOW"
)

var offset atomic.Int64

func init() {
	if err := FromEnv(); err != nil {
		// An unreadable clock setting must not silently run at the real
		// time: the process would then test or demo the wrong instant.
		fmt.Fprintf(os.Stderr, "allot: %v\n", err)
		os.Exit(2)
	}
}

// FromEnv sets the offset from the environment (see the package comment).
func FromEnv() error {
	if v := os.Getenv(EnvOffset); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%s=%q: not a duration (e.g. 2160h0m10s)", EnvOffset, v)
		}
		offset.Store(int64(d))
		return nil
	}
	name := EnvNow
	v := os.Getenv(EnvNow)
	if v == "" && testing.Testing() {
		name, v = EnvTestNow, os.Getenv(EnvTestNow)
	}
	if v == "" {
		return nil
	}
	at, err := Parse(v)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	Set(at)
	return nil
}

// Parse reads an instant in RFC 3339 (2026-12-01T00:00:30Z), with or
// without fractional seconds.
func Parse(v string) (time.Time, error) {
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not an RFC 3339 instant (e.g. 2026-12-01T00:00:30Z)", v)
	}
	return at, nil
}

// Set shifts the clock so that Now is at from this moment on, and exports
// the offset to the environment for the processes this one starts.
func Set(at time.Time) {
	SetOffset(time.Until(at))
}

// SetOffset sets the offset and exports it (ALLOT_CLOCK_OFFSET).
func SetOffset(d time.Duration) {
	offset.Store(int64(d))
	if d == 0 {
		os.Unsetenv(EnvOffset)
		return
	}
	os.Setenv(EnvOffset, d.String())
}

// Offset is how far Now is from the real time.
func Offset() time.Duration { return time.Duration(offset.Load()) }

// Shifted reports whether the clock runs at another instant than the real one.
func Shifted() bool { return offset.Load() != 0 }

// Now is the process's current time.
func Now() time.Time { return time.Now().Add(time.Duration(offset.Load())) }

// LogTime is a slog.HandlerOptions.ReplaceAttr that stamps log records
// with this clock, so a shifted process logs the instant it lives at.
func LogTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey && a.Value.Kind() == slog.KindTime {
		a.Value = slog.TimeValue(a.Value.Time().Add(Offset()))
	}
	return a
}
