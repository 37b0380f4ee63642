package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// EnvPrefix starts every variable Parse reads.
const EnvPrefix = "ALLOT_"

// Reserved are ALLOT_ variables that mean something else and are never
// read as a flag's value: the ones Allot sets in a job's environment (so
// that `allot submit` inside a job does not take the job's team or tier
// for its own), the clock's, the node agent's token, the demo personas'
// tokens, and the test harness's (any ALLOT_TEST_ or ALLOT_BENCH_ name).
var Reserved = []string{
	"ALLOT_JOB_ID", "ALLOT_JOB_NAME", "ALLOT_TEAM", "ALLOT_TIER", "ALLOT_SEGMENT", "ALLOT_NNODES",
	"ALLOT_CHECKPOINT_DIR", "ALLOT_GPU_DEVICES", "ALLOT_CLOCK_OFFSET", "ALLOT_CLOCK_CHILD", "ALLOT_NOW",
	"ALLOT_NODE_TOKEN", "ALLOT_KEEP_LEASE_DIRS",
	// allot dev's .allot/tokens.env: the demo personas' API tokens.
	"ALLOT_TOKEN_ENGINEER", "ALLOT_TOKEN_LEAD", "ALLOT_TOKEN_FINANCE", "ALLOT_TOKEN_ADMIN",
}

// IsReserved reports whether name is never read as a flag's value.
func IsReserved(name string) bool {
	return slices.Contains(Reserved, name) || strings.HasPrefix(name, "ALLOT_TEST_") || strings.HasPrefix(name, "ALLOT_BENCH_")
}

// CommandName is the command part of fs's name: "token create" for a set
// named "allot token create" or "token create".
func CommandName(fs *flag.FlagSet) string {
	return strings.TrimPrefix(fs.Name(), "allot ")
}

func envWord(s string) string {
	return strings.ToUpper(strings.NewReplacer("-", "_", " ", "_", ".", "_").Replace(s))
}

func readsEnv(name string) bool { return len(name) > 1 && name == strings.ToLower(name) }

// EnvName is the variable of flag name of command cmd, reserved or not:
// ALLOT_<CMD>_<FLAG>, or ALLOT_<FLAG> for cmd "".
func EnvName(cmd, name string) string {
	if cmd == "" {
		return EnvPrefix + envWord(name)
	}
	return EnvPrefix + envWord(cmd) + "_" + envWord(name)
}

// Shared are the flags that mean the same to every command that has
// them, and so also read ALLOT_<FLAG>: where the server is, who you are,
// which database. Every other flag reads only its command's variable, as
// Slurm's SBATCH_ACCOUNT and SQUEUE_ACCOUNT are two variables: --name,
// --state, --yes or --requeue mean different things to different
// commands.
var Shared = []string{"server", "token", "database-url", "log-level"}

// EnvNames are the variables that may give flag name of command cmd its
// value, the first set one winning: ALLOT_<COMMAND>_<FLAG>, then, for the
// Shared flags, ALLOT_<FLAG>. Dashes and spaces become underscores: --gpu-type
// of `allot submit` reads ALLOT_SUBMIT_GPU_TYPE, --name of `allot token
// create` ALLOT_TOKEN_CREATE_NAME, --server of any command
// ALLOT_<COMMAND>_SERVER, then ALLOT_SERVER. Reserved names are left out,
// and one-letter flags (short aliases such as -J) read none: their long
// forms do; so do flags with capitals (squeue's -O/--Format next to
// -o/--format), which would share the variable of their lower-case twin.
func EnvNames(cmd, name string) []string {
	var out []string
	if !readsEnv(name) {
		return nil
	}
	names := []string{EnvName(cmd, name)}
	if slices.Contains(Shared, name) {
		names = append(names, EnvName("", name))
	}
	for _, n := range names {
		if !IsReserved(n) {
			out = append(out, n)
		}
	}
	return out
}

// ErrEnv is wrapped by Parse's error for a variable with a bad value.
var ErrEnv = errors.New("bad environment variable")

// Parse parses args into fs like fs.Parse, then gives each flag that the
// command line did not set the value of its environment variable
// (EnvNames), if one is set and not empty. The command line wins over the
// environment, the environment over the flag's default (which may itself
// come from an older variable such as ALLOT_URL). A variable with a bad
// value is an error that names it, printed to fs.Output() like a bad flag.
// Repeatable flags take one value from their variable.
func Parse(fs *flag.FlagSet, args []string) error {
	_, err := ParseEnv(fs, args)
	return err
}

