package agent

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// Jobs of this package's tests run as these accounts (made for the run,
// removed after it).
const (
	testUser  = "allot-ta1"
	otherUser = "allot-ta2"
)

func TestMain(m *testing.M) {
	MaybeShim() // the agents under test start this binary as their job shim
	// Jobs get their own /tmp: the test's directories, which its jobs
	// write to, must live elsewhere.
	restore := TempDirOutsideTmp()
	var made []string
	if isRoot() {
		for _, n := range []string{testUser, otherUser} {
			created, err := EnsureAccount(n)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			if created {
				made = append(made, n)
			}
		}
	}
	code := m.Run()
	for _, n := range made {
		_ = RemoveAccount(n)
	}
	restore()
	// Leave no cgroups behind (each agent removes its own parent; the
	// common one goes when the last test is done).
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/allot-test")
	for _, d := range append(dirs, "/sys/fs/cgroup/allot-test") {
		_ = os.Remove(d)
	}
	os.Exit(code)
}

// jobDir is a temporary directory the test's jobs (running as testUser)
// can write.
func jobDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if os.Geteuid() != 0 {
		return d
	}
	u, err := user.Lookup(testUser)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chmod(filepath.Dir(d), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, uid, gid); err != nil {
		t.Fatal(err)
	}
	return d
}

// sharedTempDir is a temporary directory other accounts may traverse (the
// test's jobs reach fake device nodes and checkpoint dirs under it).
func sharedTempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, p := range []string{filepath.Dir(d), d} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func isRoot() bool { return os.Geteuid() == 0 }
