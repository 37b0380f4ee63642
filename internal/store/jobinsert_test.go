package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// Concurrent submissions are written in groups (one INSERT for the rows
// waiting at once): every submission gets its own job, with its own
// values, exactly once.
func TestConcurrentSubmissionsGroupInsert(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	before, grouped := b.count(t, "jobs"), store.GroupedRows()
	const workers, each = 24, 15
	type sub struct {
		name string
		job  allot.Job
	}
	subs := make([][]sub, workers)
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				name := fmt.Sprintf("w%d-j%d", w, i)
				j, err := b.st.SubmitJob(b.ctx, noah, allot.JobSpec{Name: name, Team: "nlp", Tier: allot.Tier3, GPUs: 1 + (w+i)%4,
					TimeLimit: time.Duration(60+w*each+i) * time.Second, Command: []string{"echo", name},
					Env: map[string]string{"WHO": name}, SecretEnv: map[string]string{"S": name}})
				if err != nil {
					errs <- err
					return
				}
				subs[w] = append(subs[w], sub{name, j})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := b.count(t, "jobs") - before; got != workers*each {
		t.Fatalf("%d jobs written, want %d", got, workers*each)
	}
	if store.GroupedRows() == grouped {
		t.Fatal("no submission was written in a group")
	}
	seen := map[int64]bool{}
	for w, list := range subs {
		for i, s := range list {
			if seen[s.job.ID] {
				t.Fatalf("job id %d answered twice", s.job.ID)
			}
			seen[s.job.ID] = true
			var name, cmd1, who string
			var gpus int
			var limit int64
			var submitted time.Time
			if err := b.pool.QueryRow(b.ctx, `SELECT name, command[2], env->>'WHO', gpus, time_limit_s, submitted_at FROM jobs WHERE id = $1`, s.job.ID).
				Scan(&name, &cmd1, &who, &gpus, &limit, &submitted); err != nil {
				t.Fatal(err)
			}
			if name != s.name || cmd1 != s.name || who != s.name || gpus != 1+(w+i)%4 || limit != int64(60+w*each+i) || !submitted.Equal(b.now) {
				t.Fatalf("job %d answered to %s holds %s %s %s %d GPUs %d s submitted %s", s.job.ID, s.name, name, cmd1, who, gpus, limit, submitted)
			}
			if !s.job.SubmittedAt.Equal(b.now) || s.job.Backend != allot.BackendNative {
				t.Fatalf("answer %+v", s.job)
			}
		}
	}
	// The secret values are sealed as alone (the agents' read decrypts).
	var secret string
	if err := b.pool.QueryRow(b.ctx, `SELECT secret_env->>'S' FROM jobs WHERE name = 'w3-j4'`).Scan(&secret); err != nil || secret != "w3-j4" {
		t.Fatalf("secret_env S = %q, %v", secret, err)
	}
}

// A group whose statement PostgreSQL refuses (one row breaks a foreign
// key) is written again row by row: the other rows are written once, the
// bad one gets its own error, and the ids come back in the rows' order.
func TestGroupInsertFallsBackRowByRow(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	at := b.now.Add(1500 * time.Microsecond)
	var rows []store.TestRow
	for i := range 40 {
		rows = append(rows, store.TestRow{Name: fmt.Sprintf("g%d", i), Team: "nlp", Tier: "3", UserID: noah.ID, Command: []string{"run", fmt.Sprint(i)}, SubmittedAt: at})
	}
	ids, errs := store.InsertGroupForTest(b.pool, rows)
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		var name string
		var submitted time.Time
		if err := b.pool.QueryRow(b.ctx, `SELECT name, submitted_at FROM jobs WHERE id = $1`, id).Scan(&name, &submitted); err != nil || name != rows[i].Name || !submitted.Equal(at) {
			t.Fatalf("row %d: id %d holds %q submitted %s (%v)", i, id, name, submitted, err)
		}
	}
	before := b.count(t, "jobs")
	rows = rows[:5]
	for i := range rows {
		rows[i].Name = fmt.Sprintf("h%d", i)
	}
	rows[2].Team = "no-such-team"
	ids, errs = store.InsertGroupForTest(b.pool, rows)
	if got := b.count(t, "jobs") - before; got != 4 {
		t.Fatalf("%d rows written, want the 4 good ones once", got)
	}
	for i := range rows {
		if (errs[i] != nil) != (i == 2) {
			t.Fatalf("row %d: error %v", i, errs[i])
		}
		if i == 2 {
			continue
		}
		var name string
		if err := b.pool.QueryRow(b.ctx, `SELECT name FROM jobs WHERE id = $1`, ids[i]).Scan(&name); err != nil || name != rows[i].Name {
			t.Fatalf("row %d: id %d holds %q (%v)", i, ids[i], name, err)
		}
	}
}

// A submitter that gives up while its row is still queued (its client
// went away) gets its context's error, and the row is never written: no
// job runs, and is billed, that its submitter was told was not created.
func TestAbandonedSubmissionIsNotWritten(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	before := b.count(t, "jobs")
	err := store.InsertAbandonedForTest(b.pool, store.TestRow{Name: "gone", Team: "nlp", Tier: "3", UserID: noah.ID, Command: []string{"true"}, SubmittedAt: b.now})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("abandoned submission: %v, want its deadline", err)
	}
	if got := b.count(t, "jobs") - before; got != 0 {
		t.Fatalf("%d jobs written for an abandoned submission", got)
	}
}