// ParseEnv is Parse, and also says which flags took their value from the
// environment: flag name → variable.
func ParseEnv(fs *flag.FlagSet, args []string) (map[string]string, error) {
	if len(args) == 2 && args[0] == "-h" && strings.HasPrefix(args[1], recordPrefix) {
		recorded.Store(args[1], fs)
		return nil, flag.ErrHelp
	}
	cmd := CommandName(fs)
	usage := fs.Usage
	fs.Usage = func() {
		if usage != nil {
			usage()
		} else {
			fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
		fmt.Fprintf(fs.Output(), "\nEvery flag can also be set in the environment as %s%s_<FLAG> (e.g. --%s: %s),\n"+
			"--server and --token also as ALLOT_SERVER and ALLOT_TOKEN. The command line wins. 'allot help env' lists them all.\n",
			EnvPrefix, envWord(cmd), exampleFlag(fs), EnvName(cmd, exampleFlag(fs)))
	}
	defer func() { fs.Usage = usage }()
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	fromEnv := map[string]string{}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		for _, env := range EnvNames(cmd, f.Name) {
			v, ok := os.LookupEnv(env)
			if !ok || v == "" {
				continue
			}
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%w: $%s=%q for --%s: %v", ErrEnv, env, v, f.Name, e)
				if isSecret(f) || sensitive.MatchString(f.Name) {
					err = fmt.Errorf("%w: $%s for --%s: %v", ErrEnv, env, f.Name, e)
				}
				fmt.Fprintln(fs.Output(), err)
			}
			fromEnv[f.Name] = env
			return
		}
	})
	return fromEnv, err
}

// sensitive flag names: a bad value of theirs is not repeated.
var sensitive = regexp.MustCompile(`(?i)secret|token|password|key|database-url`)

func isSecret(f *flag.Flag) bool {
	_, ok := f.Value.(*secret)
	return ok
}

func exampleFlag(fs *flag.FlagSet) string {
	name := ""
	fs.VisitAll(func(f *flag.Flag) {
		if name == "" && f.Name != "server" && f.Name != "token" && len(f.Name) > 1 {
			name = f.Name
		}
	})
	if name == "" {
		name = "server"
	}
	return name
}

const recordPrefix = "\x00cliflag-record-"

var (
	recorded  sync.Map // key → *flag.FlagSet
	recordSeq atomic.Int64
)

// Record calls run with an argument list that makes Parse, wherever run
// reaches it, record its flag set and return flag.ErrHelp at once, and
// returns that flag set (nil if run never reached Parse). It lets `allot
// help env` list every command's flags without running anything; other
// goroutines' Parse calls are not affected. The arguments start with -h,
// so that a command that parses with the flag package's own Parse stops
// there too (it prints its help) instead of running.
func Record(run func(args []string)) *flag.FlagSet {
	key := fmt.Sprintf("%s%d", recordPrefix, recordSeq.Add(1))
	run([]string{"-h", key})
	v, ok := recorded.LoadAndDelete(key)
	if !ok {
		return nil
	}
	return v.(*flag.FlagSet)
}

// EnvTable is the Markdown table of the variables of the flag sets: a
// row for the Shared flags, one per command with its variables, and one
// for the older variables flags take their default from ("(default: env
// DATABASE_URL)").
func EnvTable(sets []*flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| Command | Variables |\n|---|---|\n")
	code := func(s []string) string {
		for i, v := range s {
			s[i] = "`" + v + "`"
		}
		return strings.Join(s, ", ")
	}
	shared := map[string]bool{}
	older := map[string][]string{} // variable → the flags it is the default of
	var rows []string
	for _, fs := range sets {
		cmd := CommandName(fs)
		var vars []string
		fs.VisitAll(func(f *flag.Flag) {
			names := EnvNames(cmd, f.Name)
			if len(names) == 0 {
				return
			}
			vars = append(vars, names[0])
			if len(names) > 1 {
				shared[names[1]] = true
			}
			for _, m := range envInUsage.FindAllStringSubmatch(f.Usage, -1) {
				if !IsReserved(m[1]) && !slices.Contains(names, m[1]) && !slices.Contains(older[m[1]], "--"+f.Name) {
					older[m[1]] = append(older[m[1]], "--"+f.Name)
				}
			}
		})
		if len(vars) > 0 {
			rows = append(rows, fmt.Sprintf("| `allot %s` | %s |\n", cmd, code(vars)))
		}
	}
	sort.Strings(rows)
	var sh []string
	for v := range shared {
		sh = append(sh, v)
	}
	sort.Strings(sh)
	fmt.Fprintf(&b, "| every command with the flag | %s |\n", code(sh))
	for _, r := range rows {
		b.WriteString(r)
	}
	var old []string
	for v, flags := range older {
		sort.Strings(flags)
		old = append(old, fmt.Sprintf("`%s` (%s)", v, strings.Join(flags, ", ")))
	}
	sort.Strings(old)
	if len(old) > 0 {
		fmt.Fprintf(&b, "| older variables, read as a flag's default (the variables above win) | %s |\n", strings.Join(old, ", "))
	}
	return b.String()
}

var envInUsage = regexp.MustCompile(`\benv ([A-Z][A-Z0-9_]+)`)
