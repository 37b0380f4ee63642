package sim

import (
	"math"
	"slices"
	"time"

	"github.com/allotlabs/allot/internal/scheduler"
)

// ETA measurement (Config.ETA): for every job, the start the scheduler
// predicts at its first cycle after submit, and at its first cycle one
// hour after submit if it is still pending then, against its actual first
// start. Three estimators are compared:
//
//   - forecast: PendingInfo.EstStart under scheduler.ETAForecast (the
//     default), with Job.Expected learned below;
//   - limits: PendingInfo.EstStartLimits, the scheduler's earlier
//     estimate (a reservation's time, else for the first 16 blocked jobs
//     the earliest fit by time limits ignoring jobs ahead);
//   - naive: the old job-page estimator (web/jobs.go estimateStart): the
//     earliest time enough GPUs the job may use are free, each running
//     job ending at its time limit, on one node, or whole nodes of one
//     domain (Domain "" counts as one domain here).
//
// Only the cycles with a job to predict compute pending info, and only for
// those jobs (Policy.EstimateFor), so the replay stays fast.

// Learned run times: the median ratio run time / time limit of the last
// learnWindow completed jobs of the job's user (at least learnMin of
// them), else of its team, else unknown (Job.Expected 0: the forecast
// uses the time limit). Only completed jobs count: never the job's own
// future.
const (
	learnWindow = 32
	learnMin    = 3
	etaLater    = time.Hour
)

// ratioRing is a team's or user's last learnWindow run-time ratios.
type ratioRing struct {
	xs   [learnWindow]float64
	n, k int
}

func (r *ratioRing) add(x float64) {
	r.xs[r.k] = x
	r.k = (r.k + 1) % learnWindow
	r.n = min(r.n+1, learnWindow)
}

func (r *ratioRing) median(buf []float64) (float64, bool) {
	if r == nil || r.n < learnMin {
		return 0, false
	}
	buf = append(buf[:0], r.xs[:r.n]...)
	slices.Sort(buf)
	if r.n%2 == 1 {
		return buf[r.n/2], true
	}
	return (buf[r.n/2-1] + buf[r.n/2]) / 2, true
}

// etaJob is one job's predictions; -1 = none (unknown or not asked).
type etaJob struct {
	asked   [2]bool // at submit, one hour later
	atOnce  bool    // started in its first cycle
	est     [2][3]time.Duration
	pending [2]bool // still pending after that cycle
}

const (
	estForecast = iota
	estLimits
	estNaive
)

// etaState is the replay's ETA bookkeeping.
type etaState struct {
	jobs    []etaJob
	first   []int32 // jobs waiting for their first prediction
	later   []int32 // pending jobs in arrival order, for the +1 h prediction
	laterAt int
	want    map[int64]bool
	free    []int64 // naive: per node, GPU free times by time limits
	// nextRefresh: no running job reaches its expected run time before
	// this (refreshRunning).
	nextRefresh time.Duration
}

func newETAState(n int) *etaState {
	e := &etaState{jobs: make([]etaJob, n), want: map[int64]bool{}}
	for i := range e.jobs {
		for k := range e.jobs[i].est {
			for m := range e.jobs[i].est[k] {
				e.jobs[i].est[k][m] = -1
			}
		}
	}
	return e
}

// learner holds the users' and teams' run-time ratios of completed jobs
// (Config.ETA, Config.LearnedOrder, Policy.PredictedBackfill).
type learner struct {
	users map[string]*ratioRing
	teams map[string]*ratioRing
	buf   []float64
}

func newLearner() *learner {
	return &learner{users: map[string]*ratioRing{}, teams: map[string]*ratioRing{}}
}

// learned is the expected run time of a job from its user's or team's
// history, 0 if unknown.
func (s *state) learned(j *simJob) time.Duration {
	e := s.lrn
	if e == nil {
		return 0
	}
	q, ok := e.users[j.tj.User].median(e.buf)
	if !ok {
		q, ok = e.teams[j.tj.Team].median(e.buf)
	}
	if !ok {
		return 0
	}
	d := time.Duration(q * float64(j.timeLimit))
	return max(d.Round(time.Second), time.Second)
}

