package sim

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSuite: --suite runs each line as a single run (flags after FILE
// apply to every line), resolves trace paths against --trace-dir, prints
// one ratio table, and reuses cached baselines.
func TestSuite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	suite := filepath.Join(dir, "s.txt")
	body := "# comment\n\nsmall: --trace tiny.csv --teams teams.csv --nodes 3\n--trace tiny.csv --nodes 2 --walltime-factor 3\n"
	if err := os.WriteFile(suite, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	for round := 0; round < 2; round++ {
		var stdout, stderr bytes.Buffer
		code := main([]string{"--suite", suite, "--trace-dir", "testdata", "--baseline-cache", cache, "--domain-nodes", "0"}, &stdout, &stderr, nil)
		if code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
		}
		out := stdout.String()
		for _, want := range []string{"| small ", "| line4 ", "mean/easy", "mean/fifo", "| fifo-partitioned ", "absolute figures", "start-estimate error", "forecast@submit"} {
			if !strings.Contains(out, want) {
				t.Errorf("round %d: stdout lacks %q:\n%s", round, want, out)
			}
		}
		if n := strings.Count(stderr.String(), "suite "); n != 2 {
			t.Errorf("round %d: progress lines %d, want 2:\n%s", round, n, stderr.String())
		}
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 6 {
		t.Errorf("cache holds %d results, want 6 (3 baselines × 2 settings)", len(ents))
	}
	var stderr bytes.Buffer
	if code := main([]string{"--suite", suite, "--trace-dir", "testdata", "--json", "x.json"}, &bytes.Buffer{}, &stderr, nil); code != 2 {
		t.Errorf("--json in a suite: exit %d, want 2", code)
	}
	if code := main([]string{"--suite", filepath.Join(dir, "missing")}, &bytes.Buffer{}, &stderr, nil); code != 2 {
		t.Errorf("missing suite: exit %d, want 2", code)
	}
}

// TestSuiteBadInput: a bad suite file is refused with exit 2 and a message
// that names the file, the line and what is wrong, without the usage text,
// and runs nothing.
func TestSuiteBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct{ body, msg string }{
		{"a: --trace tiny.csv --nodes 2 --bogus 1\n", "line 1: bad flags: flag provided but not defined: -bogus"},
		{"a: --trace tiny.csv --nodes 2\n\na: --trace tiny.csv --nodes 3\n", `line 3: the name "a" is also on line 1`},
		{"a: --trace tiny.csv --nodes 2 --cycle soon\n", `line 1: bad flags: invalid value "soon" for flag -cycle`},
		{"a: --nodes 2\n", "line 1: --trace is required"},
		{"# nothing\n", "no settings"},
	} {
		suite := filepath.Join(dir, "s.txt")
		if err := os.WriteFile(suite, []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		code := main([]string{"--suite", suite, "--trace-dir", "testdata"}, &stdout, &stderr, nil)
		if code != 2 || !strings.Contains(stderr.String(), c.msg) || stdout.Len() != 0 {
			t.Errorf("suite %q: exit %d, stderr %q; want exit 2 and %q", c.body, code, stderr.String(), c.msg)
		}
		if strings.Contains(stderr.String(), "usage:") {
			t.Errorf("suite %q: stderr repeats the usage text:\n%s", c.body, stderr.String())
		}
	}
}
