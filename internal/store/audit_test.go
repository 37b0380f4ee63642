package store_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

func TestChangePolicyVersionsAndAudits(t *testing.T) {
	b := setup(t)
	before, err := b.st.CurrentPolicy(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(before.HealthRules) == 0 || before.BurstMaxNodes != 4 {
		t.Fatalf("seeded policy lacks health rules or burst cap: %+v", before)
	}
	e, err := b.st.ChangePolicy(b.ctx, store.PolicyChange{Actor: "ada@example.com", Action: "policy.update", Object: "policy:weights", Note: "age matters more"},
		func(_ *store.Store, p *allot.Policy) (any, any, error) {
			old := p.WeightAge
			p.WeightAge = 900
			return map[string]int{"weight_age": old}, map[string]int{"weight_age": 900}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	after, err := b.st.CurrentPolicy(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Version != before.Version+1 || after.WeightAge != 900 || after.CreatedBy != "ada@example.com" || e.PolicyVersion != after.Version {
		t.Errorf("new version %d (was %d), weight %d, by %q, audit names %d", after.Version, before.Version, after.WeightAge, after.CreatedBy, e.PolicyVersion)
	}
	if len(after.HealthRules) != len(before.HealthRules) {
		t.Errorf("health rules not carried to the new version: %d → %d", len(before.HealthRules), len(after.HealthRules))
	}
	log, err := b.st.AuditLog(b.ctx, store.AuditFilter{Action: "policy."})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]int
	if len(log) != 1 || json.Unmarshal(log[0].After, &got) != nil || got["weight_age"] != 900 || log[0].Note != "age matters more" {
		t.Fatalf("audit log: %+v", log)
	}

	// A failing change leaves neither a version nor an entry; so does an
	// invalid policy.
	boom := errors.New("boom")
	if _, err := b.st.ChangePolicy(b.ctx, store.PolicyChange{Actor: "ada@example.com", Action: "policy.update", Object: "policy:weights"},
		func(*store.Store, *allot.Policy) (any, any, error) { return nil, nil, boom }); !errors.Is(err, boom) {
		t.Errorf("failing change: %v", err)
	}
	if _, err := b.st.ChangePolicy(b.ctx, store.PolicyChange{Actor: "ada@example.com", Action: "policy.update", Object: "policy:weights"},
		func(_ *store.Store, p *allot.Policy) (any, any, error) { p.WeightAge = -1; return nil, nil, nil }); allot.ErrorCode(err) != allot.EInvalid {
		t.Errorf("invalid policy: %v", err)
	}
	if n := b.count(t, "audit_log"); n != 1 {
		t.Errorf("audit rows after refused changes: %d", n)
	}
	if p, _ := b.st.CurrentPolicy(b.ctx); p.Version != after.Version {
		t.Errorf("refused changes made version %d", p.Version)
	}
}
