package sim

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/scheduler"
)

// burstTrace: one 8-GPU node and twelve 8-GPU one-hour jobs at t = 0: the
// queue (88 GPU-h behind the first job) passes the burst thresholds once
// its mean wait passes 2 h.
func burstTrace() []TraceJob {
	var tr []TraceJob
	for i := range 12 {
		tr = append(tr, tj("j"+string(rune('a'+i)), 0, 3600, 8, "a"))
	}
	return tr
}

func burstCfg(b *BurstConfig) Config {
	return Config{Nodes: 1, GPUsPerNode: 8, Policy: policy(scheduler.ModeAllot), Schedule: scheduler.Schedule, WalltimeFactor: 1,
		TierMix: []TierWeight{{Tier: scheduler.Tier3, Weight: 1}}, Burst: b}
}

func TestBurstReplay(t *testing.T) {
	t.Parallel()
	rate := allot.Money{Micros: 1_400_000, Currency: "USD"}
	th := burst.FromPolicy(allot.DefaultPolicy()) // 50 GPU-h, 2 h, 20 GPU-h, 4 nodes
	bc := &BurstConfig{Shape: burst.Shape{GPUType: "A100-spot", GPUs: 8, Rate: rate}, Thresholds: th, Delay: 5 * time.Minute}
	without := run(t, burstCfg(nil), burstTrace())
	with := run(t, burstCfg(bc), burstTrace())
	b := with.Burst
	if b == nil || without.Burst != nil {
		t.Fatalf("burst results: with %+v, without %+v", with.Burst, without.Burst)
	}
	// At the first tick after 2 h (t = 7260 s: the mean wait must exceed
	// 2 h), 9 jobs (72 GPU-h) are pending: ceil(72 / 32) = 3 nodes, up 5
	// minutes later.
	if b.Requests != 1 || b.Nodes != 3 || b.MaxAlive != 3 {
		t.Fatalf("burst %+v, want one request for 3 nodes", b)
	}
	if with.WaitMeanS >= without.WaitMeanS || with.MakespanS >= without.MakespanS {
		t.Fatalf("mean wait %v with burst, %v without; makespan %v, %v", with.WaitMeanS, without.WaitMeanS, with.MakespanS, without.MakespanS)
	}
	// Cost: exactly the nodes' GPU-seconds at the rate.
	gpuSec := int64(b.GPUHours*3600 + 0.5)
	want, err := burst.GPUSecondsCost(gpuSec, rate)
	if err != nil {
		t.Fatal(err)
	}
	if b.Cost != want.String() || b.GPUHours <= 0 {
		t.Fatalf("cost %s for %.4f GPU-h, want %s", b.Cost, b.GPUHours, want)
	}
	// Idle burst nodes are released once the queue is short.
	if b.Releases == 0 {
		t.Fatalf("no release: %+v", b)
	}
	// Burst off (0 nodes): the same as without.
	off := *bc
	off.Thresholds.MaxNodes = 0
	if r := run(t, burstCfg(&off), burstTrace()); r.WaitMeanS != without.WaitMeanS || r.Burst.Nodes != 0 {
		t.Fatalf("burst with 0 nodes changed the replay: %+v", r.Burst)
	}
	// Baselines are not modelled with burst.
	cfg := burstCfg(bc)
	cfg.Policy = policy(scheduler.ModeEASY)
	if _, err := Run(cfg, burstTrace()); err == nil {
		t.Fatal("burst with a baseline policy ran")
	}
}

func TestBurstCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.csv")
	var b strings.Builder
	b.WriteString("job_id,submit_s,duration_s,gpus,user,team,status\n")
	for i := range 12 {
		b.WriteString("j" + string(rune('a'+i)) + ",0,3600,8,u,a,Pass\n")
	}
	if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "r.json")
	var stdout, stderr bytes.Buffer
	code := Main([]string{"--trace", trace, "--nodes", "1", "--domain-nodes", "0", "--walltime-factor", "1", "--tier-mix", "3:1",
		"--policy", "allot", "--burst", "--burst-delay", "5m", "--burst-rate", "1.40", "--json", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "| allot+burst |") || !strings.Contains(stdout.String(), "burst GPU-hours") {
		t.Fatalf("table:\n%s", stdout.String())
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]Result
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	r := res["allot+burst"].Burst
	if r == nil || r.Nodes != 3 || !strings.HasSuffix(r.Cost, " USD") || r.WaitMeanSavedS <= 0 ||
		r.WaitMeanSavedS != res["allot"].WaitMeanS-res["allot+burst"].WaitMeanS {
		t.Fatalf("JSON burst %+v", r)
	}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--policy", "easy", "--burst"}, "--policy must include allot"},
		{[]string{"--burst", "--burst-gpus", "0"}, "--burst-gpus"},
		{[]string{"--burst", "--burst-rate", "x"}, "bad flags"},
		{[]string{"--burst", "--burst-max-nodes", "-1"}, "--burst-max-nodes"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(append([]string{"--trace", trace, "--nodes", "1"}, c.args...), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), c.msg) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr.String(), c.msg)
		}
	}
}
