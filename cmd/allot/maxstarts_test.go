package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestWorkerMaxStartsFlag: bad values of allot worker's
// --max-starts-per-cycle are refused before anything starts.
func TestWorkerMaxStartsFlag(t *testing.T) {
	for _, v := range []string{"0", "-2", "many"} {
		var stderr bytes.Buffer
		code := run([]string{"worker", "--database-url", "postgres://127.0.0.1:1/none", "--max-starts-per-cycle", v}, &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "max-starts-per-cycle") {
			t.Errorf("--max-starts-per-cycle %s: exit %d, %q", v, code, stderr.String())
		}
	}
}

// TestWorkerDecayPeriodFlag: bad values of allot worker's --decay-period
// are refused before anything starts.
func TestWorkerDecayPeriodFlag(t *testing.T) {
	for v, want := range map[string]string{"-1m": "--decay-period must be 0 (every cycle) or more, not -1m0s", "often": "invalid value"} {
		var stderr bytes.Buffer
		code := run([]string{"worker", "--database-url", "postgres://127.0.0.1:1/none", "--decay-period", v}, &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("--decay-period %s: exit %d, %q", v, code, stderr.String())
		}
	}
}

// TestWorkerMinCycleIntervalFlag: bad values of allot worker's
// --min-cycle-interval are refused before anything starts.
func TestWorkerMinCycleIntervalFlag(t *testing.T) {
	for v, want := range map[string]string{"-1s": "--min-cycle-interval must be 0 (none) to 10s, not -1s", "11s": "to 10s, not 11s", "soon": "invalid value"} {
		var stderr bytes.Buffer
		code := run([]string{"worker", "--database-url", "postgres://127.0.0.1:1/none", "--min-cycle-interval", v}, &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("--min-cycle-interval %s: exit %d, %q", v, code, stderr.String())
		}
	}
}

// TestWorkerCycleDutyFlag: bad values of allot worker's --cycle-duty are
// refused before anything starts.
func TestWorkerCycleDutyFlag(t *testing.T) {
	for v, want := range map[string]string{"0": "--cycle-duty must be more than 0 and at most 1 (no pause), not 0", "1.5": "not 1.5", "-0.5": "not -0.5", "NaN": "not NaN", "half": "invalid value"} {
		var stderr bytes.Buffer
		code := run([]string{"worker", "--database-url", "postgres://127.0.0.1:1/none", "--cycle-duty", v}, &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("--cycle-duty %s: exit %d, %q", v, code, stderr.String())
		}
	}
}
