package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/client"
)

// `allot prio` (like sprio): the pending jobs the caller can see in the
// scheduler's order, with the factors of their priority as the last
// scheduling cycle computed them.

type prioCmd struct {
	team          string
	me            bool
	limit         int
	norm, weights bool
	listOutput
}

func prioFlags(stderr io.Writer) (*flag.FlagSet, func() *client.Client, *prioCmd) {
	fs := flag.NewFlagSet("prio", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	c := &prioCmd{}
	fs.StringVar(&c.team, "team", "", "only this `team`'s jobs")
	fs.BoolVar(&c.me, "me", false, "only my jobs")
	fs.IntVar(&c.limit, "limit", 100, "at most this many jobs, from the head of the queue (1–1000)")
	fs.BoolVar(&c.norm, "norm", false, "the factors themselves (0–1) instead of weighted (sprio -n)")
	fs.BoolVar(&c.weights, "weights", false, "print only the policy's weights (sprio -w)")
	c.flags(fs)
	aliasFlags(fs, map[string]string{"account": "team", "A": "team", "n": "norm", "w": "weights"})
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot prio [--team T] [--me] [--norm] [--weights] [--parsable] [--noheader] [--json]")
		fmt.Fprintln(stderr, "Pending jobs in queue order, like sprio: class (CLASS, tier 1 first), then PRIORITY as the last scheduling cycle")
		fmt.Fprintln(stderr, "computed it. Under the response order (the default): PRIORITY = RESPONSE × FS_MULT, RESPONSE = (wait + T) / T with")
		fmt.Fprintln(stderr, "T the time limit, FS_MULT = max(2·FAIRSHARE, 1/32). Under the multifactor order: PRIORITY = AGE + FAIRSHARE + JOBSIZE,")
		fmt.Fprintln(stderr, "each its factor times the policy's weight (and tier 3-4 jobs that have waited 20 minutes are served first, oldest first).")
		fs.PrintDefaults()
	}
	return fs, newClient, c
}

func cmdPrio(args []string, stdout, stderr io.Writer) int {
	fs, newClient, c := prioFlags(stderr)
	if !parseFlagsOnly(fs, args, "prio", stderr) {
		return 2
	}
	if c.limit < 1 || c.limit > 1000 {
		fmt.Fprintln(stderr, "allot prio: --limit must be between 1 and 1000")
		return 2
	}
	p, err := newClient().Priorities(context.Background(), client.PriorityQuery{Team: c.team, Mine: c.me, Limit: c.limit})
	if err != nil {
		return reportErr(stderr, "prio", err)
	}
	if c.json {
		return printJSON(stdout, p)
	}
	if c.weights {
		t := simpleTable{header: []string{"JOBID", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE"}}
		t.add("Weights", "", strconv.Itoa(p.Weights.Age), strconv.Itoa(p.Weights.FairShare), strconv.Itoa(p.Weights.Size))
		c.table(stdout, &t)
		return 0
	}
	if p.Order == allot.QueueOrderResponse {
		// The response order: PRIORITY = RESPONSE × FS_MULT.
		t := simpleTable{header: []string{"JOBID", "TEAM", "USER", "TIER", "CLASS", "PRIORITY", "RESPONSE", "FS_MULT", "FAIRSHARE"}}
		f := func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
		for _, j := range p.Jobs {
			t.add(strconv.FormatInt(j.ID, 10), j.Team, j.User, j.Tier, j.Class, strconv.FormatFloat(j.Priority, 'f', 3, 64),
				f(j.Factors.ResponseRatio), f(j.FairShareMultiplier), f(j.Factors.FairShare))
		}
		c.table(stdout, &t)
		return 0
	}
	t := simpleTable{header: []string{"JOBID", "TEAM", "USER", "TIER", "CLASS", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE"}}
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }
	if c.norm {
		num = func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
	}
	for _, j := range p.Jobs {
		age, fsh, size := j.Points.Age, j.Points.FairShare, j.Points.Size
		if c.norm {
			age, fsh, size = j.Factors.Age, j.Factors.FairShare, j.Factors.Size
		}
		t.add(strconv.FormatInt(j.ID, 10), j.Team, j.User, j.Tier, j.Class, strconv.FormatFloat(j.Priority, 'f', 0, 64), num(age), num(fsh), num(size))
	}
	c.table(stdout, &t)
	return 0
}
