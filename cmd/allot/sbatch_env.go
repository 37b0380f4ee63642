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
const envHelpIntro = `Every flag of the commands below can also be set in the environment (cliflag.Parse):
ALLOT_<COMMAND>_<FLAG> for one command (ALLOT_SUBMIT_GPU_TYPE, ALLOT_TOKEN_CREATE_NAME), which wins
over ALLOT_<FLAG> for every command with that flag (ALLOT_GPU_TYPE). Dashes become underscores. The
command line wins over both; an empty variable is unset; a bad value is an error that names the
variable. Variables Allot sets inside jobs (ALLOT_TEAM, ALLOT_TIER, ALLOT_JOB_ID, ...), the clock's
and the agent's (ALLOT_NODE_TOKEN) are never read as flags: their flags have only the per-command
form. One-letter aliases (-J, -A, -t) read none; their long forms do. Repeatable flags (--env)
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
	return cliflag.Markdown(cliflag.EnvTable(envFlagSets()))
}

func cmdHelpEnv(stdout io.Writer) int {
	fmt.Fprint(stdout, envHelpIntro)
	fmt.Fprint(stdout, strings.TrimRight(envTableMarkdown(), "\n")+"\n")
	return 0
}