// refreshRunning updates Job.Expected of the running jobs that have run
// past it: the median of the user's (else team's) ratios above the
// fraction of the limit already run (a conditional median), else halfway
// to the limit.
func (s *state) refreshRunning() {
	e, l := s.eta, s.lrn
	if s.now < e.nextRefresh {
		return // no running job has reached its expected run time
	}
	next := time.Duration(math.MaxInt64)
	for k := range s.running {
		r := &s.running[k]
		if r.Expected <= 0 || r.Terminating || r.TimeLimit <= 0 {
			continue
		}
		j := &s.jobs[r.ID-1]
		ran := s.now - j.runStart
		if ran < r.Expected {
			next = min(next, j.runStart+r.Expected)
			continue
		}
		frac := float64(ran+j.done) / float64(j.timeLimit)
		q, ok := l.users[j.tj.User].medianAbove(frac, l.buf)
		if !ok {
			q, ok = l.teams[j.tj.Team].medianAbove(frac, l.buf)
		}
		exp := ran + (r.TimeLimit-ran)/2
		if ok {
			exp = time.Duration(q*float64(j.timeLimit)) - j.done
		}
		r.Expected = min(max(exp, ran+time.Second), r.TimeLimit)
		next = min(next, j.runStart+r.Expected)
	}
	e.nextRefresh = next
}

// medianAbove is the median of the ratios above x (at least one).
func (r *ratioRing) medianAbove(x float64, buf []float64) (float64, bool) {
	if r == nil || r.n < learnMin {
		return 0, false
	}
	buf = buf[:0]
	for _, y := range r.xs[:r.n] {
		if y > x {
			buf = append(buf, y)
		}
	}
	if len(buf) == 0 {
		return 0, false
	}
	slices.Sort(buf)
	return buf[len(buf)/2], true
}

// learn records a completed job's run time against its time limit.
func (s *state) learn(j *simJob) {
	e := s.lrn
	if e == nil || j.timeLimit <= 0 {
		return
	}
	ran := j.tj.Duration
	if j.killed {
		ran = j.timeLimit
	}
	x := min(float64(ran)/float64(j.timeLimit), 1)
	for _, m := range []struct {
		m map[string]*ratioRing
		k string
	}{{e.users, j.tj.User}, {e.teams, j.tj.Team}} {
		r := m.m[m.k]
		if r == nil {
			r = &ratioRing{}
			m.m[m.k] = r
		}
		r.add(x)
	}
}

// etaTargets fills the EstimateFor set of this cycle; it reports whether
// there is any.
func (s *state) etaTargets() bool {
	e := s.eta
	clear(e.want)
	for _, i := range e.first {
		if s.jobs[i].phase == phasePending {
			e.want[s.jobs[i].id] = true
		}
	}
	for e.laterAt < len(e.later) {
		i := e.later[e.laterAt]
		j := &s.jobs[i]
		if j.tj.Submit+etaLater > s.now {
			break
		}
		e.laterAt++
		if j.phase == phasePending && j.firstStart < 0 {
			e.jobs[i].asked[1] = true
			e.want[j.id] = true
		}
	}
	return len(e.want) > 0
}

// etaRecord stores this cycle's predictions, after the plan is applied.
func (s *state) etaRecord(plan *scheduler.Plan) {
	e := s.eta
	if len(e.want) == 0 {
		return
	}
	byID := make(map[int64]*scheduler.PendingInfo, len(plan.Pending))
	for k := range plan.Pending {
		byID[plan.Pending[k].JobID] = &plan.Pending[k]
	}
	setup := false
	rel := func(t time.Time) time.Duration {
		if t.IsZero() {
			return -1
		}
		return max(t.Sub(Epoch), s.now)
	}
	record := func(i int32, k int) {
		ej := &e.jobs[i]
		j := &s.jobs[i]
		if j.phase != phasePending {
			ej.atOnce = k == 0
			return
		}
		ej.pending[k] = true
		if pi := byID[j.id]; pi != nil {
			ej.est[k][estForecast] = rel(pi.EstStart)
			ej.est[k][estLimits] = rel(pi.EstStartLimits)
		}
		if !setup {
			s.naiveSetup()
			setup = true
		}
		ej.est[k][estNaive] = s.naive(j)
	}
	for _, i := range e.first {
		e.jobs[i].asked[0] = true
		record(i, 0)
	}
	e.first = e.first[:0]
	for id := range e.want {
		i := int32(id - 1)
		if e.jobs[i].asked[1] && !e.jobs[i].pending[1] && s.jobs[i].tj.Submit+etaLater <= s.now {
			record(i, 1)
		}
	}
}

