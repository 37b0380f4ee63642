package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/client"
)

func cmdJobs(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	team := fs.String("team", "", "only this team")
	state := fs.String("state", "", "only this state (pending, running, completed, failed, cancelled, preempted, lost)")
	limit := fs.Int("limit", 50, "at most this many jobs (1–1000)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "allot jobs: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	jobs, err := newClient().Jobs(context.Background(), client.ListOptions{Team: *team, State: *state, Limit: *limit})
	if err != nil {
		return reportErr(stderr, "jobs", err)
	}
	if *asJSON {
		return printJSON(stdout, jobs)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tTEAM\tUSER\tTIER\tGPUS\tLIMIT\tSTATE\tSUBMITTED\tREASON")
	for _, j := range jobs {
		g := strconv.Itoa(j.GPUs)
		if j.GPUType != nil {
			g += "×" + *j.GPUType
		}
		tier := j.Tier
		if j.Preemptible && tier != "preemptible" {
			tier += "(p)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.Name, j.Team, j.User, tier, g,
			allot.FormatDuration(time.Duration(j.TimeLimitS)*time.Second), j.State, j.SubmittedAt.Format("01-02 15:04"), j.PendingReason)
	}
	tw.Flush()
	return 0
}

func cmdCancel(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: allot cancel [--server URL] [--token T] JOB_ID")
		return 2
	}
	id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
	if err != nil || id < 1 {
		fmt.Fprintf(stderr, "allot cancel: %q is not a job id\n", fs.Arg(0))
		return 2
	}
	j, err := newClient().Cancel(context.Background(), id)
	if err != nil {
		return reportErr(stderr, "cancel", err)
	}
	fmt.Fprintf(stdout, "job %d is %s\n", j.ID, j.State)
	return 0
}
