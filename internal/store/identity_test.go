package store_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// TestAccountResolutionOrder: a job runs as the admin's mapping of its
// submitter, else the identity provider's claim, else the team's service
// account; with none, it is refused when accounts are required (a field
// error on run_as_user, nothing written) and runs as the agent's default
// ("") when they are not. The job keeps the account it was submitted
// with.
func TestAccountResolutionOrder(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	spec := allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}}
	submit := func(st *store.Store) (allot.Job, error) {
		t.Helper()
		return st.SubmitJob(b.ctx, noah, spec)
	}
	runAs := func(want string) {
		t.Helper()
		j, err := submit(b.st)
		if err != nil {
			t.Fatal(err)
		}
		if j.RunAsUser != want {
			t.Errorf("submitted job runs as %q, want %q", j.RunAsUser, want)
		}
		got, err := b.st.GetJob(b.ctx, j.ID)
		if err != nil || got.RunAsUser != want {
			t.Errorf("stored job runs as %q (%v), want %q", got.RunAsUser, err, want)
		}
	}
	// The demo maps noah to "noah" and gives nlp the service account svc-nlp.
	if err := b.st.SetOIDCPosixUser(b.ctx, noah.ID, "nkim"); err != nil {
		t.Fatal(err)
	}
	runAs("noah") // the mapping wins over the claim and the team
	if _, _, err := b.st.SetPosixUser(b.ctx, "ada@example.com", "noah@example.com", "", "test"); err != nil {
		t.Fatal(err)
	}
	runAs("nkim") // then the claim
	if err := b.st.SetOIDCPosixUser(b.ctx, noah.ID, ""); err != nil {
		t.Fatal(err)
	}
	runAs("svc-nlp") // then the team's service account
	if _, err := b.pool.Exec(b.ctx, `UPDATE teams SET posix_account = '' WHERE slug = 'nlp'`); err != nil {
		t.Fatal(err)
	}
	runAs("") // none: the agent's default job user

	required := *b.st
	required.RequirePOSIXAccount = true
	before := b.count(t, "jobs")
	_, err := submit(&required)
	if f := allot.Fields(err); f == nil || !strings.Contains(f["run_as_user"], "no POSIX account") || len(f) != 1 {
		t.Errorf("required, none resolves: %v, want only a run_as_user field error", err)
	}
	if _, err := required.QuotaPreview(b.ctx, noah, &spec); allot.Fields(err)["run_as_user"] == "" {
		t.Errorf("the form's preview does not say so: %v", err)
	}
	if n := b.count(t, "jobs"); n != before {
		t.Errorf("a refused submission wrote a job: %d → %d", before, n)
	}
	// Another team's service account does not count: the lead of fraud
	// submitting for fraud gets fraud's.
	farah := b.user(t, "farah@example.com")
	if _, _, err := b.st.SetPosixUser(b.ctx, "ada@example.com", "farah@example.com", "", ""); err != nil {
		t.Fatal(err)
	}
	j, err := required.SubmitJob(b.ctx, farah, allot.JobSpec{Team: "fraud", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil || j.RunAsUser != "svc-fraud" {
		t.Errorf("farah for fraud: %q %v, want svc-fraud", j.RunAsUser, err)
	}
	// The job keeps its account when the mapping changes later.
	if _, _, err := b.st.SetPosixUser(b.ctx, "ada@example.com", "farah@example.com", "farah", ""); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.st.GetJob(b.ctx, j.ID); got.RunAsUser != "svc-fraud" {
		t.Errorf("the job's account changed with the mapping: %q", got.RunAsUser)
	}
}

// TestInvalidAccountNamesRefused: mappings, claims and service accounts
// must be POSIX account names, never root or another system account; the
// database refuses them too.
func TestInvalidAccountNamesRefused(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	audits := b.count(t, "audit_log")
	for _, bad := range []string{"root", "toor", "daemon", "Noah", "1noah", "no ah", "noah;rm", "a234567890123456789012345678901234", "-x", "nöah"} {
		if _, r, err := b.st.SetPosixUser(b.ctx, "ada@example.com", "noah@example.com", bad, ""); allot.Fields(err)["posix_user"] == "" || r.Changed {
			t.Errorf("mapping to %q: %v", bad, err)
		}
		if err := b.st.SetOIDCPosixUser(b.ctx, noah.ID, bad); allot.Fields(err)["oidc_posix_user"] == "" {
			t.Errorf("claim %q: %v", bad, err)
		}
		_, err := b.st.UpdateTeamPolicy(b.ctx, store.PolicyChange{Actor: "ada@example.com", Action: "team.update", Object: "team:nlp"}, "nlp",
			func(t *allot.Team, _ *string) { t.PosixAccount = bad })
		if allot.Fields(err)["posix_account"] == "" {
			t.Errorf("service account %q: %v", bad, err)
		}
		if _, err := b.pool.Exec(b.ctx, `UPDATE users SET posix_user = $1 WHERE id = $2`, bad, noah.ID); err == nil {
			t.Errorf("the database took posix_user %q", bad)
		}
	}
	if n := b.count(t, "audit_log"); n != audits {
		t.Errorf("refused changes were audited: %d → %d", audits, n)
	}
	// A good one is audited once; the same again changes nothing.
	m, r, err := b.st.SetPosixUser(b.ctx, "ada@example.com", "NOAH@example.com", "n_kim-2", "ticket 7")
	if err != nil || !r.Changed || m.PosixUser != "n_kim-2" || r.Entry.Action != "user.posix_user" || r.Entry.Object != "user:noah@example.com" {
		t.Fatalf("good mapping: %+v %+v %v", m, r, err)
	}
	var after struct {
		PosixUser string `json:"posix_user"`
	}
	if err := json.Unmarshal(r.Entry.After, &after); err != nil || after.PosixUser != "n_kim-2" || r.Entry.Note != "ticket 7" {
		t.Errorf("audit entry: %s %q", r.Entry.After, r.Entry.Note)
	}
	if _, r, err := b.st.SetPosixUser(b.ctx, "ada@example.com", "noah@example.com", "n_kim-2", ""); err != nil || r.Changed {
		t.Errorf("the same mapping again: %+v %v", r, err)
	}
	if _, _, err := b.st.SetPosixUser(b.ctx, "ada@example.com", "nobody@example.com", "x", ""); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("unknown user: %v", err)
	}
}

