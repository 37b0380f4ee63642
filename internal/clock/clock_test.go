package clock

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The clock's settings, read the way a process reads them when it starts.
// These run in child processes: the offset is process-wide.
func TestFromEnv(t *testing.T) {
	if os.Getenv("ALLOT_CLOCK_CHILD") == "1" {
		return // the child's init already applied the setting; main reports it
	}
	for _, tt := range []struct {
		name, env, want string
		ok              bool
	}{
		{"instant", EnvNow + "=2027-03-01T00:00:20Z", "2027-03-01T00:00:2", true},
		{"test instant", EnvTestNow + "=2028-02-29T23:59:30Z", "2028-02-29T23:59:3", true},
		{"offset wins", EnvOffset + "=-24h", "", true},
		{"bad instant", EnvNow + "=yesterday", "is not an RFC 3339 instant", false},
		{"bad offset", EnvOffset + "=soon", "not a duration", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestChildReportsNow$")
			env := []string{"ALLOT_CLOCK_CHILD=1", tt.env}
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "ALLOT_CLOCK_OFFSET=") && !strings.HasPrefix(kv, "ALLOT_NOW=") && !strings.HasPrefix(kv, "ALLOT_TEST_NOW=") {
					env = append(env, kv)
				}
			}
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if tt.ok != (err == nil) || !strings.Contains(string(out), tt.want) {
				t.Errorf("%s: err %v, output %q; want ok=%v and %q", tt.env, err, out, tt.ok, tt.want)
			}
			if tt.name == "offset wins" {
				at := strings.TrimPrefix(strings.Fields(string(out))[0], "now=")
				got, perr := time.Parse(time.RFC3339Nano, at)
				if perr != nil || got.After(time.Now().Add(-23*time.Hour)) { // the real clock: the offset is against it
					t.Errorf("ALLOT_CLOCK_OFFSET=-24h: now %q", at)
				}
			}
		})
	}
}

// TestChildReportsNow prints the clock and the offset it exports (run by
// TestFromEnv in a child process).
func TestChildReportsNow(t *testing.T) {
	if os.Getenv("ALLOT_CLOCK_CHILD") != "1" {
		t.Skip("run by TestFromEnv")
	}
	os.Stdout.WriteString("now=" + Now().UTC().Format(time.RFC3339Nano) + " exported=" + os.Getenv(EnvOffset) + "\n")
}

func TestLogTimeStampsTheClock(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: LogTime}))
	log.Info("hello")
	line := buf.String()
	want := Now().UTC().Format("2006-01-02T15:04")
	if !strings.Contains(line, "time="+want) && !strings.Contains(line, "time="+Now().Format("2006-01-02T15:04")) {
		t.Errorf("log line %q, want the clock's time %s", line, want)
	}
}
