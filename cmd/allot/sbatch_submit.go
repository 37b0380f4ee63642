package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// gpusValue is --gpus: N, or TYPE:N as sbatch's --gpus.
type gpusValue struct {
	n   int
	typ string
}

func (g *gpusValue) String() string {
	if g == nil {
		return ""
	}
	return strconv.Itoa(g.n)
}

func (g *gpusValue) Set(s string) error {
	if n, err := strconv.Atoi(s); err == nil {
		g.n, g.typ = n, "" // the server checks the count (at least 1)
		return nil
	}
	typ, n, err := typedCount(s)
	if err != nil {
		return err
	}
	g.n, g.typ = n, typ
	return nil
}

// submitStdin is what `allot submit -` reads the script from (tests
// replace it).
var submitStdin io.Reader = os.Stdin

const submitUsage = `usage: allot submit [flags] -- COMMAND [ARGS...]
       allot submit [flags] SCRIPT [ARGS...]      (a Slurm batch script: its #SBATCH lines are read; - reads it from stdin)
       allot submit [flags] --wrap "COMMAND LINE"  (run by /bin/sh -c, as sbatch --wrap)

  e.g. allot submit --team nlp --tier 3 --gpus 8 --time 4h -- python train.py
       allot submit job.sh          (#SBATCH --account=nlp --gres=gpu:a100:8 --time=1-00:00:00 ...)

--time takes Slurm's forms, MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
(a bare number is MINUTES, as in Slurm: --time 240 is 4 hours), or 4h, 90m, 1h30m, 2d.
Flags on the command line win over ALLOT_* variables, which win over #SBATCH lines.

`

