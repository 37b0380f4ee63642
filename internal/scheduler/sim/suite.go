package sim

import (
	"bufio"
	"crypto/sha256"
	"encoding/gob"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/scheduler"
)

// Goals of a loaded replay (the issue's), against the easy baseline.
const (
	goalMeanRatio   = 0.7
	goalP95Ratio    = 1.0
	goalUtilSlack   = 0.01
	goalTier1P99S   = 130
	goalTier2P99S   = 600
	goalJain        = 0.95
	goalWorstTeam   = 3.0
	worstTeamMinJob = 10 // teams with fewer jobs ran are left out of the worst-team ratio
	// loadedEASYWaitS: a setting is "loaded" when easy's mean wait is at
	// least this; the goals are checked on loaded settings only.
	loadedEASYWaitS = 60
)

// suiteSetting is one line of a suite file.
type suiteSetting struct {
	line    int
	args    []string
	name    string
	results map[scheduler.Mode]*Result
}

// readSuite parses a suite file: one setting per line, the flags of a
// single allot sim run; blank lines and lines starting with # are skipped.
// A line may start with "name:" to label its row.
func readSuite(path string) ([]suiteSetting, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--suite: %w", err)
	}
	defer f.Close()
	var out []suiteSetting
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		name := ""
		if i := strings.Index(s, ":"); i > 0 && !strings.ContainsAny(s[:i], " \t") && !strings.HasPrefix(s, "-") {
			name, s = s[:i], strings.TrimSpace(s[i+1:])
		}
		if name == "" {
			name = fmt.Sprintf("line%d", n)
		}
		if j := slices.IndexFunc(out, func(o suiteSetting) bool { return o.name == name }); j >= 0 {
			return nil, fmt.Errorf("--suite %s line %d: the name %q is also on line %d (each row of the table needs its own)", path, n, name, out[j].line)
		}
		out = append(out, suiteSetting{line: n, args: strings.Fields(s), name: name})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--suite: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--suite %s: no settings", path)
	}
	return out, nil
}

// suiteArgs splits the command line of a suite run: the --suite FILE,
// --trace-dir DIR and --baseline-cache DIR flags, and the rest, which
// every setting's flags follow (so that a setting overrides them).
func suiteArgs(args []string) (file, dir, cache string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || (name != "suite" && name != "trace-dir" && name != "baseline-cache") {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return "", "", "", nil, fmt.Errorf("--%s needs a value", name)
			}
			i++
			val = args[i]
		}
		switch name {
		case "suite":
			file = val
		case "trace-dir":
			dir = val
		case "baseline-cache":
			cache = val
		}
	}
	return file, dir, cache, rest, nil
}

func hasSuiteFlag(args []string) bool {
	for _, a := range args {
		n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && n == "suite" {
			return true
		}
	}
	return false
}

// resolvePaths makes --trace and --teams values relative to dir.
func resolvePaths(args []string, dir string) []string {
	if dir == "" {
		return args
	}
	out := slices.Clone(args)
	for i := 0; i < len(out); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(out[i], "-"), "=")
		if !strings.HasPrefix(out[i], "-") || (name != "trace" && name != "teams") {
			continue
		}
		if hasVal {
			if !filepath.IsAbs(val) {
				out[i] = "--" + name + "=" + filepath.Join(dir, val)
			}
		} else if i+1 < len(out) {
			if !filepath.IsAbs(out[i+1]) {
				out[i+1] = filepath.Join(dir, out[i+1])
			}
			i++
		}
	}
	return out
}

