package sim

import (
	"bufio"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/scheduler"
)

const usageText = `usage: allot sim --trace FILE [flags]

Replays a job trace in virtual time through the scheduler core and the
Slurm-style baselines, side by side, and prints one row of metrics per policy.

       allot sim --suite FILE [--trace-dir DIR] [--baseline-cache DIR] [flags]

Runs every setting of FILE (one per line: the flags of a single run; "name:"
labels a line; # starts a comment) one after the other and prints one table of
ratios against easy and fifo, with the goals each loaded setting misses. Flags
after FILE apply to every line (a line's own flags win); --trace and --teams
are relative to --trace-dir. --baseline-cache stores the baselines' results
(easy, fifo, fifo-partitioned) and reuses them (for developers tuning allot).

flags:
`

// options are the parsed flags of allot sim.
type options struct {
	trace, teams, policies, window, team, tierMix, jsonOut, plotOut string
	waitsOut                                                        string
	nodes, gpusPerNode, domainNodes                                 int
	timeScale, walltime, ckptFraction                               float64
	walltimeMax                                                     float64
	eta                                                             bool
	seed                                                            int64
	cycle, ckptInterval                                             time.Duration
	progress                                                        bool
	cpuProfile                                                      string
	// Policy variants of allot (for measuring mechanisms).
	allotOrder     string
	starvationWait time.Duration
	allotHold      bool
	allotRawGuar   bool
	minRuntime     time.Duration
	wideAging      bool
	sizeExponent   float64
	tier1FIFO      bool
	teamWait       bool
	starvedPreempt bool
	resvDepth      int
	predBackfill   bool
	learnedOrder   bool
	// --burst: replay allot once more with cloud burst ("allot+burst").
	burst                    bool
	burstDelay, burstHorizon time.Duration
	burstGPUs, burstMax      int
	burstType                string
	burstRate, burstBudget   allot.Money
}

// ModeAllotBurst labels the extra replay of --burst: ModeAllot with
// cloud burst.
const ModeAllotBurst scheduler.Mode = "allot+burst"

// moneyFlag parses a decimal amount in USD (or "2.5 EUR").
type moneyFlag struct{ m *allot.Money }

func (v moneyFlag) String() string {
	if v.m == nil {
		return ""
	}
	return v.m.Decimal()
}

func (v moneyFlag) Set(s string) error {
	m, err := allot.ParseMoney(s, "USD")
	if err != nil {
		return err
	}
	if m.Micros < 0 {
		return errors.New("must not be negative")
	}
	*v.m = m
	return nil
}

// Main runs `allot sim` with args (without the subcommand name) and returns
// the process exit code: 0 on success, 2 on bad flags or input, 1 when a
// replay fails.
func Main(args []string, stdout, stderr io.Writer) int {
	// A replay allocates a plan per cycle and keeps little: collecting
	// less often saves about a tenth of the CPU time.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	return main(args, stdout, stderr, nil)
}

func main(args []string, stdout, stderr io.Writer, sched ScheduleFunc) int {
	if hasSuiteFlag(args) {
		return mainSuite(args, stdout, stderr, sched)
	}
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "allot sim: %v\n", err)
		return 2
	}
	setup, err := load(o)
	if err != nil {
		fmt.Fprintf(stderr, "allot sim: %v\n", err)
		return 2
	}
	setup.sched = sched
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "allot sim: --cpuprofile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "allot sim: --cpuprofile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	results, err := setup.runAll(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "allot sim: %v\n", err)
		return 1
	}
	fillBurstSaved(setup.modes, results)
	if o.jsonOut != "-" {
		writeTable(stdout, setup, results)
	}
	if o.jsonOut != "" {
		if err := writeJSON(o.jsonOut, stdout, setup.modes, results); err != nil {
			fmt.Fprintf(stderr, "allot sim: %v\n", err)
			return 1
		}
	}
	if o.waitsOut != "" {
		if err := writeWaits(o.waitsOut, setup.modes, results); err != nil {
			fmt.Fprintf(stderr, "allot sim: %v\n", err)
			return 1
		}
	}
	if o.plotOut != "" {
		if err := writePlot(o.plotOut, setup.modes, results); err != nil {
			fmt.Fprintf(stderr, "allot sim: %v\n", err)
			return 1
		}
	}
	return 0
}

