package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/web"
)

// `allot jobs` (like squeue) and `allot cancel` (like scancel).

// stateNames maps every accepted spelling of a job state (Allot's names,
// Slurm's long and short names, any case) to Allot's name.
var stateNames = map[string]string{
	"pending": "pending", "pd": "pending",
	"running": "running", "r": "running",
	"completed": "completed", "cd": "completed",
	"failed": "failed", "f": "failed",
	"cancelled": "cancelled", "canceled": "cancelled", "ca": "cancelled",
}

// slurmState is a state's Slurm name: long (PENDING) and short (PD).
var slurmState = map[string][2]string{
	"pending": {"PENDING", "PD"}, "running": {"RUNNING", "R"}, "completed": {"COMPLETED", "CD"},
	"failed": {"FAILED", "F"}, "cancelled": {"CANCELLED", "CA"},
}

// parseStates reads a comma-separated list of states; "all" (alone) is
// no filter.
func parseStates(s string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(s, ",") {
		v = strings.ToLower(strings.TrimSpace(v))
		switch v {
		case "":
			continue
		case "all":
			if strings.TrimSpace(s) != v && strings.ToLower(strings.TrimSpace(s)) != "all" {
				return nil, errors.New(`"all" cannot be combined with other states`)
			}
			return nil, nil
		case "pr", "preempted", "requeued", "rq":
			return nil, fmt.Errorf("no Allot job is ever %s: a preempted or requeued job goes back to pending (PD) with its submission time, and `allot show JOB` counts its preemptions", strings.ToUpper(v))
		}
		st, ok := stateNames[v]
		if !ok {
			return nil, fmt.Errorf("unknown state %q: use PD, R, CD, F, CA or pending, running, completed, failed, cancelled (comma-separated), or all", v)
		}
		if !contains(out, st) {
			out = append(out, st)
		}
	}
	return out, nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// jobLine is a job with what its fields need from outside it.
type jobLine struct {
	web.JobJSON
	now     time.Time
	maxNode map[string]int // largest node's GPUs by GPU type ("" = any), for %D
}

func (j *jobLine) gres() string {
	if j.GPUType != nil {
		return fmt.Sprintf("gpu:%s:%d", *j.GPUType, j.GPUs)
	}
	return fmt.Sprintf("gpu:%d", j.GPUs)
}

func (j *jobLine) used() time.Duration {
	if j.StartedAt == nil {
		return 0
	}
	end := j.now
	if j.EndedAt != nil {
		end = *j.EndedAt
	}
	return end.Sub(*j.StartedAt)
}

// nodes is how many nodes the job takes: exact with gpus_per_node, else
// one when it fits on the largest node of its GPU type, else that many
// whole largest nodes (how the scheduler places it).
func (j *jobLine) nodes() string {
	if j.GPUsPerNode != nil && *j.GPUsPerNode > 0 {
		return strconv.Itoa((j.GPUs + *j.GPUsPerNode - 1) / *j.GPUsPerNode)
	}
	typ := ""
	if j.GPUType != nil {
		typ = *j.GPUType
	}
	m := j.maxNode[typ]
	if m <= 0 || j.GPUs <= m {
		return "1"
	}
	return strconv.Itoa((j.GPUs + m - 1) / m)
}

// memoryText is a memory size as the portal writes it ("64GiB"); 0 (the
// node's default) is "0".
func memoryText(b int64) string {
	if b == 0 {
		return "0"
	}
	return allot.FormatMemory(b)
}

func ptrText(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// jobFields are `allot jobs`' columns: squeue's letters where Slurm has
// one (account = team, partition and qos = tier).
var jobFields = []field[jobLine]{
	{'i', []string{"id", "jobid"}, "JOBID", "job id", func(j *jobLine) string { return strconv.FormatInt(j.ID, 10) }},
	{'A', []string{"job_id"}, "JOBID", "job id (as %i)", func(j *jobLine) string { return strconv.FormatInt(j.ID, 10) }},
	{'j', []string{"name"}, "NAME", "job name", func(j *jobLine) string { return j.Name }},
	{'u', []string{"user", "username"}, "USER", "submitter's email", func(j *jobLine) string { return j.User }},
	{'a', []string{"team", "account"}, "TEAM", "team (Slurm's account)", func(j *jobLine) string { return j.Team }},
	{'P', []string{"tier", "partition"}, "TIER", "tier, (p) when submitted preemptible (Slurm's partition)", func(j *jobLine) string {
		if j.Preemptible && j.Tier != "preemptible" {
			return j.Tier + "(p)"
		}
		return j.Tier
	}},
	{'q', []string{"qos"}, "QOS", "tier (Slurm's QOS)", func(j *jobLine) string { return j.Tier }},
	{'T', []string{"state", "statelong"}, "STATE", "state, long (PENDING)", func(j *jobLine) string { return slurmState[j.State][0] }},
	{'t', []string{"st", "statecompact"}, "ST", "state, short (PD)", func(j *jobLine) string { return slurmState[j.State][1] }},
	{0, []string{"allot_state"}, "STATE", "state as Allot names it (pending)", func(j *jobLine) string { return j.State }},
	{'D', []string{"nodes", "numnodes"}, "NODES", "nodes (exact with --gpus-per-node, else as the scheduler places it)", func(j *jobLine) string { return j.nodes() }},
	{'b', []string{"gres", "tres_per_node", "tres"}, "GRES", "GPUs asked for: gpu[:type]:N", func(j *jobLine) string { return j.gres() }},
	{0, []string{"gpus"}, "GPUS", "GPUs, with their type (8×A100-80GB)", func(j *jobLine) string {
		g := strconv.Itoa(j.GPUs)
		if j.GPUType != nil {
			g += "×" + *j.GPUType
		}
		return g
	}},
	{0, []string{"gpu_type"}, "GPU_TYPE", "GPU type asked for (empty: any)", func(j *jobLine) string { return ptrText(j.GPUType) }},
	{'l', []string{"time_limit", "timelimit"}, "TIME_LIMIT", "time limit ([D-]H:MM:SS)", func(j *jobLine) string {
		return slurmDuration(time.Duration(j.TimeLimitS) * time.Second)
	}},
	{'M', []string{"time", "timeused", "time_used"}, "TIME", "time used (since the first start)", func(j *jobLine) string { return slurmDuration(j.used()) }},
	{'L', []string{"time_left", "timeleft"}, "TIME_LEFT", "time left before the limit", func(j *jobLine) string {
		if j.EndedAt != nil {
			return slurmDuration(0)
		}
		return slurmDuration(time.Duration(j.TimeLimitS)*time.Second - j.used())
	}},
	{'r', []string{"reason"}, "REASON", "why it is pending, or why it ended", func(j *jobLine) string {
		if j.PendingReason != "" {
			return j.PendingReason
		}
		return j.EndReason
	}},
	{'R', []string{"reasonlist"}, "REASON", "(reason) of a pending job; Allot's list has no node names: see allot show", func(j *jobLine) string {
		if j.PendingReason != "" {
			return "(" + j.PendingReason + ")"
		}
		return ""
	}},
	{'V', []string{"submit_time", "submittime", "submitted"}, "SUBMIT_TIME", "submission time (UTC)", func(j *jobLine) string { return slurmTime(&j.SubmittedAt) }},
	{'S', []string{"start_time", "starttime"}, "START_TIME", "first start (UTC), N/A before", func(j *jobLine) string { return slurmTime(j.StartedAt) }},
	{'e', []string{"end_time", "endtime"}, "END_TIME", "end (UTC), N/A before", func(j *jobLine) string { return slurmTime(j.EndedAt) }},
	{'Q', []string{"priority"}, "PRIORITY", "priority as the last scheduling cycle computed it (see allot prio)", func(j *jobLine) string {
		return strconv.FormatFloat(j.Priority, 'f', 0, 64)
	}},
	{'p', []string{"prio"}, "PRIORITY", "priority (as %Q)", func(j *jobLine) string { return strconv.FormatFloat(j.Priority, 'f', 0, 64) }},
	{'Z', []string{"work_dir", "workdir"}, "WORK_DIR", "working directory", func(j *jobLine) string { return j.WorkDir }},
	{'o', []string{"command"}, "COMMAND", "command", func(j *jobLine) string { return strings.Join(j.Command, " ") }},
	{'C', []string{"cpus", "numcpus"}, "CPUS", "CPUs per node (0: the node's default)", func(j *jobLine) string { return strconv.FormatFloat(j.CPUs, 'f', -1, 64) }},
	{'m', []string{"min_memory", "minmemory", "memory"}, "MIN_MEMORY", "memory per node (0: the node's default)", func(j *jobLine) string {
		return memoryText(j.MemoryBytes)
	}},
	{0, []string{"run_as", "run_as_user"}, "RUN_AS", "POSIX account the job runs as", func(j *jobLine) string { return j.RunAsUser }},
	{0, []string{"exit_code", "exitcode"}, "EXIT_CODE", "exit code", func(j *jobLine) string {
		if j.ExitCode == nil {
			return ""
		}
		return strconv.Itoa(*j.ExitCode)
	}},
	{0, []string{"preemptions"}, "PREEMPTIONS", "times preempted or requeued", func(j *jobLine) string { return strconv.Itoa(j.Preemptions) }},
}

// defaultJobsFormat is `allot jobs` without --format.
const defaultJobsFormat = "id,name,team,user,tier,gpus,time_limit,state,submit_time,reason"

// jobsOptions are the filters `allot jobs` and `allot cancel` share.
type jobsOptions struct {
	me                     bool
	team, state, user, tie string
	name                   string
}

func (o *jobsOptions) flags(fs *flag.FlagSet) {
	fs.BoolVar(&o.me, "me", false, "only my jobs (squeue --me)")
	fs.StringVar(&o.team, "team", "", "only this `team` (Slurm's account)")
	fs.StringVar(&o.state, "state", "", "only these `states`, comma-separated: PD, R, CD, F, CA or pending, running, completed, failed, cancelled; all")
	fs.StringVar(&o.user, "user", "", "only jobs of these `emails`, comma-separated (me: mine)")
	fs.StringVar(&o.tie, "tier", "", "only this `tier` (1, 2, 3, 4, preemptible; Slurm's partition)")
	fs.StringVar(&o.name, "name", "", "only jobs whose name contains `text`")
	aliasFlags(fs, map[string]string{"account": "team", "A": "team", "states": "state", "t": "state", "u": "user",
		"partition": "tier", "p": "tier", "n": "name"})
}

// aliasFlags adds Slurm's spellings of flags: alias → flag, sharing its value.
func aliasFlags(fs *flag.FlagSet, aliases map[string]string) {
	names := make([]string, 0, len(aliases))
	for a := range aliases {
		names = append(names, a)
	}
	sort.Strings(names)
	for _, a := range names {
		of := fs.Lookup(aliases[a])
		dash := "--"
		if len(of.Name) == 1 {
			dash = "-"
		}
		fs.Var(of.Value, a, "same as "+dash+of.Name)
	}
}

func (o *jobsOptions) query() (client.JobQuery, error) {
	q := client.JobQuery{Mine: o.me, Team: strings.TrimSpace(o.team), Tier: strings.TrimSpace(o.tie), Name: strings.TrimSpace(o.name)}
	if strings.Contains(q.Team, ",") {
		return q, errors.New("--team takes one team")
	}
	states, err := parseStates(o.state)
	if err != nil {
		return q, fmt.Errorf("--state: %w", err)
	}
	q.States = states
	for _, u := range strings.Split(o.user, ",") {
		if u = strings.TrimSpace(u); u != "" {
			q.Users = append(q.Users, u)
		}
	}
	return q, nil
}

// jobsFlags is `allot jobs`' flag set (also read by shell completion).
func jobsFlags(stderr io.Writer) (*flag.FlagSet, func() *client.Client, *jobsCmd) {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	c := &jobsCmd{}
	c.opts.flags(fs)
	fs.StringVar(&c.format, "format", "", "output `format`: squeue letters (\"%.8i %-20j %T %M\") or field names (id,name:30,state:.10, squeue -O style)")
	aliasFlags(fs, map[string]string{"o": "format", "Format": "format", "O": "format"})
	c.out.flags(fs)
	fs.IntVar(&c.limit, "limit", 100, "at most this many jobs, newest first (0: all)")
	fs.BoolVar(&c.start, "start", false, "pending jobs in the scheduler's order with the last cycle's rank and expected start, like squeue --start")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot jobs [--me] [--team T] [--state PD,R] [--user EMAIL] [-o FORMAT] [--parsable] [--noheader] [--json]")
		fmt.Fprintln(stderr, "       allot jobs --start [--me] [--team T] [--tier T] [--name TEXT] [--limit N] [--parsable] [--noheader] [--json]")
		fmt.Fprintln(stderr, "Lists jobs newest first, like squeue (which lists only pending and running ones: --state PD,R). Times are UTC.")
		fmt.Fprintln(stderr, "With --start, like squeue --start: the pending jobs in the scheduler's order as its last cycle decided it, with their rank,")
		fmt.Fprintln(stderr, "expected start and what it rests on (reservation, preemption, projection) and reason; jobs not yet through a cycle last.")
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "Fields (letter for -o, names for --format/-O):\n%s", fieldHelp(jobFields))
	}
	return fs, newClient, c
}

