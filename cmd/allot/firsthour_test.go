package main

// Tests of what a newcomer hits in the first hour with `allot dev` and the
// CLI: the tokens file, secrets on -h screens, the OIDC provider's address,
// a second dev on the same database, log levels, exit codes of the built
// binary, and the fault-injection folder.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/store/storetest"
)

// devRun is one `allot dev` running in-process.
type devRun struct {
	URL, Token     string // the portal and the engineer's token, as printed
	Stdout, Stderr *syncBuffer
	cancel         context.CancelFunc
	done           chan int
	code           int
	stopped        bool
}

// launchDev starts devMain with args and returns at once.
func launchDev(t *testing.T, args ...string) *devRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &devRun{Stdout: &syncBuffer{}, Stderr: &syncBuffer{}, cancel: cancel, done: make(chan int, 1)}
	go func() { d.done <- devMain(ctx, args, d.Stdout, d.Stderr) }()
	t.Cleanup(func() { d.Stop(t) })
	return d
}

// startDev starts devMain with args and waits until it has printed
// everything it prints at start.
func startDev(t *testing.T, args ...string) *devRun {
	t.Helper()
	d := launchDev(t, args...)
	deadline := time.Now().Add(90 * time.Second) // deadline (real time)
	for !strings.Contains(d.Stdout.String(), "Ctrl-C stops everything") {
		select {
		case code := <-d.done:
			d.code, d.stopped = code, true
			t.Fatalf("allot dev %v exited early with %d:\n%s\n%s", args, code, d.Stdout, d.Stderr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) { // deadline (real time)
			t.Fatalf("allot dev %v did not finish starting:\n%s\n%s", args, d.Stdout, d.Stderr)
		}
	}
	out := d.Stdout.String()
	if m := regexp.MustCompile(`Allot is running at (http://\S+)`).FindStringSubmatch(out); m != nil {
		d.URL = m[1]
	}
	if m := regexp.MustCompile(`(?m)^\s+engineer\s+\S+\s+(allot_\S+)`).FindStringSubmatch(out); m != nil {
		d.Token = m[1]
	}
	if d.URL == "" || d.Token == "" {
		t.Fatalf("no URL or engineer token printed:\n%s", out)
	}
	return d
}

// Wait waits for devMain to return (at most a minute) and gives its code.
func (d *devRun) Wait(t *testing.T) int {
	t.Helper()
	if d.stopped {
		return d.code
	}
	select {
	case d.code = <-d.done:
		d.stopped = true
	case <-time.After(time.Minute):
		t.Fatalf("allot dev did not exit:\n%s\n%s", d.Stdout, d.Stderr)
	}
	return d.code
}

// Stop cancels devMain's context and waits for it to return.
func (d *devRun) Stop(t *testing.T) int {
	t.Helper()
	d.cancel()
	return d.Wait(t)
}

// devArgs are the flags of a dev instance of its own for a test: its own
// database, state directory and port.
func devArgs(t *testing.T, extra ...string) (args []string, stateDir string) {
	t.Helper()
	stateDir = t.TempDir()
	return append([]string{"--addr", "127.0.0.1:0", "--database-url", storetest.URL(t), "--data-dir", filepath.Join(stateDir, "pgdata")}, extra...), stateDir
}

func apiStatus(t *testing.T, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/api/v1/me", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// cleanEnv is the environment without ALLOT_* and DATABASE_URL.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ALLOT_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	return env
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestDevTokensEnvExportsAndBuiltCLI: `. .allot/tokens.env` exports
// ALLOT_TOKEN and ALLOT_URL, so the built CLI then works without flags; the
// built binary exits 2 on bad flags and usage, 1 when the server refuses.
func TestDevTokensEnvExportsAndBuiltCLI(t *testing.T) {
	t.Parallel()
	binDir := t.TempDir()
	built := make(chan string, 1)
	go func() {
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, "allot"), ".")
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
		out, err := cmd.CombinedOutput()
		if err != nil {
			built <- fmt.Sprintf("go build: %v\n%s", err, out)
			return
		}
		built <- ""
	}()
	args, stateDir := devArgs(t, "--no-agents", "--no-oidc")
	d := startDev(t, args...)
	envFile := filepath.Join(stateDir, "tokens.env")
	if !strings.Contains(d.Stdout.String(), "`. "+envFile+"` exports them") {
		t.Errorf("dev does not say how to use %s:\n%s", envFile, d.Stdout)
	}
	b, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(l, "export ALLOT_") {
			t.Errorf("tokens.env line %q is not an export", l)
		}
	}
	cmd := exec.Command("sh", "-c", `. "$1"; env`, "sh", envFile)
	cmd.Env = cleanEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sourcing %s: %v", envFile, err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	if env["ALLOT_TOKEN"] != d.Token || env["ALLOT_URL"] != d.URL || !strings.HasPrefix(env["ALLOT_TOKEN_LEAD"], "allot_") {
		t.Fatalf("after `. tokens.env` the environment has ALLOT_TOKEN=%q ALLOT_URL=%q ALLOT_TOKEN_LEAD=%q; want %q and %q",
			env["ALLOT_TOKEN"], env["ALLOT_URL"], env["ALLOT_TOKEN_LEAD"], d.Token, d.URL)
	}

	if msg := <-built; msg != "" {
		t.Fatal(msg)
	}
	bin := filepath.Join(binDir, "allot")
	run := func(script string) (string, int) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script, "sh", envFile, bin)
		cmd.Env = cleanEnv()
		out, err := cmd.CombinedOutput()
		return string(out), exitCode(err)
	}
	if out, code := run(`. "$1" && "$2" jobs --limit 5`); code != 0 || !strings.Contains(out, "STATE") {
		t.Fatalf("`. tokens.env && allot jobs`: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		script string
		want   int
		say    string
	}{
		{`"$2" jobs --bogus`, 2, "flag provided but not defined"},
		{`"$2" submit --team nlp -- true`, 2, "--time is required"},
		{`. "$1" && "$2" cancel not-a-job`, 2, "is not a job id"},
		{`. "$1" && "$2" frobnicate`, 2, "unknown command"},
		{`. "$1" && "$2" jobs --token allot_not-a-token`, 1, "allot jobs:"},
		{`. "$1" && "$2" submit --team nlp --tier 3 --gpus 100000 --time 1h -- true`, 1, "gpus"},
		{`. "$1" && ALLOT_TOKEN=$ALLOT_TOKEN_FINANCE "$2" cancel 999999`, 1, "allot cancel:"},
	} {
		out, code := run(c.script)
		if code != c.want || !strings.Contains(out, c.say) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", c.script, code, c.want, c.say, out)
		}
	}
}

