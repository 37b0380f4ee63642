// Package agenttest helps tests run real agents: it makes the real POSIX
// accounts jobs run as, and removes them afterwards.
package agenttest

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"time"
)

// Root reports whether the test runs as root (needed to run jobs as other
// accounts, in cgroups).
func Root() bool { return os.Geteuid() == 0 }

// EnsureAccounts creates the system accounts names that do not exist yet
// (as root; useradd) and returns a function that removes those it created.
// Packages testing in parallel must use different names.
func EnsureAccounts(names ...string) (cleanup func(), err error) {
	var made []string
	cleanup = func() {
		for _, n := range made {
			retry(func() error { return run("userdel", n) })
		}
	}
	if !Root() {
		return cleanup, nil
	}
	for _, n := range names {
		if _, err := user.Lookup(n); err == nil {
			continue
		}
		if err := retry(func() error {
			return run("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "--user-group", n)
		}); err != nil {
			cleanup()
			return func() {}, err
		}
		made = append(made, n)
	}
	return cleanup, nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// retry retries while /etc/passwd is locked by another package's useradd.
func retry(f func() error) error {
	var err error
	for range 50 {
		if err = f(); err == nil || !strings.Contains(err.Error(), "lock") {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
