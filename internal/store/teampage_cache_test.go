package store_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/store"
	"github.com/google/go-cmp/cmp"
)

// TestTeamPageUsageKeptSums: the team page's usage from kept sums (of
// allocations released by an instant) plus what is live is exactly what
// the single query over every allocation gives — for every demo team, at
// the month's first instant, a microsecond after, mid-month, later the
// same day and back again — and stays so after each change the sums must
// not hide: an open allocation released in the past (a lost node), one
// imported into the past (Slurm), a job classified differently (run-as,
// no allocation changed), a user's new e-mail, a node's GPU type. Views
// after the first are served from the kept sums; while another session
// holds a write lock on allocations nothing is kept (its change may be
// committing) and the result is still exact.
func TestTeamPageUsageKeptSums(t *testing.T) {
	b := setup(t)
	month := store.MonthStart(b.now)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, state, submitted_at, started_at, segment, run_as)
		SELECT 'kept', 'nlp', (SELECT id FROM users WHERE email = 'noah@example.com'), '3', 4, 864000, '{true}', 'running',
			$1::timestamptz - interval '40 days', $2::timestamptz - interval '5 days', 1, '3'`, b.now, month)
	exec(`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at)
		SELECT (SELECT id FROM jobs WHERE name = 'kept'), 1, n, g, s, r FROM (VALUES
			('gpu01', 60, $1::timestamptz - interval '35 days', NULL::timestamptz),
			('gpu01', 61, $2::timestamptz - interval '3 hours', $2::timestamptz + interval '50 hours 7 minutes 3 seconds'),
			('gpu13', 60, $2::timestamptz + interval '2 days 23 hours', $2::timestamptz + interval '3 days 1 hour'),
			('gpu13', 61, $2::timestamptz + interval '5 days', $2::timestamptz + interval '5 days'),
			('gpu13', 62, $2::timestamptz, $2::timestamptz + interval '1 second'),
			('gpu01', 62, $1::timestamptz - interval '1 hour', NULL),
			('gpu01', 63, $1::timestamptz - interval '2 hours', $1::timestamptz + interval '30 minutes')
		) v(n, g, s, r)`, b.now, month)

	instants := []time.Time{b.now, month, month.Add(time.Microsecond), month.Add(3*24*time.Hour + 30*time.Minute),
		b.now.Add(20 * time.Minute), b.now.Add(40*time.Minute + 500*time.Millisecond), b.now}
	check := func(step string) {
		t.Helper()
		for _, team := range []string{"nlp", "recs", "fraud"} {
			for _, upTo := range instants {
				for range 2 { // the second view of an instant comes from kept sums
					got, err := b.st.TeamPageUsage(b.ctx, team, upTo)
					if err != nil {
						t.Fatal(err)
					}
					want, err := store.TeamPageUsageQuery(b.st, b.ctx, team, upTo)
					if err != nil {
						t.Fatal(err)
					}
					if d := cmp.Diff(want, got); d != "" {
						t.Fatalf("%s: %s up to %v: kept sums differ (-one query +kept):\n%s", step, team, upTo, d)
					}
				}
			}
		}
	}
	kept := store.TeamPageKeptViews()
	check("demo history")
	if n := store.TeamPageKeptViews() - kept; n < 10 {
		t.Errorf("%d views from kept sums, want most of the 42", n)
	}
	if got, _ := b.st.TeamPageUsage(b.ctx, "nlp", b.now); got.UsedGPUSeconds == 0 || got.LastMonthGPUSeconds == 0 || len(got.Daily) != 20 {
		t.Fatalf("nlp: the demo's history is not there: %+v", got)
	}

	// A lost node: its open allocation ends at its last heartbeat, in the past.
	exec(`UPDATE allocations SET released_at = $1::timestamptz - interval '30 minutes'
		WHERE job_id = (SELECT id FROM jobs WHERE name = 'kept') AND gpu_index = 62 AND node = 'gpu01'`, b.now)
	check("released in the past")
	// Imported from Slurm: a run of last week and one across the month's start.
	exec(`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at)
		SELECT (SELECT id FROM jobs WHERE name = 'kept'), 1, n, g, s, r FROM (VALUES
			('gpu13', 63, $1::timestamptz - interval '7 days', $1::timestamptz - interval '6 days 5 hours'),
			('gpu02', 0, $2::timestamptz - interval '1 day', $2::timestamptz + interval '1 day 1 second')
		) v(n, g, s, r)`, b.now, month)
	check("imported")
	// Classified differently without an allocation changing.
	exec(`UPDATE jobs SET run_as = '1' WHERE name = 'kept'`)
	check("run as tier 1")
	exec(`UPDATE users SET email = 'aaa-noah@example.com' WHERE email = 'noah@example.com'`)
	check("new e-mail")
	exec(`UPDATE nodes SET gpu_type = (SELECT name FROM gpu_types WHERE name <> nodes.gpu_type ORDER BY name LIMIT 1) WHERE name = 'gpu13'`)
	check("new GPU type")

	// Another session writing allocations: nothing is kept meanwhile.
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if _, err := tx.Exec(b.ctx, `UPDATE allocations SET released_at = released_at WHERE false`); err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at)
		VALUES ((SELECT id FROM jobs WHERE name = 'kept'), 1, 'gpu02', 1, $1::timestamptz - interval '2 days', $1::timestamptz - interval '1 day')`, b.now)
	kept = store.TeamPageKeptViews()
	check("while another session writes")
	if n := store.TeamPageKeptViews() - kept; n != 0 {
		t.Errorf("%d views from kept sums while allocations were being written", n)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	check("after the writer")
}
