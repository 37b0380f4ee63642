package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/web"
)

// `allot show JOB` (like `scontrol show job`): everything the API tells
// about a job as Key=Value pairs, a few to a line.

func showFlags(stderr io.Writer) (*flag.FlagSet, func() *client.Client, *bool) {
	fs := flag.NewFlagSet("show", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot show [job] JOB_ID... [--json]")
		fmt.Fprintln(stderr, "Shows a job as Key=Value lines, like scontrol show job. Times are UTC; (null) is an empty value.")
		fs.PrintDefaults()
	}
	return fs, newClient, asJSON
}

func cmdShow(args []string, stdout, stderr io.Writer) int {
	fs, newClient, asJSON := showFlags(stderr)
	ids, ok := parseJobIDs(fs, args, "show", stderr, func(w string) bool { return w == "job" || w == "jobs" }) // scontrol's "show job 12"
	if !ok {
		return 2
	}
	if len(ids) == 0 {
		fs.Usage()
		return 2
	}
	cl := newClient()
	var jobs []web.JobDetailJSON
	rc := 0
	for _, id := range ids {
		j, err := cl.JobDetail(context.Background(), id)
		if err != nil {
			rc = reportErr(stderr, "show", err)
			continue
		}
		jobs = append(jobs, j)
	}
	if *asJSON {
		if len(ids) == 1 && len(jobs) == 1 {
			printJSON(stdout, jobs[0])
		} else if len(jobs) > 0 {
			printJSON(stdout, jobs)
		}
		return rc
	}
	for i := range jobs {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		writeJobKV(stdout, &jobs[i], clock.Now())
	}
	return rc
}

type kv struct{ k, v string }

