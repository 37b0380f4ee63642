package slurm

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// v0038 is REST v0.0.38 / dbv0.0.38 (Slurm 22.05–24.05; Debian bookworm's
// 22.05.8 here). Tested against the live cluster and against responses
// recorded from it (testdata/v0038_*, testdata/dbv0038_*).
//
// Shapes: flat numbers (times as epoch seconds, 0 = unset), job_state a
// string, node state lower case plus state_flags, environment a JSON object,
// GPUs as gres ("gpu:h100:2") or gpus. No node update: Drain/Resume use
// scontrol.
type v0038 struct{}

func (v0038) version() string { return "v0.0.38" }

func gresSpec(typ string, n int) string {
	if typ != "" {
		return "gpu:" + typ + ":" + strconv.Itoa(n)
	}
	return "gpu:" + strconv.Itoa(n)
}

func envWithPath(env map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	if _, ok := out["PATH"]; !ok {
		out["PATH"] = "/usr/local/bin:/usr/bin:/bin"
	}
	return out
}

func minutesUp(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Minute - 1) / time.Minute)
}

func (v0038) submitBody(s JobSubmit) any {
	j := map[string]any{
		"environment":               envWithPath(s.Env),
		"current_working_directory": orDefault(s.Workdir, "/tmp"),
		"requeue":                   s.Requeue,
	}
	setStr(j, "name", s.Name)
	setStr(j, "account", s.Account)
	setStr(j, "qos", s.QOS)
	setStr(j, "partition", s.Partition)
	setStr(j, "comment", s.Comment)
	setStr(j, "standard_output", s.Output)
	if m := minutesUp(s.TimeLimit); m > 0 {
		j["time_limit"] = m
	}
	if s.Hold {
		j["hold"] = true
	}
	if s.CPUsPerTask > 0 {
		j["cpus_per_task"] = s.CPUsPerTask
	}
	if s.Nodes > 0 {
		j["nodes"] = strconv.Itoa(s.Nodes) // verified: a string is accepted
	}
	switch {
	case s.GPUsPerNode > 0:
		j["gres"] = gresSpec(s.GRESType, s.GPUsPerNode)
	case s.GPUs > 0 && s.Nodes <= 1:
		j["gres"] = gresSpec(s.GRESType, s.GPUs)
	case s.GPUs > 0:
		g := strconv.Itoa(s.GPUs)
		if s.GRESType != "" {
			g = s.GRESType + ":" + g
		}
		j["gpus"] = g
	}
	return map[string]any{"script": s.Script, "job": j}
}

func (v0038) updateBody(u JobUpdate) any {
	j := map[string]any{}
	if u.QOS != nil {
		j["qos"] = *u.QOS
	}
	if u.Partition != nil {
		j["partition"] = *u.Partition
	}
	if u.Comment != nil {
		j["comment"] = *u.Comment
	}
	return j
}

func (v0038) nodeUpdateBody(bool, string) (any, bool) { return nil, false }

type v0038Job struct {
	JobID        int64    `json:"job_id"`
	Name         string   `json:"name"`
	Account      string   `json:"account"`
	UserName     string   `json:"user_name"`
	QOS          string   `json:"qos"`
	Partition    string   `json:"partition"`
	JobState     strList  `json:"job_state"`
	StateReason  string   `json:"state_reason"`
	Comment      string   `json:"comment"`
	SubmitTime   num      `json:"submit_time"`
	EligibleTime num      `json:"eligible_time"`
	StartTime    num      `json:"start_time"`
	EndTime      num      `json:"end_time"`
	TimeLimit    num      `json:"time_limit"`
	TresAlloc    string   `json:"tres_alloc_str"`
	TresReq      string   `json:"tres_req_str"`
	TresPerNode  string   `json:"tres_per_node"`
	TresPerJob   string   `json:"tres_per_job"`
	NodeCount    num      `json:"node_count"`
	Nodes        string   `json:"nodes"`
	GresDetail   []string `json:"gres_detail"`
	RestartCnt   num      `json:"restart_cnt"`
	ExitCode     exitCode `json:"exit_code"`
	Features     string   `json:"features"`
	// v0.0.40+: "minimum_switches"; absent in v0.0.38.
	MinSwitches num `json:"minimum_switches"`
}

