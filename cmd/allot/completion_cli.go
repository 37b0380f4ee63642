package main

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// Shell completion. `allot completion bash|zsh|fish` prints a script that
// asks the binary itself what fits: `allot __complete WORD...` (the words
// after "allot", the last one being completed) prints one candidate a line.
// Nothing is kept by hand: the commands and their subcommands come from the
// usage text, each command's flags from its own flag set (what its -h
// prints), so a flag added to a command completes without touching this
// file.

// completeCommand is the hidden command the scripts call.
const completeCommand = "__complete"

var (
	usageCommandRE = regexp.MustCompile(`(?m)^  ([a-z][a-z0-9-]*)\s+\S`)
	subcommandRE   = regexp.MustCompile(`^[a-z][a-z-]*$`)
	flagLineRE     = regexp.MustCompile(`^\s+-([A-Za-z][\w-]*)(?:\s+(\S+))?`)
	usageFlagRE    = regexp.MustCompile(`(?:^|[\s\[(])--([a-z][\w-]*)(?:[ =]([A-Z][A-Z_]*\b|"))?`)
)

// usageCommands lists the commands of the usage text, in its order.
func usageCommands() []string {
	var out []string
	for _, m := range usageCommandRE.FindAllStringSubmatch(usage, -1) {
		out = append(out, m[1])
	}
	return out
}

// subcommands are cmd's subcommands as its usage line shows them
// ("allot token create … | list | revoke ID").
func subcommands(cmd string) []string {
	for _, line := range strings.Split(usage, "\n") {
		if m := usageCommandRE.FindStringSubmatch(line); m == nil || m[1] != cmd {
			continue
		}
		_, rest, ok := strings.Cut(line, "allot "+cmd+" ")
		if !ok {
			return nil
		}
		var out []string
		for _, piece := range strings.Split(rest, " | ") {
			w := strings.TrimRight(strings.Fields(piece + " x")[0], ":,;)")
			if subcommandRE.MatchString(w) && !contains(out, w) {
				out = append(out, w)
			}
		}
		return out
	}
	return nil
}

// commandFlags runs `allot CMD [SUB] -h` in-process and reads the flags
// its flag set prints (flag.PrintDefaults): name → whether it takes a
// value. (Not cliflag.Record: a command that does not parse with
// cliflag.Parse, or a subcommand that takes a name first, would run.)
func commandFlags(cmdline ...string) map[string]bool {
	var out, errb bytes.Buffer
	func() {
		defer func() { _ = recover() }() // a command that cannot build its flags completes none
		run(append(append([]string{}, cmdline...), "-h"), &out, &errb)
	}()
	text := out.String() + "\n" + errb.String()
	flags := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		m := flagLineRE.FindStringSubmatch(line)
		if m == nil || m[1] == "h" || m[1] == "help" {
			continue
		}
		// PrintDefaults puts a flag's value name after it ("-team team");
		// a bool flag has none.
		flags[m[1]] = m[2] != ""
	}
	if len(flags) == 0 {
		// A hand-written usage ("flags: --server URL --token T"): its
		// --names, taking a value when an upper-case word follows.
		for _, m := range usageFlagRE.FindAllStringSubmatch(text, -1) {
			flags[m[1]] = flags[m[1]] || m[2] != ""
		}
	}
	return flags
}

func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// flagValues are the candidates for some flags' values.
var flagValues = map[string][]string{
	"state": {"PD", "R", "CD", "F", "CA", "pending", "running", "completed", "failed", "cancelled", "all"},
}

// complete returns the candidates for the last of words (the words after
// "allot"), or none (the shell then completes file names).
func complete(words []string) []string {
	if len(words) == 0 {
		words = []string{""}
	}
	cur, prev := words[len(words)-1], words[:len(words)-1]
	var cands []string
	if len(prev) == 0 {
		cands = usageCommands()
	} else {
		cmd := prev[0]
		if !contains(usageCommands(), cmd) {
			return nil
		}
		subs := subcommands(cmd)
		cmdline := []string{cmd}
		if len(prev) > 1 && contains(subs, prev[1]) {
			cmdline = append(cmdline, prev[1])
		}
		flags := commandFlags(cmdline...)
		if last := prev[len(prev)-1]; len(prev) > 1 && strings.HasPrefix(last, "-") && !strings.Contains(last, "=") {
			name := strings.TrimLeft(last, "-")
			if takes, ok := flags[name]; ok && takes {
				vals := flagValues[name]
				if name == "t" || name == "states" {
					vals = flagValues["state"]
				}
				cands = vals
				return filterPrefix(cands, cur)
			}
		}
		switch {
		case strings.HasPrefix(cur, "-"):
			for name := range flags {
				cands = append(cands, dashed(name))
			}
			sort.Strings(cands)
		case len(prev) == 1 && len(subs) > 0:
			cands = subs
		}
	}
	return filterPrefix(cands, cur)
}

func filterPrefix(cands []string, prefix string) []string {
	var out []string
	for _, c := range cands {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func cmdComplete(args []string, stdout io.Writer) int {
	for _, c := range complete(args) {
		fmt.Fprintln(stdout, c)
	}
	return 0
}

const bashCompletion = `# bash completion for allot: source <(allot completion bash)
_allot() {
	local IFS=$'\n'
	COMPREPLY=($(allot ` + completeCommand + ` "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _allot allot
`

const zshCompletion = `#compdef allot
# zsh completion for allot: source <(allot completion zsh) (after compinit)
_allot() {
	local -a cands
	cands=("${(@f)$(allot ` + completeCommand + ` "${(@)words[2,CURRENT]}" 2>/dev/null)}")
	if [[ -n "${cands[1]}" ]]; then
		compadd -- "${cands[@]}"
	else
		_files
	fi
}
compdef _allot allot
`

const fishCompletion = `# fish completion for allot: allot completion fish | source
function __allot_complete
	set -l words (commandline -opc)
	set -l cur (commandline -ct)
	# "$cur": one word even when empty (a command substitution would drop it)
	set -l cands (allot ` + completeCommand + ` $words[2..-1] "$cur" 2>/dev/null)
	if test (count $cands) -gt 0
		printf '%s\n' $cands
	else
		__fish_complete_path (commandline -ct)
	end
end
complete -c allot -f -a '(__allot_complete)'
`

func cmdCompletion(args []string, stdout, stderr io.Writer) int {
	help := "usage: allot completion bash|zsh|fish\n" +
		"Prints a completion script: bash: source <(allot completion bash) (or save it in /etc/bash_completion.d/allot);\n" +
		"zsh: source <(allot completion zsh) after compinit; fish: allot completion fish > ~/.config/fish/completions/allot.fish\n"
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		fmt.Fprint(stderr, help)
		return 0
	}
	if len(args) != 1 {
		fmt.Fprint(stderr, help)
		return 2
	}
	switch args[0] {
	case "bash":
		io.WriteString(stdout, bashCompletion)
	case "zsh":
		io.WriteString(stdout, zshCompletion)
	case "fish":
		io.WriteString(stdout, fishCompletion)
	default:
		fmt.Fprintf(stderr, "allot completion: no completion for shell %q: bash, zsh or fish\n", args[0])
		return 2
	}
	return 0
}