// mainSuite runs every setting of a suite file, one after the other (the
// policies of one setting concurrently), and prints one table of ratios
// against easy and fifo, then the absolute figures.
func mainSuite(args []string, stdout, stderr io.Writer, sched ScheduleFunc) int {
	file, dir, cache, common, err := suiteArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "allot sim: %v\n", err)
		return 2
	}
	settings, err := readSuite(file)
	if err != nil {
		fmt.Fprintf(stderr, "allot sim: %v\n", err)
		return 2
	}
	type prepared struct {
		o *options
	}
	preps := make([]prepared, len(settings))
	for i := range settings {
		a := resolvePaths(append(slices.Clone(common), settings[i].args...), dir)
		// The error names the bad flag; the usage text is not repeated
		// for a line of the file.
		o, err := parseFlags(a, io.Discard)
		if err != nil {
			fmt.Fprintf(stderr, "allot sim: --suite %s line %d: %v\n", file, settings[i].line, err)
			return 2
		}
		if o.jsonOut != "" || o.plotOut != "" || o.waitsOut != "" || o.burst {
			fmt.Fprintf(stderr, "allot sim: --suite %s line %d: --json, --plot, --waits and --burst are for single runs\n", file, settings[i].line)
			return 2
		}
		preps[i].o = o
	}
	t0 := time.Now()
	for i := range settings {
		s := &settings[i]
		o := preps[i].o
		st, err := load(o)
		if err != nil {
			fmt.Fprintf(stderr, "allot sim: --suite %s line %d: %v\n", file, s.line, err)
			return 2
		}
		st.sched = sched
		s.results = map[scheduler.Mode]*Result{}
		// Baselines may come from the cache.
		key := func(m scheduler.Mode) string {
			h := sha256.Sum256([]byte(strings.Join(append(slices.Clone(settings[i].args), baselineArgs(common)...), "\x00") + "\x00" + string(m) + "\x00" + cacheVersion))
			return filepath.Join(cache, hex.EncodeToString(h[:12])+".gob")
		}
		var todo []scheduler.Mode
		for _, m := range st.modes {
			if cache != "" && m != scheduler.ModeAllot && sched == nil {
				if r, err := readCached(key(m)); err == nil {
					s.results[m] = r
					continue
				}
			}
			todo = append(todo, m)
		}
		st.modes = todo
		rs, err := st.runAll(o, io.Discard)
		if err != nil {
			fmt.Fprintf(stderr, "allot sim: --suite %s line %d: %v\n", file, s.line, err)
			return 1
		}
		for k, m := range todo {
			r := rs[k]
			r.Waits, r.Timeline, r.JobWaits = nil, nil, nil
			s.results[m] = r
			if cache != "" && m != scheduler.ModeAllot && sched == nil {
				_ = writeCached(cache, key(m), r)
			}
		}
		fmt.Fprintf(stderr, "suite %d/%d %s: %d jobs, %.1f s\n", i+1, len(settings), s.name, len(st.trace), time.Since(t0).Seconds())
	}
	writeSuite(stdout, settings)
	return 0
}

func readCached(path string) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r Result
	if err := gob.NewDecoder(f).Decode(&r); err != nil {
		return nil, err
	}
	return &r, nil
}

func writeCached(dir, path string, r *Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(gob.NewEncoder(f).Encode(r), f.Close())
}

// worstTeamRatio is the highest team mean wait over the overall mean wait
// (teams with at least worstTeamMinJob jobs that ran); 0 without waiting.
func worstTeamRatio(r *Result) (float64, string) {
	if r.WaitMeanS <= 0 {
		return 0, ""
	}
	worst, who := 0.0, ""
	for _, name := range groupNames(r.ByTeam) {
		g := r.ByTeam[name]
		if g.Jobs >= worstTeamMinJob && g.WaitMeanS/r.WaitMeanS > worst {
			worst, who = g.WaitMeanS/r.WaitMeanS, name
		}
	}
	return worst, who
}

func groupNames(m map[string]Group) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func tierP99(r *Result, t string) (float64, bool) {
	g, ok := r.ByTier[t]
	if !ok || g.Jobs == 0 {
		return 0, false
	}
	return g.WaitP99S, true
}