// TestLeaseCarriesIdentityImageLimitsAndSecrets: the order a node takes
// names the account, the submitter, the image and the limits, and its env
// holds the secret variables, which are never loaded with the job (its
// row reads keys only) nor written to the lease row.
func TestLeaseCarriesIdentityImageLimitsAndSecrets(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	spec := allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 2, TimeLimit: time.Hour, Command: []string{"python", "train.py"},
		Env: map[string]string{"WANDB_MODE": "offline"}, SecretEnv: map[string]string{"WANDB_API_KEY": "s3cr3t-k3y", "RANK": "9"},
		Image: "nvcr.io/nvidia/pytorch:24.05-py3", MemoryBytes: 64 << 30, MilliCPUs: 8500}
	j, err := b.st.SubmitJob(b.ctx, noah, spec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.st.GetJob(b.ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.SecretEnv != nil || strings.Join(got.SecretEnvKeys, ",") != "RANK,WANDB_API_KEY" || got.Image != spec.Image ||
		got.MemoryBytes != 64<<30 || got.MilliCPUs != 8500 || got.RunAsUser != "noah" {
		t.Fatalf("stored job: %+v", got)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE nodes SET state = 'up', registered_at = $1, last_heartbeat = $1 WHERE name = 'gpu16'`, b.now); err != nil {
		t.Fatal(err)
	}
	err = b.st.InTx(b.ctx, func(tx *store.Store) error {
		_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{{JobID: j.ID, RunAs: allot.Tier3,
			Parts: []store.LeasePart{{Node: "gpu16", GPUs: []int{0, 1}, Env: map[string]string{"WANDB_MODE": "offline", "CUDA_VISIBLE_DEVICES": "0,1", "RANK": "0"}}}}}, nil, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var leaseEnv string
	if err := b.pool.QueryRow(b.ctx, `SELECT env::text FROM leases WHERE job_id = $1`, j.ID).Scan(&leaseEnv); err != nil || strings.Contains(leaseEnv, "s3cr3t") {
		t.Errorf("the lease row holds the secret: %s %v", leaseEnv, err)
	}
	o, err := b.st.TakeOrders(b.ctx, "gpu16")
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Offer) != 1 {
		t.Fatalf("offers: %+v", o.Offer)
	}
	l := o.Offer[0]
	if l.User != "noah" || l.Submitter != "noah@example.com" || l.Image != spec.Image || l.MemoryBytes != 64<<30 || l.MilliCPUs != 8500 {
		t.Errorf("lease identity and limits: %+v", l)
	}
	if l.Env["WANDB_API_KEY"] != "s3cr3t-k3y" || l.Env["WANDB_MODE"] != "offline" || l.Env["CUDA_VISIBLE_DEVICES"] != "0,1" {
		t.Errorf("lease env: %v", l.Env)
	}
	if l.Env["RANK"] != "0" {
		t.Errorf("a secret overrode what Allot sets: RANK=%q", l.Env["RANK"])
	}
}

// TestSpecFieldsRefusedWithFieldErrors: bad image, memory, CPUs and a
// variable in both env and secret_env are field errors, and nothing is
// written.
func TestSpecFieldsRefusedWithFieldErrors(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	before := b.count(t, "jobs")
	for _, tt := range []struct {
		name  string
		edit  func(s *allot.JobSpec)
		field string
	}{
		{"image with a space", func(s *allot.JobSpec) { s.Image = "ubuntu 22.04" }, "image"},
		{"image upper case path", func(s *allot.JobSpec) { s.Image = "ghcr.io/Acme/Train:1" }, "image"},
		{"image too long", func(s *allot.JobSpec) { s.Image = "r/" + strings.Repeat("a", 260) }, "image"},
		{"image with a scheme", func(s *allot.JobSpec) { s.Image = "docker://ubuntu" }, "image"},
		{"memory negative", func(s *allot.JobSpec) { s.MemoryBytes = -1 }, "memory"},
		{"memory tiny", func(s *allot.JobSpec) { s.MemoryBytes = 1024 }, "memory"},
		{"cpus negative", func(s *allot.JobSpec) { s.MilliCPUs = -500 }, "cpus"},
		{"cpus too many", func(s *allot.JobSpec) { s.MilliCPUs = 10_000_000 }, "cpus"},
		{"secret and env", func(s *allot.JobSpec) {
			s.Env, s.SecretEnv = map[string]string{"TOKEN": "a"}, map[string]string{"TOKEN": "b"}
		}, "secret_env"},
		{"secret set by Allot", func(s *allot.JobSpec) { s.SecretEnv = map[string]string{"ALLOT_JOB_ID": "1"} }, "secret_env"},
		{"secret bad name", func(s *allot.JobSpec) { s.SecretEnv = map[string]string{"1X": "1"} }, "secret_env"},
		{"secret in the sealed form", func(s *allot.JobSpec) { s.SecretEnv = map[string]string{"TOKEN": "allot:v1:0a1b2c3d:AAAA"} }, "secret_env"},
	} {
		spec := allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}}
		tt.edit(&spec)
		_, err := b.st.SubmitJob(b.ctx, noah, spec)
		if f := allot.Fields(err); len(f) != 1 || f[tt.field] == "" {
			t.Errorf("%s: %v, want only a %s field error", tt.name, err, tt.field)
		}
	}
	if n := b.count(t, "jobs"); n != before {
		t.Errorf("bad specs wrote jobs: %d → %d", before, n)
	}
}