type jobsCmd struct {
	opts   jobsOptions
	format string
	out    listOutput
	limit  int
	start  bool
}

func cmdJobs(args []string, stdout, stderr io.Writer) int {
	fs, newClient, c := jobsFlags(stderr)
	if !parseFlagsOnly(fs, args, "jobs", stderr) {
		return 2
	}
	q, err := c.opts.query()
	if err != nil {
		fmt.Fprintf(stderr, "allot jobs: %v\n", err)
		return 2
	}
	if c.limit < 0 {
		fmt.Fprintln(stderr, "allot jobs: --limit must be 0 (all) or a positive number of jobs")
		return 2
	}
	if c.start {
		return c.runStart(q, newClient, stdout, stderr)
	}
	text := c.format
	if text == "" {
		text = defaultJobsFormat
	}
	f, err := parseFormat(jobFields, text)
	if err != nil {
		fmt.Fprintf(stderr, "allot jobs: --format: %v\n", err)
		return 2
	}
	ctx := context.Background()
	cl := newClient()
	q.Limit = min(max(c.limit, 1), 1000)
	if c.limit == 0 {
		q.Limit = 1000
	}
	jobs, err := cl.AllJobs(ctx, q, c.limit)
	if err != nil {
		return reportErr(stderr, "jobs", err)
	}
	if c.out.json {
		if jobs == nil {
			jobs = []web.JobJSON{}
		}
		return printJSON(stdout, jobs)
	}
	rows := make([]*jobLine, len(jobs))
	now := clock.Now()
	var maxNode map[string]int
	for _, sp := range f.specs() {
		if sp.f.letter == 'D' && maxNode == nil {
			if maxNode, err = largestNodes(ctx, cl); err != nil {
				return reportErr(stderr, "jobs", err)
			}
		}
	}
	for i := range jobs {
		rows[i] = &jobLine{JobJSON: jobs[i], now: now, maxNode: maxNode}
	}
	printRows(stdout, f, rows, c.out.parsable, c.out.noHeader)
	return 0
}