// factorRange parses "F" or "A:B" (A < B) of positive numbers.
type factorRange struct{ lo, hi *float64 }

func (v factorRange) String() string {
	if v.lo == nil {
		return ""
	}
	if *v.hi > *v.lo {
		return fmt.Sprintf("%v:%v", *v.lo, *v.hi)
	}
	return fmt.Sprint(*v.lo)
}

func (v factorRange) Set(s string) error {
	a, b, isRange := strings.Cut(s, ":")
	lo, err := strconv.ParseFloat(a, 64)
	if err != nil || !(lo > 0) {
		return errors.New("want a number > 0, or A:B with 0 < A < B")
	}
	hi := 0.0
	if isRange {
		if hi, err = strconv.ParseFloat(b, 64); err != nil || !(hi > lo) {
			return errors.New("want A:B with 0 < A < B")
		}
	}
	*v.lo, *v.hi = lo, hi
	return nil
}

// secondsOrDuration accepts a Go duration ("10s", "1m30s") or plain seconds
// ("10", "0").
type secondsOrDuration struct{ d *time.Duration }

func (v secondsOrDuration) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

func (v secondsOrDuration) Set(s string) error {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 {
			return errors.New("must be ≥ 0")
		}
		*v.d = secs(f)
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 10s or plain seconds")
	}
	if d < 0 {
		return errors.New("must be ≥ 0")
	}
	*v.d = d
	return nil
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	def := allot.DefaultPolicy()
	o := &options{cycle: 10 * time.Second, ckptInterval: 30 * time.Minute,
		burstRate: allot.Money{Micros: 1_400_000, Currency: "USD"}, burstBudget: allot.Money{Currency: "USD"}}
	fs := flag.NewFlagSet("allot sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.trace, "trace", "", "normalized trace CSV (job_id,submit_s,duration_s,gpus,user,team,status); required")
	fs.StringVar(&o.teams, "teams", "", "teams CSV: team name first, then gpus (or nodes, gpus_per_node); the team guarantees, and the cluster size when --nodes is 0")
	fs.IntVar(&o.nodes, "nodes", 0, "nodes in the cluster; 0 = the teams file's total GPUs / --gpus-per-node")
	fs.IntVar(&o.gpusPerNode, "gpus-per-node", 8, "GPUs per node (1..64)")
	fs.IntVar(&o.domainNodes, "domain-nodes", 32, "nodes per interconnect domain; 0 = no domain constraint")
	fs.StringVar(&o.policies, "policy", "allot,easy,fifo,fifo-partitioned", "comma-separated policies to replay side by side")
	fs.Float64Var(&o.timeScale, "time-scale", 1, "divide inter-arrival times by this (> 0) to raise the load")
	fs.StringVar(&o.window, "window", "", "START:END: keep jobs with START ≤ submit_s < END (trace seconds), rebased to 0")
	fs.StringVar(&o.team, "team", "", "replay only this team's jobs")
	o.walltime = 2
	fs.Var(factorRange{&o.walltime, &o.walltimeMax}, "walltime-factor", "time limit = duration × this (> 0); A:B draws each user's factor uniformly in [A, B] and jitters each job's by ×0.8–1.25 (at least 1)")
	fs.BoolVar(&o.eta, "eta", true, "measure start-estimate (ETA) error: forecast, limits and the old page's estimate, at submit and 1 h later")
	fs.StringVar(&o.tierMix, "tier-mix", "1:1,2:4,3:45,4:50", "tier:weight,…; a job's tier is a seeded hash of its id (tier 5 = preemptible)")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the tier and checkpointability hashes")
	fs.StringVar(&o.jsonOut, "json", "", "write the metrics as JSON to this file ('-' = stdout, instead of the table)")
	fs.StringVar(&o.plotOut, "plot", "", "write utilization over time and the wait CDF, one SVG with two panels (PNG if FILE ends in .png), to this file")
	fs.StringVar(&o.waitsOut, "waits", "", "write one CSV row per job that ran and policy (policy,job_id,team,tier,gpus,submit_s,first_start_s,wait_s,preemptions) to this file, for per-tier or per-team percentiles")
	fs.Var(secondsOrDuration{&o.cycle}, "cycle", "periodic cycle in virtual time (e.g. 10s); 0 = schedule only on submit/finish events")
	fs.Var(secondsOrDuration{&o.ckptInterval}, "checkpoint-interval", "checkpointable jobs save their progress every this much run time")
	fs.Float64Var(&o.ckptFraction, "checkpointable", 0.5, "fraction of jobs (seeded hash of the id) that checkpoint, 0..1")
	fs.StringVar(&o.allotOrder, "allot-order", "", "allot's order inside a class: multifactor or response (default: the policy's)")
	o.starvationWait = -1
	o.minRuntime = -1
	fs.BoolVar(&o.wideAging, "allot-wide-aging", scheduler.DefaultPolicy().WideAging, "allot: multi-node jobs age per node they need")
	fs.Float64Var(&o.sizeExponent, "allot-size-exponent", scheduler.DefaultPolicy().SizeExponent, "allot, response order: priority × GPUs^this, the job-size factor (> 0 favours large jobs, < 0 small ones; -2..2)")
	fs.BoolVar(&o.tier1FIFO, "allot-tier1-fifo", scheduler.DefaultPolicy().Tier1FIFO, "allot: tier-1 jobs oldest first, their preemptors served in that turn (false: by priority, preemptors ahead of the queue)")
	fs.BoolVar(&o.predBackfill, "allot-predicted-backfill", scheduler.DefaultPolicy().PredictedBackfill, "allot: reservations and backfill use learned run times (the user's, else team's, median run time / limit of recent completed jobs × the job's limit; doubled while a job outlives it, at most its limit) instead of time limits")
	fs.BoolVar(&o.learnedOrder, "allot-learned-order", false, "allot: the response order's T is the learned run time (as --allot-predicted-backfill's) instead of the time limit")
	fs.Var(secondsOrDuration{&o.minRuntime}, "allot-min-runtime", "allot: no preemption before this much run time (default: the policy's)")
	fs.BoolVar(&o.allotRawGuar, "allot-raw-guarantees", false, "allot: keep oversubscribed guarantees unscaled")
	fs.BoolVar(&o.teamWait, "allot-team-wait", scheduler.DefaultPolicy().TeamWaitBoost, "allot: a team whose pending tier 3-4 jobs waited longer on average than all teams' gets its priority raised by that ratio")
	fs.IntVar(&o.resvDepth, "allot-resv-depth", scheduler.DefaultPolicy().ReservationDepth, "allot: blocked jobs per class that get a backfill reservation")
	fs.BoolVar(&o.starvedPreempt, "allot-starved-preempt", scheduler.DefaultPolicy().StarvedTeamPreempt, "allot: a team whose pending tier 3-4 jobs waited 3× all teams' mean may preempt like a team under its guarantee")
	fs.BoolVar(&o.allotHold, "allot-hold", false, "allot: a job reserved in the last cycle keeps the head of its class")
	fs.Var(secondsOrDuration{&o.starvationWait}, "starvation-wait", "allot's starvation guard (0 = off; default: the policy's)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the replays to this file (for developers)")
	fs.BoolVar(&o.progress, "progress", false, "draw a progress bar on stderr even when it is not a terminal")
	fs.BoolVar(&o.burst, "burst", false, "also replay allot with cloud burst (row allot+burst; the policy's thresholds: request above 50 pending GPU-h with a mean wait over 2 h, release idle nodes below 20 GPU-h) and report burst GPU-hours, cost and the wait saved against allot")
	fs.Var(secondsOrDuration{&o.burstDelay}, "burst-delay", "provisioning delay of burst nodes (virtual time)")
	o.burstDelay = 5 * time.Minute
	fs.Var(secondsOrDuration{&o.burstHorizon}, "burst-horizon", "planning horizon: nodes requested = ceil(pending GPU-h / (GPUs per node × horizon))")
	o.burstHorizon = 4 * time.Hour
	fs.IntVar(&o.burstGPUs, "burst-gpus", 8, "GPUs per burst node (1..64)")
	fs.IntVar(&o.burstMax, "burst-max-nodes", def.BurstMaxNodes, "burst nodes alive at most (the policy's BurstMaxNodes)")
	fs.StringVar(&o.burstType, "burst-gpu-type", "A100-spot", "GPU type of burst nodes (trace jobs ask for any type)")
	fs.Var(moneyFlag{&o.burstRate}, "burst-rate", "price of a burst GPU-hour (spot), e.g. 1.40 or \"1.40 USD\"")
	fs.Var(moneyFlag{&o.burstBudget}, "burst-budget", "burst budget for the whole replay (0 = no cap)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("bad flags: %v (see allot sim -h)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags only; see allot sim -h)", fs.Arg(0))
	}
	switch {
	case o.trace == "":
		return nil, errors.New("--trace is required")
	case o.gpusPerNode < 1 || o.gpusPerNode > 64:
		return nil, fmt.Errorf("--gpus-per-node %d: want 1..64", o.gpusPerNode)
	case o.nodes < 0:
		return nil, fmt.Errorf("--nodes %d: want ≥ 1 (or 0 to derive it from --teams)", o.nodes)
	case o.domainNodes < 0:
		return nil, fmt.Errorf("--domain-nodes %d: want ≥ 0", o.domainNodes)
	case !(o.timeScale > 0):
		return nil, fmt.Errorf("--time-scale %v: want > 0", o.timeScale)
	case !(o.walltime > 0):
		return nil, fmt.Errorf("--walltime-factor %v: want > 0", o.walltime)
	case !(o.ckptFraction >= 0 && o.ckptFraction <= 1):
		return nil, fmt.Errorf("--checkpointable %v: want 0..1", o.ckptFraction)
	case o.allotOrder != "" && o.allotOrder != string(scheduler.OrderMultifactor) && o.allotOrder != string(scheduler.OrderResponse):
		return nil, fmt.Errorf("--allot-order %q: want multifactor or response", o.allotOrder)
	case !(o.sizeExponent >= -2 && o.sizeExponent <= 2):
		return nil, fmt.Errorf("--allot-size-exponent %v: want -2..2", o.sizeExponent)
	case o.ckptInterval <= 0:
		return nil, errors.New("--checkpoint-interval: want > 0")
	case o.burst && (o.burstGPUs < 1 || o.burstGPUs > 64):
		return nil, fmt.Errorf("--burst-gpus %d: want 1..64", o.burstGPUs)
	case o.burst && o.burstMax < 0:
		return nil, fmt.Errorf("--burst-max-nodes %d: want ≥ 0", o.burstMax)
	case o.burst && o.burstHorizon <= 0:
		return nil, errors.New("--burst-horizon: want > 0")
	}
	return o, nil
}

