package main

// `allot submit job.sh`: the #SBATCH directives of a Slurm batch script,
// and the sbatch options `allot submit` takes on its command line.

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// sbatchArg is whether an sbatch option takes a value.
type sbatchArg int

const (
	argNone     sbatchArg = iota
	argRequired           // --opt=value, --opt value, -Xvalue, -X value
	argOptional           // only as --opt=value
)

// sbatchAct is what allot submit does with an option.
type sbatchAct int

const (
	actHonour sbatchAct = iota // becomes part of the job
	actIgnore                  // a warning, then the job is submitted without it
	actRefuse                  // an error: the job would not be what the script asks for
)

// sbatchOpt is one sbatch option. note says what it becomes (honoured)
// or why it is ignored or refused, for warnings, errors and the README.
type sbatchOpt struct {
	long  string
	alias []string // other long names
	short byte     // 0: none
	arg   sbatchArg
	act   sbatchAct
	note  string
}

// sbatchOpts are the options allot submit knows, from sbatch(1). Any
// other option is warned about and ignored.
var sbatchOpts = []sbatchOpt{
	{long: "job-name", short: 'J', arg: argRequired, note: "the job's name (--name)"},
	{long: "account", short: 'A', arg: argRequired, note: "the team (--team)"},
	{long: "time", short: 't', arg: argRequired, note: "the time limit (--time), in any of the forms --time takes"},
	{long: "qos", short: 'q', arg: argRequired, note: "the tier (--tier): a tier's id (1, tier3, preemptible) or name (Experiment); an unknown one is refused"},
	{long: "partition", short: 'p', arg: argRequired, note: "the tier, like --qos (which wins); a partition that names no tier is ignored with a warning"},
	{long: "gres", arg: argRequired, note: "gpu[:type]:N is N GPUs per node (other resources are ignored with a warning)"},
	{long: "gpus", short: 'G', arg: argRequired, note: "[type:]N GPUs in all (--gpus)"},
	{long: "gpus-per-node", arg: argRequired, note: "[type:]N GPUs per node (--gpus-per-node)"},
	{long: "gpus-per-task", arg: argRequired, note: "[type:]N, times --ntasks-per-node (per node) or --ntasks (in all)"},
	{long: "nodes", short: 'N', arg: argRequired, note: "N nodes: GPUs per node × N (a range min-max with min ≠ max is refused)"},
	{long: "ntasks", short: 'n', arg: argRequired, note: "only to count GPUs and CPUs per task: Allot runs the script once per node"},
	{long: "ntasks-per-node", alias: []string{"tasks-per-node"}, arg: argRequired, note: "only to count GPUs and CPUs per task: Allot runs the script once per node"},
	{long: "cpus-per-task", short: 'c', arg: argRequired, note: "CPUs per node (--cpus), times --ntasks-per-node"},
	{long: "mem", arg: argRequired, note: "memory per node (--memory); a bare number is MiB, K/M/G/T suffixes are binary; 0 is the node's"},
	{long: "mem-per-gpu", arg: argRequired, note: "memory per node (--memory) = this × the GPUs per node, which --gres, --gpus-per-node or --nodes must give"},
	{long: "chdir", alias: []string{"workdir"}, short: 'D', arg: argRequired, note: "the working directory on the node (--workdir); relative to where allot submit runs"},
	{long: "export", arg: argRequired, note: "KEY=value becomes the job's env; KEY takes $KEY from where allot submit runs; NONE is nothing; ALL is ignored with a warning (the node does not get this shell's environment)"},
	{long: "requeue", arg: argNone, note: "checkpointable (--checkpointable): requeued, not failed, when its node is lost, with ALLOT_CHECKPOINT_DIR to resume from"},
	{long: "no-requeue", arg: argNone, note: "not checkpointable (the default)"},
	{long: "container-image", arg: argRequired, note: "the OCI image (--image); pyxis's registry#image is read as registry/image"},
	{long: "parsable", arg: argNone, note: "print only the job id"},

	{long: "output", short: 'o', arg: argRequired, act: actIgnore, note: "Allot keeps the job's output itself (the job page, GET /api/v1/jobs/ID/log)"},
	{long: "error", short: 'e', arg: argRequired, act: actIgnore, note: "Allot keeps the job's output itself (the job page, GET /api/v1/jobs/ID/log)"},
	{long: "input", short: 'i', arg: argRequired, act: actIgnore, note: "the job's standard input is empty"},
	{long: "open-mode", arg: argRequired, act: actIgnore, note: "Allot keeps the job's output itself"},
	{long: "mail-type", arg: argRequired, act: actIgnore, note: "Allot sends no mail; a team lead can set the team's webhook"},
	{long: "mail-user", arg: argRequired, act: actIgnore, note: "Allot sends no mail; a team lead can set the team's webhook"},
	{long: "mem-per-cpu", arg: argRequired, act: actIgnore, note: "give --mem, memory per node"},

	{long: "exclusive", arg: argOptional, act: actIgnore, note: "Allot gives a job whole GPUs, and their node's share of CPUs and memory when asked (--cpus-per-task, --mem)"},
	{long: "oversubscribe", short: 's', arg: argNone, act: actIgnore, note: "Allot gives a job whole GPUs"},
	{long: "constraint", short: 'C', arg: argRequired, act: actIgnore, note: "Allot places by GPU type (--gres=gpu:TYPE:N)"},
	{long: "nodelist", short: 'w', arg: argRequired, act: actIgnore, note: "the scheduler chooses the nodes"},
	{long: "exclude", short: 'x', arg: argRequired, act: actIgnore, note: "the scheduler chooses the nodes"},
	{long: "signal", arg: argRequired, act: actIgnore, note: "Allot sends SIGTERM, then SIGKILL after the policy's grace period"},
	{long: "comment", arg: argRequired, act: actIgnore, note: "Allot jobs have no comment"},
	{long: "reservation", arg: argRequired, act: actIgnore, note: "tiers 1 and 2 have the reserved GPUs"},
	{long: "licenses", short: 'L', arg: argRequired, act: actIgnore, note: "Allot has no licenses"},
	{long: "wckey", arg: argRequired, act: actIgnore, note: "Allot bills the team (--account)"},
	{long: "nice", arg: argOptional, act: actIgnore, note: "the tier and fair share order the queue"},
	{long: "priority", arg: argRequired, act: actIgnore, note: "the tier and fair share order the queue"},
	{long: "time-min", arg: argRequired, act: actIgnore, note: "the job gets its --time"},
	{long: "distribution", short: 'm', arg: argRequired, act: actIgnore, note: "Allot runs the script once per node"},
	{long: "ntasks-per-gpu", arg: argRequired, act: actIgnore, note: "Allot runs the script once per node"},
	{long: "cpus-per-gpu", arg: argRequired, act: actIgnore, note: "give --cpus-per-task (CPUs per node)"},
	{long: "gpu-bind", arg: argRequired, act: actIgnore, note: "CUDA_VISIBLE_DEVICES names the job's GPUs on each node"},
	{long: "gpu-freq", arg: argRequired, act: actIgnore, note: "Allot does not set GPU clocks"},
	{long: "hint", arg: argRequired, act: actIgnore, note: "Allot does not bind CPUs"},
	{long: "threads-per-core", arg: argRequired, act: actIgnore, note: "Allot does not bind CPUs"},
	{long: "sockets-per-node", arg: argRequired, act: actIgnore, note: "Allot does not bind CPUs"},
	{long: "cores-per-socket", arg: argRequired, act: actIgnore, note: "Allot does not bind CPUs"},
	{long: "mincpus", arg: argRequired, act: actIgnore, note: "give --cpus-per-task"},
	{long: "tmp", arg: argRequired, act: actIgnore, note: "every job has its own /tmp"},
	{long: "propagate", arg: argOptional, act: actIgnore, note: "the node's limits apply"},
	{long: "get-user-env", arg: argOptional, act: actIgnore, note: "the job gets the env it is given (--export)"},
	{long: "export-file", arg: argRequired, act: actIgnore, note: "give the variables with --export"},
	{long: "no-kill", short: 'k', arg: argOptional, act: actIgnore, note: "a gang whose node fails stops (and requeues if --requeue)"},
	{long: "kill-on-invalid-dep", arg: argRequired, act: actIgnore, note: "Allot has no dependencies"},
	{long: "cluster", alias: []string{"clusters"}, short: 'M', arg: argRequired, act: actIgnore, note: "--server chooses the Allot server"},
	{long: "verbose", short: 'v', arg: argNone, act: actIgnore, note: "no effect"},
	{long: "quiet", short: 'Q', arg: argNone, act: actIgnore, note: "no effect"},
	{long: "container", arg: argRequired, act: actIgnore, note: "give an OCI image (--image or --container-image)"},
	{long: "switches", arg: argRequired, act: actIgnore, note: "the scheduler places a gang in one domain where it can"},
	{long: "use-min-nodes", arg: argNone, act: actIgnore, note: "the scheduler packs a gang on as few nodes as it can"},
	{long: "spread-job", arg: argNone, act: actIgnore, note: "the scheduler packs a gang on as few nodes as it can"},
	{long: "uid", arg: argRequired, act: actIgnore, note: "the job runs as the account Allot maps you to"},
	{long: "gid", arg: argRequired, act: actIgnore, note: "the job runs as the account Allot maps you to"},
	{long: "wait", short: 'W', arg: argNone, act: actIgnore, note: "allot submit returns at once; watch the job with allot jobs"},

	{long: "array", short: 'a', arg: argRequired, act: actRefuse, note: "Allot has no job arrays: submit one job per task (e.g. in a shell loop, with the index in --env)"},
	{long: "dependency", short: 'd', arg: argRequired, act: actRefuse, note: "Allot has no job dependencies: submit the next job when this one has completed"},
	{long: "begin", short: 'b', arg: argRequired, act: actRefuse, note: "Allot cannot hold a job until a start time: submit it then"},
	{long: "deadline", arg: argRequired, act: actRefuse, note: "Allot has no deadlines: give --time"},
	{long: "hold", short: 'H', arg: argNone, act: actRefuse, note: "Allot cannot hold a job: submit it when it should run"},
	{long: "test-only", arg: argNone, act: actRefuse, note: "Allot cannot estimate a start without submitting"},
	{long: "immediate", short: 'I', arg: argOptional, act: actRefuse, note: "Allot queues every job"},
	{long: "het-job", arg: argNone, act: actRefuse, note: "Allot has no heterogeneous jobs"},
	{long: "overcommit", short: 'O', arg: argNone, act: actRefuse, note: "Allot does not overcommit GPUs"},
}

