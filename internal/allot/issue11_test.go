package allot_test

import (
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// TestParseDurationUnitsOnceLargestFirst: every unit at most once, largest
// first; a repeated or out-of-order unit is refused with a message that
// says so, not added up ("1h1h" was 2h).
func TestParseDurationUnitsOnceLargestFirst(t *testing.T) {
	t.Parallel()
	good := []struct {
		in   string
		want time.Duration
	}{
		{"4h", 4 * time.Hour},
		{"90m", 90 * time.Minute},
		{"1h30m", 90 * time.Minute},
		{"1d12h", 36 * time.Hour},
		{"2d", 48 * time.Hour},
		{"1d2h3m4s", 24*time.Hour + 2*time.Hour + 3*time.Minute + 4*time.Second},
		{"1.5h", 90 * time.Minute},
		{".5m", 30 * time.Second},
		{"1d0.5h", 24*time.Hour + 30*time.Minute},
		{"1s500ms", 1500 * time.Millisecond},
		{"3600", time.Hour},
		{"0", 0},
		{"0s", 0},
		{" 10m ", 10 * time.Minute},
		{"-5m", -5 * time.Minute}, // callers refuse negatives with their own message
		{"2h45m30s", 2*time.Hour + 45*time.Minute + 30*time.Second},
	}
	for _, tt := range good {
		if got, err := allot.ParseDuration(tt.in); err != nil || got != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	bad := []struct{ in, msg string }{
		{"1h1h", `the unit "h" appears twice`},
		{"1d1d", `the unit "d" appears twice`},
		{"30m30m", `the unit "m" appears twice`},
		{"1h30m1h", `"h" comes after a smaller unit`},
		{"30m1h", `"h" comes after a smaller unit`},
		{"10s1m", `"m" comes after a smaller unit`},
		{"1h1d", `"d" comes after a smaller unit`},
		{"", "empty duration"},
		{"soon", "use e.g. 4h"},
		{"4x", "use e.g. 4h"},
		{"h", "use e.g. 4h"},
		{"1.2.3h", "use e.g. 4h"},
		{"1h30", "use e.g. 4h"},
		{"1 h", "use e.g. 4h"},
		{"99999999999999d", "too long"},
		{"9223372036854775807", "too long"},
	}
	for _, tt := range bad {
		_, err := allot.ParseDuration(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("ParseDuration(%q) = %v, want an error containing %q", tt.in, err, tt.msg)
		}
	}
	// What FormatDuration prints parses back to the same duration.
	for _, d := range []time.Duration{time.Second, 90 * time.Minute, 49*time.Hour + 61*time.Second, 30 * 24 * time.Hour} {
		if got, err := allot.ParseDuration(allot.FormatDuration(d)); err != nil || got != d {
			t.Errorf("round trip of %v via %q: %v, %v", d, allot.FormatDuration(d), got, err)
		}
	}
}

// TestOnlyWrittenJobStates: the states offered as filters are the ones a
// job is ever in; preempted and lost jobs are requeued (running → pending)
// or fail, in one transaction.
func TestOnlyWrittenJobStates(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"preempted", "lost"} {
		if _, ok := allot.ParseJobState(s); ok {
			t.Errorf("state %q is accepted, but no job is ever in it", s)
		}
	}
	var names []string
	for _, s := range allot.JobStates {
		names = append(names, string(s))
	}
	if got := strings.Join(names, ","); got != "pending,running,completed,failed,cancelled" {
		t.Errorf("JobStates = %s", got)
	}
	if !allot.CanTransition(allot.JobRunning, allot.JobPending) {
		t.Error("a requeue (running → pending) must be a legal transition")
	}
}

// TestQuotaWarningTense: the submission-time warning is reworded for the
// job's state: never "will run" once the job has ended.
func TestQuotaWarningTense(t *testing.T) {
	t.Parallel()
	spec := allot.JobSpec{Tier: "3", GPUs: 8, TimeLimit: 4 * time.Hour}
	w := allot.CheckQuota(&spec, 100, 200*3600).Warning
	if !strings.HasSuffix(w, "this job will run as preemptible") {
		t.Fatalf("warning %q", w)
	}
	cases := []struct {
		state         allot.JobState
		ran           bool
		want, notWant string
	}{
		{allot.JobPending, false, "this job will run as preemptible", ""},
		{allot.JobRunning, true, "this job runs as preemptible", "will run"},
		{allot.JobCompleted, true, "At submission: Budget exceeded by 100.0 h; so it ran as preemptible", "will run"},
		{allot.JobFailed, true, "so it ran as preemptible", "will run"},
		{allot.JobCancelled, false, "so it was to run as preemptible (it never started)", "will run"},
	}
	for _, c := range cases {
		got := allot.QuotaWarningAt(w, c.state, c.ran)
		if !strings.Contains(got, c.want) || c.notWant != "" && strings.Contains(got, c.notWant) {
			t.Errorf("%s: %q, want %q without %q", c.state, got, c.want, c.notWant)
		}
	}
	prod := allot.JobSpec{Tier: "1", GPUs: 8, TimeLimit: 4 * time.Hour}
	pw := allot.CheckQuota(&prod, 100, 200*3600).Warning
	if got := allot.QuotaWarningAt(pw, allot.JobCompleted, true); !strings.Contains(got, "so it kept its priority") || strings.Contains(got, "keeps") {
		t.Errorf("production, ended: %q", got)
	}
	if allot.QuotaWarningAt("", allot.JobCompleted, true) != "" {
		t.Error("no warning stays no warning")
	}
}