// setup is everything loaded and derived before the replays.
type setup struct {
	trace []TraceJob
	teams []TeamSpec
	modes []scheduler.Mode
	mix   []TierWeight
	win   Window
	nodes int
	sched ScheduleFunc
}

func parseModes(s string) ([]scheduler.Mode, error) {
	var modes []scheduler.Mode
	for _, p := range strings.Split(s, ",") {
		m := scheduler.Mode(strings.TrimSpace(p))
		switch m {
		case scheduler.ModeAllot, scheduler.ModeEASY, scheduler.ModeFIFO, scheduler.ModeFIFOPartitioned:
		default:
			return nil, fmt.Errorf("--policy: unknown policy %q (want allot, easy, fifo or fifo-partitioned)", p)
		}
		if slices.Contains(modes, m) {
			return nil, fmt.Errorf("--policy: %q listed twice", m)
		}
		modes = append(modes, m)
	}
	return modes, nil
}

func parseWindow(s string) (Window, error) {
	if s == "" {
		return Window{}, nil
	}
	a, b, ok := strings.Cut(s, ":")
	fa, err1 := strconv.ParseFloat(a, 64)
	fb, err2 := strconv.ParseFloat(b, 64)
	if !ok || err1 != nil || err2 != nil || fa < 0 || fb <= fa {
		return Window{}, fmt.Errorf("--window %q: want START:END in trace seconds with 0 ≤ START < END", s)
	}
	return Window{Start: secs(fa), End: secs(fb), Set: true}, nil
}

