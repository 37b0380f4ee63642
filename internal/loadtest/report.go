package loadtest

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Errors is the number of failed calls over every operation.
func (r *Report) Errors() int {
	n := 0
	for _, o := range r.Ops {
		n += o.Errors
	}
	return n
}

// Op returns the named operation's figures (zero when it never ran).
func (r *Report) Op(name string) OpReport {
	for _, o := range r.Ops {
		if o.Name == name {
			return o
		}
	}
	return OpReport{Name: name}
}

// WriteText prints the report as a table for people.
func (r *Report) WriteText(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "allot loadtest: %.1f s from %s", r.DurationS, r.StartedAt.Format("2006-01-02 15:04:05 UTC"))
	if c.WarmupS > 0 {
		fmt.Fprintf(w, " (after %gs of warm-up)", c.WarmupS)
	}
	fmt.Fprintf(w, "; %d submitters", c.Submitters)
	if c.SubmitRate > 0 {
		fmt.Fprintf(w, " at %g/s", c.SubmitRate)
	} else {
		fmt.Fprint(w, " as fast as they go")
	}
	fmt.Fprintf(w, ", %d agents × %d GPUs heartbeating every %gs (jobs run %gs), %d pending and %d busy nodes seeded",
		c.Agents, c.GPUsPerAgent, c.HeartbeatS, c.JobRuntimeS, c.Pending, c.Nodes)
	if c.Pages {
		fmt.Fprintf(w, ", pages with a year of history (%d jobs)", c.HistoryJobs)
	}
	fmt.Fprintln(w)
	if len(r.Seeding) > 0 {
		parts := make([]string, len(r.Seeding))
		for i, s := range r.Seeding {
			parts[i] = fmt.Sprintf("%s %.1f s", s.What, s.S)
		}
		fmt.Fprintf(w, "seeding: %s\n", strings.Join(parts, "; "))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "operation\tcount\terrors\trate/s\tp50 ms\tp90 ms\tp95 ms\tp99 ms\tmax ms\t")
	for _, o := range r.Ops {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", o.Name, o.Count, o.Errors, o.Rate, o.P50, o.P90, o.P95, o.P99, o.Max)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, o := range r.Ops {
		if o.Errors > 0 {
			parts := []string{}
			for _, k := range sortedKeys(o.ByStatus) {
				parts = append(parts, fmt.Sprintf("%s × %d", k, o.ByStatus[k]))
			}
			fmt.Fprintf(w, "errors of %s: %s; first: %s\n", o.Name, strings.Join(parts, ", "), o.FirstError)
		}
	}
	if len(r.Server) > 0 {
		fmt.Fprintln(w, "\ninside the server (allot_http_request_duration_seconds, from admission to the answer; allot_admission_wait_seconds, an admitted request's wait for a slot; interpolated in the buckets):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "route\tcount\tp50 ms\tp99 ms\tover 5 s\t")
		for _, o := range r.Server {
			fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%d\t\n", o.Route, o.Count, o.P50, o.P99, o.Over)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if p := r.Probe; p != nil {
		fmt.Fprintf(w, "\ncycle probe after seeding (%d pending, %d nodes, %d GPUs): load %.1f ms, whole cycle %.1f ms (lock, decay, load, plan, apply, commit), %d started\n",
			p.Pending, p.Nodes, p.GPUs, p.LoadMS, p.CycleMS, p.Started)
	}
	if cy := r.Cycles; cy != nil {
		fmt.Fprintf(w, "\nworker's cycles during the run: %d, p50 %.1f ms, p99 %.1f ms, max %.1f ms; up to %d pending; %d jobs started, %d preempted\n",
			cy.Count, cy.P50, cy.P99, cy.Max, cy.MaxPending, cy.Started, cy.Preempted)
		if len(cy.Phases) > 0 {
			parts := []string{}
			for _, k := range sortedKeys(cy.Phases) {
				parts = append(parts, fmt.Sprintf("%s %.1f ms", k, cy.Phases[k]))
			}
			fmt.Fprintf(w, "cycle phases (mean, from the worker's metrics): %s\n", strings.Join(parts, ", "))
		}
	}
	for _, c := range []struct {
		what string
		n    map[string]int
	}{{"submitted jobs at the end", r.Jobs}, {"the agents' nodes at the end", r.Nodes}, {"refused by admission control in the window (level/reason)", r.Refused}} {
		if len(c.n) == 0 {
			continue
		}
		parts := []string{}
		for _, k := range sortedKeys(c.n) {
			parts = append(parts, fmt.Sprintf("%s %d", k, c.n[k]))
		}
		fmt.Fprintf(w, "%s: %s\n", c.what, strings.Join(parts, ", "))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	_, err := fmt.Fprintf(w, "\n%d errors in all\n", r.Errors())
	return err
}
