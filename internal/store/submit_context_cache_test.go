package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// TestSubmitContextFollowsTheTokenEpochs: a request authenticated by
// UserByAPITokenContext carries the three epochs read with its token, and
// its submission reuses the context judged for the previous one only while
// they hold: a budget, a tier's limit, a POSIX account or an allocation
// changed before the request is seen by it. With a trigger off the stale
// context is reused (so the cache is used at all), and a request without
// epochs always reads afresh. A context read at an epoch that has only
// just moved is not kept.
func TestSubmitContextFollowsTheTokenEpochs(t *testing.T) {
	b := setup(t)
	clk := b.now
	st := store.New(b.pool)
	st.Now = func() time.Time { return clk }
	st.ConfigSettle = -1 // a context read at an epoch is kept at once
	noah := b.user(t, "noah@example.com")
	secret, _, err := st.CreateAPIToken(b.ctx, noah.ID, "cache")
	if err != nil {
		t.Fatal(err)
	}
	request := func() (context.Context, *allot.User) {
		t.Helper()
		u, ctx, err := st.UserByAPITokenContext(b.ctx, secret)
		if err != nil {
			t.Fatal(err)
		}
		return ctx, &u
	}
	spec := allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}}
	remaining := func(ctx context.Context, u *allot.User) int64 {
		t.Helper()
		q, err := st.QuotaPreview(ctx, u, &spec)
		if err != nil {
			t.Fatal(err)
		}
		return q.RemainingGPUSeconds
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	// A context read in the moment between a change's epoch moving and
	// the change becoming visible (simulated: the epoch moved by hand, the
	// change written with the trigger off) holds the old values under the
	// new epoch. It is not kept until the epoch has settled (here never),
	// so the next request reads the change.
	exec(`ALTER TABLE teams DISABLE TRIGGER config_epoch_bump`)
	unsettled := store.New(b.pool)
	unsettled.Now = st.Now
	unsettled.ConfigSettle = time.Hour
	ctx, u := request()
	if _, err := unsettled.QuotaPreview(ctx, u, &spec); err != nil {
		t.Fatal(err)
	}
	exec(`SELECT nextval('config_epoch')`)
	ctx, u = request()
	qa, err := unsettled.QuotaPreview(ctx, u, &spec)
	if err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE teams SET monthly_budget_gpu_hours = monthly_budget_gpu_hours + 10 WHERE slug = 'nlp'`)
	ctx, u = request()
	if qb, err := unsettled.QuotaPreview(ctx, u, &spec); err != nil {
		t.Fatal(err)
	} else if qb.RemainingGPUSeconds != qa.RemainingGPUSeconds+10*3600 {
		t.Errorf("a context read before its epoch settled was kept: remaining %d after the change, want %d", qb.RemainingGPUSeconds, qa.RemainingGPUSeconds+10*3600)
	}
	exec(`ALTER TABLE teams ENABLE TRIGGER config_epoch_bump`)

	r0 := remaining(request())
	if r := remaining(request()); r != r0 {
		t.Fatalf("nothing changed, remaining %d then %d", r0, r)
	}

	// The budget raised by 10 GPU-hours with the teams' trigger off: the
	// request reuses the context judged before (its epochs did not move),
	// a request without epochs reads the new budget.
	exec(`ALTER TABLE teams DISABLE TRIGGER config_epoch_bump`)
	exec(`UPDATE teams SET monthly_budget_gpu_hours = monthly_budget_gpu_hours + 10 WHERE slug = 'nlp'`)
	if r := remaining(request()); r != r0 {
		t.Errorf("with the epoch frozen the judged context should have been reused: remaining %d, want %d", r, r0)
	}
	if r := remaining(b.ctx, noah); r != r0+10*3600 {
		t.Errorf("without epochs: remaining %d, want %d", r, r0+10*3600)
	}
	exec(`ALTER TABLE teams ENABLE TRIGGER config_epoch_bump`)
	exec(`UPDATE teams SET monthly_budget_gpu_hours = monthly_budget_gpu_hours + 10 WHERE slug = 'nlp'`)
	if r := remaining(request()); r != r0+20*3600 {
		t.Errorf("after a budget change: remaining %d, want %d", r, r0+20*3600)
	}

	// An allocation of nlp (2 GPUs for an hour, ended) is counted at once.
	var job int64
	if err := b.pool.QueryRow(b.ctx, `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, state, submitted_at, started_at, ended_at, segment, run_as)
		VALUES ('cache', 'nlp', $1, '3', 2, 86400, '{true}', 'completed', $2, $2, $3, 1, '3') RETURNING id`, noah.ID, clk.Add(-2*time.Hour), clk.Add(-time.Hour)).Scan(&job); err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at) VALUES ($1, 1, 'gpu01', 0, $2, $3), ($1, 1, 'gpu01', 1, $2, $3)`,
		job, clk.Add(-2*time.Hour), clk.Add(-time.Hour))
	if r := remaining(request()); r != r0+20*3600-2*3600 {
		t.Errorf("after an allocation: remaining %d, want %d", r, r0+20*3600-2*3600)
	}

	// The tier's limit lowered to 10 minutes: the next hour-long
	// submission is refused.
	exec(`UPDATE tiers SET max_runtime_s = 600 WHERE id = '3'`)
	ctx, u = request()
	if _, err := st.SubmitJob(ctx, u, spec); allot.ErrorCode(err) != allot.EInvalid {
		t.Errorf("an hour past the tier's new 10-minute limit: %v, want it refused", err)
	}
	exec(`UPDATE tiers SET max_runtime_s = 86400 WHERE id = '3'`)

	// The submitter mapped to a POSIX account: the next job runs as it.
	ctx, u = request()
	j, err := st.SubmitJob(ctx, u, spec)
	if err != nil {
		t.Fatal(err)
	}
	before := j.RunAsUser
	exec(`UPDATE users SET posix_user = 'noahp' WHERE id = $1`, noah.ID)
	ctx, u = request()
	if j, err = st.SubmitJob(ctx, u, spec); err != nil {
		t.Fatal(err)
	} else if j.RunAsUser != "noahp" {
		t.Errorf("after the mapping the job runs as %q (before: %q), want noahp", j.RunAsUser, before)
	}

	// A running allocation's time is counted to the whole second from the
	// reused context, as from a fresh read.
	exec(`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at) VALUES ($1, 2, 'gpu02', 0, $2)`, job, clk.Add(-time.Minute))
	ctx, u = request()
	r1 := remaining(ctx, u)
	clk = clk.Add(7500 * time.Millisecond)
	ctx, u = request()
	if r := remaining(ctx, u); r != r1-7 {
		t.Errorf("7.5 s later with one GPU running: remaining %d, want %d", r, r1-7)
	}
	if r := remaining(b.ctx, noah); r != r1-7 {
		t.Errorf("7.5 s later, read afresh: remaining %d, want %d", r, r1-7)
	}
}
