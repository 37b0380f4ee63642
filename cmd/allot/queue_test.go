package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/web"
)

// TestQueueOneSourceOfTruth runs real scheduling cycles on one T4 node and
// checks that the job page, GET /api/v1/jobs/{id}, GET /api/v1/priorities
// and `allot jobs --start` all show what the cycle stored: its rank, its
// start estimate and what that rests on, and the cycle. The tier-1 job
// that preempts is told it starts when its victim's grace period ends.
func TestQueueOneSourceOfTruth(t *testing.T) {
	e := bootQuiet(t)
	ctx := context.Background()
	st := e.m.Store
	e.exec(`UPDATE jobs SET state = 'cancelled', ended_at = submitted_at WHERE state = 'pending'`)
	e.exec(`UPDATE nodes SET state = 'up', registered_at = $1, last_heartbeat = $1 WHERE name = 'gpu13'`, st.Now())
	noah, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Engineer])
	if err != nil {
		t.Fatal(err)
	}
	submit := func(name string, tier allot.TierID, gpus int, limit time.Duration) int64 {
		t.Helper()
		j, err := st.SubmitJob(ctx, &noah, allot.JobSpec{Name: name, Team: "nlp", Tier: tier, GPUs: gpus, GPUType: "T4", TimeLimit: limit, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	s := &jobs.Scheduler{Store: st}
	cycle := func() {
		t.Helper()
		if _, err := s.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A tier-3 job runs on the node (for an hour: it may be preempted).
	low := submit("low", allot.Tier3, 8, 4*time.Hour)
	cycle()
	ran := st.Now().Add(-time.Hour).Truncate(time.Second)
	e.exec(`UPDATE jobs SET submitted_at = $2, started_at = $2 WHERE id = $1 AND state = 'running'`, low, ran)
	e.exec(`UPDATE allocations SET started_at = $2 WHERE job_id = $1`, low, ran)
	e.exec(`UPDATE leases SET state = 'running', taken_at = $2, started_at = $2 WHERE job_id = $1`, low, ran)
	wait := submit("wait", allot.Tier4, 4, time.Hour)
	hi := submit("incident", allot.Tier1, 8, time.Hour)
	cycle() // preempts low for the incident job
	cycle() // the victim in its grace period

	type row struct {
		rank      int
		est       *time.Time
		kind      string
		cycle     int64
		decidedAt time.Time
	}
	stored := map[int64]row{}
	rows, err := e.m.Pool.Query(ctx, `SELECT q.job_id, q.rank, q.est_start, q.est_kind, q.cycle_id, m.decided_at FROM queue_decisions q, queue_cycle m ORDER BY q.rank`)
	if err != nil {
		t.Fatal(err)
	}
	var order []int64
	for rows.Next() {
		var id int64
		var r row
		if err := rows.Scan(&id, &r.rank, &r.est, &r.kind, &r.cycle, &r.decidedAt); err != nil {
			t.Fatal(err)
		}
		stored[id] = r
		order = append(order, id)
	}
	rows.Close()
	var graceEnd time.Time
	if err := e.m.Pool.QueryRow(ctx, `SELECT stop_requested_at + stop_grace_s * interval '1 second' FROM leases WHERE job_id = $1 AND stop_requested_at IS NOT NULL`,
		low).Scan(&graceEnd); err != nil {
		t.Fatalf("the tier-3 job was not preempted: %v", err)
	}
	if fmt.Sprint(order) != fmt.Sprint([]int64{hi, wait}) {
		t.Fatalf("stored order %v, want the incident job %d then %d", order, hi, wait)
	}
	if r := stored[hi]; r.est == nil || r.kind != "preemption" || r.est.Sub(graceEnd).Abs() >= time.Second {
		t.Fatalf("the incident job's stored estimate %v (%s), want a start by preemption at the grace end %v", r.est, r.kind, graceEnd)
	}
	if r := stored[wait]; r.est == nil || r.kind == "" {
		t.Fatalf("the tier-4 job has no stored estimate: %+v", r)
	}

	// The API's job detail and the page.
	br := e.login(demo.Engineer)
	for _, id := range order {
		r := stored[id]
		var j web.JobDetailJSON
		e.getJSON(fmt.Sprintf("/api/v1/jobs/%d", id), demo.Engineer, &j)
		q := j.Queue
		if q == nil || q.Rank != r.rank || q.Position != r.rank || q.Of != 2 || q.EstimatedStart == nil || !q.EstimatedStart.Equal(*r.est) ||
			q.EstKind != r.kind || q.CycleID == nil || *q.CycleID != r.cycle || q.DecidedAt == nil || !q.DecidedAt.Equal(r.decidedAt) {
			t.Errorf("job %d: API queue %+v, stored %+v", id, q, r)
		}
		_, page := br.get(fmt.Sprintf("/jobs/%d", id))
		d := doc(t, page)
		if tid(d, "queue-position") != strconv.Itoa(r.rank) || tid(d, "queue-of") != "2" || !strings.Contains(tid(d, "eta"), fmtUTC(*r.est)) ||
			!strings.Contains(tid(d, "eta-method"), fmt.Sprintf("(cycle %d)", r.cycle)) {
			t.Errorf("job %d's page: #%q of %q, %q, %q; stored %+v", id, tid(d, "queue-position"), tid(d, "queue-of"), tid(d, "eta"), tid(d, "eta-method"), r)
		}
		if id == hi && !strings.Contains(tid(d, "eta"), "by preemption, when its victims' grace period ends") {
			t.Errorf("the incident job's page does not say it starts by preemption: %q", tid(d, "eta"))
		}
	}

	// The CLI, like squeue --start.
	rc, out, errOut := e.cli(demo.Engineer, "jobs", "--start", "--parsable")
	if rc != 0 {
		t.Fatalf("jobs --start: %d %s", rc, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if lines[0] != "JOBID|NAME|TEAM|TIER|RANK|EST_START|REASON" || len(lines) != 3 {
		t.Fatalf("jobs --start:\n%s", out)
	}
	for i, id := range order {
		r := stored[id]
		f := strings.Split(lines[i+1], "|")
		want := []string{strconv.FormatInt(id, 10), strconv.Itoa(r.rank), slurmTime(r.est) + " (" + r.kind + ")"}
		if f[0] != want[0] || f[4] != want[1] || f[5] != want[2] || f[6] == "" {
			t.Errorf("jobs --start line %q, want id, rank, start %v", lines[i+1], want)
		}
	}
	var p web.PrioritiesJSON
	e.getJSON("/api/v1/priorities", demo.Engineer, &p)
	if len(p.Jobs) != 2 || p.Jobs[0].ID != hi || p.Jobs[0].Rank != 1 || p.Jobs[0].EstKind != "preemption" || p.CycleID == nil || *p.CycleID != stored[hi].cycle {
		t.Errorf("priorities: %+v", p)
	}

	// A job submitted after the cycle comes last, unranked, with no estimate.
	late := submit("late", allot.Tier3, 1, time.Hour)
	rc, out, _ = e.cli(demo.Engineer, "jobs", "--start", "--parsable", "--noheader")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if want := fmt.Sprintf("%d|late|nlp|3|N/A|N/A|waiting for the next scheduling cycle", late); rc != 0 || len(lines) != 3 || lines[2] != want {
		t.Errorf("jobs --start with an unranked job: %d\n%s\nwant last %q", rc, out, want)
	}

	// Refused flags: a CLI error and exit status 2.
	for _, args := range [][]string{
		{"jobs", "--start", "--state", "R"},
		{"jobs", "--start", "--format", "%i"},
		{"jobs", "--start", "--user", "someone@example.com"},
		{"jobs", "--start", "--limit", "-1"},
	} {
		rc, out, errOut := e.cli(demo.Engineer, args...)
		if rc != 2 || out != "" || !strings.Contains(errOut, "allot jobs") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, rc, out, errOut)
		}
	}
}
