package web_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
)

// TestLossRequeuesBounded: a checkpointable job goes back to the queue
// when its node is lost, but only as often as the policy's
// max_loss_requeues: with 1, its second lost node fails it (node_lost),
// where before it moved from node to node without end.
func TestLossRequeuesBounded(t *testing.T) {
	r := newRig(t)
	r.exec(`UPDATE policy_versions SET max_loss_requeues = 1 WHERE version = (SELECT max(version) FROM policy_versions)`)
	u, err := r.st.UserByEmail(r.ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	c13 := r.agent("gpu13")
	j, err := r.st.SubmitJob(r.ctx, &u, allot.JobSpec{Team: "recs", Tier: allot.Tier3, GPUs: 8, GPUType: "T4", TimeLimit: time.Hour,
		Command: []string{"sleep", "600"}, Checkpointable: true})
	if err != nil {
		t.Fatal(err)
	}
	r.cycle()
	r.start(c13, j.ID)

	// gpu13 goes silent: the job is requeued (the first loss).
	r.advance(5 * time.Minute)
	if _, err := r.st.MarkLostNodes(r.ctx, r.at()); err != nil {
		t.Fatal(err)
	}
	if got := r.jobState(j.ID); got.State != allot.JobPending || got.PendingReason != allot.PendingAfterLostNode("gpu13") {
		t.Fatalf("after the first lost node: %s %q, want pending, requeued", got.State, got.PendingReason)
	}

	// It runs again on gpu14, which goes silent too: the second loss
	// fails it.
	c14 := r.agent("gpu14")
	r.cycle()
	r.start(c14, j.ID)
	r.advance(5 * time.Minute)
	if _, err := r.st.MarkLostNodes(r.ctx, r.at()); err != nil {
		t.Fatal(err)
	}
	if got := r.jobState(j.ID); got.State != allot.JobFailed || got.EndReason != "node_lost" || got.Segment != 2 {
		t.Errorf("after the second lost node: %s %q (segment %d), want failed node_lost in segment 2", got.State, got.EndReason, got.Segment)
	}
	if n := r.open(j.ID); n != 0 {
		t.Errorf("%d GPUs still allocated", n)
	}
}