// lookupSbatch finds the option of a long name ("job-name") or, with
// short, of a one-letter name.
func lookupSbatch(name string, short bool) *sbatchOpt {
	for i := range sbatchOpts {
		o := &sbatchOpts[i]
		if short {
			if o.short != 0 && len(name) == 1 && o.short == name[0] {
				return o
			}
			continue
		}
		if o.long == name {
			return o
		}
		for _, a := range o.alias {
			if a == name {
				return o
			}
		}
	}
	return nil
}

// directive is one sbatch option as written: in a script (line ≥ 1), on
// the command line (line 0) or in an ALLOT_* variable (line -1, env).
type directive struct {
	opt     *sbatchOpt
	written string // as the user wrote the option's name: "--gres", "-J"
	value   string
	line    int
	env     string // the variable, for line -1
}

// rank orders the sources: the command line (2) over the environment (1)
// over the script (0).
func (d directive) rank() int {
	switch {
	case d.line == 0:
		return 2
	case d.line < 0:
		return 1
	}
	return 0
}

func (d directive) where() string { return d.whereValue("") }

// whereValue is where with the option's value (or part of it) shown:
// "#SBATCH --mem=lots (line 4)", "--mem=lots".
func (d directive) whereValue(v string) string {
	w := d.written
	if v != "" {
		w += "=" + v
	}
	if d.line == 0 {
		return w
	}
	if d.line < 0 {
		return fmt.Sprintf("$%s (%s)", d.env, w)
	}
	return fmt.Sprintf("#SBATCH %s (line %d)", w, d.line)
}

