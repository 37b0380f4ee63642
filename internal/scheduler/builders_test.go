package scheduler

import (
	"maps"
	"slices"
	"time"
)

// t0 is "now" in most tests: 14:00 UTC.
var t0 = time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)

// cluster returns n up, on-premise nodes of gpus GPUs of type "A100", in
// domain "d0".
func cluster(n, gpus int) []Node {
	ns := make([]Node, n)
	for i := range ns {
		ns[i] = Node{Name: "n" + string(rune('a'+i)), GPUType: "A100", GPUs: gpus, Site: SiteOnPrem, Domain: "d0", State: NodeUp}
	}
	return ns
}

type jobOpt func(*Job)

// job is a tier-3 job of team "a" asking gpus GPUs, 1 h time limit,
// submitted a minute before t0.
func job(id int64, gpus int, opts ...jobOpt) Job {
	j := Job{ID: id, Team: "a", Tier: Tier3, GPUs: gpus, TimeLimit: time.Hour, Submit: t0.Add(-time.Minute)}
	for _, o := range opts {
		o(&j)
	}
	return j
}

func team(name string) jobOpt          { return func(j *Job) { j.Team = name } }
func tier(t Tier) jobOpt               { return func(j *Job) { j.Tier = t } }
func limit(d time.Duration) jobOpt     { return func(j *Job) { j.TimeLimit = d } }
func submitted(d time.Duration) jobOpt { return func(j *Job) { j.Submit = t0.Add(-d) } }
func gpuType(t string) jobOpt          { return func(j *Job) { j.GPUType = t } }
func preemptible() jobOpt              { return func(j *Job) { j.Preemptible = true } }
func runAs(c Tier) jobOpt              { return func(j *Job) { j.RunAs = c } }

// on makes a running job: started `ago` before t0, holding GPUs gpus of
// node n (and further slots). A job that would already have reached its
// time limit gets 100 h more.
func on(ago time.Duration, slots ...Slot) jobOpt {
	return func(j *Job) {
		j.Start = t0.Add(-ago)
		if j.TimeLimit <= ago {
			j.TimeLimit = ago + 100*time.Hour
		}
		j.Placement = slots
		if j.RunAs == 0 {
			j.RunAs = j.Tier
		}
	}
}

func slot(node int, gpus ...int) Slot { return Slot{Node: node, GPUs: gpus} }

func seq(from, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = from + i
	}
	return s
}

func teamsAB(ga, gb int) []Team {
	return []Team{
		{Name: "a", Weight: 1, Guarantee: map[string]int{"": ga}},
		{Name: "b", Weight: 1, Guarantee: map[string]int{"": gb}},
	}
}

func startIDs(p Plan) []int64 {
	ids := []int64{}
	for _, s := range p.Starts {
		ids = append(ids, s.JobID)
	}
	return ids
}

func victimIDs(p Plan) []int64 {
	ids := []int64{}
	for _, v := range p.Preemptions {
		ids = append(ids, v.JobID)
	}
	return ids
}

func pendingInfo(p Plan, id int64) PendingInfo {
	for _, pi := range p.Pending {
		if pi.JobID == id {
			return pi
		}
	}
	return PendingInfo{}
}

// cloneSnapshot deep-copies s.
func cloneSnapshot(s Snapshot) Snapshot {
	c := Snapshot{
		Nodes:   slices.Clone(s.Nodes),
		Running: cloneJobs(s.Running),
		Pending: cloneJobs(s.Pending),
		Teams:   slices.Clone(s.Teams),
	}
	for i := range c.Nodes {
		c.Nodes[i].Unavailable = slices.Clone(c.Nodes[i].Unavailable)
	}
	for i := range c.Teams {
		c.Teams[i].Guarantee = maps.Clone(c.Teams[i].Guarantee)
	}
	return c
}

func cloneJobs(js []Job) []Job {
	c := slices.Clone(js)
	for i := range c {
		c[i].Placement = slices.Clone(c[i].Placement)
		for k := range c[i].Placement {
			c[i].Placement[k].GPUs = slices.Clone(c[i].Placement[k].GPUs)
		}
	}
	return c
}
