package store_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
)

// TestQueuePositionFollowsTierOrder: a pending job's place in the queue
// follows the tiers' class order as admins set it, as the scheduler does.
func TestQueuePositionFollowsTierOrder(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	submit := func(tier allot.TierID) allot.Job {
		t.Helper()
		j, err := b.st.SubmitJob(b.ctx, noah, allot.JobSpec{Team: "nlp", Tier: tier, GPUs: 8, GPUType: "A100-80GB",
			TimeLimit: time.Hour, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	b.pool.Exec(b.ctx, `UPDATE jobs SET state = 'cancelled', ended_at = $1 WHERE state = 'pending'`, clock.Now()) //nolint:errcheck
	t3, t4 := submit(allot.Tier3), submit(allot.Tier4)
	pos := func(j allot.Job) int {
		t.Helper()
		q, err := b.st.QueuePositionOf(b.ctx, &j)
		if err != nil {
			t.Fatal(err)
		}
		return q.Position
	}
	if pos(t3) != 1 || pos(t4) != 2 {
		t.Fatalf("natural order: tier 3 at %d, tier 4 at %d", pos(t3), pos(t4))
	}
	for _, q := range []string{`UPDATE tiers SET class_order = 99 WHERE id = '3'`, `UPDATE tiers SET class_order = 3 WHERE id = '4'`, `UPDATE tiers SET class_order = 4 WHERE id = '3'`} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if pos(t4) != 1 || pos(t3) != 2 {
		t.Errorf("tier 4 ordered before tier 3: tier 4 at %d, tier 3 at %d", pos(t4), pos(t3))
	}
}