func cmdSubmit(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, submitUsage)
		fs.PrintDefaults()
	}
	newClient := clientFlags(fs)
	team := fs.String("team", "", "team to submit for (required; sbatch: --account, -A)")
	tier := fs.String("tier", "3", "tier: 1, 2, 3, 4 or preemptible (sbatch: --qos, -q, --partition, -p)")
	gpus := &gpusValue{n: 1}
	fs.Var(gpus, "gpus", "number of GPUs in all, N or TYPE:N (sbatch: --gpus, -G)")
	gpuType := fs.String("gpu-type", "", "GPU type, e.g. A100-80GB (default: any)")
	perNode := fs.Int("gpus-per-node", 0, "GPUs per node for multi-node jobs (default: scheduler decides)")
	limit := fs.String("time", "", "time limit: MINUTES, HH:MM:SS, D-HH:MM:SS or 4h, 90m, 2d; a bare number is minutes, as in Slurm (required; sbatch: --time, -t)")
	name := fs.String("name", "", "job name (default: the script's file name, or from the command; sbatch: --job-name, -J)")
	workdir := fs.String("workdir", "", "absolute working directory on the node (sbatch: --chdir, -D)")
	preemptible := fs.Bool("preemptible", false, "run as preemptible (idle GPUs only, 70 % cheaper)")
	checkpointable := fs.Bool("checkpointable", false, "the job checkpoints to ALLOT_CHECKPOINT_DIR and can resume (sbatch: --requeue)")
	asJSON := fs.Bool("json", false, "print the job as JSON")
	parsable := fs.Bool("parsable", false, "print only the job's id, as sbatch --parsable")
	wrap := fs.String("wrap", "", "a command line to run with /bin/sh -c, as sbatch --wrap")
	env := envFlag{}
	fs.Var(env, "env", "KEY=value environment variable (repeatable; the submitter, the team's leads and admins see the values; sbatch: --export)")
	secretEnv := secretEnvFlag{}
	fs.Var(secretEnv, "secret-env", "KEY=value, or KEY to take the value from $KEY (keeps it out of ps): secret environment variable (repeatable; passed to the job, never shown again)")
	image := fs.String("image", "", "OCI image to run the command in, e.g. nvcr.io/nvidia/pytorch:24.05-py3 (default: on the node's host; sbatch: --container-image)")
	memory := fs.String("memory", "", "memory per node, e.g. 64GiB or 512MiB (default: the node's; sbatch: --mem)")
	cpus := fs.String("cpus", "", "CPUs per node, e.g. 8 or 0.5 (default: the node's; sbatch: --cpus-per-task)")
	// sbatch's own spellings, read like #SBATCH lines but winning over them.
	var cmdline []directive
	var cmdlineFlag []string // the flag each came from
	for _, o := range sbatchOpts {
		if o.act != actHonour {
			continue
		}
		names := append([]string{o.long}, o.alias...)
		if o.short != 0 && fs.Lookup(string(o.short)) == nil {
			names = append(names, string(o.short))
		}
		for _, n := range names {
			if fs.Lookup(n) != nil {
				continue // Allot's own flag of that name
			}
			o, written := lookupSbatch(o.long, false), "--"+n
			if len(n) == 1 {
				written = "-" + n
			}
			usage := "sbatch's " + written + ": " + o.note
			if o.arg == argNone {
				fs.BoolFunc(n, usage, func(string) error {
					cmdline, cmdlineFlag = append(cmdline, directive{opt: o, written: written}), append(cmdlineFlag, n)
					return nil
				})
				continue
			}
			fs.Func(n, usage, func(v string) error {
				cmdline, cmdlineFlag = append(cmdline, directive{opt: o, written: written, value: v}), append(cmdlineFlag, n)
				return nil
			})
		}
	}
	fromEnv, err := cliflag.ParseEnv(fs, args)
	if err != nil {
		return 2
	}
	for i, n := range cmdlineFlag {
		if v, ok := fromEnv[n]; ok {
			cmdline[i].line, cmdline[i].env = -1, v
		}
	}
	// given: the rank of each Allot flag set, as directive.rank: 2 on the
	// command line, 1 from the environment.
	given := map[string]int{}
	fs.Visit(func(f *flag.Flag) {
		given[f.Name] = 2
		if _, ok := fromEnv[f.Name]; ok {
			given[f.Name] = 1
		}
	})

	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "allot submit: "+format+"\n", a...)
		return 2
	}

	// What to run: -- COMMAND, a batch script, or --wrap.
	dashdash := fs.NArg() > 0 && len(args) > fs.NArg() && args[len(args)-fs.NArg()-1] == "--"
	var command []string
	var script *batchScript
	defaultName := ""
	switch {
	case *wrap != "" && fs.NArg() > 0:
		return fail("--wrap and %s: give one", map[bool]string{true: "a command after --", false: "a script"}[dashdash])
	case *wrap != "":
		command, defaultName = []string{"/bin/sh", "-c", *wrap}, "wrap"
	case dashdash:
		command = fs.Args()
	case fs.NArg() > 0:
		path := fs.Arg(0)
		var content []byte
		var err error
		if path == "-" {
			content, err = io.ReadAll(io.LimitReader(submitStdin, 4<<20))
			path = "stdin"
		} else {
			content, err = os.ReadFile(path)
		}
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fail("%s: no such batch script (to run a program, put it after --: allot submit [flags] -- %s)", path, strings.Join(fs.Args(), " "))
			}
			return fail("%v", err)
		}
		s, err := parseBatchScript(string(content))
		if err != nil {
			return fail("%s: %v", path, err)
		}
		script, defaultName = &s, filepath.Base(path)
		if command, err = batchCommand(s.interpreter, string(content), defaultName, fs.Args()[1:]); err != nil {
			return fail("%s: %v", path, err)
		}
	}

	var ds []directive
	if script != nil {
		ds = append(ds, script.directives...)
		for _, w := range script.warnings {
			fmt.Fprintf(stderr, "allot submit: warning: %s\n", w)
		}
	}
	ds = append(ds, cmdline...)
	cwd, _ := os.Getwd()
	bj, warns, err := applyDirectives(ds, os.LookupEnv, cwd)
	if err != nil {
		return fail("%v", err)
	}
	for _, w := range warns {
		fmt.Fprintf(stderr, "allot submit: warning: %s\n", w)
	}

	// Precedence: the command line, then ALLOT_* variables, then #SBATCH
	// lines; Allot's flag wins over the sbatch option from the same place.
	// wins says whether Allot's flag wins over sbatch option key: it is
	// set, from a place as high as the option's, or higher.
	wins := func(flagName, key string) bool {
		r, ok := given[flagName]
		return ok && r >= bj.rankOf(key)
	}
	pick := func(flagName, flagValue, key, fromDirective string) string {
		if fromDirective == "" || wins(flagName, key) {
			return flagValue
		}
		return fromDirective
	}
	req := web.JobRequest{Name: pick("name", *name, "job-name", bj.name), Team: pick("team", *team, "account", bj.team),
		WorkDir: pick("workdir", *workdir, "chdir", bj.workdir), Preemptible: *preemptible, Checkpointable: *checkpointable}
	if req.Name == "" {
		req.Name = defaultName
	}
	if bj.requeue != nil && !wins("checkpointable", "requeue") {
		req.Checkpointable = *bj.requeue
	}
	n, pn := gpus.n, *perNode
	if bj.gpus > 0 && !wins("gpus", "gpus") {
		n = bj.gpus
	}
	// The GPU type from the highest place: --gpu-type, --gpus TYPE:N, the
	// directives (--gres=gpu:TYPE:N ...).
	typ, typRank := bj.gpuType, bj.rankOf("gpus")
	if gpus.typ != "" && given["gpus"] >= typRank {
		typ, typRank = gpus.typ, given["gpus"]
	}
	if *gpuType != "" && given["gpu-type"] >= typRank {
		typ = *gpuType
	}
	if bj.gpusPerNode > 0 && !wins("gpus-per-node", "gpus") && n%bj.gpusPerNode == 0 {
		pn = bj.gpusPerNode
	}
	req.GPUs, req.GPUType, req.GPUsPerNode = &n, typ, pn

	var problems []string
	if req.Team == "" {
		problems = append(problems, "--team is required (or #SBATCH --account)")
	}
	timeLimit := pick("time", *limit, "time", bj.timeLimit)
	timeFlag := "--time"
	if fromEnv["time"] != "" {
		timeFlag = "$" + fromEnv["time"]
	}
	if bj.timeLimit != "" && !wins("time", "time") {
		timeFlag = "#SBATCH --time"
		for _, d := range ds {
			if d.opt.long == "time" {
				timeFlag = d.where()
			}
		}
	}
	if timeLimit == "" {
		problems = append(problems, "--time is required (e.g. --time 4h, --time 2-00:00:00, or #SBATCH --time)")
	} else if d, err := cliflag.ParseTimeLimit(timeLimit); err != nil {
		problems = append(problems, timeFlag+": "+err.Error())
	} else {
		secs := int64(d / time.Second)
		req.TimeLimitS = &secs
	}
	if len(command) == 0 {
		problems = append(problems, "the command is missing: put it after --, e.g. -- python train.py; or give a batch script (allot submit job.sh) or --wrap \"COMMAND\"")
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "allot submit: %s\n", p)
		}
		return 2
	}
	req.Command = command
	for _, k := range bj.envOrder {
		if _, ok := env[k]; !ok {
			env[k] = bj.env[k]
		}
	}
	if len(env) > 0 {
		req.Env = env
	}
	if len(secretEnv) > 0 {
		req.SecretEnv = secretEnv
	}
	// Memory and CPUs go as typed: the server parses them (one rule set).
	req.Image, req.Memory = pick("image", *image, "container-image", bj.image), pick("memory", *memory, "mem", bj.memory)
	if c := pick("cpus", *cpus, "cpus-per-task", bj.cpus); c != "" {
		req.CPUs, _ = json.Marshal(c)
	}

	c := newClient()
	ctx := context.Background()
	tierValue := *tier
	if !wins("tier", "qos") || !wins("tier", "partition") {
		if bj.qos != "" && wins("tier", "qos") {
			bj.qos = ""
		}
		if bj.partition != "" && wins("tier", "partition") {
			bj.partition = ""
		}
		if bj.qos != "" || bj.partition != "" {
			tiers, err := lazyTiers(ctx, c, bj.qos, bj.partition)
			if err != nil {
				return reportErr(stderr, "submit", err)
			}
			if id, ok := resolveTier(bj.qos, tiers); bj.qos != "" && ok {
				tierValue = id
			} else if bj.qos != "" {
				return fail("%s: no such tier; the tiers are %s", bj.qosAt, tierNames(tiers))
			} else if id, ok := resolveTier(bj.partition, tiers); ok {
				tierValue = id
			} else {
				fmt.Fprintf(stderr, "allot submit: warning: %s ignored: it names no tier (the tiers are %s); the job is tier %s\n", bj.partitionAt, tierNames(tiers), tierValue)
			}
		}
	}
	req.Tier, _ = json.Marshal(tierValue)
	if req.GPUType != "" && req.GPUType != *gpuType {
		types, err := c.GPUTypes(ctx)
		if err != nil {
			return reportErr(stderr, "submit", err)
		}
		req.GPUType = resolveGPUType(req.GPUType, types)
	}

	j, err := c.Submit(ctx, req)
	if err != nil {
		return reportErr(stderr, "submit", err)
	}
	switch {
	case *parsable || bj.parsable:
		fmt.Fprintln(stdout, j.ID)
		return 0
	case *asJSON:
		return printJSON(stdout, j)
	}
	fmt.Fprintf(stdout, "submitted job %d (%s): %d GPUs, tier %s, state %s\n", j.ID, j.Name, j.GPUs, j.Tier, j.State)
	if j.RunAsUser != "" {
		fmt.Fprintf(stdout, "runs as %s\n", j.RunAsUser)
	}
	if j.QuotaWarning != "" {
		fmt.Fprintf(stdout, "warning: %s\n", j.QuotaWarning)
	}
	return 0
}