// largestNodes is the largest node's GPU count per GPU type, and over
// all types under "".
func largestNodes(ctx context.Context, cl *client.Client) (map[string]int, error) {
	u, err := cl.NodeUsage(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, n := range u.Nodes {
		out[n.GPUType] = max(out[n.GPUType], n.GPUs)
		out[""] = max(out[""], n.GPUs)
	}
	return out, nil
}

// cancelFlags is `allot cancel`'s flag set.
func cancelFlags(stderr io.Writer) (*flag.FlagSet, func() *client.Client, *cancelCmd) {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	c := &cancelCmd{}
	c.opts.flags(fs)
	fs.BoolVar(&c.yes, "yes", false, "cancel the jobs the filters select without asking")
	aliasFlags(fs, map[string]string{"y": "yes"})
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot cancel JOB_ID...\n       allot cancel [--team T] [--state PD,R] [--me] [--user EMAIL] [--name TEXT] [--yes]")
		fmt.Fprintln(stderr, "Cancels jobs by id, or every pending and running job the filters select (after a confirmation), like scancel.")
		fmt.Fprintln(stderr, "Exit status 1 when any job could not be cancelled.")
		fs.PrintDefaults()
	}
	return fs, newClient, c
}

type cancelCmd struct {
	opts jobsOptions
	yes  bool
}

