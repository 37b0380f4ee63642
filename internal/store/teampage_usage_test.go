package store_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/store"
	"github.com/google/go-cmp/cmp"
)

// TestTeamPageUsageMatchesTheSeparateQueries: the team page's one query
// gives exactly what TeamMonthUsageDetail, TeamUsageByKind and
// TeamUsageBetween give, for every demo team, with the demo's history plus
// allocations at the edges: still running, across the month's start,
// across days, of zero length, one at the first instant of the month,
// and two GPUs of a gang sharing their start and release.
func TestTeamPageUsageMatchesTheSeparateQueries(t *testing.T) {
	b := setup(t)
	month := store.MonthStart(b.now)
	for _, q := range []string{
		// A job of nlp with allocations on the edges, on gpu01 (A100) and gpu13 (T4).
		`INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, state, submitted_at, started_at, segment, run_as)
			SELECT 'edges', 'nlp', (SELECT id FROM users WHERE email = 'noah@example.com'), '3', 4, 864000, '{true}', 'running',
				$1::timestamptz - interval '40 days', $2::timestamptz - interval '5 days', 1, '2'`,
		`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at)
			SELECT (SELECT id FROM jobs WHERE name = 'edges'), 1, n, g, s, r FROM (VALUES
				('gpu01', 60, $1::timestamptz - interval '35 days', NULL::timestamptz),                      -- running since last month
				('gpu01', 61, $2::timestamptz - interval '3 hours', $2::timestamptz + interval '50 hours 7 minutes 3.5 seconds'), -- across the month's start and days
				('gpu13', 60, $2::timestamptz + interval '2 days 23 hours', $2::timestamptz + interval '3 days 1 hour'),        -- across a midnight
				('gpu13', 61, $2::timestamptz + interval '5 days', $2::timestamptz + interval '5 days'),                        -- zero length
				('gpu13', 62, $2::timestamptz, $2::timestamptz + interval '0.4 seconds'),                                       -- at the first instant
				('gpu01', 62, $1::timestamptz - interval '1 hour', NULL),                                                       -- running, today
				('gpu01', 63, $2::timestamptz - interval '3 hours', $2::timestamptz + interval '50 hours 7 minutes 3.5 seconds')  -- a gang's second GPU
			) v(n, g, s, r)`,
	} {
		if _, err := b.pool.Exec(b.ctx, q, b.now, month); err != nil {
			t.Fatal(err)
		}
	}
	for _, team := range []string{"nlp", "recs", "fraud"} {
		for _, upTo := range []time.Time{b.now, month, month.Add(time.Microsecond), month.Add(3*24*time.Hour + 30*time.Minute)} {
			got, err := b.st.TeamPageUsage(b.ctx, team, upTo)
			if err != nil {
				t.Fatal(err)
			}
			detail, err := b.st.TeamMonthUsageDetail(b.ctx, team, upTo)
			if err != nil {
				t.Fatal(err)
			}
			kinds, err := b.st.TeamUsageByKind(b.ctx, team, detail.Month, detail.UpTo)
			if err != nil {
				t.Fatal(err)
			}
			last, err := b.st.TeamUsageBetween(b.ctx, team, detail.Month.AddDate(0, -1, 0), detail.Month)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(detail, got.TeamUsage); d != "" {
				t.Errorf("%s up to %v: detail differs (-separate +one query):\n%s", team, upTo, d)
			}
			if d := cmp.Diff(kinds, got.Kinds); d != "" {
				t.Errorf("%s up to %v: kinds differ (-separate +one query):\n%s", team, upTo, d)
			}
			if last != got.LastMonthGPUSeconds {
				t.Errorf("%s up to %v: last month %d, separately %d", team, upTo, got.LastMonthGPUSeconds, last)
			}
			if team == "nlp" && upTo.Equal(b.now) && (len(got.Daily) != 20 || got.UsedGPUSeconds == 0 || got.LastMonthGPUSeconds == 0 || len(got.Kinds) < 2) {
				t.Errorf("nlp: the demo's history is not there: %+v", got)
			}
		}
	}
	if _, err := b.st.TeamPageUsage(b.ctx, "nosuch", b.now); err == nil {
		t.Error("an unknown team should be an error")
	}
}
