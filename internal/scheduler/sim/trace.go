package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/scheduler"
)

// TraceJob is one row of a normalized trace (schema in
// ../shared/traces/README.md), after windowing and time scaling.
type TraceJob struct {
	Name     string        // the trace's job_id
	Submit   time.Duration // offset from the replay origin
	Duration time.Duration // run time; never scaled
	GPUs     int
	User     string
	Team     string
}

// TeamSpec is one team's guaranteed GPUs, from a teams file.
type TeamSpec struct {
	Name string
	GPUs int
}

var traceHeader = []string{"job_id", "submit_s", "duration_s", "gpus", "user", "team", "status"}

// ReadTrace parses a normalized trace CSV. Rows must be sorted by submit_s
// (the normalized traces are); an unsorted file is sorted stably.
func ReadTrace(r io.Reader) ([]TraceJob, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty trace: no header")
		}
		return nil, fmt.Errorf("reading trace header: %w", err)
	}
	if len(head) != len(traceHeader) {
		return nil, fmt.Errorf("trace header %q: want %q", strings.Join(head, ","), strings.Join(traceHeader, ","))
	}
	for i, h := range head {
		if strings.TrimSpace(h) != traceHeader[i] {
			return nil, fmt.Errorf("trace header %q: want %q", strings.Join(head, ","), strings.Join(traceHeader, ","))
		}
	}
	var jobs []TraceJob
	sorted := true
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading trace: %w", err)
		}
		line, _ := cr.FieldPos(0)
		sub, err := strconv.ParseFloat(rec[1], 64)
		if err != nil || sub < 0 || math.IsNaN(sub) || math.IsInf(sub, 0) {
			return nil, fmt.Errorf("trace line %d: submit_s %q: want a number ≥ 0", line, rec[1])
		}
		dur, err := strconv.ParseFloat(rec[2], 64)
		if err != nil || !(dur > 0) || math.IsInf(dur, 0) {
			return nil, fmt.Errorf("trace line %d: duration_s %q: want a number > 0", line, rec[2])
		}
		gpus, err := strconv.Atoi(rec[3])
		if err != nil || gpus <= 0 {
			return nil, fmt.Errorf("trace line %d: gpus %q: want an integer > 0", line, rec[3])
		}
		if rec[0] == "" || rec[5] == "" {
			return nil, fmt.Errorf("trace line %d: empty job_id or team", line)
		}
		j := TraceJob{
			Name:     rec[0],
			Submit:   secs(sub),
			Duration: secs(dur),
			GPUs:     gpus,
			User:     rec[4],
			Team:     rec[5],
		}
		if n := len(jobs); n > 0 && j.Submit < jobs[n-1].Submit {
			sorted = false
		}
		jobs = append(jobs, j)
	}
	if !sorted {
		sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].Submit < jobs[b].Submit })
	}
	return jobs, nil
}

// ReadTeams parses a teams file: a header whose first column names the team
// (vc, cluster, team …) and that has a gpus column, or else nodes and
// gpus_per_node columns. The guarantee is gpus (or nodes × gpus_per_node).
func ReadTeams(r io.Reader) ([]TeamSpec, error) {
	cr := csv.NewReader(r)
	head, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty teams file: no header")
		}
		return nil, fmt.Errorf("reading teams header: %w", err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(h)] = i
	}
	gi, hasG := col["gpus"]
	ni, hasN := col["nodes"]
	pi, hasP := col["gpus_per_node"]
	if !hasG && !(hasN && hasP) {
		return nil, fmt.Errorf("teams header %q: want a team column first and a gpus column (or nodes and gpus_per_node)", strings.Join(head, ","))
	}
	var teams []TeamSpec
	seen := map[string]bool{}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading teams: %w", err)
		}
		line, _ := cr.FieldPos(0)
		name := strings.TrimSpace(rec[0])
		if name == "" {
			return nil, fmt.Errorf("teams line %d: empty team name", line)
		}
		if seen[name] {
			return nil, fmt.Errorf("teams line %d: team %q listed twice", line, name)
		}
		seen[name] = true
		var gpus int
		if hasG {
			gpus, err = strconv.Atoi(strings.TrimSpace(rec[gi]))
			if err != nil || gpus < 0 {
				return nil, fmt.Errorf("teams line %d: gpus %q: want an integer ≥ 0", line, rec[gi])
			}
		} else {
			n, err1 := strconv.Atoi(strings.TrimSpace(rec[ni]))
			p, err2 := strconv.Atoi(strings.TrimSpace(rec[pi]))
			if err1 != nil || err2 != nil || n < 0 || p < 0 {
				return nil, fmt.Errorf("teams line %d: nodes %q, gpus_per_node %q: want integers ≥ 0", line, rec[ni], rec[pi])
			}
			gpus = n * p
		}
		teams = append(teams, TeamSpec{Name: name, GPUs: gpus})
	}
	if len(teams) == 0 {
		return nil, errors.New("teams file has no rows")
	}
	return teams, nil
}

