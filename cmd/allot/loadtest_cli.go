package main

import (
	"fmt"
	"io"
)

// cmdLoadtest is `allot loadtest`.
func cmdLoadtest(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "allot loadtest: not built yet")
	return 2
}
