package demo_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The demo seeds the same organisation at every instant: the first seconds
// of a month, a leap day's last seconds, a year's end, the day the story
// starts to fit, and the clock's own now (ALLOT_TEST_NOW).
func TestSeedAtEveryInstant(t *testing.T) {
	instants := []string{
		"2026-12-01T00:00:00Z", "2027-03-01T00:00:20Z", "2026-12-01T08:05:00Z", "2026-12-02T23:00:00Z",
		"2028-02-29T23:59:30Z", "2026-12-31T23:59:50Z", "2027-01-07T23:59:59Z", "2027-01-08T00:00:00Z",
		"2027-02-28T12:00:00Z", "2027-07-16T09:30:00Z",
	}
	instants = append(instants, clock.Now().UTC().Format(time.RFC3339Nano))
	for _, at := range instants {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			now, err := clock.Parse(at)
			if err != nil {
				t.Fatal(err)
			}
			pool := storetest.Pool(t)
			st := store.New(pool)
			st.Now = func() time.Time { return now }
			ctx := context.Background()
			if err := demo.SeedAll(ctx, st); err != nil {
				t.Fatalf("seeding at %s: %v", at, err)
			}
			if s, err := demo.Inspect(ctx, st); err != nil || s != demo.Seeded {
				t.Fatalf("Inspect after seeding = %v, %v; want Seeded", s, err)
			}
			// The seeded usage lies inside the cluster's registered
			// capacity, last month and this one (which has no rows yet at
			// its first second).
			for i, m := range []time.Time{store.MonthStart(now).AddDate(0, -1, 0), store.MonthStart(now)} {
				cp, err := st.CapacityOf(ctx, billing.Month(m))
				if err != nil || cp.AllocatedOutsideGPUSeconds != 0 || (i == 0 && len(cp.Rows) == 0) {
					t.Errorf("capacity of %s: %d GPU-seconds allocated outside capacity, %d rows, %v", m.Format("2006-01"), cp.AllocatedOutsideGPUSeconds, len(cp.Rows), err)
				}
			}
			teams, err := st.ListTeams(ctx)
			if err != nil {
				t.Fatal(err)
			}
			budgets := map[string]int64{}
			for _, tm := range teams {
				budgets[tm.Slug] = tm.MonthlyBudgetGPUHours
			}
			if budgets["fraud"] != 2000 || budgets["recs"] != 3000 || budgets["nlp"] != 4000 {
				t.Errorf("budgets %v, want fraud 2000, recs 3000, nlp 4000 at every instant", budgets)
			}
			monthStart := store.MonthStart(now)
			last := store.New(pool)
			last.Now = func() time.Time { return monthStart.Add(-time.Nanosecond) }
			alerts, err := st.BudgetAlerts(ctx, nil, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, tm := range demo.Teams {
				// Last month holds the whole story on the team's A100
				// nodes: exactly its share (the week of activity on the T4
				// nodes comes on top).
				used := nodeUse(t, pool, tm.Nodes, monthStart.AddDate(0, -1, 0), monthStart)
				if all, err := last.TeamMonthUsage(ctx, tm.Slug); err != nil || all < used {
					t.Errorf("%s: last month's usage %d < its A100 usage %d (%v)", tm.Slug, all, used, err)
				}
				want := tm.MonthlyBudgetGPUHours * 3600 * int64(tm.UsedPct) / 100
				if used != want {
					t.Errorf("%s used %d GPU-s last month, want %d (%d %% of %d GPU-h)", tm.Slug, used, want, tm.UsedPct, tm.MonthlyBudgetGPUHours)
				}
				var fired []int
				for _, a := range alerts {
					if a.Team == tm.Slug && a.Month.Equal(monthStart.AddDate(0, -1, 0)) {
						fired = append(fired, a.ThresholdPct)
						if !a.FiredAt.Before(monthStart) || !strings.Contains(a.Message, monthStart.AddDate(0, -1, 0).Format("January 2006")) {
							t.Errorf("%s alert %d %%: fired %s, %q; want last month", tm.Slug, a.ThresholdPct, a.FiredAt, a.Message)
						}
					}
				}
				wantAlerts := map[string]int{"fraud": 0, "recs": 1, "nlp": 2}[tm.Slug]
				if len(fired) != wantAlerts {
					t.Errorf("%s: last month fired alerts %v, want %d", tm.Slug, fired, wantAlerts)
				}
				// This month: nothing after now, and the story's pace.
				if n, err := pool.Exec(ctx, `SELECT 1 FROM jobs j JOIN allocations a ON a.job_id = j.id WHERE a.released_at > $1 OR a.started_at > $1`, now); err != nil || n.RowsAffected() != 0 {
					t.Errorf("%d allocations end after now (%v)", n.RowsAffected(), err)
				}
				a100 := nodeUse(t, pool, tm.Nodes, monthStart, now)
				want = demo.ThisMonthUse(tm, now)
				if now.Sub(monthStart) >= demo.StoryFrom && want != tm.MonthlyBudgetGPUHours*36*int64(tm.UsedPct) {
					t.Errorf("%s: %d GPU-s this month, want the whole story", tm.Slug, want)
				}
				if want < 8*60 {
					want = 0 // less than a minute of an 8-GPU job is not seeded
				}
				if a100 != want/8*8 {
					t.Errorf("%s used %d GPU-s of its A100 nodes this month, want %d", tm.Slug, a100, want/8*8)
				}
			}
			// The queue is there at every instant.
			jobs, err := st.ListJobs(ctx, store.JobFilter{State: allot.JobPending})
			if err != nil {
				t.Fatal(err)
			}
			if len(jobs) != 4 {
				t.Errorf("%d pending jobs, want the 4 of the demo queue", len(jobs))
			}
		})
	}
}

