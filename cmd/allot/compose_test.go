package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestComposeFileIsValid: docker-compose.yml is a valid Compose file under
// every profile (Debian's docker-compose, which .ci/run installs, parses
// and validates it), it has the services the README names, and every
// command its allot services run is an allot command with flags that
// command has.
func TestComposeFileIsValid(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	// The commands: JSON arrays after `command:`, possibly over two lines.
	for _, m := range regexp.MustCompile(`(?ms)^\s*command: (\[.*?\])\s*$`).FindAllStringSubmatch(string(b), -1) {
		var args []string
		if err := json.Unmarshal([]byte(m[1]), &args); err != nil {
			t.Errorf("command %s: %v", m[1], err)
			continue
		}
		if strings.HasPrefix(args[0], "--") { // Prometheus's, not ours
			continue
		}
		if !slices.Contains(usageCommands(), args[0]) {
			t.Errorf("docker-compose.yml runs `allot %s`, which allot does not have", args[0])
			continue
		}
		var out bytes.Buffer
		run([]string{args[0], "-h"}, &out, &out)
		for _, a := range args[1:] {
			if name, ok := strings.CutPrefix(a, "--"); ok {
				name, _, _ = strings.Cut(name, "=")
				if !strings.Contains(out.String(), "-"+name+" ") && !strings.Contains(out.String(), "-"+name+"\n") {
					t.Errorf("docker-compose.yml runs `allot %s --%s`, a flag allot %s -h does not list", args[0], name, args[0])
				}
			}
		}
	}

	dc, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("docker-compose is not installed (.ci/run installs Debian's docker-compose); the file was checked only by the command check above")
	}
	compose := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(dc, append([]string{"-f", "../../docker-compose.yml", "--project-directory", "../.."}, args...)...)
		cmd.Env = append(os.Environ(), "ALLOT_NODE_TOKEN=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("docker-compose %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	all := []string{"--profile", "cli", "--profile", "fake-agent", "--profile", "monitoring"}
	for _, profile := range [][]string{nil, {"--profile", "cli"}, {"--profile", "fake-agent"}, {"--profile", "monitoring"}, all} {
		compose(append(profile, "config", "-q")...)
	}
	profiles := strings.Fields(compose("config", "--profiles"))
	for _, p := range []string{"cli", "fake-agent", "monitoring"} {
		if !slices.Contains(profiles, p) {
			t.Errorf("profiles %v lack %q", profiles, p)
		}
	}
	services := strings.Fields(compose(append(all, "config", "--services")...))
	for _, s := range []string{"postgres", "migrate", "server", "worker", "cli", "fake-agent", "prometheus", "grafana"} {
		if !slices.Contains(services, s) {
			t.Errorf("services %v lack %q", services, s)
		}
	}
}