func (c *cancelCmd) filtered() bool {
	o := c.opts
	return o.me || o.team != "" || o.state != "" || o.user != "" || o.tie != "" || o.name != ""
}

// parseJobIDs parses `allot cmd`'s flags (cliflag.Parse) and the job ids
// that follow, also comma-separated, maybe with flags after them (allot
// cancel 1 2,3 --server URL). skip, if not nil, says which word before
// the first id is no id (scontrol's "show job 12"). False when something
// was refused, after saying why.
func parseJobIDs(fs *flag.FlagSet, args []string, cmd string, stderr io.Writer, skip func(word string) bool) ([]int64, bool) {
	if err := cliflag.Parse(fs, args); err != nil {
		return nil, false
	}
	var ids []int64
	rest := fs.Args()
	for len(rest) > 0 {
		if strings.HasPrefix(rest[0], "-") {
			if err := fs.Parse(rest); err != nil {
				return nil, false
			}
			rest = fs.Args()
			continue
		}
		word := rest[0]
		rest = rest[1:]
		if len(ids) == 0 && skip != nil && skip(word) {
			continue
		}
		for _, a := range strings.Split(word, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(a), 10, 64)
			if err != nil || id < 1 {
				fmt.Fprintf(stderr, "allot %s: %q is not a job id\n", cmd, a)
				return nil, false
			}
			ids = append(ids, id)
		}
	}
	return ids, true
}