// lazyTiers fetches the tiers only when a name is not a tier id already.
func lazyTiers(ctx context.Context, c *client.Client, names ...string) ([]store.TierValues, error) {
	for _, n := range names {
		if n == "" {
			continue
		}
		if _, ok := resolveTier(n, nil); !ok {
			return c.Tiers(ctx)
		}
	}
	return nil, nil
}

func normName(s string) string {
	return strings.ToLower(strings.NewReplacer(" ", "", "-", "", "_", "", ".", "").Replace(strings.TrimSpace(s)))
}

// resolveTier maps a --qos or --partition value to a tier id: the id in
// any spelling ParseTier takes ("3", "tier3", "Tier 3", "tier-3",
// "preemptible"), optionally prefixed "allot" ("allot-tier3"), or a
// tier's name ("Experiment", "scheduled-production"), case and separators
// aside.
func resolveTier(v string, tiers []store.TierValues) (string, bool) {
	n := strings.TrimPrefix(normName(v), "allot")
	if n == "" {
		return "", false
	}
	if t, ok := allot.ParseTier(n); ok {
		return string(t), true
	}
	for _, t := range tiers {
		if normName(t.Name) == n || normName(t.ID) == n {
			return t.ID, true
		}
	}
	return "", false
}

func tierNames(tiers []store.TierValues) string {
	var out []string
	for _, t := range tiers {
		out = append(out, fmt.Sprintf("%s (%s)", t.ID, t.Name))
	}
	return strings.Join(out, ", ")
}

