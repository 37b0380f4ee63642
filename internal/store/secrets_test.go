package store_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

func mustKeys(t *testing.T, lines ...string) *store.SecretKeys {
	t.Helper()
	k, err := store.ParseSecretKeys([]byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestSecretEnvEncryptedAtRest: with a key file, a job's secret values are
// stored sealed (AES-GCM, the variable's name bound in), never in clear;
// the order a node takes carries them in clear; a process without the key
// refuses to hand them out, saying why; reseal moves values stored in
// clear or under an older key to the current one (rotation).
func TestSecretEnvEncryptedAtRest(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	oldKey, newKey := store.NewSecretKey(), store.NewSecretKey()
	b.st.Secrets = mustKeys(t, oldKey)
	submit := func(secret string) int64 {
		t.Helper()
		j, err := b.st.SubmitJob(b.ctx, noah, allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 2, TimeLimit: time.Hour,
			Command: []string{"python", "train.py"}, SecretEnv: map[string]string{"WANDB_API_KEY": secret, "HF_TOKEN": "hf-" + secret}})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	stored := func(id int64) string {
		t.Helper()
		var s string
		if err := b.pool.QueryRow(b.ctx, `SELECT secret_env::text FROM jobs WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	sealed := submit("s3cr3t-old")
	if s := stored(sealed); strings.Contains(s, "s3cr3t") || strings.Count(s, "allot:v1:"+b.st.Secrets.KeyID()+":") != 2 || !strings.Contains(s, `"HF_TOKEN"`) {
		t.Fatalf("stored secret_env = %s; want both values sealed by key %s, the names visible", s, b.st.Secrets.KeyID())
	}
	b.st.Secrets = nil
	clear := submit("s3cr3t-clear") // before encryption was configured
	if s := stored(clear); !strings.Contains(s, "s3cr3t-clear") {
		t.Fatalf("without a key the value is stored as given: %s", s)
	}

	// Rotation: a new first key; the old one only opens.
	b.st.Secrets = mustKeys(t, "# rotated", newKey, oldKey)
	// A job sealed by a key the file does not hold is left as it is, and
	// listed.
	lost := b.st.Secrets
	b.st.Secrets = mustKeys(t, store.NewSecretKey())
	orphan := submit("s3cr3t-lost-key")
	b.st.Secrets = lost
	if n, skipped, err := b.st.ResealSecrets(b.ctx); err != nil || n != 2 || len(skipped) != 1 || !strings.Contains(skipped[0], fmt.Sprintf("job %d: ", orphan)) {
		t.Fatalf("ResealSecrets = %d, %q, %v; want the 2 jobs, job %d skipped", n, skipped, err, orphan)
	}
	newID := b.st.Secrets.KeyID()
	for _, id := range []int64{sealed, clear} {
		if s := stored(id); strings.Contains(s, "s3cr3t") || strings.Count(s, "allot:v1:"+newID+":") != 2 {
			t.Errorf("job %d after reseal: %s; want sealed by %s", id, s, newID)
		}
	}
	if n, _, err := b.st.ResealSecrets(b.ctx); err != nil || n != 0 {
		t.Errorf("a second reseal rewrote %d jobs (%v); want 0", n, err)
	}
	if _, _, err := (&store.Store{}).ResealSecrets(b.ctx); err == nil {
		t.Error("reseal without keys: no error")
	}

	// The node's order: held back without the key (not marked sent, the
	// node's other orders still go), in clear with only the new key.
	if _, err := b.pool.Exec(b.ctx, `UPDATE nodes SET state = 'up', registered_at = $1, last_heartbeat = $1 WHERE name = 'gpu16'`, b.now); err != nil {
		t.Fatal(err)
	}
	err := b.st.InTx(b.ctx, func(tx *store.Store) error {
		_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{{JobID: sealed, RunAs: allot.Tier3,
			Parts: []store.LeasePart{{Node: "gpu16", GPUs: []int{0, 1}, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"}}}}}, nil, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	keyless := store.New(b.pool)
	keyless.Now = b.st.Now
	if o, err := keyless.TakeOrders(b.ctx, "gpu16"); err != nil || len(o.Offer) != 0 || len(o.Unreadable) != 1 ||
		o.Unreadable[0].JobID != sealed || !strings.Contains(o.Unreadable[0].Err, "--secret-key-file") {
		t.Errorf("orders without the key: %+v, %v; want the offer held back, saying why", o, err)
	}
	onlyNew := store.New(b.pool)
	onlyNew.Now, onlyNew.Secrets = b.st.Now, mustKeys(t, newKey)
	o, err := onlyNew.TakeOrders(b.ctx, "gpu16")
	if err != nil || len(o.Offer) != 1 {
		t.Fatalf("orders: %+v %v", o, err)
	}
	if env := o.Offer[0].Env; env["WANDB_API_KEY"] != "s3cr3t-old" || env["HF_TOKEN"] != "hf-s3cr3t-old" {
		t.Errorf("the order's env: %v", env)
	}
}

// TestSealedSecretsResistTampering: a value moved to another variable, a
// damaged value and an unknown key do not open; bad key files are refused
// with the line that is wrong.
func TestSealedSecretsResistTampering(t *testing.T) {
	t.Parallel()
	k := mustKeys(t, store.NewSecretKey())
	v := k.Seal("A", "x")
	if id, ok := store.Sealed(v); !ok || id != k.KeyID() {
		t.Fatalf("Sealed(%q) = %q, %v", v, id, ok)
	}
	if v2 := k.Seal("A", "x"); v2 == v {
		t.Error("two seals of one value are equal: the nonce is not random")
	}
	for _, tt := range []struct {
		name, variable, stored string
		keys                   *store.SecretKeys
		want                   string
	}{
		{"moved to another variable", "B", v, k, "moved from another variable"},
		{"damaged", "A", v[:len(v)-4] + "AAAA", k, "does not decrypt"},
		{"not base64", "A", "allot:v1:" + k.KeyID() + ":%%%", k, "damaged"},
		{"another key", "A", v, mustKeys(t, store.NewSecretKey()), "not in the secret key file"},
		{"no key", "A", v, nil, "no --secret-key-file"},
	} {
		if _, err := tt.keys.Open(tt.variable, tt.stored); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	if got, err := k.Open("A", v); err != nil || got != "x" {
		t.Errorf("open = %q, %v", got, err)
	}
	key := store.NewSecretKey()
	for text, want := range map[string]string{
		"":                      "no key",
		"# only a comment\n":    "no key",
		"not-base64!":           "line 1: not a key",
		"\n" + key[:20]:         "line 2: not a key",
		key + "\n" + key + "\n": "line 2: the same key twice",
	} {
		if _, err := store.ParseSecretKeys([]byte(text)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSecretKeys(%q) = %v, want %q", text, err, want)
		}
	}
}