// Window is a [Start, End) range of trace submit times.
type Window struct {
	Start, End time.Duration
	Set        bool
}

// Prepare clips jobs to the window (by submit time, then rebases so the
// window starts at 0), keeps only team's jobs when team is not "", and divides
// inter-arrival times by scale (durations are not scaled). The result is a
// new slice; jobs is not modified.
func Prepare(jobs []TraceJob, w Window, team string, scale float64) []TraceJob {
	if scale <= 0 {
		scale = 1
	}
	out := make([]TraceJob, 0, len(jobs))
	for _, j := range jobs {
		if w.Set && (j.Submit < w.Start || j.Submit >= w.End) {
			continue
		}
		if team != "" && j.Team != team {
			continue
		}
		if w.Set {
			j.Submit -= w.Start
		}
		out = append(out, j)
	}
	if scale != 1 && len(out) > 0 {
		// Divide inter-arrival times: t'_i = t_0 + (t_i - t_0)/scale.
		t0 := out[0].Submit
		for i := range out {
			out[i].Submit = t0 + time.Duration(float64(out[i].Submit-t0)/scale)
		}
	}
	return out
}

// TierWeight is one entry of --tier-mix.
type TierWeight struct {
	Tier   scheduler.Tier
	Weight uint64
}

// DefaultTierMix is --tier-mix 1:1,2:4,3:45,4:50.
var DefaultTierMix = []TierWeight{{1, 1}, {2, 4}, {3, 45}, {4, 50}}

// ParseTierMix parses "1:1,2:4,3:45,4:50" (tier:weight; tiers 1-5, 5 =
// preemptible).
func ParseTierMix(s string) ([]TierWeight, error) {
	var mix []TierWeight
	var total uint64
	seen := map[scheduler.Tier]bool{}
	for _, part := range strings.Split(s, ",") {
		t, w, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("tier-mix entry %q: want tier:weight", part)
		}
		tier, err := strconv.Atoi(t)
		if err != nil || tier < 1 || tier > 5 {
			return nil, fmt.Errorf("tier-mix entry %q: tier must be 1..5 (5 = preemptible)", part)
		}
		weight, err := strconv.ParseUint(w, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("tier-mix entry %q: weight must be an integer ≥ 0", part)
		}
		if seen[scheduler.Tier(tier)] {
			return nil, fmt.Errorf("tier-mix: tier %d listed twice", tier)
		}
		seen[scheduler.Tier(tier)] = true
		total += weight
		mix = append(mix, TierWeight{scheduler.Tier(tier), weight})
	}
	if total == 0 {
		return nil, errors.New("tier-mix: weights sum to 0")
	}
	return mix, nil
}

// hash64 is FNV-1a of seed, a salt and the job name: the simulator's only
// source of randomness, so a replay is a pure function of its inputs.
func hash64(seed int64, salt, name string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(uint64(seed) >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(salt))
	h.Write([]byte{0})
	h.Write([]byte(name))
	// FNV's low bits mix poorly for near-identical names; finish with a
	// splitmix64 round.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// TierOf assigns a job its tier from mix by a seeded hash of its name.
func TierOf(mix []TierWeight, seed int64, name string) scheduler.Tier {
	var total uint64
	for _, m := range mix {
		total += m.Weight
	}
	if total == 0 {
		return scheduler.Tier3
	}
	x := hash64(seed, "tier", name) % total
	for _, m := range mix {
		if x < m.Weight {
			return m.Tier
		}
		x -= m.Weight
	}
	return mix[len(mix)-1].Tier
}

// CheckpointableOf reports whether a job checkpoints, a seeded hash of its
// name against fraction.
func CheckpointableOf(fraction float64, seed int64, name string) bool {
	if fraction <= 0 {
		return false
	}
	if fraction >= 1 {
		return true
	}
	return float64(hash64(seed, "ckpt", name)>>11)/(1<<53) < fraction
}

func secs(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
