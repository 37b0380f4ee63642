package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// writeKeyFile writes a key file of keys (mode perm) and returns its path.
func writeKeyFile(t *testing.T, perm os.FileMode, keys ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret.key")
	if err := os.WriteFile(path, []byte(strings.Join(keys, "\n")+"\n"), perm); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSecretEnvSealedEndToEnd: with --secret-key-file, a secret submitted
// through the API is stored sealed (the database holds no clear value),
// and the job the agent runs still gets it in its environment.
func TestSecretEnvSealedEndToEnd(t *testing.T) {
	key := store.NewSecretKey()
	l := startLive(t, func(m *Main) { m.SecretKeyFile = writeKeyFile(t, 0o600, key) })
	l.startAgent("gpu01")
	l.waitNode("gpu01", "up")
	const secret = "sealed-s3cr3t-e2e"
	j := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":1,"time_limit":"5m","secret_env":{"API_KEY":"`+secret+`"},"command":`+
		jsonCmd("sh", "-c", `if [ "$API_KEY" = "`+secret+`" ]; then echo has-the-secret; else echo no-secret; fi`)+`}`)
	var stored string
	if err := l.m.Pool.QueryRow(context.Background(), `SELECT secret_env->>'API_KEY' FROM jobs WHERE id = $1`, j.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if id, ok := store.Sealed(stored); !ok || strings.Contains(stored, secret) || id != l.m.Store.Secrets.KeyID() {
		t.Errorf("stored value %q: want sealed by key %s", stored, l.m.Store.Secrets.KeyID())
	}
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "completed" }, "completed")
	lines, err := l.m.Store.JobLog(context.Background(), j.ID)
	if err != nil || len(lines) != 1 || lines[0] != "has-the-secret" {
		t.Errorf("the job's log = %+v %v; want has-the-secret", lines, err)
	}
}

// TestSecretKeyCLI: allot secret-key new prints a key the server takes;
// bad key files and flags are refused with exit 2 and a message, before
// anything starts; reseal seals values stored in clear.
func TestSecretKeyCLI(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if rc := run([]string{"secret-key", "new"}, &out, &errb); rc != 0 {
		t.Fatalf("secret-key new: %d %s", rc, errb.String())
	}
	k1, err := store.ParseSecretKeys(out.Bytes())
	if err != nil {
		t.Fatalf("its output is no key file: %v\n%s", err, out.String())
	}
	out.Reset()
	run([]string{"secret-key", "new"}, &out, &errb)
	if k2, _ := store.ParseSecretKeys(out.Bytes()); k2 == nil || k2.KeyID() == k1.KeyID() {
		t.Error("two new keys are the same")
	}
	good := writeKeyFile(t, 0o600, store.NewSecretKey())
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"secret-key"}, "usage: allot secret-key"},
		{[]string{"secret-key", "rotate"}, `unknown subcommand "rotate"`},
		{[]string{"secret-key", "new", "extra"}, "takes no arguments"},
		{[]string{"secret-key", "reseal"}, "give --secret-key-file"},
		{[]string{"secret-key", "reseal", "--secret-key-file", writeKeyFile(t, 0o644, store.NewSecretKey())}, "chmod 600"},
		{[]string{"secret-key", "reseal", "--secret-key-file", writeKeyFile(t, 0o600, "short")}, "line 1: not a key"},
		{[]string{"server", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--secret-key-file", "/nonexistent/secret.key"}, "--secret-key-file: secret key file"},
		{[]string{"worker", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--secret-key-file", writeKeyFile(t, 0o640, store.NewSecretKey())}, "chmod 600"},
		{[]string{"secret-key", "reseal", "--secret-key-file", good, "--database-url", "postgres://nobody@127.0.0.1:1/none", "x"}, `unexpected argument "x"`},
	} {
		errb.Reset()
		if rc := run(tt.args, &out, &errb); rc != 2 || !strings.Contains(errb.String(), tt.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tt.args, rc, errb.String(), tt.want)
		}
	}
}

// TestSecretKeyReseal: values stored before encryption was configured are
// sealed by allot secret-key reseal, and read back by a key-holding store.
func TestSecretKeyReseal(t *testing.T) {
	e := bootMain(t, &Main{Config: Config{DevMode: true}})
	ctx := context.Background()
	u, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Engineer])
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 3 {
		j, err := e.m.Store.SubmitJob(ctx, &u, allot.JobSpec{Team: "nlp", Tier: allot.Tier4, GPUs: 1, TimeLimit: time.Hour,
			Command: []string{"true"}, SecretEnv: map[string]string{"TOKEN": fmt.Sprintf("clear-%d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	key := writeKeyFile(t, 0o600, store.NewSecretKey())
	var out, errb bytes.Buffer
	if rc := run([]string{"secret-key", "reseal", "--secret-key-file", key, "--database-url", e.m.DatabaseURL}, &out, &errb); rc != 0 ||
		!strings.HasPrefix(out.String(), "resealed the secrets of ") {
		t.Fatalf("reseal: %d %q %q", rc, out.String(), errb.String())
	}
	keys, err := store.LoadSecretKeys(key)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		var v string
		if err := e.m.Pool.QueryRow(ctx, `SELECT secret_env->>'TOKEN' FROM jobs WHERE id = $1`, id).Scan(&v); err != nil {
			t.Fatal(err)
		}
		got, err := keys.Open("TOKEN", v)
		if kid, ok := store.Sealed(v); !ok || kid != keys.KeyID() || err != nil || got != fmt.Sprintf("clear-%d", i) {
			t.Errorf("job %d: stored %q, opened %q (%v)", id, v, got, err)
		}
	}
}