func null(s string) string {
	if s == "" {
		return "(null)"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// writeJobKV prints j as scontrol does: the first line flush left, the
// others indented by three spaces; long text gets a line of its own.
func writeJobKV(w io.Writer, j *web.JobDetailJSON, now time.Time) {
	r := &jobLine{JobJSON: j.JobJSON, now: now}
	gpuType, gpn := "(null)", "(null)"
	if j.GPUType != nil {
		gpuType = *j.GPUType
	}
	if j.GPUsPerNode != nil {
		gpn = strconv.Itoa(*j.GPUsPerNode)
	}
	exit := "(null)"
	if j.ExitCode != nil {
		exit = strconv.Itoa(*j.ExitCode)
	}
	var nodes []string
	if n := len(j.Runs); n > 0 {
		nodes = j.Runs[n-1].Nodes
	}
	var factors []string
	prio := strconv.FormatFloat(j.Priority, 'f', 0, 64)
	if j.PriorityBreakdown.Order == allot.QueueOrderResponse {
		// response-ratio:R×fair-share-multiplier:M (the response order's product)
		prio = strconv.FormatFloat(j.Priority, 'f', 3, 64)
		for _, f := range j.PriorityFactors {
			factors = append(factors, fmt.Sprintf("%s:%s", f.Name, strconv.FormatFloat(f.Points, 'f', -1, 64)))
		}
		factors = []string{strings.Join(factors, "×")}
	} else {
		for _, f := range j.PriorityFactors {
			factors = append(factors, fmt.Sprintf("%s:%s×%d=%s", f.Name, strconv.FormatFloat(f.Factor, 'f', -1, 64), f.Weight,
				strconv.FormatFloat(f.Points, 'f', 1, 64)))
		}
	}
	lines := [][]kv{
		{{"JobId", strconv.FormatInt(j.ID, 10)}, {"JobName", null(j.Name)}},
		{{"UserId", j.User}, {"Account", j.Team}, {"RunAsUser", null(j.RunAsUser)}},
		{{"Tier", j.Tier}, {"Partition", j.Tier}, {"QOS", j.Tier}, {"Preemptible", yesNo(j.Preemptible)}, {"Demoted", yesNo(j.Demoted)},
			{"Checkpointable", yesNo(j.Checkpointable)}, {"RunAsTier", null(j.RunAs)}},
		{{"JobState", slurmState[j.State][0]}, {"AllotState", j.State}, {"ExitCode", exit}, {"Segment", strconv.Itoa(j.Segment)},
			{"Preemptions", strconv.Itoa(j.Preemptions)}},
		{{"Reason", null(j.PendingReason)}},
		{{"Priority", prio}, {"PriorityClass", strconv.Itoa(j.PriorityBreakdown.Class)},
			{"PriorityFactors", null(strings.Join(factors, ","))}},
	}
	if q := j.Queue; q != nil {
		est := "(null)"
		if q.EstimatedStart != nil {
			est = slurmTime(q.EstimatedStart)
		}
		lines = append(lines, []kv{{"QueuePosition", fmt.Sprintf("%d/%d", q.Position, q.Of)}, {"AheadGPUHours", q.AheadGPUHours},
			{"EstimatedStart", est}})
		if q.Unknown != "" {
			lines = append(lines, []kv{{"EstimateUnknownBecause", q.Unknown}})
		}
	}
	lines = append(lines,
		[]kv{{"SubmitTime", slurmTime(&j.SubmittedAt)}, {"StartTime", slurmTime(j.StartedAt)}, {"EndTime", slurmTime(j.EndedAt)}},
		[]kv{{"TimeLimit", slurmDuration(time.Duration(j.TimeLimitS) * time.Second)}, {"RunTime", slurmDuration(r.used())},
			{"TimeLeft", jobFieldValue('L', r)}},
		[]kv{{"NumNodes", strconv.Itoa(max(len(nodes), 1))}, {"NodeList", null(strings.Join(nodes, ","))}, {"GPUs", strconv.Itoa(j.GPUs)},
			{"GPUType", gpuType}, {"GPUsPerNode", gpn}, {"TRES", r.gres()}},
		[]kv{{"MinCPUsNode", strconv.FormatFloat(j.CPUs, 'f', -1, 64)}, {"MinMemoryNode", memoryText(j.MemoryBytes)},
			{"Image", null(j.Image)}},
		[]kv{{"WorkDir", null(j.WorkDir)}},
		[]kv{{"Command", null(strings.Join(j.Command, " "))}},
		[]kv{{"Environment", null(strings.Join(sortedKeys(j.Env), ","))}, {"EnvRedacted", yesNo(j.EnvRedacted)},
			{"SecretEnvironment", null(strings.Join(sortedKeys(j.SecretEnv), ","))}},
	)
	if j.EndReason != "" {
		lines = append(lines, []kv{{"EndReason", j.EndReason}})
	}
	if j.QuotaWarning != "" {
		lines = append(lines, []kv{{"QuotaWarning", j.QuotaWarning}})
	}
	cost := strings.TrimSpace(j.Cost.Amount + " " + j.Cost.Currency)
	lines = append(lines, []kv{{"Cost", null(cost)}, {"Charges", null(j.Cost.Charges)}, {"PreemptionCredits", null(j.Cost.Credits)},
		{"GPUHours", null(j.Cost.GPUHours)}, {"CostUpTo", null(j.Cost.UpTo)}})
	for _, run := range j.Runs {
		l := []kv{{fmt.Sprintf("Run[%d]", run.Segment), null(strings.Join(run.Nodes, ","))}, {"GPUs", strconv.Itoa(run.GPUs)},
			{"Start", slurmTime(&run.Start)}, {"End", slurmTime(run.End)}}
		if run.StopReason != "" {
			l = append(l, kv{"StopReason", run.StopReason})
		}
		if run.PreemptedBy != 0 {
			l = append(l, kv{"PreemptedBy", strconv.FormatInt(run.PreemptedBy, 10)})
		}
		lines = append(lines, l)
	}
	for i, l := range lines {
		parts := make([]string, len(l))
		for k, p := range l {
			parts[k] = p.k + "=" + oneLine(p.v)
		}
		indent := "   "
		if i == 0 {
			indent = ""
		}
		fmt.Fprintln(w, indent+strings.Join(parts, " "))
	}
}

// jobFieldValue is the value of `allot jobs`' field with letter c.
func jobFieldValue(c byte, r *jobLine) string {
	return fieldByLetter(jobFields, c).value(r)
}
