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
// for its own), the clock's, the node agent's token, and the test
// harness's (any ALLOT_TEST_ or ALLOT_BENCH_ name).
var Reserved = []string{
	"ALLOT_JOB_ID", "ALLOT_JOB_NAME", "ALLOT_TEAM", "ALLOT_TIER", "ALLOT_SEGMENT", "ALLOT_NNODES",
	"ALLOT_CHECKPOINT_DIR", "ALLOT_GPU_DEVICES", "ALLOT_CLOCK_OFFSET", "ALLOT_CLOCK_CHILD", "ALLOT_NOW",
	"ALLOT_NODE_TOKEN", "ALLOT_KEEP_LEASE_DIRS",
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

// EnvNames are the variables that may give flag name of command cmd its
// value, the first set one winning: ALLOT_<COMMAND>_<FLAG> (this command
// only), then ALLOT_<FLAG> (every command with such a flag). Dashes and
// spaces become underscores: --gpu-type of `allot submit` reads
// ALLOT_SUBMIT_GPU_TYPE, then ALLOT_GPU_TYPE. Reserved names are left out,
// and one-letter flags (short aliases such as -J) read none: their long
// forms do.
func EnvNames(cmd, name string) []string {
	var out []string
	if len(name) < 2 {
		return nil
	}
	for _, n := range []string{EnvPrefix + envWord(cmd) + "_" + envWord(name), EnvPrefix + envWord(name)} {
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
	if len(args) == 1 && strings.HasPrefix(args[0], recordPrefix) {
		recorded.Store(args[0], fs)
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
		fmt.Fprintf(fs.Output(), "\nEvery flag can also be set in the environment: %s%s_<FLAG> (this command only), or %s<FLAG>;\n"+
			"e.g. --%s: %s. The command line wins. 'allot help env' lists them all.\n",
			EnvPrefix, envWord(cmd), EnvPrefix, exampleFlag(fs), strings.Join(EnvNames(cmd, exampleFlag(fs)), " or "))
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
// goroutines' Parse calls are not affected.
func Record(run func(args []string)) *flag.FlagSet {
	key := fmt.Sprintf("%s%d", recordPrefix, recordSeq.Add(1))
	run([]string{key})
	v, ok := recorded.LoadAndDelete(key)
	if !ok {
		return nil
	}
	return v.(*flag.FlagSet)
}

// EnvVar is one row of the environment table: a variable and the flag it
// sets.
type EnvVar struct {
	Name     string   // ALLOT_GPU_TYPE
	Flag     string   // gpu-type
	Commands []string // the commands whose flag it sets, sorted
	Usage    string   // the flag's usage, first clause
}

// EnvTable lists the variables of the flag sets: one row per flag name
// for ALLOT_<FLAG> (the commands that have it), and, where that name is
// reserved, one row per command for ALLOT_<COMMAND>_<FLAG>. Rows are
// sorted by variable.
func EnvTable(sets []*flag.FlagSet) []EnvVar {
	rows := map[string]*EnvVar{}
	add := func(name string, f *flag.Flag, cmd string) {
		if name == EnvPrefix+envWord(f.Name) || !strings.HasPrefix(name, EnvPrefix+envWord(cmd)+"_") {
			cmd, _, _ = strings.Cut(cmd, " ") // a shared variable lists commands, not subcommands
		}
		r := rows[name]
		if r == nil {
			r = &EnvVar{Name: name, Flag: f.Name, Usage: firstClause(f.Usage)}
			rows[name] = r
		}
		if !slices.Contains(r.Commands, cmd) {
			r.Commands = append(r.Commands, cmd)
		}
	}
	for _, fs := range sets {
		cmd := CommandName(fs)
		fs.VisitAll(func(f *flag.Flag) {
			name := EnvPrefix + envWord(f.Name)
			if len(f.Name) < 2 {
				return
			}
			if IsReserved(name) {
				name = EnvPrefix + envWord(cmd) + "_" + envWord(f.Name)
				if IsReserved(name) {
					return // the command line only
				}
			}
			add(name, f, cmd)
			// Older variables a flag takes its default from ("(default:
			// env DATABASE_URL)") are rows too.
			for _, m := range envInUsage.FindAllStringSubmatch(f.Usage, -1) {
				if !IsReserved(m[1]) {
					add(m[1], f, cmd)
				}
			}
		})
	}
	out := make([]EnvVar, 0, len(rows))
	for _, r := range rows {
		sort.Strings(r.Commands)
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

var envInUsage = regexp.MustCompile(`\benv ([A-Z][A-Z0-9_]+)`)

// firstClause is usage up to its first parenthesis, semicolon or
// sentence end, without backquotes (flag's placeholder marks): a short
// description that does not depend on the environment.
func firstClause(u string) string {
	u = strings.ReplaceAll(u, "`", "")
	u = strings.NewReplacer("e.g. ", "e.g.\x00", "i.e. ", "i.e.\x00").Replace(u)
	for _, sep := range []string{" (", "; ", ". ", "\n"} {
		if i := strings.Index(u, sep); i > 0 {
			u = u[:i]
		}
	}
	return strings.TrimSpace(strings.ReplaceAll(u, "\x00", " "))
}

// Markdown is the table as a Markdown table.
func Markdown(rows []EnvVar) string {
	var b strings.Builder
	b.WriteString("| Variable | Flag | Commands | Meaning |\n|---|---|---|---|\n")
	esc := strings.NewReplacer("|", `\|`)
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | `--%s` | %s | %s |\n", r.Name, r.Flag, esc.Replace(strings.Join(r.Commands, ", ")), esc.Replace(r.Usage))
	}
	return b.String()
}