func load(o *options) (*setup, error) {
	st := &setup{}
	var err error
	if st.modes, err = parseModes(o.policies); err != nil {
		return nil, err
	}
	if o.burst {
		if !slices.Contains(st.modes, scheduler.ModeAllot) {
			return nil, errors.New("--burst compares allot with and without burst: --policy must include allot")
		}
		st.modes = append(st.modes, ModeAllotBurst)
	}
	if st.mix, err = ParseTierMix(o.tierMix); err != nil {
		return nil, fmt.Errorf("--%v", err)
	}
	if st.win, err = parseWindow(o.window); err != nil {
		return nil, err
	}
	f, err := os.Open(o.trace)
	if err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	all, err := ReadTrace(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("--trace %s: %w", o.trace, err)
	}
	if o.teams != "" {
		f, err := os.Open(o.teams)
		if err != nil {
			return nil, fmt.Errorf("--teams: %w", err)
		}
		st.teams, err = ReadTeams(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("--teams %s: %w", o.teams, err)
		}
	}
	st.nodes = o.nodes
	if st.nodes == 0 {
		if len(st.teams) == 0 {
			return nil, errors.New("--nodes is required without --teams (the cluster size is derived from the teams' total GPUs)")
		}
		total := 0
		for _, t := range st.teams {
			total += t.GPUs
		}
		st.nodes = (total + o.gpusPerNode - 1) / o.gpusPerNode
		if st.nodes == 0 {
			return nil, errors.New("--teams: guarantees sum to 0 GPUs; give --nodes")
		}
	}
	st.trace = Prepare(all, st.win, o.team, o.timeScale)
	if len(st.trace) == 0 {
		return nil, errors.New("no jobs to replay (check --window and --team)")
	}
	return st, nil
}