// nodeUse is the GPU-seconds allocated on nodes in [from, to).
func nodeUse(t *testing.T, pool *pgxpool.Pool, nodes []string, from, to time.Time) int64 {
	t.Helper()
	var used int64
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(extract(epoch FROM least(released_at, $2) - greatest(started_at, $1))), 0)::bigint
		FROM allocations WHERE node = ANY($3) AND released_at > $1 AND started_at < $2`, from, to, nodes).Scan(&used); err != nil {
		t.Fatal(err)
	}
	return used
}

// A seed that fails leaves nothing behind, and a database with teams but no
// complete seed is told apart from an empty and a seeded one.
func TestSeedIsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := storetest.New(t)
	// A user the demo would create makes the seed fail half-way.
	if err := st.CreateUser(ctx, &allot.User{OIDCSubject: "x", Email: "noah@example.com", Name: "Noah"}); err != nil {
		t.Fatal(err)
	}
	err := demo.SeedAll(ctx, st)
	if err == nil {
		t.Fatal("seed over a clashing user succeeded")
	}
	if n, err := st.CountTeams(ctx); err != nil || n != 0 {
		t.Fatalf("a failed seed left %d teams (%v)", n, err)
	}
	if types, err := st.ListGPUTypes(ctx); err != nil || len(types) != 0 {
		t.Fatalf("a failed seed left %d GPU types (%v)", len(types), err)
	}
	if s, err := demo.Inspect(ctx, st); err != nil || s != demo.Empty {
		t.Fatalf("Inspect after a failed seed = %v, %v; want Empty", s, err)
	}
	// Teams made by hand (or by an interrupted old seed): Foreign.
	if err := st.CreateTeam(ctx, &allot.Team{Slug: "fraud", Name: "Fraud", CostCenter: "CC-1", MonthlyBudgetGPUHours: 1, FairShareWeight: 1}); err != nil {
		t.Fatal(err)
	}
	if s, err := demo.Inspect(ctx, st); err != nil || s != demo.Foreign {
		t.Fatalf("Inspect with teams but no seed = %v, %v; want Foreign", s, err)
	}
	if err := demo.Seed(ctx, st); err == nil || !strings.Contains(err.Error(), "already holds") {
		t.Fatalf("seeding over teams: %v; want a refusal", err)
	}
}

// The demo workspace's stand-ins run as the README's examples do: they
// start, print a step, and stop cleanly on SIGTERM, checkpointing.
func TestWorkspaceStandIns(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on this machine: the demo's stand-ins need one")
	}
	dir, ckpt := t.TempDir(), t.TempDir()
	if err := demo.WriteWorkspace(dir); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "train.py", "--lr", "3e-4")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ALLOT_CHECKPOINT_DIR="+ckpt, "CUDA_VISIBLE_DEVICES=0,1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "train step 5 ") {
			cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("train.py after SIGTERM: %v\n%s", err, strings.Join(lines, "\n"))
	}
	got := strings.Join(lines, "\n")
	for _, want := range []string{"['--lr', '3e-4'] on GPUs 0,1", "train step 5 loss", "SIGTERM, checkpointing"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ckpt, "step")); err != nil || string(b) != "5" {
		t.Errorf("checkpoint %q, %v", b, err)
	}
}