// suiteGoals lists the goals r misses against easy (empty: all met).
func suiteGoals(r, easy *Result) []string {
	var miss []string
	ratio := func(a, b float64) float64 {
		if b <= 0 {
			if a <= 0 {
				return 1
			}
			return 99
		}
		return a / b
	}
	if q := ratio(r.WaitMeanS, easy.WaitMeanS); q > goalMeanRatio {
		miss = append(miss, fmt.Sprintf("mean %.2f×", q))
	}
	if q := ratio(r.WaitP95S, easy.WaitP95S); q > goalP95Ratio {
		miss = append(miss, fmt.Sprintf("p95 %.2f×", q))
	}
	if r.BoundedSlowdownMean > easy.BoundedSlowdownMean {
		miss = append(miss, fmt.Sprintf("bsld %.2f×", ratio(r.BoundedSlowdownMean, easy.BoundedSlowdownMean)))
	}
	if d := r.UtilizationSpan - easy.UtilizationSpan; d < -goalUtilSlack {
		miss = append(miss, fmt.Sprintf("util %+.3f", d))
	}
	if p, ok := tierP99(r, "1"); ok && p > goalTier1P99S {
		miss = append(miss, fmt.Sprintf("t1p99 %.0fs", p))
	}
	if p, ok := tierP99(r, "2"); ok && p > goalTier2P99S {
		miss = append(miss, fmt.Sprintf("t2p99 %.0fs", p))
	}
	if len(r.ByTeam) > 1 && r.JainFairness < goalJain {
		miss = append(miss, fmt.Sprintf("jain %.3f", r.JainFairness))
	}
	if w, _ := worstTeamRatio(r); w > goalWorstTeam {
		if ew, _ := worstTeamRatio(easy); w > ew/2 {
			miss = append(miss, fmt.Sprintf("team %.1f× (easy %.1f×)", w, ew))
		}
	}
	return miss
}

func writeSuite(w io.Writer, settings []suiteSetting) {
	ratio := func(a, b float64) string {
		if b <= 0 {
			if a <= 0 {
				return "1.00"
			}
			return "inf"
		}
		return f2(a / b)
	}
	p99 := func(r *Result, t string) string {
		if p, ok := tierP99(r, t); ok {
			return f0(p)
		}
		return "-"
	}
	fmt.Fprintln(w, "ratios against easy (mean, p95, bsld: policy / easy; util: policy − easy) and fifo (mean)")
	rows := [][]string{{"setting", "policy", "mean/easy", "p95/easy", "bsld/easy", "util−easy", "t1_p99_s", "t2_p99_s",
		"jain", "worst_team", "mean/fifo", "goals (loaded)"}}
	for _, s := range settings {
		easy := s.results[scheduler.ModeEASY]
		fifo := s.results[scheduler.ModeFIFO]
		for _, m := range []scheduler.Mode{scheduler.ModeAllot, scheduler.ModeEASY, scheduler.ModeFIFO, scheduler.ModeFIFOPartitioned} {
			r := s.results[m]
			if r == nil {
				continue
			}
			row := []string{s.name, string(m)}
			if easy != nil {
				row = append(row, ratio(r.WaitMeanS, easy.WaitMeanS), ratio(r.WaitP95S, easy.WaitP95S),
					ratio(r.BoundedSlowdownMean, easy.BoundedSlowdownMean), fmt.Sprintf("%+.3f", r.UtilizationSpan-easy.UtilizationSpan))
			} else {
				row = append(row, "-", "-", "-", "-")
			}
			wt, _ := worstTeamRatio(r)
			row = append(row, p99(r, "1"), p99(r, "2"), f3(r.JainFairness), f2(wt))
			if fifo != nil {
				row = append(row, ratio(r.WaitMeanS, fifo.WaitMeanS))
			} else {
				row = append(row, "-")
			}
			goals := ""
			if m == scheduler.ModeAllot && easy != nil {
				switch miss := suiteGoals(r, easy); {
				case easy.WaitMeanS < loadedEASYWaitS:
					goals = "(not loaded)"
				case len(miss) == 0:
					goals = "all met"
				default:
					goals = strings.Join(miss, "; ")
				}
			}
			rows = append(rows, append(row, goals))
		}
	}
	markdown(w, rows)

	fmt.Fprintln(w, "\nabsolute figures")
	rows = [][]string{{"setting", "policy", "jobs", "dropped", "load_span", "util_span", "idle_pend", "idle_held", "wait_mean_s", "wait_p95_s", "bsld",
		"preempt", "lost_gpu_h", "worst_team", "wall_s"}}
	for _, s := range settings {
		for _, m := range []scheduler.Mode{scheduler.ModeAllot, scheduler.ModeEASY, scheduler.ModeFIFO, scheduler.ModeFIFOPartitioned} {
			r := s.results[m]
			if r == nil {
				continue
			}
			wt, who := worstTeamRatio(r)
			team := "-"
			if who != "" {
				team = fmt.Sprintf("%s %s s (%s×)", who, f0(wt*r.WaitMeanS), f1(wt))
			}
			rows = append(rows, []string{s.name, string(m), fmt.Sprint(r.Jobs), fmt.Sprint(r.Dropped), f3(r.OfferedLoadSpan), f3(r.UtilizationSpan), f3(r.IdlePendingSpan), f3(r.IdleHeldSpan),
				f0(r.WaitMeanS), f0(r.WaitP95S), f2(r.BoundedSlowdownMean), fmt.Sprint(r.Preemptions),
				f0(r.GPUSLostToPreemption / 3600), team, f2(r.SimWallS)})
		}
	}
	markdown(w, rows)
	writeSuiteETA(w, settings)
}

