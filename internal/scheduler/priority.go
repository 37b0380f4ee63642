package scheduler

import (
	"math"
	"time"
)

// computeShares fills each team's sshare row: S = Weight / ΣWeight (equal
// shares when no team has a positive weight), U = Usage / ΣUsage,
// F = 2^(-U/S). A team without shares gets F = 0.
func (st *state) computeShares() {
	var wsum, usum float64
	for i := range st.teams {
		t := st.teams[i].t
		wsum += math.Max(t.Weight, 0)
		usum += math.Max(t.Usage, 0)
	}
	for i := range st.teams {
		t := st.teams[i].t
		var s float64
		switch {
		case wsum > 0:
			s = math.Max(t.Weight, 0) / wsum
		case len(st.teams) > 0:
			s = 1 / float64(len(st.teams))
		}
		u := 0.0
		if usum > 0 {
			u = math.Max(t.Usage, 0) / usum
		}
		f := 0.0
		if s > 0 {
			f = math.Exp2(-u / s)
		}
		st.teams[i].share = TeamShare{
			Team:           t.Name,
			NormShares:     s,
			RawUsage:       t.Usage,
			EffectiveUsage: u,
			FairShare:      f,
		}
	}
}

func (st *state) fairShare(ti int) float64 {
	if ti < 0 {
		return 0
	}
	return st.teams[ti].share.FairShare
}

func (st *state) sizeFactor(gpus int) float64 {
	total := st.totalGPUs()
	if total <= 0 {
		return 0
	}
	return math.Min(float64(gpus)/float64(total), 1)
}

func (st *state) totalGPUs() int {
	if st.total == 0 {
		st.total = max(st.clusterGPUs(), 1)
	}
	return st.total
}

// priorityTotal is priority(pj).Total, without the breakdown that only
// output reads (the queue's sort key, computed for every pending job on
// every cycle; output computes the breakdown, with the same inputs and so
// the same Total, when it asks for it).
func (st *state) priorityTotal(pj *pjob) float64 {
	if st.p.Order == OrderResponse {
		return st.responsePriority(pj.j, pj.team, pj.class, pj.maxCap, -pj.submit)
	}
	return st.priority(pj).Total
}

// priority is the multifactor priority of a pending job.
func (st *state) priority(pj *pjob) Priority {
	p := st.p
	age := 0.0
	if p.MaxAge > 0 && pj.submit < 0 {
		age = math.Min(float64(-pj.submit)/float64(p.MaxAge), 1)
	}
	pr := Priority{
		Class:     pj.class,
		FairShare: st.fairShare(pj.team),
		Size:      st.sizeFactor(pj.j.GPUs),
		Age:       age,
	}
	if p.Order == OrderResponse {
		pr.Total = st.priorityTotal(pj)
		return pr
	}
	pr.Total = p.WeightFairShare*pr.FairShare + p.WeightSize*pr.Size + p.WeightAge*pr.Age
	return pr
}

// responsePriority is OrderResponse's priority of job j of team (index;
// -1 none) in class after waiting wait ns: its response ratio times the
// team's fair share 2F (at least 1/32), times the job-size factor
// GPUs^Policy.SizeExponent, times the team-wait boost of a research job
// under Policy.TeamWaitBoost (maxCap: see ratioOf).
func (st *state) responsePriority(j *Job, team int, class Tier, maxCap int, wait int64) float64 {
	p := st.ratioOf(j, maxCap, wait) * max(2*st.fairShare(team), 1.0/32)
	if e := st.p.SizeExponent; e != 0 && j.GPUs > 1 {
		p *= math.Pow(float64(j.GPUs), e)
	}
	if st.p.TeamWaitBoost && team >= 0 && class.Research() {
		if b := st.teams[team].boost; b > 1 {
			p *= b
		}
	}
	return p
}

// ratioOf is the response ratio of job j after waiting wait ns (maxCap:
// the GPUs of the largest node it may use, for WideAging; 0 = unknown).
func (st *state) ratioOf(j *Job, maxCap int, wait int64) float64 {
	t := float64(j.Estimate)
	if t <= 0 {
		t = float64(j.TimeLimit)
	}
	if t <= 0 {
		t = float64(st.p.MaxAge)
	}
	if st.p.WideAging && maxCap > 0 && j.GPUs > maxCap {
		t /= float64((j.GPUs + maxCap - 1) / maxCap) // per node it needs
	}
	t = max(t, float64(time.Minute))
	return (float64(max(wait, 0)) + t) / t
}

// requeuedPriority is running job r's priority under OrderResponse were it
// preempted now and back in the queue at the grace end: its wait counts
// from its original submit time (Job.Submit), so a job that waited or ran
// long comes back high (for wide aging, the largest node it runs on
// stands for the nodes it may use).
func (st *state) requeuedPriority(r *runJob) float64 {
	maxCap := 0
	for _, sl := range r.j.Placement {
		if sl.Node >= 0 && sl.Node < len(st.nodes) {
			maxCap = max(maxCap, st.nodes[sl.Node].cap)
		}
	}
	return st.responsePriority(r.j, r.team, r.class, maxCap, -rel(r.j.Submit, st.now)+int64(st.p.GracePeriod))
}

// teamWaitBoosts sets each team's boost (Policy.TeamWaitBoost): the mean
// wait of its pending tier 3-4 jobs over that of all teams' pending tier
// 3-4 jobs, when above 1, at most maxTeamWaitBoost.
func (st *state) teamWaitBoosts() {
	var sum float64
	n := 0
	for i := range st.teams {
		sum += st.teams[i].waitSum
		n += st.teams[i].waitN
	}
	if n == 0 || sum <= 0 {
		return
	}
	mean := sum / float64(n)
	for i := range st.teams {
		t := &st.teams[i]
		if t.waitN == 0 {
			continue
		}
		t.boost = min(max(t.waitSum/float64(t.waitN)/mean, 1), maxTeamWaitBoost)
	}
}

// maxTeamWaitBoost bounds Policy.TeamWaitBoost's factor: at most it undoes
// the fair-share floor (1/32) of a team far above its share.
const maxTeamWaitBoost = 64

// starvedTeamRatio: under Policy.StarvedTeamPreempt a team whose pending
// research jobs' mean wait is at least this many times all teams' may
// preempt like a team under its guarantee.
const starvedTeamRatio = 3
