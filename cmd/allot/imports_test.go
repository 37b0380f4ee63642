package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportGuards keeps the layers apart: the domain, the wire protocol and
// the scheduler core depend on the standard library only, and the node agent
// never links the database, the web framework, templates or River.
func TestImportGuards(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	deps := func(pkg string) []string {
		cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg)
		cmd.Dir = "../.."
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		return strings.Fields(string(out))
	}
	const mod = "github.com/allotlabs/allot/"
	for _, pkg := range []string{"internal/allot", "internal/agentproto", "internal/scheduler"} {
		for _, d := range deps("./" + pkg) {
			if d != mod+pkg && !strings.HasPrefix(d, mod+"internal/allot") {
				t.Errorf("%s must use the standard library only, but imports %s", pkg, d)
			}
		}
	}
	for _, d := range deps("./internal/agent") {
		for _, bad := range []string{"github.com/jackc/pgx", "github.com/labstack/echo", "github.com/a-h/templ", "github.com/riverqueue/river", mod + "internal/store", mod + "web"} {
			if strings.HasPrefix(d, bad) {
				t.Errorf("the agent must not import %s (via %s)", bad, d)
			}
		}
	}
}
