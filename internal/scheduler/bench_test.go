package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchSnapshot builds a busy cluster of nodes×8 GPUs (32 nodes per
// interconnect domain, a tenth of them in the cloud) about 95 % allocated,
// with pending jobs of a Philly-like mix of sizes (mostly 1 GPU, some up to
// 64), tiers 1:1, 2:4, 3:45, 4:50 and 5 % preemptible, over 20 teams whose
// guarantees add up to the cluster.
func benchSnapshot(pending, nodes int) Snapshot {
	r := rand.New(rand.NewPCG(uint64(pending), uint64(nodes)))
	const teams = 20
	var s Snapshot
	for i := range nodes {
		site := SiteOnPrem
		if i%10 == 9 {
			site = SiteCloud
		}
		s.Nodes = append(s.Nodes, Node{Name: fmt.Sprintf("n%05d", i), GPUType: "A100", GPUs: 8, Site: site, Domain: fmt.Sprintf("d%03d", i/32), State: NodeUp})
	}
	for t := range teams {
		s.Teams = append(s.Teams, Team{
			Name:       fmt.Sprintf("team%02d", t),
			Weight:     float64(nodes * 8 / teams),
			Guarantee:  map[string]int{"": nodes * 8 / teams},
			Usage:      r.Float64() * 1e9,
			OverBudget: t == 7,
		})
	}
	size := func() int {
		x := r.Float64()
		switch {
		case x < 0.80:
			return 1
		case x < 0.87:
			return 2
		case x < 0.93:
			return 4
		case x < 0.98:
			return 8
		case x < 0.995:
			return 16
		default:
			return 64
		}
	}
	tierOf := func() Tier {
		x := r.IntN(100)
		switch {
		case x < 1:
			return Tier1
		case x < 5:
			return Tier2
		case x < 50:
			return Tier3
		default:
			return Tier4
		}
	}
	now := t0
	id := int64(1)
	// Fill nodes: whole-node jobs on some, packed small jobs on others.
	for n := range nodes {
		free := 8
		if n%50 == 0 {
			free = 0 // a few wholly free nodes? no: keep 2% partially free below
		}
		used := 0
		for used < 8 {
			g := min(size(), 8-used)
			if n%20 == 0 && used >= 6 {
				break // leave some GPUs free
			}
			tr := tierOf()
			j := Job{
				ID: id, Team: s.Teams[r.IntN(teams)].Name, Tier: tr, RunAs: tr, GPUs: g,
				TimeLimit: time.Duration(1+r.IntN(48)) * time.Hour,
				Start:     now.Add(-time.Duration(r.IntN(24*60)) * time.Minute),
				Placement: []Slot{{Node: n, GPUs: seq(used, g)}},
			}
			j.Submit = j.Start.Add(-time.Hour)
			s.Running = append(s.Running, j)
			id++
			used += g
		}
		_ = free
	}
	for range pending {
		j := Job{
			ID: id, Team: s.Teams[r.IntN(teams)].Name, Tier: tierOf(), GPUs: size(),
			TimeLimit:   time.Duration(1+r.IntN(24)) * time.Hour,
			Submit:      now.Add(-time.Duration(r.IntN(3*24*60)) * time.Minute),
			Preemptible: r.IntN(20) == 0,
		}
		s.Pending = append(s.Pending, j)
		id++
	}
	return s
}

func BenchmarkSchedule(b *testing.B) {
	allotMF := DefaultPolicy()
	allotMF.Order, allotMF.StarvationWait = OrderMultifactor, 20*time.Minute
	easy := DefaultPolicy()
	easy.Mode = ModeEASY
	// The start forecast's cost: allot with the earlier estimate.
	allotLim := DefaultPolicy()
	allotLim.ETA = ETALimits
	// allot-remembered: cycles 10 s apart that keep an OrderMemory, as the
	// worker and the simulator do (the first cycle sorts without one).
	variants := []struct {
		name     string
		p        Policy
		remember bool
	}{{"allot", DefaultPolicy(), false}, {"allot-multifactor", allotMF, false}, {"easy", easy, false}, {"allot-eta-limits", allotLim, false}, {"allot-remembered", DefaultPolicy(), true}}
	for _, c := range []struct{ pending, nodes int }{{1000, 100}, {10000, 1000}, {50000, 10000}, {100000, 20000}} {
		s := benchSnapshot(c.pending, c.nodes)
		for _, v := range variants {
			b.Run(fmt.Sprintf("%s/pending=%d/nodes=%d", v.name, c.pending, c.nodes), func(b *testing.B) {
				var plan Plan
				s, now := s, t0
				if v.remember {
					s.Order = new(OrderMemory)
				}
				for b.Loop() {
					plan = Schedule(s, now, v.p)
					if v.remember {
						now = now.Add(10 * time.Second)
					}
				}
				b.ReportMetric(float64(len(plan.Starts)), "starts")
				b.ReportMetric(float64(len(plan.Preemptions)), "preemptions")
				b.ReportMetric(float64(len(plan.Reservations)), "reservations")
			})
		}
	}
}