// batchScript is what allot submit reads from a batch script.
type batchScript struct {
	interpreter []string // the shebang: program and at most one argument
	directives  []directive
	warnings    []string // unknown options (ignored)
}

// parseBatchScript reads a batch script as sbatch does: it must start
// with #!; #SBATCH lines are read up to the first line that is neither a
// comment nor blank. "#SBATCH" must be the line's first word (after any
// spaces), so "# SBATCH" and "##SBATCH" are comments; a word starting with
// "#" ends a directive line (a trailing comment). Values may be quoted
// with ” or "".
func parseBatchScript(content string) (batchScript, error) {
	var b batchScript
	if !strings.HasPrefix(content, "#!") {
		return b, errors.New("this does not look like a batch script: the first line must start with #! followed by the path to an interpreter (as sbatch says); use --wrap \"COMMAND\" for a command line")
	}
	lines := strings.Split(content, "\n")
	shebang := strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(lines[0], "#!"), "\r"))
	prog, arg, _ := strings.Cut(shebang, " ")
	if prog == "" || !strings.HasPrefix(prog, "/") {
		return b, fmt.Errorf("the first line, %q, must name an interpreter by its absolute path (e.g. #!/bin/bash)", lines[0])
	}
	b.interpreter = []string{prog}
	if arg = strings.TrimSpace(arg); arg != "" {
		b.interpreter = append(b.interpreter, arg) // as Linux does: the rest is one argument
	}
	for i, line := range lines[1:] {
		n := i + 2
		t := strings.TrimSpace(strings.TrimSuffix(line, "\r"))
		if t == "" {
			continue
		}
		if !strings.HasPrefix(t, "#") {
			break
		}
		rest, ok := strings.CutPrefix(t, "#SBATCH")
		if !ok {
			continue
		}
		if rest != "" && !unicode.IsSpace(rune(rest[0])) {
			continue // #SBATCHx: a comment
		}
		words, err := shellWords(rest)
		if err != nil {
			return b, fmt.Errorf("line %d: %v", n, err)
		}
		ds, warns, err := parseSbatchArgs(words, n)
		if err != nil {
			return b, err
		}
		b.directives = append(b.directives, ds...)
		b.warnings = append(b.warnings, warns...)
	}
	return b, nil
}

