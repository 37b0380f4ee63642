package sim

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/scheduler"
)

// sharedTraces is where the shared traces live relative to this package.
var sharedTraces = filepath.Join("..", "..", "..", "..", "shared", "traces")

// needTrace returns the path of a shared trace or skips the test.
func needTrace(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(sharedTraces, name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared trace %s not available (%v); skipping", name, err)
	}
	return p
}

// loadedWindow is the loaded Philly window: --window 3456000:4665600
// --time-scale 19, guarantees from philly-vcs.csv, 8 GPUs per node.
func loadedWindow(t testing.TB) ([]TraceJob, []TeamSpec) {
	t.Helper()
	f, err := os.Open(needTrace(t, "philly.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, err := ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	g, err := os.Open(needTrace(t, "philly-vcs.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	teams, err := ReadTeams(g)
	if err != nil {
		t.Fatal(err)
	}
	w := Window{Start: 3456000 * time.Second, End: 4665600 * time.Second, Set: true}
	return Prepare(all, w, "", 19), teams
}

// TestCrossCheckReference replays the loaded window with the test-local
// reference baselines and compares with the independent reference's figures
// (mean wait fifo 10,159 s, easy 662 s, p95 1,712 s, fifo-partitioned
// 24,944 s, utilization_span easy 0.768), with the test-local reference
// baselines (which checks the simulator: event order, windowing, scaling)
// and with the real core. It takes about a minute, so it runs only with
// ALLOT_SIM_CROSSCHECK=1.
func TestCrossCheckReference(t *testing.T) {
	if os.Getenv("ALLOT_SIM_CROSSCHECK") == "" {
		t.Skip("long replay; set ALLOT_SIM_CROSSCHECK=1 to run it")
	}
	trace, teams := loadedWindow(t)
	for _, sc := range []struct {
		name  string
		sched ScheduleFunc
	}{{"ref", refSchedule}, {"core", scheduler.Schedule}} {
		for _, c := range []struct {
			mode      scheduler.Mode
			wait, p95 float64
			util      float64
		}{
			{scheduler.ModeFIFO, 10159, 0, 0},
			{scheduler.ModeEASY, 662, 1712, 0.768},
			{scheduler.ModeFIFOPartitioned, 24944, 0, 0},
		} {
			t.Run(sc.name+"/"+string(c.mode), func(t *testing.T) {
				t.Parallel()
				p := scheduler.DefaultPolicy()
				p.Mode = c.mode
				r, err := Run(Config{Nodes: 352, GPUsPerNode: 8, Teams: teams, Policy: p, WalltimeFactor: 2, Schedule: sc.sched}, trace)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s: jobs %d dropped %d wait mean %.0f p95 %.0f util_span %.3f load_span %.3f jain %.3f cycles %d wall %.2fs",
					c.mode, r.Jobs, r.Dropped, r.WaitMeanS, r.WaitP95S, r.UtilizationSpan, r.OfferedLoadSpan, r.JainFairness, r.Cycles, r.SimWallS)
				within := func(name string, got, want float64) {
					if want != 0 && (got < want*0.95 || got > want*1.05) {
						t.Errorf("%s = %.3f, reference %.3f: off by more than 5%%", name, got, want)
					}
				}
				within("wait_mean_s", r.WaitMeanS, c.wait)
				within("wait_p95_s", r.WaitP95S, c.p95)
				within("utilization_span", r.UtilizationSpan, c.util)
			})
		}
	}
}
