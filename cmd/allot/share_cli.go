package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/web"
)

// `allot share` (like sshare): every team's fair-share standing, and this
// month's budget use for the teams the caller may see budgets of.

type shareCmd struct {
	team string
	listOutput
}

func shareFlags(stderr io.Writer) (*flag.FlagSet, func() *client.Client, *shareCmd) {
	fs := flag.NewFlagSet("share", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	c := &shareCmd{}
	fs.StringVar(&c.team, "team", "", "only these `teams`, comma-separated (Slurm's accounts)")
	c.flags(fs)
	aliasFlags(fs, map[string]string{"account": "team", "A": "team", "P": "parsable", "n": "noheader"})
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot share [--team T,U] [--parsable] [--noheader] [--json]")
		fmt.Fprintln(stderr, "Each team's fair share, like sshare: RawShares = its fair-share weight, NormShares = weight ÷ all weights,")
		fmt.Fprintln(stderr, "RawUsage = decayed GPU-seconds, EffectvUsage = its part of all usage, FairShare = 2^(−EffectvUsage/NormShares);")
		fmt.Fprintln(stderr, "and this month's budget (GPU-hours) and use, for the teams you are in (finance and admins: all).")
		fs.PrintDefaults()
	}
	return fs, newClient, c
}

// ShareRow is one line of `allot share --json`.
type ShareRow struct {
	web.FairShareRowJSON
	BudgetGPUHours *int64  `json:"budget_gpu_hours"` // null: not yours to see
	UsedGPUHours   *string `json:"used_gpu_hours"`
	UsedPct        *int64  `json:"used_pct"`
	Month          string  `json:"month,omitempty"`
}

func cmdShare(args []string, stdout, stderr io.Writer) int {
	fs, newClient, c := shareFlags(stderr)
	if !parseFlagsOnly(fs, args, "share", stderr) {
		return 2
	}
	want := map[string]bool{}
	for _, t := range strings.Split(c.team, ",") {
		if t = strings.TrimSpace(t); t != "" {
			want[t] = true
		}
	}
	ctx := context.Background()
	cl := newClient()
	fsh, err := cl.FairShare(ctx)
	if err != nil {
		return reportErr(stderr, "share", err)
	}
	me, err := cl.Me(ctx)
	if err != nil {
		return reportErr(stderr, "share", err)
	}
	known := map[string]bool{}
	for _, t := range fsh.Teams {
		known[t.Team] = true
	}
	for t := range want {
		if !known[t] {
			fmt.Fprintf(stderr, "allot share: no team %q\n", t)
			return 2
		}
	}
	var rows []ShareRow
	for _, t := range fsh.Teams {
		if len(want) > 0 && !want[t.Team] {
			continue
		}
		r := ShareRow{FairShareRowJSON: t}
		if _, member := me.Teams[t.Team]; member || me.Admin || me.Finance {
			b, err := cl.TeamBudget(ctx, t.Team)
			if err != nil {
				return reportErr(stderr, "share", err)
			}
			r.BudgetGPUHours, r.UsedGPUHours, r.UsedPct, r.Month = &b.BudgetGPUHours, &b.UsedGPUHours, &b.UsedPct, b.Month
		}
		rows = append(rows, r)
	}
	if c.json {
		if rows == nil {
			rows = []ShareRow{}
		}
		return printJSON(stdout, rows)
	}
	t := simpleTable{header: []string{"Account", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare", "BudgetGPUh", "UsedGPUh", "Used%"}}
	f6 := func(x float64) string { return strconv.FormatFloat(x, 'f', 6, 64) }
	for _, r := range rows {
		budget, used, pct := "", "", ""
		if r.BudgetGPUHours != nil {
			budget, used, pct = strconv.FormatInt(*r.BudgetGPUHours, 10), *r.UsedGPUHours, strconv.FormatInt(*r.UsedPct, 10)
		}
		t.add(r.Team, strconv.Itoa(r.RawShares), f6(r.NormShares), strconv.FormatFloat(r.RawUsageGPUSec, 'f', 0, 64), f6(r.EffectiveUsage),
			f6(r.FairShare), budget, used, pct)
	}
	c.table(stdout, &t)
	return 0
}