// job converts a slurmctld job (the shape is shared by v0.0.38–v0.0.41; only
// number encoding and job_state differ, which num and strList absorb).
func (j v0038Job) job() Job {
	state, flags := baseState(j.JobState, jobBaseStates)
	out := Job{
		ID: j.JobID, Name: j.Name, Account: j.Account, User: j.UserName, QOS: j.QOS,
		Partition: j.Partition, State: state, Flags: flags, Reason: reasonCode(j.StateReason),
		Comment: j.Comment, Submit: unixTime(j.SubmitTime.val()), Eligible: unixTime(j.EligibleTime.val()),
		Start: unixTime(j.StartTime.val()), Restarts: int(j.RestartCnt.val()),
		Constraints: j.Features, Switches: int(j.MinSwitches.val()),
	}
	if finished(state) {
		out.End = unixTime(j.EndTime.val())
	}
	if tl := j.TimeLimit.val(); tl > 0 && tl < 1<<31 && !j.TimeLimit.Infinite {
		out.TimeLimit = time.Duration(tl) * time.Minute
	}
	out.ExitCode = j.ExitCode.code()
	if j.ExitCode.Raw != nil && j.Nodes == "" && *j.ExitCode.Raw > 0 && *j.ExitCode.Raw < 256 {
		// Set by slurmctld for a job that never ran (e.g. BadConstraints:
		// 1), not a wait status.
		out.ExitCode = int(*j.ExitCode.Raw)
	}
	// GPUs: allocated when running, else the request (whole job).
	n, typ := tresGPUs(j.TresAlloc)
	if n == 0 {
		n, typ = tresGPUs(j.TresReq)
	}
	if n == 0 {
		if per, t := gresGPUs(j.TresPerNode); per > 0 {
			nodes := int(j.NodeCount.val())
			if nodes < 1 {
				nodes = 1
			}
			n, typ = per*nodes, t
		} else {
			n, typ = gresGPUs(j.TresPerJob)
		}
	}
	if typ == "" {
		_, typ = gresGPUs(j.TresPerNode)
	}
	if typ == "" {
		_, typ = gresGPUs(j.TresPerJob)
	}
	out.GPUs, out.GRESType = n, typ
	if state == "RUNNING" || state == "SUSPENDED" || finished(state) {
		out.Nodes = ExpandHostlist(j.Nodes)
	}
	if state == "RUNNING" || state == "SUSPENDED" {
		out.GPUIndices = gpuIndices(out.Nodes, j.GresDetail)
	}
	return out
}