func (st *setup) config(o *options, m scheduler.Mode) Config {
	p := scheduler.DefaultPolicy()
	p.Mode = m
	if o.allotOrder != "" {
		p.Order = scheduler.Order(o.allotOrder)
	}
	if o.allotHold {
		p.HoldReservations = true
	}
	p.RawGuarantees = o.allotRawGuar
	p.WideAging = o.wideAging
	p.SizeExponent = o.sizeExponent
	p.Tier1FIFO = o.tier1FIFO
	p.TeamWaitBoost = o.teamWait
	p.StarvedTeamPreempt = o.starvedPreempt
	p.ReservationDepth = o.resvDepth
	p.PredictedBackfill = o.predBackfill
	if o.minRuntime >= 0 {
		p.MinRuntime = o.minRuntime
	}
	if o.starvationWait >= 0 {
		p.StarvationWait = o.starvationWait
	}
	var bc *BurstConfig
	if m == ModeAllotBurst {
		p.Mode = scheduler.ModeAllot
		th := burst.FromPolicy(allot.DefaultPolicy())
		th.MaxNodes, th.MonthlyBudget = o.burstMax, o.burstBudget
		bc = &BurstConfig{Shape: burst.Shape{GPUType: o.burstType, GPUs: o.burstGPUs, Rate: o.burstRate}, Thresholds: th,
			Horizon: o.burstHorizon, Delay: o.burstDelay}
	}
	return Config{
		Burst:              bc,
		Nodes:              st.nodes,
		GPUsPerNode:        o.gpusPerNode,
		DomainNodes:        o.domainNodes,
		Teams:              st.teams,
		Policy:             p,
		Cycle:              o.cycle,
		WalltimeFactor:     o.walltime,
		WalltimeFactorMax:  o.walltimeMax,
		ETA:                o.eta,
		LearnedOrder:       o.learnedOrder && p.Mode == scheduler.ModeAllot,
		TierMix:            st.mix,
		Seed:               o.seed,
		CheckpointFraction: o.ckptFraction,
		CheckpointInterval: o.ckptInterval,
		Schedule:           st.sched,
		Timeline:           o.plotOut != "",
		JobWaits:           o.waitsOut != "",
	}
}