func cmdCancel(args []string, stdout, stderr io.Writer) int {
	fs, newClient, c := cancelFlags(stderr)
	ids, ok := parseJobIDs(fs, args, "cancel", stderr, nil)
	if !ok {
		return 2
	}
	switch {
	case len(ids) == 0 && !c.filtered():
		fs.Usage()
		return 2
	case len(ids) > 0 && c.filtered():
		fmt.Fprintln(stderr, "allot cancel: give job ids or filters (--team, --state, --me, --user, --tier, --name), not both")
		return 2
	}
	ctx := context.Background()
	cl := newClient()
	if len(ids) == 0 {
		q, err := c.opts.query()
		if err != nil {
			fmt.Fprintf(stderr, "allot cancel: %v\n", err)
			return 2
		}
		if q.States == nil {
			q.States = []string{"pending", "running"}
		}
		for _, s := range q.States {
			if s != "pending" && s != "running" {
				fmt.Fprintf(stderr, "allot cancel: --state: only pending and running jobs can be cancelled, not %s ones\n", s)
				return 2
			}
		}
		jobs, err := cl.AllJobs(ctx, q, 0)
		if err != nil {
			return reportErr(stderr, "cancel", err)
		}
		if len(jobs) == 0 {
			fmt.Fprintln(stdout, "no job matches: nothing cancelled")
			return 0
		}
		if !confirmCancel(stdin, stdinIsTTY(), stdout, stderr, jobs, c.yes) {
			return 1
		}
		for _, j := range jobs {
			ids = append(ids, j.ID)
		}
	}
	failed := 0
	for _, id := range ids {
		j, err := cl.Cancel(ctx, id)
		if err != nil {
			failed++
			var p *client.Error
			if errors.As(err, &p) {
				fmt.Fprintf(stderr, "allot cancel: job %d: %s (not cancelled)\n", id, p.Error())
			} else {
				fmt.Fprintf(stderr, "allot cancel: job %d: %v (not cancelled)\n", id, err)
			}
			continue
		}
		fmt.Fprintf(stdout, "job %d is %s\n", j.ID, j.State)
	}
	if failed > 0 {
		if len(ids) > 1 {
			fmt.Fprintf(stderr, "allot cancel: %d of %d jobs not cancelled\n", failed, len(ids))
		}
		return 1
	}
	return 0
}

// stdin is where a confirmation is read; stdinIsTTY says whether it is a
// terminal (tests say no: `go test` run from a terminal has one).
var (
	stdin      io.Reader = os.Stdin
	stdinIsTTY           = func() bool {
		fi, err := os.Stdin.Stat()
		return err == nil && fi.Mode()&os.ModeCharDevice != 0
	}
)

