// Package agenttest helps tests run real agents: it makes the real POSIX
// accounts jobs run as, and removes them afterwards.
package agenttest

import (
	"os"

	"github.com/allotlabs/allot/internal/agent"
)

// Root reports whether the test runs as root (needed to run jobs as other
// accounts, in cgroups).
func Root() bool { return os.Geteuid() == 0 }

// EnsureAccounts creates the system accounts names that do not exist yet
// (as root) and returns a function that removes those it created. Packages
// testing in parallel must use different names.
func EnsureAccounts(names ...string) (cleanup func(), err error) {
	var made []string
	cleanup = func() {
		for _, n := range made {
			_ = agent.RemoveAccount(n)
		}
	}
	if !Root() {
		return cleanup, nil
	}
	for _, n := range names {
		created, err := agent.EnsureAccount(n)
		if err != nil {
			cleanup()
			return func() {}, err
		}
		if created {
			made = append(made, n)
		}
	}
	return cleanup, nil
}

// TempDirOutsideTmp points TMPDIR (and so t.TempDir) at a directory of this
// run under /var/tmp, and returns what removes it: jobs get their own
// /tmp, so a test's directories that its jobs write to must be elsewhere.
func TempDirOutsideTmp() func() { return agent.TempDirOutsideTmp() }