// runAll replays every policy concurrently, at most GOMAXPROCS at a time.
func (st *setup) runAll(o *options, stderr io.Writer) ([]*Result, error) {
	results := make([]*Result, len(st.modes))
	errs := make([]error, len(st.modes))
	counters := make([]*atomic.Int64, len(st.modes))
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	cfgs := make([]Config, len(st.modes))
	for i, m := range st.modes {
		counters[i] = new(atomic.Int64)
		cfgs[i] = st.config(o, m)
		cfgs[i].Progress = counters[i]
	}
	// The costliest replays start first (allot, then the partitioned
	// FIFO, which runs the most cycles), so that the cheaper ones fill in
	// after them rather than leave one of them running alone at the end.
	order := make([]int, len(st.modes))
	for i := range order {
		order[i] = i
	}
	rank := func(m scheduler.Mode) int {
		switch m {
		case scheduler.ModeAllot:
			return 0
		case scheduler.ModeFIFOPartitioned:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rank(st.modes[a]), rank(st.modes[b])) })
	var wg sync.WaitGroup
	wg.Add(len(order))
	go func() {
		for _, i := range order {
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				results[i], errs[i] = Run(cfgs[i], st.trace)
			}()
		}
	}()
	stop := func() {}
	if o.progress || isTerminal(stderr) {
		stop = progressBar(stderr, st.modes, counters, len(st.trace))
	}
	wg.Wait()
	stop()
	return results, errors.Join(errs...)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressBar redraws one status line on w until the returned stop is
// called.
func progressBar(w io.Writer, modes []scheduler.Mode, counters []*atomic.Int64, total int) func() {
	done := make(chan struct{})
	finished := make(chan struct{})
	draw := func() {
		var b strings.Builder
		var sum int64
		got := make([]int64, len(counters))
		for i, c := range counters {
			got[i] = c.Load()
			sum += got[i]
		}
		frac := float64(sum) / float64(max(1, total*len(counters)))
		const width = 30
		fill := int(frac * width)
		b.WriteString("\rsim [")
		b.WriteString(strings.Repeat("#", fill))
		b.WriteString(strings.Repeat(".", width-fill))
		fmt.Fprintf(&b, "] %3.0f%%", 100*frac)
		for i, m := range modes {
			fmt.Fprintf(&b, "  %s %3.0f%%", m, 100*float64(got[i])/float64(max(1, total)))
		}
		io.WriteString(w, b.String())
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				draw()
				io.WriteString(w, "\n")
				return
			case <-t.C:
				draw()
			}
		}
	}()
	return func() { close(done); <-finished }
}

