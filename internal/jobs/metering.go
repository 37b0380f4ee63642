package jobs

import (
	"context"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/riverqueue/river"
)

// DefaultSampleRetention is how long raw GPU samples are kept once rolled up.
const DefaultSampleRetention = 14 * 24 * time.Hour

// MeteringResult says what a metering run did.
type MeteringResult struct {
	Rows           int   // job-hour rollup rows written
	SamplesDeleted int64 // raw samples deleted by retention
}

// Metering rolls up the job usage of the last 3 UTC hours and the current
// one (so late samples and exit reports are picked up), then deletes raw
// samples older than retention (default 14 days) in hours already rolled
// up. Both steps are idempotent; rollups are kept.
func Metering(ctx context.Context, st *store.Store, now time.Time, retention time.Duration) (MeteringResult, error) {
	var res MeteringResult
	if retention <= 0 {
		retention = DefaultSampleRetention
	}
	now = now.UTC()
	n, err := st.RollupJobUsage(ctx, now.Truncate(time.Hour).Add(-3*time.Hour), now)
	if err != nil {
		return res, err
	}
	res.Rows = n
	res.SamplesDeleted, err = st.DeleteRawSamples(ctx, now.Add(-retention))
	return res, err
}

// MeteringArgs runs the hourly metering rollup and sample retention.
type MeteringArgs struct{}

// Kind names the job in River's table.
func (MeteringArgs) Kind() string { return "metering" }

// InsertOpts makes the job unique per hour so replicas don't pile it up.
func (MeteringArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: time.Hour}}
}

// MeteringWorker works MeteringArgs.
type MeteringWorker struct {
	river.WorkerDefaults[MeteringArgs]
	Store     *store.Store
	Retention time.Duration // raw sample retention; 0 means DefaultSampleRetention
}

// Work rolls up usage and applies the retention.
func (w *MeteringWorker) Work(ctx context.Context, _ *river.Job[MeteringArgs]) error {
	_, err := Metering(ctx, w.Store, w.Store.Now(), w.Retention)
	return err
}

// WeeklySummary returns team's weekly right-sizing message for the 7 days
// before now (for the team's weekly notification).
func WeeklySummary(ctx context.Context, st *store.Store, team string, now time.Time) (string, error) {
	rep, err := st.RightSizing(ctx, now.Add(-7*24*time.Hour), now, store.RightSizingScope{Teams: []string{team}})
	if err != nil {
		return "", err
	}
	return WeeklySummaryText(rep, team), nil
}

// WeeklySummaryText formats team's part of rep as one message, e.g.
// "Weekly GPU report for nlp: 412.5 GPU-h, mean util 37 %, 3 jobs flagged,
// ≈ 1,234.00 USD could have been saved: #12 bert (request 4 GPUs instead of
// 8, 600.00 USD); …". At most 3 jobs are named.
func WeeklySummaryText(rep *store.RightSizingReport, team string) string {
	t := store.UsageSummary{Team: team, Cost: allot.Money{Currency: rep.Currency}, Savings: allot.Money{Currency: rep.Currency}}
	for _, x := range rep.Teams {
		if x.Team == team {
			t = x
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Weekly GPU report for %s (%s – %s): %s GPU-h", team, rep.From.Format("Jan 2"), rep.To.Format("Jan 2"),
		new(big.Rat).SetFrac64(t.GPUSeconds, 3600).FloatString(1))
	if t.MeanUtilPct != nil {
		fmt.Fprintf(&b, ", mean util %.0f %%", *t.MeanUtilPct)
	}
	if t.MeanMemPct != nil {
		fmt.Fprintf(&b, ", mean memory %.0f %%", *t.MeanMemPct)
	}
	fmt.Fprintf(&b, ", cost %s", groupThousands(t.Cost))
	if t.Flagged == 0 {
		b.WriteString(", no job flagged.")
		return b.String()
	}
	fmt.Fprintf(&b, ", %d job%s flagged, ≈ %s could have been saved:", t.Flagged, plural(t.Flagged), groupThousands(t.Savings))
	named := 0
	for _, j := range rep.Jobs {
		if j.Team != team {
			continue
		}
		if named == 3 {
			b.WriteString(" …")
			break
		}
		sep := " "
		if named > 0 {
			sep = "; "
		}
		best := j.Flags[0]
		for _, f := range j.Flags {
			if f.Savings.Micros > best.Savings.Micros {
				best = f
			}
		}
		fmt.Fprintf(&b, "%s#%d %s by %s (%s, %s)", sep, j.JobID, j.Name, j.User, best.Suggestion, groupThousands(j.Savings))
		named++
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// groupThousands formats money as "1,234.00 USD".
func groupThousands(m allot.Money) string {
	d := m.Decimal()
	sign := ""
	if strings.HasPrefix(d, "-") {
		sign, d = "-", d[1:]
	}
	whole, frac, _ := strings.Cut(d, ".")
	var out []byte
	for i := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, whole[i])
	}
	return sign + string(out) + "." + frac + " " + m.Currency
}
