// Command allot is the single Allot binary: portal server, worker, node
// agent, CLI and trace simulator, chosen by subcommand.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/allotlabs/allot/internal/scheduler/sim"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: allot <command> [flags]

commands:
  sim       replay a job trace through the scheduler and baselines
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "sim":
		return sim.Main(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "allot: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}
