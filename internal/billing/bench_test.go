package billing

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// monthOfCluster is one month (720 h from 2026-03-01) of a 1,000-GPU
// cluster kept full: 125 nodes × 8 GPUs, each node in lanes of 4, 2, 1 and 1
// GPUs, 200 back-to-back jobs per lane: 100,000 jobs, 720,000 GPU-hours.
// One job in ten is preempted (half of them checkpointable).
func monthOfCluster() []Segment {
	r := rand.New(rand.NewPCG(1, 2))
	start := at("2026-03-01T00:00:00Z")
	span := int64(720 * 3600)
	segs := make([]Segment, 0, 100_000)
	job := int64(0)
	for node := 0; node < 125; node++ {
		for _, gpus := range []int{4, 2, 1, 1} {
			cuts := make([]int64, 0, 201)
			cuts = append(cuts, 0)
			for range 199 {
				cuts = append(cuts, r.Int64N(span))
			}
			slices.Sort(cuts)
			cuts = append(cuts, span)
			for i := 0; i+1 < len(cuts); i++ {
				job++
				s := Segment{
					JobID: job, Segment: 1, Team: teams[r.IntN(3)], User: users[r.IntN(3)],
					TierAsRun: allot.Tiers[r.IntN(len(allot.Tiers))], GPUType: []string{"H100", "A100"}[node%2],
					Node: "n", GPUs: gpus,
					Start: start.Add(time.Duration(cuts[i]) * time.Second), End: start.Add(time.Duration(cuts[i+1]) * time.Second),
				}
				s.CostCenter = "cc-" + s.Team
				if r.IntN(10) == 0 {
					s.PreemptedAt = s.End
					s.Checkpointable = r.IntN(2) == 0
					s.LastCheckpoint = s.Start.Add(s.End.Sub(s.Start) / 2)
				}
				segs = append(segs, s)
			}
		}
	}
	return segs
}

func BenchmarkSplitLinesMonth1000GPUs(b *testing.B) {
	card := testCard(b)
	segs := monthOfCluster()
	var gs int64
	for i := range segs {
		gs += segs[i].Seconds() * int64(segs[i].GPUs)
	}
	if gs != 720_000*3600 {
		b.Fatalf("workload has %d GPU-seconds", gs)
	}
	b.ReportAllocs()
	var nPieces, nLines int
	for b.Loop() {
		ps, err := Split(card, segs)
		if err != nil {
			b.Fatal(err)
		}
		ls, err := Lines(ps)
		if err != nil {
			b.Fatal(err)
		}
		nPieces, nLines = len(ps), len(ls)
	}
	b.ReportMetric(float64(nPieces), "pieces")
	b.ReportMetric(float64(nLines), "lines")
}

func BenchmarkTotalsMonth1000GPUs(b *testing.B) {
	card := testCard(b)
	ps, err := Split(card, monthOfCluster())
	if err != nil {
		b.Fatal(err)
	}
	ls, err := Lines(ps)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Totals(ls); err != nil {
			b.Fatal(err)
		}
	}
}