func writeTable(w io.Writer, st *setup, rs []*Result) {
	fmt.Fprintf(w, "trace: %d jobs, %d nodes × %d GPUs = %d GPUs\n\n", len(st.trace), st.nodes, rs[0].TotalGPUs/max(1, st.nodes), rs[0].TotalGPUs)
	rows := [][]string{{"policy", "jobs", "dropped", "util", "load", "util_span", "load_span", "idle_pend", "idle_held",
		"wait_mean_s", "wait_p50_s", "wait_p95_s", "wait_p99_s", "jct_mean_s", "bsld", "preempt", "lost_gpu_h",
		"jain", "worst_team_wait_s", "cycles", "cycle_mean_us", "cycle_p99_us", "wall_s"}}
	for i, r := range rs {
		worst := 0.0
		for _, g := range r.ByTeam {
			worst = max(worst, g.WaitMeanS)
		}
		rows = append(rows, []string{string(st.modes[i]), strconv.Itoa(r.Jobs), strconv.Itoa(r.Dropped),
			f3(r.Utilization), f3(r.OfferedLoad), f3(r.UtilizationSpan), f3(r.OfferedLoadSpan), f3(r.IdlePendingSpan), f3(r.IdleHeldSpan),
			f0(r.WaitMeanS), f0(r.WaitP50S), f0(r.WaitP95S), f0(r.WaitP99S), f0(r.JCTMeanS),
			f2(r.BoundedSlowdownMean), strconv.Itoa(r.Preemptions), f0(r.GPUSLostToPreemption / 3600),
			f3(r.JainFairness), f0(worst), strconv.Itoa(r.Cycles), f0(r.CycleMeanUS), f0(r.CycleP99US), f2(r.SimWallS)})
	}
	markdown(w, rows)
	writeBurst(w, st, rs)
	writeETA(w, st.modes, rs)

	fmt.Fprintln(w, "\nby tier: mean / p95 / p99 wait (s), share ratio")
	rows = [][]string{{"policy"}}
	tiers := keys(rs, func(r *Result) map[string]Group { return r.ByTier })
	for _, t := range tiers {
		rows[0] = append(rows[0], "tier "+t)
	}
	for i, r := range rs {
		row := []string{string(st.modes[i])}
		for _, t := range tiers {
			g := r.ByTier[t]
			row = append(row, fmt.Sprintf("%s / %s / %s, %s", f0(g.WaitMeanS), f0(g.WaitP95S), f0(g.WaitP99S), f2(g.ShareRatio)))
		}
		rows = append(rows, row)
	}
	markdown(w, rows)

	fmt.Fprintln(w, "\nby team: jobs, mean wait (s), share ratio")
	rows = [][]string{{"team"}}
	for _, m := range st.modes {
		rows[0] = append(rows[0], string(m))
	}
	for _, t := range keys(rs, func(r *Result) map[string]Group { return r.ByTeam }) {
		row := []string{t}
		for _, r := range rs {
			g, ok := r.ByTeam[t]
			if !ok {
				row = append(row, "-")
				continue
			}
			row = append(row, fmt.Sprintf("%d, %s, %s", g.Jobs, f0(g.WaitMeanS), f2(g.ShareRatio)))
		}
		rows = append(rows, row)
	}
	markdown(w, rows)
}

