package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
)

// TestMinCycleIntervalSpacesCycles: with a minimum interval between
// cycles, a storm of submissions (each asks for a cycle) does not run
// cycles back to back: consecutive cycles start at least the interval apart
// (less what the clock reads between the wait and the cycle's record), and
// every submitted job is still ranked by a cycle.
func TestMinCycleIntervalSpacesCycles(t *testing.T) {
	const every = time.Second
	e := bootMain(t, &Main{Config: Config{Worker: true, MinCycleInterval: every}}).withTokens()
	ctx := context.Background()
	var first int64
	if err := e.m.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM scheduling_cycles`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 30 {
		code, _, b := e.api("POST", "/api/v1/jobs", demo.Admin, fmt.Sprintf(`{"team":"fraud","tier":3,"gpus":1,"time_limit":"1h","name":"storm-%d","command":["true"]}`, i))
		if code != http.StatusCreated {
			t.Fatalf("submit: %d %s", code, b)
		}
		var j struct{ ID int64 }
		if err := json.Unmarshal(b, &j); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
		time.Sleep(100 * time.Millisecond) // a storm over 3 s
	}
	deadline := time.Now().Add(30 * time.Second) // deadline
	for {
		var ranked int
		if err := e.m.Pool.QueryRow(ctx, `SELECT count(*) FROM queue_decisions WHERE job_id = ANY($1)`, ids).Scan(&ranked); err != nil {
			t.Fatal(err)
		}
		if ranked == len(ids) {
			break
		}
		if time.Now().After(deadline) { // the deadline above, on the real clock
			t.Fatalf("%d of %d submitted jobs ranked by a cycle after 30 s", ranked, len(ids))
		}
		time.Sleep(100 * time.Millisecond)
	}
	rows, err := e.m.Pool.Query(ctx, `SELECT started_at FROM scheduling_cycles WHERE id > $1 ORDER BY id`, first)
	if err != nil {
		t.Fatal(err)
	}
	var starts []time.Time
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		starts = append(starts, at)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(starts) < 2 {
		t.Fatalf("%d cycles during a 3 s storm, want several", len(starts))
	}
	for i := 1; i < len(starts); i++ {
		// Back to back they start a few ms apart; 300 ms of slack covers
		// the cycle's own reads before it records its start.
		if gap := starts[i].Sub(starts[i-1]); gap < every-300*time.Millisecond {
			t.Errorf("cycles %d and %d started %v apart, want about %v at least", i-1, i, gap, every)
		}
	}
}
