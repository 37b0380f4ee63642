package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
)

// benchStart measures job start overhead on the node: from the Start
// order to the job's first line of output (it runs `echo up` as its user
// in its cgroup, or in its container), p50 and p99 over b.N jobs, each run
// to its end before the next.
func benchStart(b *testing.B, edit func(*Config), lease func(i int) agentproto.Lease) {
	if !isRoot() {
		b.Skip("needs root")
	}
	cfg := Config{Server: "http://127.0.0.1:1", Token: "x", Hostname: "bench", Backend: NewFake(FakeOptions{GPUs: 8, Hostname: "bench"}),
		Logger: discardLogger(), StateDir: b.TempDir(), JobUser: testUser, CgroupParent: "allot-test/bench-" + strconv.Itoa(b.N)}
	if edit != nil {
		edit(&cfg)
	}
	a := New(cfg)
	inv, _ := cfg.Backend.Inventory()
	a.inv = inv
	for _, g := range inv.GPUs {
		a.gpuSet[g.Index] = true
	}
	if err := a.prepare(); err != nil {
		b.Fatal(err)
	}
	defer a.cgd.removeParent()
	var d []time.Duration
	b.ResetTimer()
	for i := range b.N {
		l := lease(i)
		r := agentproto.LeaseRef{JobID: l.JobID, Segment: l.Segment}
		a.mu.Lock()
		a.jobs[r] = &job{ref: r, lease: l, state: stateTaken}
		a.mu.Unlock()
		t0 := time.Now() // stopwatch
		a.start(r)
		out := filepath.Join(a.leasesDir(), leaseName(r), "output.log")
		for {
			if fi, err := os.Stat(out); err == nil && fi.Size() > 0 {
				break
			}
			if time.Since(t0) > time.Minute {
				b.Fatal("no output")
			}
			time.Sleep(500 * time.Microsecond)
		}
		d = append(d, time.Since(t0))
		for {
			a.mu.Lock()
			_, running := a.jobs[r]
			a.mu.Unlock()
			if !running {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(d[(len(d)*99)/100].Microseconds())/1000, "p99-ms")
}

func BenchmarkJobStartHost(b *testing.B) {
	benchStart(b, nil, func(i int) agentproto.Lease { return shLease(int64(i+1), []int{i % 8}, "echo up") })
}

func BenchmarkJobStartContainer(b *testing.B) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		b.Skip("no podman")
	}
	img := testImageTB(b, podman)
	benchStart(b, func(c *Config) { c.ContainerRuntime = "podman" }, func(i int) agentproto.Lease {
		l := shLease(int64(i+1), []int{i % 8}, "echo up")
		l.Image = img
		return l
	})
}