func keys(rs []*Result, m func(*Result) map[string]Group) []string {
	set := map[string]bool{}
	for _, r := range rs {
		for k := range m(r) {
			set[k] = true
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// markdown writes rows as an aligned Markdown table (first row = header).
func markdown(w io.Writer, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(r []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range r {
			pad := width[i] - len([]rune(c))
			if i == 0 {
				b.WriteString(" " + c + strings.Repeat(" ", pad) + " |")
			} else {
				b.WriteString(" " + strings.Repeat(" ", pad) + c + " |")
			}
		}
		fmt.Fprintln(w, b.String())
	}
	line(rows[0])
	sep := make([]string, len(width))
	for i, n := range width {
		if i == 0 {
			sep[i] = strings.Repeat("-", n)
		} else {
			sep[i] = strings.Repeat("-", n-1) + ":"
		}
	}
	var b strings.Builder
	b.WriteString("|")
	for _, s := range sep {
		b.WriteString(" " + s + " |")
	}
	fmt.Fprintln(w, b.String())
	for _, r := range rows[1:] {
		line(r)
	}
}

func f0(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) }
func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
func f3(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }

// writeJSON writes {"<policy>": {metrics…}, …} in --policy order to path,
// or to stdout when path is "-".
func writeJSON(path string, stdout io.Writer, modes []scheduler.Mode, rs []*Result) error {
	var b strings.Builder
	b.WriteString("{\n")
	for i, m := range modes {
		body, err := json.MarshalIndent(rs[i], "  ", "  ")
		if err != nil {
			return err
		}
		name, _ := json.Marshal(string(m))
		fmt.Fprintf(&b, "  %s: %s", name, body)
		if i < len(modes)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString("}\n")
	if path == "-" {
		_, err := io.WriteString(stdout, b.String())
		return err
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	return nil
}

// writeWaits writes the per-job waits of every policy as CSV to path:
// policy,job_id,team,tier,gpus,submit_s,first_start_s,wait_s,preemptions,
// one row per job that ran, policies in --policy order, jobs in trace
// order. job_id is the trace's; times are virtual seconds after the window
// start (after --time-scale); tier 5 is preemptible.
func writeWaits(path string, modes []scheduler.Mode, rs []*Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--waits: %w", err)
	}
	bw := bufio.NewWriter(f)
	w := csv.NewWriter(bw)
	_ = w.Write([]string{"policy", "job_id", "team", "tier", "gpus", "submit_s", "first_start_s", "wait_s", "preemptions"})
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	for i, m := range modes {
		for _, jw := range rs[i].JobWaits {
			_ = w.Write([]string{string(m), jw.Name, jw.Team, strconv.Itoa(int(jw.Tier)), strconv.Itoa(jw.GPUs),
				num(jw.SubmitS), num(jw.FirstStartS), num(jw.WaitS), strconv.Itoa(jw.Preemptions)})
		}
	}
	w.Flush()
	err = errors.Join(w.Error(), bw.Flush(), f.Close())
	if err != nil {
		return fmt.Errorf("--waits: %w", err)
	}
	return nil
}

// fillBurstSaved sets the wait burst saved: allot's waits minus
// allot+burst's, over the same jobs.
func fillBurstSaved(modes []scheduler.Mode, rs []*Result) {
	base, with := -1, -1
	for i, m := range modes {
		switch m {
		case scheduler.ModeAllot:
			base = i
		case ModeAllotBurst:
			with = i
		}
	}
	if base < 0 || with < 0 || rs[with].Burst == nil {
		return
	}
	b, r := rs[base], rs[with].Burst
	w := rs[with]
	r.WaitMeanSavedS = b.WaitMeanS - w.WaitMeanS
	r.WaitP95SavedS = b.WaitP95S - w.WaitP95S
	r.WaitP99SavedS = b.WaitP99S - w.WaitP99S
	// Job-seconds of waiting saved over the jobs that ran in both.
	r.JobHoursSaved = (b.WaitMeanS*float64(b.Jobs-b.Dropped) - w.WaitMeanS*float64(w.Jobs-w.Dropped)) / 3600
}

func writeBurst(w io.Writer, st *setup, rs []*Result) {
	for i, m := range st.modes {
		if m != ModeAllotBurst || rs[i].Burst == nil {
			continue
		}
		b := rs[i].Burst
		fmt.Fprintf(w, "\nburst (allot+burst against allot): %d requests, %d nodes provisioned (at most %d alive), %d releases\n",
			b.Requests, b.Nodes, b.MaxAlive, b.Releases)
		fmt.Fprintf(w, "burst GPU-hours %s, cost %s; wait saved: mean %s s, p95 %s s, p99 %s s; %s job-hours of waiting saved\n",
			f2(b.GPUHours), b.Cost, f0(b.WaitMeanSavedS), f0(b.WaitP95SavedS), f0(b.WaitP99SavedS), f0(b.JobHoursSaved))
	}
}

// etaCell is "median / p90 (with estimate %)" of one estimator.
func etaCell(e ETAError) string {
	if e.WithEstimate == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s (%s%%)", f0(e.MedianS), f0(e.P90S), f0(100*e.WithEstimate))
}

// writeETA writes the start-estimate error table (Config.ETA).
func writeETA(w io.Writer, modes []scheduler.Mode, rs []*Result) {
	if len(rs) == 0 || rs[0].ETAAtSubmit == nil {
		return
	}
	fmt.Fprintln(w, "\nstart estimates: |estimate − actual first start|, median / p90 (s) (share of the jobs with an estimate), over jobs still pending after")
	fmt.Fprintln(w, "their first cycle (at submit) and after one hour; forecast = the scheduler's EstStart now, limits = its earlier estimate, naive = the old job page's")
	rows := [][]string{{"policy", "at", "jobs", "forecast", "limits", "naive", "forecast bias_s"}}
	for i, r := range rs {
		for _, x := range []struct {
			at string
			e  *ETAStats
		}{{"submit", r.ETAAtSubmit}, {"+1h", r.ETAAt1h}} {
			if x.e == nil {
				continue
			}
			jobs := strconv.Itoa(x.e.Jobs)
			if x.at == "submit" {
				jobs = fmt.Sprintf("%d (+%d at once)", x.e.Jobs, x.e.AtOnce)
			}
			rows = append(rows, []string{string(modes[i]), x.at, jobs, etaCell(x.e.Forecast), etaCell(x.e.Limits), etaCell(x.e.Naive), f0(x.e.Forecast.BiasS)})
		}
	}
	markdown(w, rows)
}
