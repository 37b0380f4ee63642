package slurmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRestProxyAsUser: on 22.05 a root (SlurmUser) token with
// X-SLURM-USER-NAME of another POSIX account submits as that account (the
// "authenticating proxy"), the job runs as it; a user's own token cannot name
// another user.
func TestRestProxyAsUser(t *testing.T) {
	need(t)
	EnsureUser(t, testUser)
	c := Start(t, Options{Nodes: 1, Accounts: []string{"nlp"}, Users: []string{testUser}})
	rootTok := c.Token(t, "root", time.Minute)
	submit := func(userName, token, out string) (int, map[string]any) {
		return rest(t, c, "POST", "/slurm/v0.0.38/job/submit", userName, token, map[string]any{
			"script": "#!/bin/sh\nid -un\n",
			"job": map[string]any{
				"name": "proxy", "account": "nlp", "gres": "gpu:1",
				"current_working_directory": c.JobsDir,
				"standard_output":           filepath.Join(c.JobsDir, out),
				"environment":               map[string]string{"PATH": "/usr/bin:/bin"},
			},
		})
	}
	code, m := submit(testUser, rootTok, "proxy.out")
	t.Logf("root token as %s: %d %v", testUser, code, m)
	if code != 200 {
		t.Fatalf("proxy submit: %d %v", code, m)
	}
	id := int64(m["job_id"].(float64))
	if st := c.WaitJob(t, id); st != "COMPLETED" {
		t.Fatalf("job %d: %s", id, st)
	}
	out, _ := os.ReadFile(filepath.Join(c.JobsDir, "proxy.out"))
	if strings.TrimSpace(string(out)) != testUser {
		t.Errorf("proxied job ran as %q, want %s", out, testUser)
	}
	if got := c.Run(t, "squeue", "-h", "-t", "all", "-j", fmt.Sprint(id), "-o", "%u"); strings.TrimSpace(got) != testUser {
		t.Errorf("squeue user %q", got)
	}

	// A minted root token works as the proxy too.
	minted, err := c.MintToken("root", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code, m := submit(testUser, minted, "proxy2.out"); code != 200 {
		t.Errorf("proxy submit with minted token: %d %v", code, m)
	}

	// The user's own token naming root: refused.
	userTok := c.Token(t, testUser, time.Minute)
	code, m = submit("root", userTok, "evil.out")
	t.Logf("user token as root: %d %v", code, m)
	if code == 200 {
		t.Errorf("a user's token submitted as root: %v", m)
	}
	// The user's own token as itself: fine.
	if code, m := submit(testUser, userTok, "own.out"); code != 200 {
		t.Errorf("own token: %d %v", code, m)
	}
}

// TestEnforceQOSCreatedAfterStart: AccountingStorageEnforce=associations,
// limits,qos with QOS added by sacctmgr after slurmctld started.
func TestEnforceQOSCreatedAfterStart(t *testing.T) {
	need(t)
	c := Start(t, Options{Nodes: 1, Accounts: []string{"nlp"}, Enforce: "associations,limits,qos"})
	c.Run(t, "sacctmgr", "-i", "add", "qos", "allot-t1,allot-t3,allot-preemptible")
	c.Run(t, "sacctmgr", "-i", "modify", "account", "nlp", "set", "qos+=allot-t3,allot-preemptible", "defaultqos=allot-t3")
	// slurmdbd pushes QOS and association changes to slurmctld asynchronously:
	// the first submits may still be refused.
	began := time.Now() // stopwatch
	var id int64
	for {
		out, err := c.Exec("sbatch", "--parsable", "-A", "nlp", "--qos=allot-preemptible", "-o", "/dev/null", "--wrap", "true")
		if err == nil {
			fmt.Sscan(out, &id)
			break
		}
		if time.Since(began) > 10*time.Second {
			t.Fatalf("sbatch with the new QOS still refused after 10 s: %v\n%s", err,
				c.Run(t, "sacctmgr", "-P", "show", "assoc", "format=account,user,qos,defaultqos"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("new QOS usable %v after sacctmgr returned", time.Since(began))
	if st := c.WaitJob(t, id); st != "COMPLETED" {
		t.Errorf("job with a new QOS: %s", st)
	}
	id = c.Sbatch(t, "", "-A", "nlp", "-o", "/dev/null", "--wrap", "true")
	c.WaitJob(t, id)
	if q := strings.TrimSpace(c.Run(t, "squeue", "-h", "-t", "all", "-j", fmt.Sprint(id), "-o", "%q")); q != "allot-t3" {
		t.Errorf("default QOS: %q", q)
	}
	if out, err := c.Exec("sbatch", "-A", "nlp", "--qos=allot-t1", "-o", "/dev/null", "--wrap", "true"); err == nil {
		t.Errorf("a QOS the association lacks was accepted: %s", out)
	} else {
		t.Logf("refused as expected: %v", err)
	}
	if out, err := c.Exec("sbatch", "-A", "nosuch", "-o", "/dev/null", "--wrap", "true"); err == nil {
		t.Errorf("an unknown account was accepted: %s", out)
	}
}

// TestJWTKeyPermissions: slurmctld with a world-readable key, and with a key
// owned by another user.
func TestJWTKeyPermissions(t *testing.T) {
	need(t)
	c := Start(t, Options{Nodes: 1, NoDBD: true})
	for _, tc := range []struct {
		name  string
		setup func() error
	}{
		{"0644 root", func() error { return os.Chmod(c.JWTKeyFile, 0o644) }},
		{"0600 nobody", func() error {
			if err := os.Chmod(c.JWTKeyFile, 0o600); err != nil {
				return err
			}
			return os.Chown(c.JWTKeyFile, 65534, 65534)
		}},
		{"0400 root", func() error {
			if err := os.Chown(c.JWTKeyFile, 0, 0); err != nil {
				return err
			}
			return os.Chmod(c.JWTKeyFile, 0o400)
		}},
	} {
		c.StopCtld(t)
		if err := tc.setup(); err != nil {
			t.Fatal(err)
		}
		if err := c.startDaemon("slurmctld", c.bin("slurmctld"), "-D"); err != nil {
			t.Fatal(err)
		}
		err := c.waitPort("slurmctld", c.ctldPort, 15*time.Second)
		if err != nil {
			t.Logf("%s: slurmctld did not start: %v", tc.name, err)
			continue
		}
		code, m := rest(t, c, "GET", "/slurm/v0.0.38/ping", "root", c.Token(t, "root", time.Minute), nil)
		t.Logf("%s: slurmctld up; ping %d; log: %s", tc.name, code, grepLog(c, "slurmctld.log", "jwt"))
		_ = m
	}
}

func grepLog(c *Cluster, file, word string) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "log", file))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(strings.ToLower(l), word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, " | ")
}

// TestRestAsRoot: does slurmrestd run as root (no -u/-g)?
func TestRestAsRoot(t *testing.T) {
	need(t)
	c := Start(t, Options{Nodes: 1, NoDBD: true, NoRest: true})
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	defer releasePorts(ports)
	if err := c.startDaemonEnv("slurmrestd", []string{"SLURM_JWT=daemon"}, findBin("slurmrestd"),
		"-a", "rest_auth/jwt", "-s", "openapi/v0.0.38", fmt.Sprintf("127.0.0.1:%d", ports[0])); err != nil {
		t.Fatal(err)
	}
	c.restPort = ports[0]
	c.RestURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	err = c.waitPort("slurmrestd", ports[0], 10*time.Second)
	b, _ := os.ReadFile(filepath.Join(c.Dir, "log", "slurmrestd.out"))
	t.Logf("slurmrestd as root: err=%v\n%s", err, b)
	if err == nil {
		code, m := rest(t, c, "GET", "/slurm/v0.0.38/ping", "root", c.Token(t, "root", time.Minute), nil)
		t.Logf("ping as root-run slurmrestd: %d %v", code, m)
	}
}
