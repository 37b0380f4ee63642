package allot

import (
	"strings"
	"testing"
	"time"
)

func TestPOSIXAccountNames(t *testing.T) {
	for _, ok := range []string{"noah", "_svc", "svc-nlp", "a", "n_kim-2", strings.Repeat("a", 32)} {
		if msg := POSIXAccountProblem(ok); msg != "" {
			t.Errorf("%q refused: %s", ok, msg)
		}
	}
	for _, bad := range []string{"", "root", "toor", "nobody", "Noah", "1a", "-a", "a b", "a.b", "a@b", strings.Repeat("a", 33), "nöah", "a\n"} {
		if POSIXAccountProblem(bad) == "" {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestResolveAccountOrder(t *testing.T) {
	for _, tt := range []struct{ mapped, claimed, team, want, source string }{
		{"noah", "nkim", "svc-nlp", "noah", AccountFromUser},
		{"", "nkim", "svc-nlp", "nkim", AccountFromOIDC},
		{"", "", "svc-nlp", "svc-nlp", AccountFromTeam},
		{"", "", "", "", AccountFromNone},
		{"root", "Bad", "svc-nlp", "svc-nlp", AccountFromTeam}, // invalid names are skipped
	} {
		if a, src := ResolveAccount(tt.mapped, tt.claimed, tt.team); a != tt.want || src != tt.source {
			t.Errorf("ResolveAccount(%q, %q, %q) = %q %q, want %q %q", tt.mapped, tt.claimed, tt.team, a, src, tt.want, tt.source)
		}
	}
}

func TestParseMemoryAndCPUs(t *testing.T) {
	for in, want := range map[string]int64{"64GiB": 64 << 30, "512MiB": 512 << 20, "512Mi": 512 << 20, "1.5GiB": 3 << 29, "1TiB": 1 << 40,
		"500MB": 500e6, "64gb": 64e9, "1073741824": 1 << 30, " 2 GiB ": 2 << 30, "0": 0} {
		if got, err := ParseMemory(in); err != nil || got != want {
			t.Errorf("ParseMemory(%q) = %d %v, want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "64G", "64M", "lots", "-1GiB", "1.5", "1e9", "GiB", "100TiB", "1..2GiB"} {
		if _, err := ParseMemory(bad); err == nil {
			t.Errorf("ParseMemory(%q) accepted", bad)
		}
	}
	for b, want := range map[int64]string{64 << 30: "64GiB", 1536 << 20: "1536MiB", 1000: "1000B", 0: ""} {
		if got := FormatMemory(b); got != want {
			t.Errorf("FormatMemory(%d) = %q, want %q", b, got, want)
		}
		if b != 0 {
			if back, err := ParseMemory(FormatMemory(b)); err != nil || back != b {
				t.Errorf("FormatMemory(%d) does not read back: %d %v", b, back, err)
			}
		}
	}
	for in, want := range map[string]int64{"4": 4000, "0.5": 500, ".25": 250, "2.125": 2125, "0": 0, " 8 ": 8000} {
		if got, err := ParseCPUs(in); err != nil || got != want {
			t.Errorf("ParseCPUs(%q) = %d %v, want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", "-1", "1.2345", "four", "1e3", "1,5", "99999999"} {
		if _, err := ParseCPUs(bad); err == nil {
			t.Errorf("ParseCPUs(%q) accepted", bad)
		}
	}
	for m, want := range map[int64]string{4000: "4", 500: "0.5", 2125: "2.125", 2100: "2.1", 0: ""} {
		if got := FormatCPUs(m); got != want {
			t.Errorf("FormatCPUs(%d) = %q, want %q", m, got, want)
		}
	}
}

func TestImageReferences(t *testing.T) {
	for _, ok := range []string{"", "ubuntu", "ubuntu:22.04", "nvcr.io/nvidia/pytorch:24.05-py3", "ghcr.io/acme/train:1.4",
		"localhost:5000/team/img", "registry.example.com:443/a/b/c:tag_1", "python@sha256:" + strings.Repeat("ab", 32),
		"docker.io/library/busybox:1.36@sha256:" + strings.Repeat("0f", 32), "my_org/my__img", "a-b---c/d", "Registry.Example.com/x", "localhost/x", "myhost:5000/x:1"} {
		if msg := ImageProblem(ok); msg != "" {
			t.Errorf("%q refused: %s", ok, msg)
		}
	}
	for _, bad := range []string{"ubuntu 22.04", "Ubuntu", "ghcr.io/Acme/x", "docker://ubuntu", "-img", "img:", "img:-tag", "img@sha256:abc",
		"a/" + strings.Repeat("b", 254), "img\t", "img/", "/img", "img;rm -rf /", "img$(x)", "UPPER/case", "Registry/x"} {
		if ImageProblem(bad) == "" {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRedactFor(t *testing.T) {
	noah := &User{ID: 1, Memberships: []Membership{{Team: "nlp", Role: TeamRoleMember}}}
	nina := &User{ID: 2, Memberships: []Membership{{Team: "nlp", Role: TeamRoleMember}}}
	nadia := &User{ID: 3, Memberships: []Membership{{Team: "nlp", Role: TeamRoleLead}}}
	rosa := &User{ID: 4, Memberships: []Membership{{Team: "recs", Role: TeamRoleLead}}}
	ada := &User{ID: 5, Admin: true}
	finn := &User{ID: 6, Finance: true}
	for _, tt := range []struct {
		who  *User
		sees bool
	}{{noah, true}, {nadia, true}, {ada, true}, {nina, false}, {rosa, false}, {finn, false}, {nil, false}} {
		j := Job{UserID: 1, JobSpec: JobSpec{Team: "nlp", Env: map[string]string{"A": "1"}, SecretEnv: map[string]string{"S": "x"}}, SecretEnvKeys: []string{"S"}}
		j.RedactFor(tt.who)
		if got := j.Env["A"] == "1"; got != tt.sees || j.EnvRedacted == tt.sees || (!tt.sees && j.Env["A"] != Redacted) {
			t.Errorf("%+v: env %v redacted=%v, want seen=%v", tt.who, j.Env, j.EnvRedacted, tt.sees)
		}
		if j.SecretEnv != nil || len(j.SecretEnvKeys) != 1 {
			t.Errorf("%+v: secret env kept: %v", tt.who, j.SecretEnv)
		}
	}
}

func TestSubmissionNeedsAnAccountWhenRequired(t *testing.T) {
	spec := JobSpec{Team: "nlp", Tier: Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}}
	c := SubmitContext{TeamFound: true, Tier: &Tier{ID: Tier3, MaxRuntime: 24 * time.Hour}, MaxGang: map[string]int{"": 8}, RequireAccount: true}
	if f := Fields(ValidateSubmission(&spec, c)); len(f) != 1 || !strings.Contains(f["run_as_user"], "team nlp has no service account") {
		t.Errorf("required, none: %v", f)
	}
	c.Account = "svc-nlp"
	if err := ValidateSubmission(&spec, c); err != nil {
		t.Errorf("with an account: %v", err)
	}
	c.Account, c.RequireAccount = "", false
	if err := ValidateSubmission(&spec, c); err != nil {
		t.Errorf("not required: %v", err)
	}
}
