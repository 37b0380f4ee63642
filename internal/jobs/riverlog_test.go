package jobs_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/jobs"
)

// TestRiverLoggerQuietUnlessDebug: River's routine info lines are dropped
// unless the process logs at debug; its warnings and its reports of failed
// jobs (which River logs at info) always come through, the latter as
// warnings.
func TestRiverLoggerQuietUnlessDebug(t *testing.T) {
	logAll := func(level slog.Level) string {
		var b bytes.Buffer
		log := jobs.RiverLogger(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: level})))
		log.Info("producer: Producer job counts", "num_jobs_running", 1)
		log.Debug("elector: Attempting to gain leadership")
		log.With("client", "c1").Info("JobExecutor: Job errored; retrying", "job_kind", "schedule")
		log.Info("JobExecutor: Job panicked", "job_kind", "billing_rollup")
		log.Warn("notifier: Listener connection lost")
		log.Error("client: Failed to fetch jobs")
		return b.String()
	}
	info := logAll(slog.LevelInfo)
	for _, want := range []string{"level=WARN msg=\"JobExecutor: Job errored; retrying\" client=c1", "level=WARN msg=\"JobExecutor: Job panicked\"", "Listener connection lost", "Failed to fetch jobs"} {
		if !strings.Contains(info, want) {
			t.Errorf("at info, missing %q:\n%s", want, info)
		}
	}
	if strings.Contains(info, "Producer job counts") || strings.Contains(info, "leadership") {
		t.Errorf("at info, River's routine lines come through:\n%s", info)
	}
	if warn := logAll(slog.LevelError); strings.Contains(warn, "Job errored") || !strings.Contains(warn, "Failed to fetch jobs") {
		t.Errorf("at error:\n%s", warn)
	}
	debug := logAll(slog.LevelDebug)
	for _, want := range []string{"level=INFO msg=\"producer: Producer job counts\"", "level=DEBUG msg=\"elector: Attempting to gain leadership\"", "level=INFO msg=\"JobExecutor: Job errored; retrying\""} {
		if !strings.Contains(debug, want) {
			t.Errorf("at debug, missing %q:\n%s", want, debug)
		}
	}
}
