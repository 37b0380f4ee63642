package agent

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestJobCannotGainPrivilegesThroughSetuid: a host job runs with
// no_new_privs, as its container jobs do (--security-opt
// no-new-privileges): a setuid-root program it runs (sudo for an account
// the node lets sudo, a setuid copy of id here) does not make it root, so
// an account with sudo rights on the node (an identity provider's claim
// such as "ubuntu") does not get a job the node's token.
func TestJobCannotGainPrivilegesThroughSetuid(t *testing.T) {
	needRoot(t)
	t.Parallel()
	dir, err := os.MkdirTemp("/var/tmp", "allot-setuid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "id")
	src, err := os.Open("/usr/bin/id")
	if err != nil {
		t.Skip("no /usr/bin/id:", err)
	}
	dst, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	src.Close()
	dst.Close()
	if err := os.Chmod(bin, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	p := newPeer(t)
	ta := startAgent(t, p)
	l := shLease(171, []int{0}, `echo "euid=$(`+bin+` -u)"; grep NoNewPrivs /proc/self/status`)
	l.User = otherUser
	ta.run(t, l)
	if e := p.waitExit(ref(171), 5*time.Second); e.ExitCode != 0 {
		t.Fatalf("exit = %+v: %s", e, logOf(p, ref(171)))
	}
	out := logOf(p, ref(171))
	if !strings.Contains(out, "euid="+uidOf(t, otherUser)) {
		t.Errorf("a setuid-root program made the job %q, want euid %s (no_new_privs)", out, uidOf(t, otherUser))
	}
	if !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Errorf("the job runs without no_new_privs: %q", out)
	}
}
