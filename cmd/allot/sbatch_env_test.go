package main

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/cliflag"
)

// readmeBlock is the README's text between <!-- name --> and <!-- /name -->.
func readmeBlock(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start, end := "<!-- "+name+" -->\n", "<!-- /"+name+" -->"
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %s ... %s block", start, end)
	}
	return s[i+len(start) : j]
}

// TestREADMETablesAreGenerated: the README's tables of ALLOT_* variables
// and of sbatch options are what `allot help env` and `allot help sbatch`
// print, so a flag added anywhere is documented (or this fails).
func TestREADMETablesAreGenerated(t *testing.T) {
	for name, want := range map[string]string{"allot help env": envTableMarkdown(), "allot help sbatch": sbatchTableMarkdown()} {
		if got := readmeBlock(t, name); got != want {
			t.Errorf("README.md's %q table is not what `go run ./cmd/allot %s` prints; regenerate it. README:\n%s\nwant:\n%s",
				name, strings.TrimPrefix(name, "allot "), got, want)
		}
	}
}

// TestEnvVariablesMeanOneThing: every command in the usage text has its
// flags recorded, and no variable could set two different flags (a
// command's ALLOT_<CMD>_<FLAG> equal to another flag's ALLOT_<FLAG>), and
// none is one Allot sets in jobs.
func TestEnvVariablesMeanOneThing(t *testing.T) {
	sets := envFlagSets()
	names := map[string]bool{}
	for _, fs := range sets {
		names[cliflag.CommandName(fs)] = true
	}
	for _, want := range []string{"submit", "jobs", "cancel", "token create", "dev", "server", "migrate"} {
		if !names[want] {
			t.Errorf("allot help env misses %q (recorded: %v)", want, names)
		}
	}
	meanings := map[string]map[string]bool{}
	add := func(v, m string) {
		if meanings[v] == nil {
			meanings[v] = map[string]bool{}
		}
		meanings[v][m] = true
	}
	for _, fs := range sets {
		cmd := cliflag.CommandName(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if len(cliflag.EnvNames(cmd, f.Name)) > 0 || len(f.Name) > 1 && f.Name == strings.ToLower(f.Name) {
				add(cliflag.EnvName(cmd, f.Name), cmd+" --"+f.Name)
				if slices.Contains(cliflag.Shared, f.Name) {
					add(cliflag.EnvName("", f.Name), "--"+f.Name)
				}
			}
			for _, v := range cliflag.EnvNames(cmd, f.Name) {
				if cliflag.IsReserved(v) {
					t.Errorf("%s --%s reads the reserved %s", cmd, f.Name, v)
				}
			}
		})
	}
	for v, ms := range meanings {
		if len(ms) > 1 && !cliflag.IsReserved(v) {
			var list []string
			for m := range ms {
				list = append(list, m)
			}
			slices.Sort(list)
			t.Errorf("%s would set %v", v, list)
		}
	}
}