// shellWords splits a directive line into words: blanks separate, ” and
// "" quote, a word starting with # ends the line.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, c := range s {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case unicode.IsSpace(c):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			return words, nil
		default:
			cur.WriteRune(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// parseSbatchArgs reads sbatch options from words (of script line line):
// --opt=value, --opt value, -Xvalue, -X value, --flag, -X.
func parseSbatchArgs(words []string, line int) ([]directive, []string, error) {
	var out []directive
	var warns []string
	at := func(w string) string { return fmt.Sprintf("#SBATCH %s (line %d)", w, line) }
	for i := 0; i < len(words); i++ {
		w := words[i]
		var o *sbatchOpt
		var name, value string
		hasValue := false
		switch {
		case strings.HasPrefix(w, "--") && len(w) > 2:
			n, v, eq := strings.Cut(w[2:], "=")
			name, value, hasValue = "--"+n, v, eq
			o = lookupSbatch(n, false)
		case strings.HasPrefix(w, "-") && len(w) > 1 && w[1] != '-':
			name = w[:2]
			o = lookupSbatch(w[1:2], true)
			if len(w) > 2 {
				value, hasValue = strings.TrimPrefix(w[2:], "="), true
			}
		default:
			return nil, nil, fmt.Errorf("%s: %q is not an option (sbatch options start with - or --)", at(w), w)
		}
		if o == nil {
			warns = append(warns, fmt.Sprintf("%s ignored: not an sbatch option allot submit knows", at(name)))
			if !hasValue && i+1 < len(words) && !strings.HasPrefix(words[i+1], "-") {
				i++ // its value, most likely
			}
			continue
		}
		switch o.arg {
		case argRequired:
			if !hasValue {
				if i+1 >= len(words) {
					return nil, nil, fmt.Errorf("%s needs a value", at(name))
				}
				i++
				value = words[i]
			}
		case argNone:
			if hasValue {
				return nil, nil, fmt.Errorf("%s takes no value", at(name))
			}
		}
		out = append(out, directive{opt: o, written: name, value: value, line: line})
	}
	return out, warns, nil
}

// batchJob is what the directives ask for; zero values are "not given".
type batchJob struct {
	name, team, timeLimit, workdir, memory, cpus, image string
	qos, partition                                      string // tier names, resolved against the server's tiers
	qosAt, partitionAt                                  string // where they were given
	gpus, gpusPerNode                                   int
	gpuType                                             string
	requeue                                             *bool
	env                                                 map[string]string
	envOrder                                            []string
	parsable                                            bool
	// rank is where each option came from (directive.rank), by sbatch
	// option ("job-name"; "gpus" for all the GPU and node counts).
	rank map[string]int
}

// rankOf is the rank of option key, -1 if no directive gave it.
func (j batchJob) rankOf(key string) int {
	if r, ok := j.rank[key]; ok {
		return r
	}
	return -1
}

// applyDirectives turns directives into a batchJob: the command line's
// win over the environment's over the script's, and a later one over an
// earlier one from the same place. It returns warnings for the
// ignored ones and an error for the first refused or malformed one.
// lookupEnv is os.LookupEnv (for --export=KEY); cwd resolves a relative
// --chdir.
func applyDirectives(ds []directive, lookupEnv func(string) (string, bool), cwd string) (batchJob, []string, error) {
	var j batchJob
	var warns []string
	// The script's first, then the environment's, then the command line's:
	// a later one wins (-A on the command line over $ALLOT_SUBMIT_ACCOUNT,
	// which --account reads).
	ds = slices.Clone(ds)
	slices.SortStableFunc(ds, func(a, b directive) int { return a.rank() - b.rank() })
	last := map[string]directive{}
	var order []string
	var exports []directive
	for _, d := range ds {
		switch d.opt.act {
		case actRefuse:
			return j, nil, fmt.Errorf("%s cannot be honoured: %s", d.where(), d.opt.note)
		case actIgnore:
			warns = append(warns, fmt.Sprintf("%s ignored: %s", d.where(), d.opt.note))
			continue
		}
		key := d.opt.long
		if key == "no-requeue" {
			key = "requeue"
		}
		if key == "export" {
			exports = append(exports, d)
			continue
		}
		if _, seen := last[key]; !seen {
			order = append(order, key)
		}
		last[key] = d
	}
	bad := func(d directive, format string, a ...any) error {
		return fmt.Errorf("%s: %s", d.whereValue(d.value), fmt.Sprintf(format, a...))
	}
	// GPUs: per node (gres, gpus-per-node, gpus-per-task × tasks per
	// node), in all (gpus, gpus-per-task × tasks), nodes.
	var perNode, total, nodes, tasks, tasksPerNode, perTask int
	var memPerGPU *directive
	var types []string
	addType := func(t string) {
		if t != "" {
			types = append(types, t)
		}
	}
	j.rank = map[string]int{}
	gpuKeys := []string{"gres", "gpus", "gpus-per-node", "gpus-per-task", "nodes", "ntasks", "ntasks-per-node"}
	// The GPU counts come from the highest place that gives one: -G on the
	// command line replaces the script's --gres, not adds to it.
	countKeys := []string{"gres", "gpus", "gpus-per-node", "gpus-per-task"}
	countRank := -1
	for _, k := range countKeys {
		if d, ok := last[k]; ok {
			countRank = max(countRank, d.rank())
		}
	}
	for _, key := range order {
		d := last[key]
		v := strings.TrimSpace(d.value)
		if slices.Contains(countKeys, key) && d.rank() < countRank {
			continue
		}
		rk := key
		if slices.Contains(gpuKeys, key) {
			rk = "gpus"
		}
		j.rank[rk] = max(j.rankOf(rk), d.rank())
		switch key {
		case "job-name":
			j.name = v
		case "account":
			j.team = v
		case "time":
			j.timeLimit = v
		case "qos":
			j.qos, j.qosAt = v, d.whereValue(v)
		case "partition":
			j.partition, j.partitionAt = v, d.whereValue(v)
		case "chdir":
			if v == "" {
				return j, nil, bad(d, "an empty directory")
			}
			if !filepath.IsAbs(v) {
				v = filepath.Join(cwd, v)
			}
			j.workdir = filepath.Clean(v)
		case "requeue":
			r := d.opt.long == "requeue"
			j.requeue = &r
		case "parsable":
			j.parsable = true
		case "container-image":
			j.image = strings.Replace(v, "#", "/", 1)
		case "mem":
			m, err := slurmMemory(v)
			if err != nil {
				return j, nil, bad(d, "%v", err)
			}
			j.memory = m
		case "mem-per-gpu":
			if _, err := slurmMemory(v); err != nil {
				return j, nil, bad(d, "%v", err)
			}
			if _, both := last["mem"]; both {
				return j, nil, bad(d, "give --mem or --mem-per-gpu, not both (as sbatch)")
			}
			memPerGPU = &d
		case "cpus-per-task":
			n, err := positive(v)
			if err != nil {
				return j, nil, bad(d, "%v", err)
			}
			j.cpus = strconv.Itoa(n)
		case "gres":
			found := false
			for _, g := range strings.Split(v, ",") {
				parts := strings.Split(strings.TrimSpace(g), ":")
				if strings.TrimPrefix(parts[0], "gres/") != "gpu" {
					warns = append(warns, fmt.Sprintf("%s ignored: Allot schedules GPUs only", d.whereValue(g)))
					continue
				}
				if found {
					return j, nil, bad(d, "gpu appears twice")
				}
				found = true
				n, typ := 1, ""
				switch len(parts) {
				case 1:
				case 2:
					if c, err := strconv.Atoi(parts[1]); err == nil {
						n = c
					} else {
						typ = parts[1]
					}
				case 3:
					typ = parts[1]
					c, err := strconv.Atoi(parts[2])
					if err != nil {
						return j, nil, bad(d, "want gpu[:type]:N")
					}
					n = c
				default:
					return j, nil, bad(d, "want gpu[:type]:N")
				}
				if n < 1 {
					return j, nil, bad(d, "ask for at least 1 GPU")
				}
				perNode = n
				addType(typ)
			}
		case "gpus", "gpus-per-node", "gpus-per-task":
			typ, n, err := typedCount(v)
			if err != nil {
				return j, nil, bad(d, "%v", err)
			}
			addType(typ)
			switch key {
			case "gpus":
				total = n
			case "gpus-per-node":
				perNode = n
			default:
				perTask = n
			}
		case "nodes":
			lo, hi, isRange := strings.Cut(v, "-")
			n, err := positive(lo)
			if err != nil {
				return j, nil, bad(d, "%v", err)
			}
			if isRange {
				m, err := positive(hi)
				if err != nil || m != n {
					return j, nil, bad(d, "a range of node counts cannot be honoured: Allot places a job on the nodes its GPUs need; give one count")
				}
			}
			nodes = n
		case "ntasks":
			n, err := positive(v)
			if err != nil {
				return j, nil, bad(d, "%v", err)
			}
			tasks = n
		case "ntasks-per-node":
			n, err := positive(v)
			if err != nil {
				return j, nil, bad(d, "%v", err)
			}
			tasksPerNode = n
		}
	}
	for _, t := range types[min(1, len(types)):] {
		if !strings.EqualFold(t, types[0]) {
			return j, nil, fmt.Errorf("the GPU type is given twice, as %q and %q: give one", types[0], t)
		}
	}
	if len(types) > 0 {
		j.gpuType = types[0]
	}
	if perTask > 0 {
		switch {
		case tasksPerNode > 0:
			perNode = perTask * tasksPerNode
		case tasks > 0:
			total = perTask * tasks
		default:
			perNode = perTask // one task per node
		}
	}
	if tasksPerNode > 0 && j.cpus != "" {
		c, _ := strconv.Atoi(j.cpus)
		j.cpus = strconv.Itoa(c * tasksPerNode)
	}
	switch {
	case total > 0 && perNode > 0:
		if total%perNode != 0 || nodes > 0 && total != perNode*nodes {
			if nodes == 0 {
				return j, nil, fmt.Errorf("%d GPUs in all are not a whole number of nodes of %d GPUs each", total, perNode)
			}
			return j, nil, fmt.Errorf("%d GPUs in all do not make %d per node on %s", total, perNode, plural(nodes, "node"))
		}
		j.gpus, j.gpusPerNode = total, perNode
	case total > 0:
		j.gpus = total
		if nodes > 0 {
			if total%nodes != 0 {
				return j, nil, fmt.Errorf("%d GPUs do not divide evenly over %s", total, plural(nodes, "node"))
			}
			j.gpusPerNode = total / nodes
		}
	case perNode > 0:
		j.gpus, j.gpusPerNode = perNode*max(nodes, 1), perNode
	case nodes > 1:
		return j, nil, fmt.Errorf("--nodes=%d: say how many GPUs each node needs (--gres=gpu:N or --gpus-per-node=N)", nodes)
	}
	if memPerGPU != nil {
		g := j.gpusPerNode
		if g == 0 {
			return j, nil, fmt.Errorf("%s: the GPUs per node are not known: give --gres=gpu:N, --gpus-per-node, --nodes or --mem", memPerGPU.whereValue(memPerGPU.value))
		}
		m, _ := slurmMemory(memPerGPU.value)
		if m != "" {
			n, _ := strconv.ParseInt(strings.TrimRight(m, "KMGTiB"), 10, 64)
			j.memory = fmt.Sprintf("%d%s", n*int64(g), m[len(strings.TrimRight(m, "KMGTiB")):])
		}
	}
	for _, d := range exports {
		for _, item := range strings.Split(d.value, ",") {
			item = strings.TrimSpace(item)
			k, v, hasValue := strings.Cut(item, "=")
			switch {
			case item == "":
			case !hasValue && (strings.EqualFold(item, "NONE") || strings.EqualFold(item, "NIL")):
			case !hasValue && strings.EqualFold(item, "ALL"):
				warns = append(warns, fmt.Sprintf("%s ignored: the job does not get this shell's environment on the node; name the variables (--export=KEY or KEY=value)", d.whereValue(item)))
			case !hasValue:
				val, ok := lookupEnv(k)
				if !ok {
					warns = append(warns, fmt.Sprintf("%s ignored: $%s is not set here", d.whereValue(k), k))
					continue
				}
				j.setEnv(k, val)
			case k == "":
				return j, nil, bad(d, "a variable without a name")
			default:
				j.setEnv(k, v)
			}
		}
	}
	return j, warns, nil
}

func (j *batchJob) setEnv(k, v string) {
	if j.env == nil {
		j.env = map[string]string{}
	}
	if _, ok := j.env[k]; !ok {
		j.envOrder = append(j.envOrder, k)
	}
	j.env[k] = v
}

func plural(n int, what string) string {
	if n == 0 {
		return "its nodes"
	}
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func positive(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("want a whole number of at least 1, not %q", s)
	}
	return n, nil
}

// typedCount reads [type:]N.
func typedCount(s string) (string, int, error) {
	if strings.Contains(s, ",") {
		return "", 0, errors.New("one GPU type per job: Allot cannot mix GPU types")
	}
	typ, num, ok := strings.Cut(s, ":")
	if !ok {
		typ, num = "", s
	}
	n, err := positive(num)
	if err != nil {
		return "", 0, fmt.Errorf("want [type:]N: %v", err)
	}
	return typ, n, nil
}

// slurmMemory converts sbatch's --mem (a number with an optional K, M, G
// or T suffix, binary units, MiB when bare; 0 for all of the node's) to
// Allot's form ("64GiB"); "" is the node's.
func slurmMemory(s string) (string, error) {
	s = strings.TrimSpace(s)
	num := strings.TrimRight(s, "KMGTkmgtBb")
	unit := strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(s[len(num):], "B"), "b"))
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || len(unit) > 1 {
		return "", fmt.Errorf("want a size such as 64G or 500M (a bare number is MiB), not %q", s)
	}
	if n == 0 {
		return "", nil
	}
	if unit == "" {
		unit = "M"
	}
	return fmt.Sprintf("%d%siB", n, unit), nil
}
