package store_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// TestSetNodeInventory: an admin declares a node again (type and count);
// bad input is a field error, a node with GPUs allocated is refused (its
// jobs were placed and are billed by its type), and nothing changes in
// either case; the change is audited once, and again is no change.
func TestSetNodeInventory(t *testing.T) {
	b := setup(t)
	var gpuType string
	var gpus int
	declared := func(node string) string {
		t.Helper()
		if err := b.pool.QueryRow(b.ctx, `SELECT gpu_type, coalesce(declared_gpus, gpu_count) FROM nodes WHERE name = $1`, node).Scan(&gpuType, &gpus); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%s × %d", gpuType, gpus)
	}
	before := declared("gpu15")
	for _, tt := range []struct {
		name, node, gpuType string
		gpus                int
		code, field         string
	}{
		{"unknown type", "gpu15", "B300", 8, "", "gpu_type"},
		{"no type", "gpu15", "", 8, "", "gpu_type"},
		{"no GPUs", "gpu15", "A100-80GB", 0, "", "gpus"},
		{"too many GPUs", "gpu15", "A100-80GB", 65, "", "gpus"},
		{"unknown node", "gpu99", "A100-80GB", 8, allot.ENotFound, ""},
	} {
		_, err := b.st.SetNodeInventory(b.ctx, "ada@example.com", tt.node, tt.gpuType, tt.gpus, "")
		if tt.field != "" && allot.Fields(err)[tt.field] == "" || tt.code != "" && allot.ErrorCode(err) != tt.code {
			t.Errorf("%s: %v, want %s%s", tt.name, err, tt.code, tt.field)
		}
	}

	// A node with a job on it.
	noah := b.user(t, "noah@example.com")
	j, err := b.st.SubmitJob(b.ctx, noah, allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 2, TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE nodes SET state = 'up', registered_at = $1, last_heartbeat = $1 WHERE name = 'gpu16'`, b.now); err != nil {
		t.Fatal(err)
	}
	if err := b.st.InTx(b.ctx, func(tx *store.Store) error {
		_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{{JobID: j.ID, RunAs: allot.Tier3, Parts: []store.LeasePart{{Node: "gpu16", GPUs: []int{0, 1}, Env: map[string]string{}}}}}, nil, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	busy := declared("gpu16")
	if _, err := b.st.SetNodeInventory(b.ctx, "ada@example.com", "gpu16", "A100-80GB", 8, ""); allot.ErrorCode(err) != allot.EConflict || !strings.Contains(err.Error(), "drain it") {
		t.Errorf("a node with GPUs allocated: %v, want a conflict saying to drain it", err)
	}
	if declared("gpu16") != busy || declared("gpu15") != before {
		t.Fatal("a refused declaration changed a node")
	}
	audits := b.count(t, "audit_log")

	changed, err := b.st.SetNodeInventory(b.ctx, "ada@example.com", "gpu15", "A100-80GB", 4, "the T4s went to the lab")
	if err != nil || !changed {
		t.Fatalf("SetNodeInventory = %v, %v", changed, err)
	}
	if d := declared("gpu15"); d != "A100-80GB × 4" {
		t.Errorf("gpu15 declared as %s, want A100-80GB × 4", d)
	}
	var action, note string
	if err := b.pool.QueryRow(b.ctx, `SELECT action, note FROM audit_log ORDER BY id DESC LIMIT 1`).Scan(&action, &note); err != nil || action != "node.inventory" || note != "the T4s went to the lab" {
		t.Errorf("audit: %q %q %v", action, note, err)
	}
	// A registered node whose agent differs: declared again as what it
	// registered, its note goes.
	inv := store.NodeInventory{Hostname: "gpu14", Backend: "fake"}
	for i := range 4 {
		inv.GPUs = append(inv.GPUs, store.NodeGPU{Index: i, UUID: fmt.Sprintf("GPU-14-%d", i), Model: "NVIDIA A100-PCIE-40GB", MemoryMiB: 40960})
	}
	if _, err := b.st.RegisterNode(b.ctx, "gpu14", inv); err != nil {
		t.Fatal(err)
	}
	if note, err := b.st.InventoryNoteOf(b.ctx, "gpu14"); err != nil || note == "" {
		t.Fatalf("gpu14's note after registering other GPUs: %q %v", note, err)
	}
	if _, err := b.st.CreateGPUTypeAudited(b.ctx, store.PolicyChange{Actor: "ada@example.com"},
		allot.GPUType{Name: "A100-40GB", MemoryGB: 40, HourlyRate: allot.Money{Micros: 2_100_000, Currency: "USD"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.SetNodeInventory(b.ctx, "ada@example.com", "gpu14", "A100-40GB", 4, ""); err != nil {
		t.Fatal(err)
	}
	if note, err := b.st.InventoryNoteOf(b.ctx, "gpu14"); err != nil || note != "" {
		t.Errorf("gpu14's note after it was declared as what it registered: %q %v", note, err)
	}
	audits = b.count(t, "audit_log")
	if changed, err := b.st.SetNodeInventory(b.ctx, "ada@example.com", "gpu15", "A100-80GB", 4, ""); err != nil || changed {
		t.Errorf("the same again: changed %v, %v", changed, err)
	}
	if n := b.count(t, "audit_log"); n != audits {
		t.Errorf("audit entries %d → %d after no change", audits, n)
	}
}
