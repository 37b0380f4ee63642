package demo

import (
	"slices"
	"strings"
)

// Accounts are the POSIX accounts the demo's jobs run as: each team's
// people (their first names) and each team's service account. allot dev,
// as root, creates those a machine lacks, so the demo's jobs run as their
// submitters on its agents.
func Accounts() []string {
	var out []string
	for _, who := range people {
		if who.team != "" {
			out = append(out, strings.ToLower(strings.Fields(who.name)[0]))
		}
	}
	for _, t := range Teams {
		if t.PosixAccount != "" {
			out = append(out, t.PosixAccount)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
