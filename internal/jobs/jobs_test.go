package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// TestCleanupSessionsRunsOnRiver starts a real River client on a test
// database and waits for the periodic cleanup to remove an expired session
// while keeping a live one.
func TestCleanupSessionsRunsOnRiver(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := storetest.Pool(t)
	st := store.New(pool)
	u := &allot.User{OIDCSubject: "s", Email: "a@example.com", Name: "A"}
	if err := st.CreateUser(ctx, u); err != nil {
		t.Fatal(err)
	}
	expired, err := st.CreateSession(ctx, u.ID, -time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	live, err := st.CreateSession(ctx, u.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := jobs.NewClient(jobs.Config{Pool: pool, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer client.Stop(context.Background()) //nolint:errcheck
	for {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM sessions").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("expired session still there after %v", 30*time.Second)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if _, err := st.UserBySession(ctx, live); err != nil {
		t.Errorf("live session removed: %v", err)
	}
	if _, err := st.UserBySession(ctx, expired); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("expired session: %v", err)
	}
}
