package slurm

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// unixTime: 0 (and negative) is "unknown" in Slurm's answers.
func unixTime(s int64) time.Time {
	if s <= 0 {
		return time.Time{}
	}
	return time.Unix(s, 0).UTC()
}

// num is a v0.0.40+ number object {"set":true,"infinite":false,"number":N};
// it also accepts a bare number or null, so one type reads both generations.
type num struct {
	Set      bool
	Infinite bool
	Number   int64
}

func (n *num) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	switch {
	case s == "null":
		*n = num{}
		return nil
	case strings.HasPrefix(s, "{"):
		var o struct {
			Set      bool    `json:"set"`
			Infinite bool    `json:"infinite"`
			Number   float64 `json:"number"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		*n = num{Set: o.Set, Infinite: o.Infinite, Number: int64(o.Number)}
		return nil
	case s == `"Infinity"` || s == `"infinite"`:
		*n = num{Infinite: true}
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*n = num{Set: true, Number: int64(f)}
	return nil
}

// val is the number if set and finite, else 0.
func (n num) val() int64 {
	if !n.Set || n.Infinite {
		return 0
	}
	return n.Number
}

// strList reads a JSON string or array of strings (v0.0.38 job_state is a
// string, v0.0.40 an array of flags).
type strList []string

func (l *strList) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "null" {
		*l = nil
		return nil
	}
	if strings.HasPrefix(s, "[") {
		var a []string
		if err := json.Unmarshal(b, &a); err != nil {
			return err
		}
		*l = a
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err != nil {
		return err
	}
	*l = strList{one}
	return nil
}

// baseState splits Slurm state words into the base state (upper case) and
// the remaining flags. v0.0.38 jobs give "RUNNING", nodes "mixed" plus
// state_flags; v0.0.40+ give ["PENDING","REQUEUED"] / ["IDLE","DRAIN"].
func baseState(words []string, known map[string]bool) (string, []string) {
	base := ""
	var flags []string
	for _, w := range words {
		w = strings.ToUpper(strings.TrimSpace(w))
		if w == "" {
			continue
		}
		if base == "" && known[w] {
			base = w
			continue
		}
		flags = append(flags, w)
	}
	if base == "" && len(flags) > 0 {
		base, flags = flags[0], flags[1:]
	}
	return base, flags
}

var jobBaseStates = map[string]bool{
	"PENDING": true, "RUNNING": true, "SUSPENDED": true, "COMPLETED": true, "CANCELLED": true,
	"FAILED": true, "TIMEOUT": true, "NODE_FAIL": true, "PREEMPTED": true, "BOOT_FAIL": true,
	"DEADLINE": true, "OUT_OF_MEMORY": true, "REQUEUED": true,
}

var nodeBaseStates = map[string]bool{
	"IDLE": true, "ALLOCATED": true, "MIXED": true, "DOWN": true, "ERROR": true, "FUTURE": true, "UNKNOWN": true,
}

// finished reports whether a job state is terminal.
func finished(state string) bool {
	switch state {
	case "PENDING", "RUNNING", "SUSPENDED", "REQUEUED", "":
		return false
	}
	return true
}

// tresCount reads the GPU count and type from a TRES string
// "cpu=2,mem=1000M,node=1,billing=2,gres/gpu=2,gres/gpu:h100=2".
func tresGPUs(s string) (n int, typ string) {
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		if k == "gres/gpu" {
			n, _ = strconv.Atoi(v)
		} else if t, ok := strings.CutPrefix(k, "gres/gpu:"); ok && typ == "" {
			typ = t
		}
	}
	return n, typ
}

// tresValue reads key from a TRES string ("gres/gpuutil=75"); ok=false if absent.
func tresValue(s, key string) (float64, bool) {
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok && k == key {
			f, err := strconv.ParseFloat(strings.TrimRight(v, "KMGTP"), 64)
			if err != nil {
				return 0, false
			}
			switch v[len(v)-1] { // a converted size; --noconvert avoids this
			case 'K':
				f *= 1 << 10
			case 'M':
				f *= 1 << 20
			case 'G':
				f *= 1 << 30
			case 'T':
				f *= 1 << 40
			}
			return f, true
		}
	}
	return 0, false
}

// gresGPUs reads a GRES spec: "gpu:h100:4", "gpu:4(S:0)", "gres:gpu:h100:2"
// (v0.0.38 tres_per_node), "gres/gpu:h100:2" (v0.0.40+), comma-separated
// lists of them. It sums the gpu entries; typ is the first named type.
func gresGPUs(s string) (n int, typ string) {
	for _, part := range splitTop(s) {
		part = strings.TrimSpace(part)
		if i := strings.IndexByte(part, '('); i >= 0 {
			part = part[:i]
		}
		part = strings.TrimPrefix(part, "gres:")
		part = strings.TrimPrefix(part, "gres/")
		f := strings.Split(part, ":")
		if len(f) == 0 || f[0] != "gpu" {
			continue
		}
		switch len(f) {
		case 1:
			n++
		case 2:
			if c, err := strconv.Atoi(f[1]); err == nil {
				n += c
			} else {
				n++
				if typ == "" {
					typ = f[1]
				}
			}
		default:
			c, _ := strconv.Atoi(f[2])
			n += c
			if typ == "" {
				typ = f[1]
			}
		}
	}
	return n, typ
}

// splitTop splits at commas outside parentheses and brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// gresIndices reads the GPU indices of one gres_detail entry:
// "gpu:h100:2(IDX:0-1)" → [0 1]; "gpu(IDX:0,2-3)" → [0 2 3].
func gresIndices(s string) []int {
	i := strings.Index(s, "IDX:")
	if i < 0 {
		return nil
	}
	rest := s[i+4:]
	if j := strings.IndexByte(rest, ')'); j >= 0 {
		rest = rest[:j]
	}
	var out []int
	for _, r := range strings.Split(rest, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		for k := a; k <= b; k++ {
			out = append(out, k)
		}
	}
	return out
}

// ExpandHostlist expands a Slurm hostlist: "gpu[01-03,07],login1" →
// gpu01 gpu02 gpu03 gpu07 login1. "(null)", "None" and "" are empty.
func ExpandHostlist(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" || s == "(null)" || s == "None" {
		return nil
	}
	var out []string
	for _, part := range splitTop(s) {
		out = append(out, expandOne(part)...)
	}
	return out
}

func expandOne(p string) []string {
	i := strings.IndexByte(p, '[')
	if i < 0 {
		return []string{p}
	}
	j := strings.IndexByte(p[i:], ']')
	if j < 0 {
		return []string{p}
	}
	j += i
	prefix, body, suffix := p[:i], p[i+1:j], p[j+1:]
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err1 := strconv.Atoi(lo)
		if !isRange || err1 != nil {
			for _, s := range expandOne(suffix) {
				out = append(out, prefix+r+s)
			}
			continue
		}
		b, err := strconv.Atoi(hi)
		if err != nil {
			continue
		}
		for k := a; k <= b; k++ {
			n := strconv.Itoa(k)
			for len(n) < len(lo) {
				n = "0" + n
			}
			for _, s := range expandOne(suffix) {
				out = append(out, prefix+n+s)
			}
		}
	}
	return out
}

// gpuIndices maps the job's nodes to the indices in gres_detail (one entry
// per allocated node, in node order).
func gpuIndices(nodes []string, detail []string) map[string][]int {
	if len(detail) == 0 || len(nodes) == 0 {
		return nil
	}
	m := map[string][]int{}
	for i, d := range detail {
		if i >= len(nodes) {
			break
		}
		if idx := gresIndices(d); idx != nil {
			m[nodes[i]] = idx
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// exitStatus turns a raw wait status (v0.0.38 exit_code) into an exit code;
// 128+signal when killed by a signal.
func exitStatus(raw int64) int {
	if raw < 0 {
		return 0
	}
	if sig := raw & 0x7f; sig != 0 && sig != 0x7f {
		return 128 + int(sig)
	}
	return int((raw >> 8) & 0xff)
}

func reasonCode(s string) string {
	if s == "None" {
		return ""
	}
	return s
}

// tres is one TRES entry of accounting: {"type":"gres","name":"gpu:h100","count":2}.
type tres struct {
	Type  string  `json:"type"`
	Name  *string `json:"name"`
	Count *num    `json:"count"`
}

// tresListGPUs reads GPU count and type from a TRES list.
func tresListGPUs(l []tres) (n int, typ string) {
	for _, t := range l {
		if t.Type != "gres" || t.Name == nil || t.Count == nil {
			continue
		}
		if *t.Name == "gpu" {
			n = int(t.Count.val())
		} else if ty, ok := strings.CutPrefix(*t.Name, "gpu:"); ok && typ == "" {
			typ = ty
		}
	}
	return n, typ
}

func tresListValue(l []tres, name string) (int64, bool) {
	for _, t := range l {
		if t.Type == "gres" && t.Name != nil && *t.Name == name && t.Count != nil && t.Count.Set {
			return t.Count.Number, true
		}
	}
	return 0, false
}

// stepUsage is what right-sizing needs of one step: gres/gpuutil (sum of SM
// utilization over the step's GPUs, percent) and gres/gpumem (bytes).
type stepUsage struct {
	util, mem       float64
	hasUtil, hasMem bool
}

// rightSize picks the busiest step and turns its sums into per-GPU figures.
func rightSize(r *Run, steps []stepUsage) {
	best := -1
	for i, s := range steps {
		if !s.hasUtil && !s.hasMem {
			continue
		}
		if best < 0 || s.util > steps[best].util || (s.util == steps[best].util && s.mem > steps[best].mem) {
			best = i
		}
	}
	if best < 0 {
		return
	}
	s := steps[best]
	if s.hasUtil {
		u := s.util
		if r.GPUs > 1 {
			u /= float64(r.GPUs)
		}
		r.GPUUtilPct = &u
	}
	if s.hasMem {
		m := int64(s.mem) >> 20
		r.GPUMemMiB = &m
	}
}

// exitCode reads v0.0.38's raw wait status (a number) or the verbose
// object {"status":["SIGNALED"],"return_code":...,"signal":{"id"|"signal_id":15}}
// of dbv0.0.38 and v0.0.40+.
type exitCode struct {
	Raw      *int64
	Status   strList
	Return   num
	SignalID num
}

func (e *exitCode) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "null" {
		*e = exitCode{}
		return nil
	}
	if !strings.HasPrefix(s, "{") {
		var n num
		if err := n.UnmarshalJSON(b); err != nil {
			return err
		}
		v := n.val()
		*e = exitCode{Raw: &v}
		return nil
	}
	var o struct {
		Status     strList `json:"status"`
		ReturnCode num     `json:"return_code"`
		Signal     struct {
			SignalID num `json:"signal_id"`
			ID       num `json:"id"`
		} `json:"signal"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	sig := o.Signal.ID
	if !sig.Set {
		sig = o.Signal.SignalID
	}
	*e = exitCode{Status: o.Status, Return: o.ReturnCode, SignalID: sig}
	return nil
}

// code is the exit code, 128+signal for a signalled process.
func (e exitCode) code() int {
	if e.Raw != nil {
		return exitStatus(*e.Raw)
	}
	for _, st := range e.Status {
		if strings.EqualFold(st, "SIGNALED") && e.SignalID.val() > 0 {
			return 128 + int(e.SignalID.val())
		}
	}
	return int(e.Return.val())
}