// writeSuiteETA is the start-estimate error per setting and policy (see
// writeETA).
func writeSuiteETA(w io.Writer, settings []suiteSetting) {
	any := false
	for _, s := range settings {
		for _, r := range s.results {
			any = any || r.ETAAtSubmit != nil
		}
	}
	if !any {
		return
	}
	fmt.Fprintln(w, "\nstart-estimate error: median / p90 |estimate − actual| (s) (share with an estimate), jobs pending after their first cycle (at submit) and after 1 h")
	rows := [][]string{{"setting", "policy", "jobs", "forecast@submit", "limits@submit", "naive@submit", "jobs@1h", "forecast@1h", "limits@1h", "naive@1h"}}
	for _, s := range settings {
		for _, m := range []scheduler.Mode{scheduler.ModeAllot, scheduler.ModeEASY, scheduler.ModeFIFO, scheduler.ModeFIFOPartitioned} {
			r := s.results[m]
			if r == nil || r.ETAAtSubmit == nil || r.ETAAt1h == nil {
				continue
			}
			a, h := r.ETAAtSubmit, r.ETAAt1h
			rows = append(rows, []string{s.name, string(m), fmt.Sprint(a.Jobs), etaCell(a.Forecast), etaCell(a.Limits), etaCell(a.Naive),
				fmt.Sprint(h.Jobs), etaCell(h.Forecast), etaCell(h.Limits), etaCell(h.Naive)})
		}
	}
	markdown(w, rows)
}

func f1(x float64) string { return fmt.Sprintf("%.1f", x) }

// cacheVersion is part of the baseline cache's key: results stored by an
// older Result (without a metric added since) are not reused.
const cacheVersion = "2"

// baselineArgs drops the flags that change only allot (--allot-…,
// --starvation-wait) and --policy from args, for the baseline cache key.
func baselineArgs(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		name, _, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if strings.HasPrefix(args[i], "-") && (strings.HasPrefix(name, "allot-") || name == "starvation-wait" || name == "policy") {
			if !hasVal {
				i++
			}
			continue
		}
		out = append(out, args[i])
	}
	return out
}
