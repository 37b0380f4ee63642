package agent

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"time"
)

// EnsureAccount creates the system account name (useradd, as root: no
// home, no login shell, its own group) unless it exists. It reports
// whether it created it. allot dev uses it for its demo account; tests for
// theirs.
func EnsureAccount(name string) (bool, error) {
	if _, err := user.Lookup(name); err == nil {
		return false, nil
	}
	err := retryPasswd(func() error {
		return runQuiet("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "--user-group", name)
	})
	if err != nil {
		if _, lerr := user.Lookup(name); lerr == nil {
			return false, nil // another process made it meanwhile: it is theirs
		}
	}
	return err == nil, err
}

// RemoveAccount deletes an account EnsureAccount created.
func RemoveAccount(name string) error {
	return retryPasswd(func() error { return runQuiet("userdel", name) })
}

func runQuiet(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// retryPasswd retries while /etc/passwd is locked by another useradd.
func retryPasswd(f func() error) error {
	var err error
	for range 50 {
		if err = f(); err == nil || !strings.Contains(err.Error(), "lock") {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// TempDirOutsideTmp points TMPDIR (and so os.TempDir and t.TempDir) at a
// new directory under /var/tmp and returns what restores TMPDIR and
// removes it. Host jobs get their own /tmp, so the directories a test's
// jobs write to must lie elsewhere.
func TempDirOutsideTmp() func() {
	d, err := os.MkdirTemp("/var/tmp", "allot-test-")
	if err != nil {
		return func() {}
	}
	_ = os.Chmod(d, 0o755)
	old, had := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", d)
	return func() {
		if had {
			os.Setenv("TMPDIR", old)
		} else {
			os.Unsetenv("TMPDIR")
		}
		_ = os.RemoveAll(d)
	}
}
