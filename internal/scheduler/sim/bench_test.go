package sim

import (
	"os"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/scheduler"
)

// BenchmarkSim replays the shared slice traces (all jobs, on the cluster of
// their teams file or 32 nodes × 8 GPUs) under each policy with the real
// core: go test -bench Sim ./internal/scheduler/sim
func BenchmarkSim(b *testing.B) {
	for _, c := range []struct{ trace, teams string }{
		{"philly-slice.csv", "philly-vcs.csv"},
		{"msft-itp-2021-slice.csv", "msft-itp-2021-clusters.csv"},
	} {
		f, err := os.Open(needTrace(b, c.trace))
		if err != nil {
			b.Fatal(err)
		}
		trace, err := ReadTrace(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		g, err := os.Open(needTrace(b, c.teams))
		if err != nil {
			b.Fatal(err)
		}
		teams, err := ReadTeams(g)
		g.Close()
		if err != nil {
			b.Fatal(err)
		}
		total := 0
		for _, t := range teams {
			total += t.GPUs
		}
		for _, m := range []scheduler.Mode{scheduler.ModeAllot, scheduler.ModeEASY, scheduler.ModeFIFO, scheduler.ModeFIFOPartitioned} {
			b.Run(c.trace+"/"+string(m), func(b *testing.B) {
				cfg := Config{Nodes: total / 8, GPUsPerNode: 8, DomainNodes: 32, Teams: teams, Policy: policy(m),
					Cycle: 10 * time.Second, WalltimeFactor: 2, CheckpointFraction: 0.5}
				var cycles int
				for b.Loop() {
					r, err := Run(cfg, trace)
					if err != nil {
						b.Fatal(err)
					}
					cycles = r.Cycles
				}
				b.ReportMetric(float64(len(trace)), "jobs")
				b.ReportMetric(float64(cycles), "cycles")
			})
		}
	}
}