// naiveSetup computes every node's GPU free times by time limits.
func (s *state) naiveSetup() {
	e := s.eta
	per := s.cfg.GPUsPerNode
	e.free = slices.Grow(e.free[:0], len(s.nodes)*per)[:len(s.nodes)*per]
	clear(e.free)
	for k := range s.running {
		r := &s.running[k]
		end := r.Start.Sub(Epoch) + r.TimeLimit
		if r.Terminating {
			end = r.GraceEnd.Sub(Epoch)
		}
		for _, sl := range r.Placement {
			for _, g := range sl.GPUs {
				e.free[sl.Node*per+g] = int64(max(end, s.now))
			}
		}
	}
	for n := range s.nodes {
		gs := e.free[n*per : (n+1)*per]
		for g := range gs {
			if gs[g] < int64(s.now) {
				gs[g] = int64(s.now)
			}
		}
		slices.Sort(gs)
	}
}

// naive is the old job page's estimate for job j (see the top of the file).
func (s *state) naive(j *simJob) time.Duration {
	e := s.eta
	per := s.cfg.GPUsPerNode
	g := j.tj.GPUs
	best := int64(math.MaxInt64)
	if g <= per {
		for n := range s.nodes {
			best = min(best, e.free[n*per+g-1])
		}
		return time.Duration(best)
	}
	dom := s.cfg.DomainNodes
	if dom <= 0 {
		dom = len(s.nodes)
	}
	var ts []int64
	for a := 0; a < len(s.nodes); a += dom {
		ts = ts[:0]
		for n := a; n < min(a+dom, len(s.nodes)); n++ {
			ts = append(ts, e.free[(n+1)*per-1])
		}
		slices.Sort(ts)
		need := (g + per - 1) / per
		if need <= len(ts) {
			best = min(best, ts[need-1])
		}
	}
	if best == math.MaxInt64 {
		return -1
	}
	return time.Duration(best)
}

// ETAStats is the start-estimate error at one moment (at submit, or one
// hour later) over the jobs still pending after that cycle that ran.
type ETAStats struct {
	Jobs     int      `json:"jobs"`
	AtOnce   int      `json:"started_at_first_cycle,omitempty"` // at submit only: jobs started in their first cycle (not in Jobs)
	Forecast ETAError `json:"forecast"`
	Limits   ETAError `json:"limits"`
	Naive    ETAError `json:"naive"`
	// The same over the tier 1-2 jobs among them (starts by preemption).
	ProdJobs     int      `json:"prod_jobs"`
	ProdForecast ETAError `json:"prod_forecast"`
	ProdLimits   ETAError `json:"prod_limits"`
	ProdNaive    ETAError `json:"prod_naive"`
}

// ETAError is one estimator's absolute error |estimate − actual start|.
type ETAError struct {
	WithEstimate float64 `json:"with_estimate"` // fraction of Jobs that had an estimate
	MedianS      float64 `json:"median_abs_error_s"`
	P90S         float64 `json:"p90_abs_error_s"`
	BiasS        float64 `json:"median_error_s"` // median of estimate − actual (< 0: too early)
}

func (s *state) etaResult() (at, later *ETAStats) {
	out := [2]*ETAStats{{}, {}}
	var errs, perrs [2][3][]float64
	var signed, psigned [2][3][]float64
	for i := range s.jobs {
		j := &s.jobs[i]
		ej := &s.eta.jobs[i]
		if j.phase != phaseDone || j.firstStart < 0 {
			continue
		}
		if ej.atOnce {
			out[0].AtOnce++
		}
		for k := range 2 {
			if !ej.pending[k] {
				continue
			}
			out[k].Jobs++
			prod := j.tier.Production()
			if prod {
				out[k].ProdJobs++
			}
			for m := range 3 {
				if est := ej.est[k][m]; est >= 0 {
					d := (est - j.firstStart).Seconds()
					errs[k][m] = append(errs[k][m], math.Abs(d))
					signed[k][m] = append(signed[k][m], d)
					if prod {
						perrs[k][m] = append(perrs[k][m], math.Abs(d))
						psigned[k][m] = append(psigned[k][m], d)
					}
				}
			}
		}
	}
	fill := func(dst *ETAError, xs, ys []float64, n int) {
		if n > 0 {
			dst.WithEstimate = float64(len(xs)) / float64(n)
		}
		slices.Sort(xs)
		slices.Sort(ys)
		dst.MedianS, dst.P90S, dst.BiasS = Percentile(xs, 50), Percentile(xs, 90), Percentile(ys, 50)
	}
	for k := range 2 {
		for m, dst := range []*ETAError{&out[k].Forecast, &out[k].Limits, &out[k].Naive} {
			fill(dst, errs[k][m], signed[k][m], out[k].Jobs)
		}
		for m, dst := range []*ETAError{&out[k].ProdForecast, &out[k].ProdLimits, &out[k].ProdNaive} {
			fill(dst, perrs[k][m], psigned[k][m], out[k].ProdJobs)
		}
	}
	return out[0], out[1]
}
