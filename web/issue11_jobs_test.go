package web

import (
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
)

// TestTimelineShowsPreemptionsAndLostNodes: a job is never in a state
// "preempted" or "lost" (it is requeued or fails at once), so its
// timeline is where a preemption, a lost node or a drain shows, from its
// run segments.
func TestTimelineShowsPreemptionsAndLostNodes(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	j := allot.Job{ID: 9, User: "noah@example.com", JobSpec: allot.JobSpec{Tier: "3", GPUs: 8, Checkpointable: true}, State: allot.JobPending, SubmittedAt: t0, Preemptions: 1}
	segs := []store.RunSegment{
		{Segment: 1, Nodes: []string{"gpu01"}, GPUs: 8, Start: at(1), End: at(10), StopReason: "preempted", PreemptedBy: 7},
		{Segment: 2, Nodes: []string{"gpu02"}, GPUs: 8, Start: at(11), End: at(20), StopReason: "node_lost"},
		{Segment: 3, Nodes: []string{"gpu03"}, GPUs: 8, Start: at(21), End: at(30), StopReason: store.StopDrain},
	}
	kinds := func(ev []views.TimelineEvent) string {
		var k []string
		for _, e := range ev {
			k = append(k, e.Kind)
		}
		return strings.Join(k, ",")
	}
	ev := timeline(&j, segs, at(40))
	if got := kinds(ev); got != "submitted,started,preempted,started,lost,started,requeued,pending" {
		t.Fatalf("timeline = %s", got)
	}
	if !strings.Contains(ev[2].Detail, "by job 7") || ev[4].What != "Run 2 lost: node gpu02 stopped answering" ||
		!strings.Contains(ev[4].Detail, "requeued") || !strings.Contains(ev[6].Detail, "node gpu03 was drained") {
		t.Errorf("details: %+v", ev)
	}

	// Not checkpointable: the node's loss ends the job.
	j = allot.Job{ID: 10, User: "noah@example.com", JobSpec: allot.JobSpec{Tier: "3", GPUs: 16}, State: allot.JobFailed, SubmittedAt: t0, EndedAt: at(20), EndReason: "node_lost"}
	ev = timeline(&j, []store.RunSegment{{Segment: 1, Nodes: []string{"gpu01", "gpu02"}, GPUs: 16, Start: at(1), End: at(20), StopReason: "node_lost"}}, at(40))
	if got := kinds(ev); got != "submitted,started,lost,ended" {
		t.Fatalf("timeline = %s", got)
	}
	if !strings.Contains(ev[2].What, "a node of its gang (gpu01, gpu02)") || !strings.Contains(ev[2].Detail, "the job failed") {
		t.Errorf("lost, not checkpointable: %+v", ev[2])
	}
}
