package agent

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
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

// TestContainerJobCannotMountWhatItsAccountCannotReach: a container job's
// working directory is bind-mounted by the runtime, which runs as root; a
// directory the job's account could not reach on the node (another
// person's 0700 home, root's) must not become reachable in the
// container. The job fails to start with a message that names the
// directory, and reads nothing.
func TestContainerJobCannotMountWhatItsAccountCannotReach(t *testing.T) {
	needRoot(t)
	bin, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman is not installed (.ci/run installs it from Debian)")
	}
	t.Parallel()
	img := testImageTB(t, bin)
	// /…/home-of-bob (0700, root's) / project (0755) / notes (0644): the
	// job's account cannot reach notes on the node.
	base := sharedTempDir(t)
	home := filepath.Join(base, "home-of-bob")
	project := filepath.Join(home, "project")
	if err := os.MkdirAll(project, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(home, 0o700); err != nil {
		t.Fatal(err)
	}
	const secret = "bob-private-notes-42"
	if err := os.WriteFile(filepath.Join(project, "notes"), []byte(secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// And through a symlink the job's account owns.
	link := filepath.Join(jobDir(t), "link")
	if err := os.Symlink(project, link); err != nil {
		t.Fatal(err)
	}
	p := newPeer(t)
	startAgent(t, p, func(c *Config) { c.ContainerRuntime = "podman" })
	for i, wd := range []string{project, link} {
		id := int64(181 + i)
		l := shLease(id, []int{i}, `cat notes; echo end`)
		l.Image, l.WorkDir = img, wd
		p.push(agentproto.Orders{Offer: []agentproto.Lease{l}})
		p.waitFor("take", 5*time.Second, func() bool { return slices.Contains(p.takes, ref(id)) })
		p.push(agentproto.Orders{Start: []agentproto.LeaseRef{ref(id)}})
		e := p.waitExit(ref(id), 60*time.Second)
		if out := logOf(p, ref(id)); strings.Contains(out, secret) {
			t.Errorf("workdir %s: the container job read another account's file:\n%s", wd, out)
		}
		if e.Reason != ReasonStartFailed || !strings.Contains(e.Message, "working directory") {
			t.Errorf("workdir %s: exit = %+v, want start_failed naming the working directory", wd, e)
		}
	}
}
