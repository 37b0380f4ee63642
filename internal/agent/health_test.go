package agent

import (
	"bytes"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
)

func writeFile(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// lastHB returns the newest heartbeat the peer got.
func (p *peer) lastHB() agentproto.Heartbeat {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.hbs) == 0 {
		return agentproto.Heartbeat{}
	}
	return p.hbs[len(p.hbs)-1]
}

func gpuOf(hb agentproto.Heartbeat, i int) *agentproto.GPUMetrics {
	for k := range hb.GPUs {
		if hb.GPUs[k].Index == i {
			return &hb.GPUs[k]
		}
	}
	return nil
}

// Faults written to the fake backend's fault file reach the server at the
// next heartbeat: ECC totals, a missing GPU, and each XID exactly once.
func TestFaultFileReachesHeartbeats(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	faults := filepath.Join(t.TempDir(), "faults.json")
	startAgent(t, p, func(c *Config) {
		c.Backend = NewFake(FakeOptions{GPUs: 4, Hostname: "node-a", FaultFile: faults})
	})
	p.waitFor("a healthy heartbeat", 5*time.Second, func() bool { return len(p.hbs) > 0 })
	if hb := p.lastHB(); len(hb.GPUs) != 4 || gpuOf(hb, 1).ECCDoubleVol != 0 || len(gpuOf(hb, 2).XIDs) != 0 {
		t.Fatalf("healthy heartbeat = %+v", hb.GPUs)
	}
	writeFile(t, faults, `{"gpus":[{"index":1,"ecc_dbe":2},{"index":2,"xids":[79,48]},{"index":3,"missing":true},{"index":0,"throttle":64}]}`, 0o644)
	var hit int
	p.waitFor("the faults", 5*time.Second, func() bool {
		for i, hb := range p.hbs {
			if g := gpuOf(hb, 2); g != nil && len(g.XIDs) > 0 {
				hit = i
				return true
			}
		}
		return false
	})
	p.mu.Lock()
	hb := p.hbs[hit]
	p.mu.Unlock()
	if len(hb.GPUs) != 3 || gpuOf(hb, 3) != nil || gpuOf(hb, 1).ECCDoubleVol != 2 || !slices.Equal(gpuOf(hb, 2).XIDs, []int{79, 48}) ||
		gpuOf(hb, 2).LastXID != 48 || gpuOf(hb, 0).ThrottleReasons != 64 {
		t.Fatalf("faulty heartbeat = %+v", hb.GPUs)
	}
	// Delivered XIDs are not sent again; a new one is sent alone.
	p.waitFor("two more heartbeats", 5*time.Second, func() bool { return len(p.hbs) > hit+2 })
	if g := gpuOf(p.lastHB(), 2); len(g.XIDs) != 0 || g.XIDErrors != 2 {
		t.Errorf("XIDs sent again: %+v", g)
	}
	writeFile(t, faults, `{"gpus":[{"index":1,"ecc_dbe":2},{"index":2,"xids":[79,48,94]}]}`, 0o644)
	p.waitFor("XID 94", 5*time.Second, func() bool {
		g := gpuOf(p.hbs[len(p.hbs)-1], 2)
		return g != nil && len(g.XIDs) > 0
	})
	if hb := p.lastHB(); !slices.Equal(gpuOf(hb, 2).XIDs, []int{94}) || len(hb.GPUs) != 4 {
		t.Errorf("after XID 94: %+v", hb.GPUs)
	}
	// Removing the file clears the ECC total (a reset GPU) but not history.
	os.Remove(faults) //nolint:errcheck
	p.waitFor("cleared", 5*time.Second, func() bool { return gpuOf(p.hbs[len(p.hbs)-1], 1).ECCDoubleVol == 0 })
}

// A failing --health-cmd is reported with its output until it passes.
func TestHealthCmdFailureIsReported(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	check := filepath.Join(t.TempDir(), "check")
	writeFile(t, check, "#!/bin/sh\necho 'GPU 2: row remapping pending' >&2\nexit 2\n", 0o755)
	ta := startAgent(t, p, func(c *Config) { c.HealthCmd, c.HealthInterval = check, 100*time.Millisecond })
	p.waitFor("unhealthy heartbeat", 5*time.Second, func() bool { return len(p.hbs) > 0 && p.hbs[len(p.hbs)-1].Health != "" })
	if h := p.lastHB().Health; h != "exit status 2: GPU 2: row remapping pending" {
		t.Errorf("health = %q", h)
	}
	rec := httptest.NewRecorder()
	ta.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `allot_agent_health_check_failed{Hostname="node-a"} 1`) {
		t.Errorf("metrics lack the failed health check")
	}
	writeFile(t, check, "#!/bin/sh\nexit 0\n", 0o755)
	p.waitFor("healthy again", 5*time.Second, func() bool { return p.hbs[len(p.hbs)-1].Health == "" })
}

func TestRunHealthCheckTimesOutAndTruncates(t *testing.T) {
	dir := t.TempDir()
	slow := filepath.Join(dir, "slow")
	writeFile(t, slow, "#!/bin/sh\necho started\nexec sleep 30\n", 0o755)
	start := time.Now() // stopwatch
	if got := runHealthCheck(t.Context(), slow, 200*time.Millisecond); !strings.HasPrefix(got, "timed out after 200ms") || time.Since(start) > 5*time.Second {
		t.Errorf("slow check = %q after %v", got, time.Since(start))
	}
	loud := filepath.Join(dir, "loud")
	writeFile(t, loud, "#!/bin/sh\nhead -c 100000 /dev/zero | tr '\\0' x\necho END\nexit 1\n", 0o755)
	if got := runHealthCheck(t.Context(), loud, 5*time.Second); len(got) > maxHealthOutput+64 || !strings.HasSuffix(got, "END") {
		t.Errorf("loud check: %d bytes, ends %q", len(got), got[max(0, len(got)-10):])
	}
	if got := runHealthCheck(t.Context(), filepath.Join(dir, "missing"), time.Second); !strings.Contains(got, "no such file") {
		t.Errorf("missing check = %q", got)
	}
}

func TestMainRejectsBadHealthFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--server", "http://a", "--token", "t", "--health-cmd", "/nonexistent/check"}, "is not an executable file"},
		{[]string{"--server", "http://a", "--token", "t", "--health-interval", "0s"}, "--health-interval must be positive"},
		{[]string{"--server", "http://a", "--token", "t", "--fake-faults", "/tmp/f.json"}, "--fake-faults needs --gpu fake"},
	} {
		var out, errb bytes.Buffer
		if code := Main(tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("Main(%q) = %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
