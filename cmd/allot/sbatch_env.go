package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/allotlabs/allot/internal/cliflag"
)

// `allot help env`: the ALLOT_* variables every command's flags read
// (cliflag.Parse), as the Markdown table the README has.

// envHelpIntro is printed before the table by `allot help env`.
const envHelpIntro = `Every flag of the commands below can also be set in the environment, like Slurm's SBATCH_* and
SQUEUE_*: ALLOT_<COMMAND>_<FLAG>, dashes and spaces as underscores (ALLOT_SUBMIT_GPU_TYPE is allot
submit --gpu-type, ALLOT_TOKEN_CREATE_NAME is allot token create --name). The flags that mean the same
everywhere (--server, --token, --database-url, --log-level) also read ALLOT_<FLAG>, after the command's
own. The command line wins; an empty variable is unset; a bad value is an error that names the variable.
Names Allot uses otherwise (ALLOT_NODE_TOKEN, the variables it sets in jobs, ALLOT_TEST_*) are never read.
One-letter aliases (-J, -A, -t) and flags with capitals (-O/--Format) read none. Repeatable flags (--env)
take one value. allot agent and allot sim read only the variables their -h names.

`

// envFlagSets records the flag set of every command in the usage text
// (and of each subcommand its usage line names), without running any.
func envFlagSets() []*flag.FlagSet {
	var sets []*flag.FlagSet
	seen := map[string]bool{}
	record := func(cmdline ...string) bool {
		var fs *flag.FlagSet
		func() {
			defer func() { _ = recover() }()
			fs = cliflag.Record(func(args []string) {
				run(append(append([]string{}, cmdline...), args...), io.Discard, io.Discard)
			})
		}()
		if fs == nil {
			return false
		}
		if !seen[fs.Name()] {
			seen[fs.Name()] = true
			sets = append(sets, fs)
		}
		return true
	}
	for _, cmd := range usageCommands() {
		if cmd == "agent" || cmd == "sim" { // their own packages' flags
			continue
		}
		subs := subcommands(cmd)
		if len(subs) == 0 {
			record(cmd)
			continue
		}
		for _, sub := range subs {
			// A subcommand that takes a name before its flags gets one.
			_ = record(cmd, sub) || record(cmd, sub, "x")
		}
	}
	return sets
}

// envTableMarkdown is the README's table of variables.
func envTableMarkdown() string {
	return cliflag.EnvTable(envFlagSets())
}

func cmdHelpEnv(stdout io.Writer) int {
	fmt.Fprint(stdout, envHelpIntro)
	fmt.Fprint(stdout, strings.TrimRight(envTableMarkdown(), "\n")+"\n")
	return 0
}

// sbatchTableMarkdown is the README's table of the sbatch options allot
// submit knows, from sbatchOpts.
func sbatchTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| sbatch option | allot submit | what it becomes, or why not |\n|---|---|---|\n")
	what := map[sbatchAct]string{actHonour: "honoured", actIgnore: "ignored, with a warning", actRefuse: "refused (exit 2)"}
	for _, act := range []sbatchAct{actHonour, actIgnore, actRefuse} {
		for _, o := range sbatchOpts {
			if o.act != act {
				continue
			}
			names := []string{"`--" + o.long + "`"}
			for _, a := range o.alias {
				names = append(names, "`--"+a+"`")
			}
			if o.short != 0 {
				names = append(names, "`-"+string(o.short)+"`")
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", strings.Join(names, ", "), what[act], strings.ReplaceAll(o.note, "|", `\|`))
		}
	}
	return b.String()
}

func cmdHelpSbatch(stdout io.Writer) int {
	fmt.Fprint(stdout, "The sbatch options allot submit reads from #SBATCH lines (and takes on its command line); any other is ignored with a warning.\n\n")
	fmt.Fprint(stdout, sbatchTableMarkdown())
	return 0
}