func (v0038) decodeJobs(b []byte) ([]Job, error) {
	var r struct {
		Jobs []v0038Job `json:"jobs"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("slurm: decode v0.0.38 jobs: %w", err)
	}
	out := make([]Job, 0, len(r.Jobs))
	for _, j := range r.Jobs {
		out = append(out, j.job())
	}
	return out, nil
}

type v0038Node struct {
	Name       string  `json:"name"`
	State      strList `json:"state"`
	StateFlags strList `json:"state_flags"`
	Reason     string  `json:"reason"`
	Gres       string  `json:"gres"`
}

func (n v0038Node) node() Node {
	state, flags := baseState(append(append([]string{}, n.State...), n.StateFlags...), nodeBaseStates)
	g, typ := gresGPUs(n.Gres)
	out := Node{Name: n.Name, GPUs: g, GRESType: typ, State: state, Flags: flags, Reason: n.Reason}
	for _, f := range flags {
		if f == "DRAIN" || f == "DRAINING" || f == "DRAINED" {
			out.Drain = true
		}
	}
	return out
}

func (v0038) decodeNodes(b []byte) ([]Node, error) {
	var r struct {
		Nodes []v0038Node `json:"nodes"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("slurm: decode nodes: %w", err)
	}
	out := make([]Node, 0, len(r.Nodes))
	for _, n := range r.Nodes {
		out = append(out, n.node())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (v0038) decodePing(b []byte) (Info, error) {
	var r struct {
		Meta struct {
			Slurm struct {
				Release string `json:"release"`
			} `json:"Slurm"`
		} `json:"meta"`
		Pings []struct {
			Hostname string `json:"hostname"`
			Ping     string `json:"ping"`
		} `json:"pings"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return Info{}, fmt.Errorf("slurm: decode ping: %w", err)
	}
	info := Info{Release: r.Meta.Slurm.Release, Controllers: map[string]string{}}
	for _, p := range r.Pings {
		info.Controllers[p.Hostname] = strings.ToUpper(p.Ping)
	}
	return info, nil
}

// dbJob is a slurmdbd job record; v0.0.38–v0.0.41 share it up to number
// encoding (num), state.current (string or array: strList) and exit_code
// (return_code a number or number object).
type dbJob struct {
	JobID     int64  `json:"job_id"`
	Name      string `json:"name"`
	Account   string `json:"account"`
	User      string `json:"user"`
	QOS       string `json:"qos"`
	Partition string `json:"partition"`
	Nodes     string `json:"nodes"`
	Comment   struct {
		Job *string `json:"job"`
	} `json:"comment"`
	State struct {
		Current strList `json:"current"`
	} `json:"state"`
	Time struct {
		Submission num `json:"submission"`
		Eligible   num `json:"eligible"`
		Start      num `json:"start"`
		End        num `json:"end"`
		Limit      num `json:"limit"`
	} `json:"time"`
	ExitCode exitCode `json:"exit_code"`
	Tres     struct {
		Allocated []tres `json:"allocated"`
		Requested []tres `json:"requested"`
	} `json:"tres"`
	Steps []struct {
		Tres struct {
			Requested struct {
				Average []tres `json:"average"`
			} `json:"requested"`
		} `json:"tres"`
	} `json:"steps"`
}

func (j dbJob) run() Run {
	state, _ := baseState(j.State.Current, jobBaseStates)
	r := Run{
		JobID: j.JobID, Name: j.Name, Account: j.Account, User: j.User, QOS: j.QOS,
		Partition: j.Partition, State: state,
		Submit: unixTime(j.Time.Submission.val()), Eligible: unixTime(j.Time.Eligible.val()),
		Start: unixTime(j.Time.Start.val()),
	}
	if j.Comment.Job != nil {
		r.Comment = *j.Comment.Job
	}
	if state != "RUNNING" && state != "PENDING" && state != "SUSPENDED" {
		r.End = unixTime(j.Time.End.val())
	}
	if tl := j.Time.Limit.val(); tl > 0 && tl < 1<<31 && !j.Time.Limit.Infinite {
		r.TimeLimit = time.Duration(tl) * time.Minute
	}
	if !r.Start.IsZero() {
		r.Nodes = ExpandHostlist(j.Nodes)
	}
	r.GPUs, r.GRESType = tresListGPUs(j.Tres.Allocated)
	if r.GPUs == 0 && r.Start.IsZero() {
		r.GPUs, r.GRESType = tresListGPUs(j.Tres.Requested)
	}
	if r.GRESType == "" {
		_, r.GRESType = tresListGPUs(j.Tres.Requested)
	}
	r.ExitCode = j.ExitCode.code()
	var steps []stepUsage
	for _, s := range j.Steps {
		var u stepUsage
		if v, ok := tresListValue(s.Tres.Requested.Average, "gpuutil"); ok {
			u.util, u.hasUtil = float64(v), true
		}
		if v, ok := tresListValue(s.Tres.Requested.Average, "gpumem"); ok {
			u.mem, u.hasMem = float64(v), true
		}
		steps = append(steps, u)
	}
	rightSize(&r, steps)
	return r
}

func containsStr(xs []string, x string) bool {
	for _, y := range xs {
		if strings.EqualFold(x, y) {
			return true
		}
	}
	return false
}

func decodeDBJobs(b []byte, version string) ([]Run, error) {
	var r struct {
		Jobs []dbJob `json:"jobs"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("slurm: decode %s accounting: %w", version, err)
	}
	out := make([]Run, 0, len(r.Jobs))
	for _, j := range r.Jobs {
		out = append(out, j.run())
	}
	return out, nil
}

func (v0038) decodeRuns(b []byte) ([]Run, error) { return decodeDBJobs(b, "v0.0.38") }

func setStr(m map[string]any, k, v string) {
	if v != "" {
		m[k] = v
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
