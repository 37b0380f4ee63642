package slurm

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// v0040 is REST v0.0.40 (Slurm 23.11–25.05). NOT tested against a live
// slurmrestd (none newer than 22.05 here): its tests use synthetic
// responses under testdata/v0040_* written from the data_parser v0.0.40
// schema (src/plugins/data_parser/v0.0.40/parsers.c at slurm-23-11-0-1).
//
// Differences from v0.0.38 handled here: numbers that may be unset are
// objects {"set","infinite","number"}; job_state, node state and
// state.current are arrays of flags; environment is an array of "K=V";
// GPUs are asked for with tres_per_job / tres_per_node ("gres/gpu:h100:2");
// exit codes are verbose objects; meta.slurm (lower case); ping says
// "pinged"; nodes are updated with POST /slurm/v0.0.40/node/{name}.
type v0040 struct{}

func (v0040) version() string { return "v0.0.40" }

func tresSpec(typ string, n int) string {
	if typ != "" {
		return "gres/gpu:" + typ + ":" + strconv.Itoa(n)
	}
	return "gres/gpu:" + strconv.Itoa(n)
}

// jobDesc40 is the job_desc_msg of v0.0.40 and v0.0.41.
func jobDesc40(s JobSubmit) map[string]any {
	env := envWithPath(s.Env)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	envList := make([]string, 0, len(keys))
	for _, k := range keys {
		envList = append(envList, k+"="+env[k])
	}
	j := map[string]any{
		"environment":               envList,
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
		j["time_limit"] = map[string]any{"set": true, "infinite": false, "number": m}
	}
	if s.CPUsPerTask > 0 {
		j["cpus_per_task"] = s.CPUsPerTask
	}
	if s.Nodes > 0 {
		j["nodes"] = strconv.Itoa(s.Nodes)
	}
	switch {
	case s.GPUsPerNode > 0:
		j["tres_per_node"] = tresSpec(s.GRESType, s.GPUsPerNode)
	case s.GPUs > 0:
		j["tres_per_job"] = tresSpec(s.GRESType, s.GPUs)
	}
	return j
}

func (v0040) submitBody(s JobSubmit) any {
	j := jobDesc40(s)
	if s.Hold {
		// v0.0.40 has no "hold"; priority 0 is a user hold.
		j["priority"] = map[string]any{"set": true, "infinite": false, "number": 0}
	}
	return map[string]any{"script": s.Script, "job": j}
}

func (v0040) updateBody(u JobUpdate) any { return v0038{}.updateBody(u) }

func nodeUpdate40(drain bool, reason string) (any, bool) {
	if drain {
		return map[string]any{"state": []string{"DRAIN"}, "reason": reason}, true
	}
	return map[string]any{"state": []string{"RESUME"}}, true
}

func (v0040) nodeUpdateBody(drain bool, reason string) (any, bool) {
	return nodeUpdate40(drain, reason)
}

func (v0040) decodeJobs(b []byte) ([]Job, error) { return decodeJobs40(b, "v0.0.40") }

func decodeJobs40(b []byte, version string) ([]Job, error) {
	var r struct {
		Jobs []v0038Job `json:"jobs"` // same keys; num/strList/exitCode absorb the encodings
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("slurm: decode %s jobs: %w", version, err)
	}
	out := make([]Job, 0, len(r.Jobs))
	for _, j := range r.Jobs {
		out = append(out, j.job())
	}
	return out, nil
}

func (v0040) decodeNodes(b []byte) ([]Node, error) { return v0038{}.decodeNodes(b) }

func decodePing40(b []byte) (Info, error) {
	var r struct {
		Meta struct {
			Slurm struct {
				Release string `json:"release"`
			} `json:"slurm"`
		} `json:"meta"`
		Pings []struct {
			Hostname string `json:"hostname"`
			Pinged   string `json:"pinged"`
		} `json:"pings"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return Info{}, fmt.Errorf("slurm: decode ping: %w", err)
	}
	info := Info{Release: r.Meta.Slurm.Release, Controllers: map[string]string{}}
	for _, p := range r.Pings {
		info.Controllers[p.Hostname] = strings.ToUpper(p.Pinged)
	}
	return info, nil
}

func (v0040) decodePing(b []byte) (Info, error) { return decodePing40(b) }

func (v0040) decodeRuns(b []byte) ([]Run, error) { return decodeDBJobs(b, "v0.0.40") }