// resolveGPUType maps a Slurm GRES type ("a100") to one of the server's
// GPU types: the same name in any case, else the one type whose name
// starts with it (separators aside). Anything else goes as written, for
// the server to refuse with the list.
func resolveGPUType(v string, types []web.GPUTypeJSON) string {
	var prefix []string
	for _, t := range types {
		if t.Retired {
			continue
		}
		if strings.EqualFold(t.Name, v) {
			return t.Name
		}
		if strings.HasPrefix(normName(t.Name), normName(v)) {
			prefix = append(prefix, t.Name)
		}
	}
	if len(prefix) == 1 {
		return prefix[0]
	}
	return v
}

// batchCommand is the job's command for a batch script: /bin/sh writes
// the script to a file in the job's own $TMPDIR (mode 0600) and execs its
// shebang's interpreter on it with the script's arguments, so the node
// does not need the file and the script gets the signals. name is $0 of
// that sh. The whole must fit the server's command limit.
func batchCommand(interpreter []string, content, name string, args []string) ([]string, error) {
	if strings.ContainsRune(content, 0) {
		return nil, errors.New("the script contains NUL bytes")
	}
	if !strings.HasSuffix(content, "\n") {
		content += "\n"
	}
	delim := "ALLOT_BATCH_SCRIPT_END"
	for i := 1; strings.Contains(content, delim); i++ {
		delim = fmt.Sprintf("ALLOT_BATCH_SCRIPT_END_%d", i)
	}
	quoted := make([]string, len(interpreter))
	for i, w := range interpreter {
		quoted[i] = shellQuote(w)
	}
	wrapper := "set -eC; umask 077\n" +
		"f=\"${TMPDIR:-/tmp}/allot-batch-$$\"\n" +
		"cat > \"$f\" <<'" + delim + "'\n" + content + delim + "\n" +
		"exec " + strings.Join(quoted, " ") + " \"$f\" \"$@\"\n"
	cmd := append([]string{"/bin/sh", "-c", wrapper, name}, args...)
	size := 0
	for _, a := range cmd {
		size += len(a)
	}
	if size > allot.MaxCommandBytes || len(cmd) > allot.MaxCommandArgs {
		return nil, fmt.Errorf("the script and its arguments are too long to send with the job: %d bytes and %d arguments, and a job's command takes at most %d bytes (%d KiB, with about %d bytes of Allot's wrapper) and %d arguments; keep the long part in a file the nodes can read and call it from a shorter script",
			size, len(cmd), allot.MaxCommandBytes, allot.MaxCommandBytes>>10, len(wrapper)-len(content), allot.MaxCommandArgs)
	}
	return cmd, nil
}