// confirmCancel asks before a filtered cancel: it lists the jobs and reads
// y or yes. Without a terminal it refuses (a script passes --yes).
func confirmCancel(in io.Reader, tty bool, stdout, stderr io.Writer, jobs []web.JobJSON, yes bool) bool {
	if yes {
		return true
	}
	if !tty {
		fmt.Fprintf(stderr, "allot cancel: the filters select %d jobs; not a terminal to confirm on: add --yes to cancel them\n", len(jobs))
		return false
	}
	fmt.Fprintf(stdout, "These %d jobs will be cancelled:\n", len(jobs))
	const show = 20
	for i, j := range jobs {
		if i == show {
			fmt.Fprintf(stdout, "  … and %d more\n", len(jobs)-show)
			break
		}
		fmt.Fprintf(stdout, "  %d  %s  %s  %s  %s\n", j.ID, j.Name, j.Team, j.User, j.State)
	}
	fmt.Fprint(stdout, "Cancel them? [y/N] ")
	var answer string
	if _, err := fmt.Fscanln(in, &answer); err != nil && answer == "" {
		fmt.Fprintln(stdout)
	}
	if a := strings.ToLower(strings.TrimSpace(answer)); a == "y" || a == "yes" {
		return true
	}
	fmt.Fprintln(stderr, "allot cancel: nothing cancelled")
	return false
}

// startHeader is `allot jobs --start`'s columns.
var startHeader = []string{"JOBID", "NAME", "TEAM", "TIER", "RANK", "EST_START", "REASON"}

// runStart is `allot jobs --start` (squeue --start): the pending jobs in
// the scheduler's order, as its last cycle decided it, from GET
// /api/v1/priorities: rank, expected start and what it rests on
// (reservation, preemption, projection), and why each waits.
func (c *jobsCmd) runStart(q client.JobQuery, newClient func() *client.Client, stdout, stderr io.Writer) int {
	fail := func(msg string) int {
		fmt.Fprintf(stderr, "allot jobs --start: %s\n", msg)
		return 2
	}
	switch {
	case c.format != "":
		return fail("--format does not apply: the columns are " + strings.Join(startHeader, " "))
	case len(q.States) > 1 || len(q.States) == 1 && q.States[0] != "pending":
		return fail("lists pending jobs only: drop --state, or use --state PD")
	case len(q.Users) > 1 || len(q.Users) == 1 && q.Users[0] != "me":
		return fail("--user takes only me here (or use --me)")
	}
	pq := client.PriorityQuery{Team: q.Team, Mine: q.Mine || len(q.Users) == 1, Limit: 1000}
	if c.limit > 0 && q.Tier == "" && q.Name == "" {
		pq.Limit = min(c.limit, 1000)
	}
	ctx := context.Background()
	p, err := newClient().Priorities(ctx, pq)
	if err != nil {
		return reportErr(stderr, "jobs", err)
	}
	jobs := p.Jobs[:0:0]
	for _, j := range p.Jobs {
		if q.Tier != "" && j.Tier != q.Tier || q.Name != "" && !strings.Contains(strings.ToLower(j.Name), strings.ToLower(q.Name)) {
			continue
		}
		if c.limit > 0 && len(jobs) == c.limit {
			break
		}
		jobs = append(jobs, j)
	}
	if c.out.json {
		p.Jobs = jobs
		return printJSON(stdout, p)
	}
	t := &simpleTable{header: startHeader}
	for _, j := range jobs {
		tier := j.Tier
		if j.Class == "preemptible" && j.Tier != "preemptible" {
			tier += "(p)"
		}
		rank, est := "N/A", "N/A"
		if j.Rank > 0 {
			rank = strconv.Itoa(j.Rank)
		}
		if j.EstStart != nil {
			est = slurmTime(j.EstStart)
			if j.EstKind != "" {
				est += " (" + j.EstKind + ")"
			}
		}
		// An unranked job's reason is its own row's: "waiting for the next
		// scheduling cycle", or what Slurm says of a job it places.
		t.add(strconv.FormatInt(j.ID, 10), j.Name, j.Team, tier, rank, est, j.Reason)
	}
	c.out.table(stdout, t)
	if p.CycleID == nil {
		fmt.Fprintln(stderr, "allot jobs --start: no scheduling cycle has run yet: no job is ranked")
	}
	return 0
}