// TestHelpNeverPrintsSecrets runs every subcommand's -h (and the usage
// screens of bad calls) with secrets in the environment: the screens say
// where a default comes from, never what it is.
func TestHelpNeverPrintsSecrets(t *testing.T) {
	secrets := map[string]string{
		"ALLOT_TOKEN":              "allot_secret-api-token-value",
		"ALLOT_NODE_TOKEN":         "allotn_secret-node-token-value",
		"ALLOT_OIDC_CLIENT_SECRET": "secret-oidc-client-secret",
		"DATABASE_URL":             "postgres://allot:secret-db-password@127.0.0.1:1/allot",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	t.Setenv("ALLOT_URL", "http://127.0.0.1:1")
	calls := [][]string{
		nil, {"help"}, {"nope"},
		{"dev", "-h"}, {"server", "-h"}, {"worker", "-h"}, {"migrate", "-h"}, {"agent", "-h"}, {"sim", "-h"},
		{"test-env", "-h"}, {"oidc-provider", "-h"},
		{"node-token"}, {"node-token", "create", "-h"}, {"node-token", "create", "gpu01", "-h"},
		{"node", "-h"}, {"node"}, {"node", "list", "--bogus"},
		{"token"}, {"token", "create", "-h"}, {"token", "list", "-h"}, {"token", "revoke", "-h"}, {"token", "revoke"},
		{"submit", "-h"}, {"submit", "--bogus"}, {"submit"},
		{"jobs", "-h"}, {"jobs", "--bogus"}, {"cancel", "-h"}, {"cancel"},
	}
	for _, args := range calls {
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		for k, v := range secrets {
			secret := v
			if k == "DATABASE_URL" {
				secret = "secret-db-password"
			}
			if strings.Contains(out, secret) {
				t.Errorf("allot %s (exit %d) prints %s:\n%s", strings.Join(args, " "), code, k, out)
			}
		}
		if len(args) == 2 && args[1] == "-h" && out == "" {
			t.Errorf("allot %s printed nothing", strings.Join(args, " "))
		}
	}
	// The token flags still say where their default comes from.
	for _, args := range [][]string{{"submit", "-h"}, {"jobs", "-h"}, {"cancel", "-h"}, {"token", "list", "-h"}, {"node", "-h"}} {
		var out bytes.Buffer
		run(args, &out, &out)
		if !strings.Contains(out.String(), "(default: env ALLOT_TOKEN, set)") {
			t.Errorf("allot %s does not say the token comes from ALLOT_TOKEN:\n%s", strings.Join(args, " "), out.String())
		}
	}
	var out bytes.Buffer
	run([]string{"agent", "-h"}, &out, &out)
	if !strings.Contains(out.String(), "(default: env ALLOT_NODE_TOKEN, set)") {
		t.Errorf("allot agent -h does not say the token comes from ALLOT_NODE_TOKEN:\n%s", out.String())
	}
	t.Setenv("ALLOT_TOKEN", "")
	out.Reset()
	run([]string{"jobs", "-h"}, &out, &out)
	if !strings.Contains(out.String(), "(default: env ALLOT_TOKEN, unset)") {
		t.Errorf("allot jobs -h without ALLOT_TOKEN:\n%s", out.String())
	}
}

// TestDevOIDCAddr: --oidc-addr places the development OIDC provider; a
// taken default moves to a free port and says so on the console; a taken
// address given with --oidc-addr stops allot dev with a clear message.
// Not parallel: it changes the default address.
func TestDevOIDCAddr(t *testing.T) {
	for in, want := range map[string]string{":8081": "127.0.0.1:8081", "127.0.0.1:9": "127.0.0.1:9", "localhost:0": "localhost:0", "[::1]:8081": "[::1]:8081"} {
		if got, err := devOIDCAddr(in); err != nil || got != want {
			t.Errorf("devOIDCAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"8081", "0.0.0.0:8081", "example.com:8081", "127.0.0.1:http", "127.0.0.1:99999"} {
		if _, err := devOIDCAddr(in); err == nil {
			t.Errorf("devOIDCAddr(%q): no error", in)
		}
	}
	var stderr bytes.Buffer
	if code := devMain(context.Background(), []string{"--oidc-addr", "0.0.0.0:8081"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "this machine only") {
		t.Errorf("--oidc-addr 0.0.0.0:8081: exit %d\n%s", code, stderr.String())
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	issuerRE := regexp.MustCompile(`development OIDC provider at (http://\S+):`)

	// The default is taken: it moves, and says where.
	old := defaultDevOIDCAddr
	defaultDevOIDCAddr = addr
	t.Cleanup(func() { defaultDevOIDCAddr = old })
	args, _ := devArgs(t, "--no-agents")
	d := startDev(t, args...)
	m := issuerRE.FindStringSubmatch(d.Stdout.String())
	if m == nil || m[1] == "http://"+addr {
		t.Fatalf("issuer: %v\n%s", m, d.Stdout)
	}
	moved := addr + " is taken, so the development OIDC provider listens on " + strings.TrimPrefix(m[1], "http://")
	if !strings.Contains(d.Stdout.String(), moved) || !strings.Contains(d.Stderr.String(), moved) {
		t.Errorf("the move is not said (%q) on stdout and the log:\n%s\n%s", moved, d.Stdout, d.Stderr)
	}
	resp, err := http.Get(m[1] + "/.well-known/openid-configuration")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("moved provider: %v %v", resp, err)
	}
	resp.Body.Close()
	if code := d.Stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	defaultDevOIDCAddr = old

	// Given with --oidc-addr and taken: a clear error, exit 1.
	args, _ = devArgs(t, "--no-agents", "--oidc-addr", addr)
	d = launchDev(t, args...)
	if code := d.Wait(t); code != 1 || !strings.Contains(d.Stderr.String(), "cannot listen on --oidc-addr "+addr) ||
		!strings.Contains(d.Stderr.String(), "address already in use") {
		t.Errorf("taken --oidc-addr: exit %d\n%s", code, d.Stderr)
	}

	// Given with --oidc-addr and free: used as is.
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	freeAddr := free.Addr().String()
	free.Close()
	args, _ = devArgs(t, "--no-agents", "--oidc-addr", freeAddr)
	d = startDev(t, args...)
	if m := issuerRE.FindStringSubmatch(d.Stdout.String()); m == nil || m[1] != "http://"+freeAddr || strings.Contains(d.Stdout.String(), "is taken") {
		t.Errorf("--oidc-addr %s: issuer %v\n%s", freeAddr, m, d.Stdout)
	}
}

// TestDevRefusesSecondInstanceOnSameDatabase: a second allot dev on the
// database of a running one stops with a clear message, and the first
// one's tokens keep working; once the first stops, the second starts.
func TestDevRefusesSecondInstanceOnSameDatabase(t *testing.T) {
	t.Parallel()
	dbURL := storetest.URL(t)
	common := []string{"--addr", "127.0.0.1:0", "--database-url", dbURL, "--oidc-addr", "127.0.0.1:0", "--no-agents"}
	first := startDev(t, slices.Concat(common, []string{"--data-dir", filepath.Join(t.TempDir(), "pgdata")})...)
	secondArgs := slices.Concat(common, []string{"--data-dir", filepath.Join(t.TempDir(), "pgdata")})
	second := launchDev(t, secondArgs...)
	if code := second.Wait(t); code != 1 {
		t.Fatalf("second allot dev: exit %d, want 1\n%s\n%s", code, second.Stdout, second.Stderr)
	}
	msg := second.Stderr.String()
	for _, want := range []string{"another allot dev", "at " + first.URL, "would revoke its persona tokens", "stop that one", "--database-url"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(second.Stdout.String(), "allot_") {
		t.Errorf("the refused instance printed tokens:\n%s", second.Stdout)
	}
	if code := apiStatus(t, first.URL, first.Token); code != 200 {
		t.Fatalf("the first instance's engineer token: %d after a second start", code)
	}
	if code := first.Stop(t); code != 0 {
		t.Fatalf("first allot dev: exit %d", code)
	}
	again := startDev(t, secondArgs...)
	if code := apiStatus(t, again.URL, again.Token); code != 200 {
		t.Fatalf("second instance after the first stopped: %d", code)
	}
}

// TestDevLogLevel: --log-level parses, a bad value exits 2 with a clear
// message, and River's own routine lines appear only at debug.
func TestDevLogLevel(t *testing.T) {
	t.Parallel()
	for _, cmd := range [][]string{{"dev"}, {"server"}, {"worker"}} {
		var stderr bytes.Buffer
		code := run(append(cmd, "--log-level", "loud"), io.Discard, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), `invalid value "loud" for flag -log-level: want debug, info, warn or error`) {
			t.Errorf("allot %s --log-level loud: exit %d\n%s", cmd[0], code, stderr.String())
		}
	}
	quietArgs, _ := devArgs(t, "--no-agents", "--no-oidc")
	loudArgs, _ := devArgs(t, "--no-agents", "--no-oidc", "--log-level", "DEBUG")
	quiet, loud := launchDev(t, quietArgs...), launchDev(t, loudArgs...)
	for _, d := range []*devRun{quiet, loud} {
		deadline := time.Now().Add(90 * time.Second)                                                         // deadline (real time)
		for !strings.Contains(d.Stdout.String(), "Ctrl-C stops everything") && time.Now().Before(deadline) { // deadline (real time)
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !strings.Contains(loud.Stderr.String(), "River client started") {
		t.Errorf("--log-level debug: no River line:\n%.3000s", loud.Stderr)
	}
	if s := quiet.Stderr.String(); strings.Contains(s, "River client started") || !strings.Contains(s, "level=INFO") {
		t.Errorf("default level: River lines, or none of Allot's info lines:\n%.3000s", s)
	}
}

// TestDevFaultsFolderPerInstance: each allot dev has its own folder of
// injected GPU faults, next to its data directory, and says where it is.
func TestDevFaultsFolderPerInstance(t *testing.T) {
	t.Parallel()
	faultRE := regexp.MustCompile(`> (\S+)/gpu03\.json`)
	var dirs []string
	for i := 0; i < 2; i++ {
		args, stateDir := devArgs(t, "--no-oidc")
		d := startDev(t, args...)
		m := faultRE.FindStringSubmatch(d.Stdout.String())
		if m == nil {
			t.Fatalf("instance %d does not say where faults go:\n%s", i, d.Stdout)
		}
		if want := filepath.Join(stateDir, "faults"); m[1] != want {
			t.Errorf("instance %d: faults in %s, want %s", i, m[1], want)
		}
		if fi, err := os.Stat(m[1]); err != nil || !fi.IsDir() {
			t.Errorf("faults folder %s: %v", m[1], err)
		}
		dirs = append(dirs, m[1])
	}
	if dirs[0] == dirs[1] {
		t.Fatalf("two instances share the faults folder %s", dirs[0])
	}
	if devFaultFile(dirs[0], "gpu03") != filepath.Join(dirs[0], "gpu03.json") || devFaultFile("", "gpu03") != "" {
		t.Errorf("devFaultFile")
	}
}
