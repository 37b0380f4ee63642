package sim

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/scheduler"
)

func TestProbe(t *testing.T) {
	if os.Getenv("PROBE") == "" {
		t.Skip()
	}
	f, _ := os.Open("../../../../shared/traces/philly.csv")
	all, _ := ReadTrace(f)
	tf, _ := os.Open("../../../../shared/traces/philly-vcs.csv")
	teams, _ := ReadTeams(tf)
	tr := Prepare(all, Window{Start: secs(3456000), End: secs(4665600), Set: true}, "", 19)
	p := scheduler.DefaultPolicy()
	p.StarvationWait = 20 * time.Minute
	last := time.Duration(-1)
	stats := map[string]int{}
	defer func() {
		for k, v := range stats {
			fmt.Println("preempt", k, v)
		}
	}()
	sched := func(s scheduler.Snapshot, now time.Time, pol scheduler.Policy) scheduler.Plan {
		plan := scheduler.Schedule(s, now, pol)
		if len(plan.Preemptions) > 0 {
			byID := map[int64]scheduler.Job{}
			for _, j := range s.Pending {
				byID[j.ID] = j
			}
			for _, pr := range plan.Preemptions {
				j := byID[pr.By]
				stats[fmt.Sprintf("tier%d gpus%d %s", j.Tier, j.GPUs, j.Team)]++
			}
		}
		if os.Getenv("PROBE") != "2" {
			return plan
		}
		v := now.Sub(Epoch)
		if v/(2000*time.Second) != last/(2000*time.Second) {
			last = v
			used := make([]int, len(s.Nodes))
			maxEnd := make([]time.Duration, len(s.Nodes))
			for _, r := range s.Running {
				e := r.Start.Add(r.TimeLimit).Sub(now)
				for _, sl := range r.Placement {
					used[sl.Node] += len(sl.GPUs)
					maxEnd[sl.Node] = max(maxEnd[sl.Node], e)
				}
			}
			var ends, acts []float64
			actEnd := make([]time.Duration, len(s.Nodes))
			for _, r := range s.Running {
				e := r.Start.Add(r.TimeLimit / 2).Sub(now)
				for _, sl := range r.Placement {
					actEnd[sl.Node] = max(actEnd[sl.Node], e)
				}
			}
			for n := range maxEnd {
				ends = append(ends, maxEnd[n].Hours())
				acts = append(acts, actEnd[n].Hours())
			}
			slices.Sort(ends)
			slices.Sort(acts)
			fmt.Printf("   R_n hours (limit) min/5th/10th/25th: %.1f %.1f %.1f %.1f  actual: %.1f %.1f %.1f %.1f\n", ends[0], ends[len(ends)/20], ends[len(ends)/10], ends[len(ends)/4], acts[0], acts[len(acts)/20], acts[len(acts)/10], acts[len(acts)/4])
			wf, long := 0, 0
			for n := range used {
				if used[n] == 0 {
					wf++
				}
				if maxEnd[n] > 24*time.Hour {
					long++
				}
			}
			wide, oldest := 0, time.Duration(0)
			var starving int
			for _, j := range s.Pending {
				if j.GPUs >= 8 {
					wide++
					oldest = max(oldest, now.Sub(j.Submit))
				}
				if now.Sub(j.Submit) > time.Hour {
					starving++
				}
			}
			busy := 0
			for _, u := range used {
				busy += u
			}
			fmt.Printf("t=%6.0f busy=%4d wholefree=%3d nodes_end>24h=%3d pending=%5d starving=%4d wide=%3d oldestwide=%6.0f resv=%d\n",
				v.Seconds(), busy, wf, long, len(s.Pending), starving, wide, oldest.Seconds(), len(plan.Reservations))
		}
		return plan
	}
	_, err := Run(Config{Nodes: 352, GPUsPerNode: 8, DomainNodes: 32, Teams: teams, Policy: p, Cycle: 10 * time.Second,
		WalltimeFactor: 2, CheckpointFraction: 0.5, CheckpointInterval: 30 * time.Minute, Schedule: sched, Seed: 1}, tr)
	if err != nil {
		t.Fatal(err)
	}
}
