package slurmtest

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// usersDir holds, per throw-away account, a marker that slurmtest created it
// and one holder file per process using it; it is shared by every test binary
// on the host (flock on usersDir/lock).
const usersDir = "/tmp/allot-slurmtest-users"

// EnsureUser makes sure the POSIX account name exists for the test: an
// existing account is used as it is and never removed; a missing one is
// created (useradd -m) and removed again (userdel -r) when the last test
// process using it is done, so parallel test binaries can share it.
func EnsureUser(t testing.TB, name string) {
	t.Helper()
	if err := acquireUser(name); err != nil {
		t.Fatalf("slurmtest.EnsureUser(%s): %v", name, err)
	}
	t.Cleanup(func() {
		if err := releaseUser(name); err != nil {
			t.Errorf("slurmtest: releasing account %s: %v", name, err)
		}
	})
}

func holderFile(name string) string {
	return filepath.Join(usersDir, fmt.Sprintf("%s.holder.%d", name, os.Getpid()))
}

func withUsersLock(f func() error) error {
	if err := os.MkdirAll(usersDir, 0o700); err != nil {
		return err
	}
	l, err := os.OpenFile(filepath.Join(usersDir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer l.Close()
	if err := syscall.Flock(int(l.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(l.Fd()), syscall.LOCK_UN)
	return f()
}

func acquireUser(name string) error {
	return withUsersLock(func() error {
		hf := holderFile(name)
		n := 0
		if b, err := os.ReadFile(hf); err == nil {
			n, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if _, err := user.Lookup(name); err != nil {
			out, err := exec.Command("useradd", "-m", "-s", "/bin/sh", "-c", "slurmtest throw-away account", name).CombinedOutput()
			if err != nil {
				return fmt.Errorf("useradd: %v: %s", err, out)
			}
			if err := os.WriteFile(filepath.Join(usersDir, name+".created"), nil, 0o600); err != nil {
				return err
			}
		}
		return os.WriteFile(hf, []byte(strconv.Itoa(n+1)), 0o600)
	})
}

func releaseUser(name string) error {
	return withUsersLock(func() error {
		hf := holderFile(name)
		n := 0
		if b, err := os.ReadFile(hf); err == nil {
			n, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if n > 1 {
			return os.WriteFile(hf, []byte(strconv.Itoa(n-1)), 0o600)
		}
		os.Remove(hf)
		// Other holders (other test binaries still alive)?
		m, _ := filepath.Glob(filepath.Join(usersDir, name+".holder.*"))
		for _, f := range m {
			pid, err := strconv.Atoi(f[strings.LastIndexByte(f, '.')+1:])
			if err == nil && syscall.Kill(pid, 0) == nil {
				return nil
			}
			os.Remove(f) // a dead process's
		}
		marker := filepath.Join(usersDir, name+".created")
		if _, err := os.Stat(marker); err != nil {
			return nil // not ours: leave it
		}
		if out, err := exec.Command("userdel", "-r", name).CombinedOutput(); err != nil {
			// exit 12: the home or mail spool was already gone; the account is removed.
			if _, lerr := user.Lookup(name); lerr == nil {
				return fmt.Errorf("userdel -r: %v: %s", err, out)
			}
		}
		return os.Remove(marker)
	})
}
