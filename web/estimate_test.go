package web

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

func TestEstimateStart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(h int) time.Time { return now.Add(time.Duration(h) * time.Hour) }
	node := func(name, typ, domain, site, state string, frees ...time.Time) store.NodeLoad {
		return store.NodeLoad{Name: name, GPUType: typ, Domain: domain, Site: site, State: state, GPUs: 8, Frees: frees}
	}
	loads := []store.NodeLoad{
		// a1: 4 held, ending at +1 h and +3 h (twice) and +5 h.
		node("a1", "A100", "ib", allot.SiteOnPrem, "up", at(1), at(3), at(3), at(5)),
		// a2: full until +2 h (one GPU past its limit already).
		node("a2", "A100", "ib", allot.SiteOnPrem, "up", at(-1), at(2), at(2), at(2), at(2), at(2), at(2), at(2)),
		// a3: free but draining: never counted.
		node("a3", "A100", "ib", allot.SiteOnPrem, "draining"),
		// c1: a free cloud node: not for production tiers.
		node("c1", "A100", "", allot.SiteCloud, "up"),
		node("t1", "T4", "ib", allot.SiteOnPrem, "up", at(4), at(4), at(4), at(4), at(4), at(4), at(4), at(4)),
	}
	job := func(tier allot.TierID, gpus, perNode int, typ string) *allot.Job {
		return &allot.Job{JobSpec: allot.JobSpec{Tier: tier, GPUs: gpus, GPUsPerNode: perNode, GPUType: typ}}
	}
	for _, tt := range []struct {
		name string
		j    *allot.Job
		want time.Time
	}{
		{"fits in a1's free GPUs now", job(allot.Tier3, 4, 0, "A100"), now},
		{"production skips the free cloud node: a2 frees 7 GPUs at +2 h", job(allot.Tier1, 6, 0, "A100"), at(2)},
		{"non-production may use the cloud node now", job(allot.Tier3, 8, 0, "A100"), now},
		{"whole a1 at +5 h, a2 at +2 h: both at +5 h", job(allot.Tier1, 16, 0, "A100"), at(5)},
		{"any type: the cloud node is free now", job(allot.Tier4, 8, 0, ""), now},
		{"T4 node full until +4 h", job(allot.Tier3, 2, 0, "T4"), at(4)},
		{"8 per node on two ib nodes: a2 at +2 h, t1 at +4 h (any type)", job(allot.Tier2, 16, 8, ""), at(4)},
	} {
		got, why := estimateStart(tt.j, loads, now)
		if !got.Equal(tt.want) || why != "" {
			t.Errorf("%s: %v (%q), want %v", tt.name, got, why, tt.want)
		}
	}
	if got, why := estimateStart(job(allot.Tier3, 32, 0, "T4"), loads, now); !got.IsZero() || why == "" {
		t.Errorf("32 T4 GPUs cannot fit: got %v %q", got, why)
	}
}
