// Package sim replays a GPU-cluster job trace in virtual time through the
// scheduler core, comparing Allot's policy with Slurm-style baselines.
package sim

import (
	"fmt"
	"io"
)

// Main runs `allot sim` with args (without the subcommand name) and returns
// the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "allot sim: not implemented yet")
	return 2
}
