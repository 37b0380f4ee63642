package cliflag

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
)

func TestSecretNeverShowsItsValue(t *testing.T) {
	t.Setenv("CLIFLAG_TEST_TOKEN", "s3cret-value")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	tok := Secret(fs, "token", "CLIFLAG_TEST_TOKEN", "API `token`")
	if err := fs.Parse([]string{"-h"}); err != flag.ErrHelp {
		t.Fatal(err)
	}
	if s := out.String(); strings.Contains(s, "s3cret") || !strings.Contains(s, "-token token") || !strings.Contains(s, "(default: env CLIFLAG_TEST_TOKEN, set)") {
		t.Errorf("usage:\n%s", s)
	}
	if tok() != "s3cret-value" {
		t.Errorf("default = %q", tok())
	}
	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	tok = Secret(fs, "token", "CLIFLAG_TEST_TOKEN", "API `token`")
	if err := fs.Parse([]string{"--token", "given"}); err != nil || tok() != "given" {
		t.Errorf("--token given: %q, %v", tok(), err)
	}
	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	tok = Secret(fs, "token", "CLIFLAG_TEST_TOKEN", "API `token`")
	if err := fs.Parse([]string{"--token="}); err != nil || tok() != "" {
		t.Errorf("--token= (explicitly empty): %q, %v", tok(), err)
	}
}

func TestLogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "warn": slog.LevelWarn, "warning": slog.LevelWarn, "Error": slog.LevelError} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		l := LogLevel(fs, slog.LevelInfo, "log level")
		if err := fs.Parse([]string{"--log-level", in}); err != nil || l.Level != want {
			t.Errorf("--log-level %s: %v, %v", in, l.Level, err)
		}
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l := LogLevel(fs, slog.LevelWarn, "log level")
	if l.Level != slog.LevelWarn || l.String() != "warn" {
		t.Errorf("default: %v", l)
	}
	for _, bad := range []string{"loud", "", "INFO+2", "3"} {
		if err := fs.Parse([]string{"--log-level", bad}); err == nil || !strings.Contains(err.Error(), "want debug, info, warn or error") {
			t.Errorf("--log-level %q: %v", bad, err)
		}
	}
}

func TestParseReadsTheEnvironment(t *testing.T) {
	newSet := func() (*flag.FlagSet, *string, *int, *bool, *bytes.Buffer) {
		fs := flag.NewFlagSet("submit", flag.ContinueOnError)
		var out bytes.Buffer
		fs.SetOutput(&out)
		gpuType := fs.String("gpu-type", "any", "GPU type")
		gpus := fs.Int("gpus", 1, "GPUs")
		pre := fs.Bool("preemptible", false, "preemptible")
		fs.String("team", "", "team")
		fs.String("server", "http://default", "server")
		return fs, gpuType, gpus, pre, &out
	}
	// Default, then ALLOT_<CMD>_<FLAG>, then the command line.
	fs, typ, gpus, pre, _ := newSet()
	if err := Parse(fs, nil); err != nil || *typ != "any" || *gpus != 1 || *pre {
		t.Fatalf("defaults: %q %d %v %v", *typ, *gpus, *pre, err)
	}
	t.Setenv("ALLOT_GPU_TYPE", "T4") // not a shared flag: not read
	t.Setenv("ALLOT_SUBMIT_GPUS", "4")
	t.Setenv("ALLOT_SUBMIT_PREEMPTIBLE", "true")
	fs, typ, gpus, pre, _ = newSet()
	fromEnv, err := ParseEnv(fs, []string{"rest"})
	if err != nil || *typ != "any" || *gpus != 4 || !*pre || fs.Arg(0) != "rest" || fromEnv["gpus"] != "ALLOT_SUBMIT_GPUS" || fromEnv["gpu-type"] != "" {
		t.Fatalf("ALLOT_SUBMIT_<FLAG>: %q %d %v %v %v", *typ, *gpus, *pre, fromEnv, err)
	}
	t.Setenv("ALLOT_SUBMIT_GPU_TYPE", "H100")
	t.Setenv("ALLOT_SUBMIT_GPUS", "") // empty is unset
	fs, typ, gpus, _, _ = newSet()
	if err := Parse(fs, nil); err != nil || *typ != "H100" || *gpus != 1 {
		t.Fatalf("ALLOT_SUBMIT_GPU_TYPE: %q %d %v", *typ, *gpus, err)
	}
	fs, typ, gpus, pre, _ = newSet()
	if err := Parse(fs, []string{"--gpu-type", "A100", "--gpus=8", "--preemptible=false"}); err != nil || *typ != "A100" || *gpus != 8 || *pre {
		t.Fatalf("the command line wins: %q %d %v %v", *typ, *gpus, *pre, err)
	}
	// A shared flag: ALLOT_<CMD>_SERVER, then ALLOT_SERVER.
	t.Setenv("ALLOT_SERVER", "http://shared")
	fs, _, _, _, _ = newSet()
	if err := Parse(fs, nil); err != nil || fs.Lookup("server").Value.String() != "http://shared" {
		t.Fatalf("ALLOT_SERVER: %v %v", fs.Lookup("server").Value, err)
	}
	t.Setenv("ALLOT_SUBMIT_SERVER", "http://submit")
	fs, _, _, _, _ = newSet()
	if err := Parse(fs, nil); err != nil || fs.Lookup("server").Value.String() != "http://submit" {
		t.Fatalf("ALLOT_SUBMIT_SERVER: %v %v", fs.Lookup("server").Value, err)
	}
	// Another command does not read ALLOT_SUBMIT_*.
	other := flag.NewFlagSet("jobs", flag.ContinueOnError)
	otype := other.String("gpu-type", "", "")
	oserver := other.String("server", "", "")
	if err := Parse(other, nil); err != nil || *otype != "" || *oserver != "http://shared" {
		t.Fatalf("jobs: --gpu-type %q --server %q %v", *otype, *oserver, err)
	}
	// A job's own variables are not inputs: ALLOT_TEAM is the job's team.
	t.Setenv("ALLOT_TEAM", "nlp")
	fs, _, _, _, _ = newSet()
	if err := Parse(fs, nil); err != nil || fs.Lookup("team").Value.String() != "" {
		t.Fatalf("ALLOT_TEAM was read: %q %v", fs.Lookup("team").Value, err)
	}
	t.Setenv("ALLOT_SUBMIT_TEAM", "recs")
	fs, _, _, _, _ = newSet()
	if err := Parse(fs, nil); err != nil || fs.Lookup("team").Value.String() != "recs" {
		t.Fatalf("ALLOT_SUBMIT_TEAM: %q %v", fs.Lookup("team").Value, err)
	}
	// A bad value is an error naming the variable.
	t.Setenv("ALLOT_SUBMIT_GPUS", "eight")
	fs, _, _, _, out := newSet()
	if err := Parse(fs, nil); err == nil || !errors.Is(err, ErrEnv) || !strings.Contains(err.Error(), `$ALLOT_SUBMIT_GPUS="eight" for --gpus`) ||
		!strings.Contains(out.String(), "ALLOT_SUBMIT_GPUS") {
		t.Fatalf("bad value: %v / %q", err, out.String())
	}
	// ... unless the command line sets the flag.
	fs, _, gpus, _, _ = newSet()
	if err := Parse(fs, []string{"--gpus", "2"}); err != nil || *gpus != 2 {
		t.Fatalf("command line over a bad variable: %d %v", *gpus, err)
	}
	// -h names the variables.
	fs, _, _, _, out = newSet()
	if err := Parse(fs, []string{"-h"}); err != flag.ErrHelp || !strings.Contains(out.String(), "ALLOT_SUBMIT_<FLAG> (e.g. --gpu-type: ALLOT_SUBMIT_GPU_TYPE)") {
		t.Fatalf("-h: %v\n%s", err, out.String())
	}
}

func TestSecretFromTheEnvironmentIsNotPrinted(t *testing.T) {
	t.Setenv("CLIFLAG_TEST_TOKEN2", "")
	t.Setenv("ALLOT_X_TOKEN", "from-env")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	tok := Secret(fs, "token", "CLIFLAG_TEST_TOKEN2", "API `token`")
	if err := Parse(fs, nil); err != nil || tok() != "from-env" {
		t.Fatalf("token = %q %v", tok(), err)
	}
	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.Int("api-token-ttl-days", 0, "")
	t.Setenv("ALLOT_X_API_TOKEN_TTL_DAYS", "s3cret")
	if err := Parse(fs, nil); err == nil || strings.Contains(err.Error()+out.String(), "s3cret") {
		t.Fatalf("a sensitive flag's bad value was repeated: %v %s", err, out.String())
	}
}

func TestRecordAndEnvTable(t *testing.T) {
	cmds := map[string]func(args []string) int{
		"submit": func(args []string) int {
			fs := flag.NewFlagSet("submit", flag.ContinueOnError)
			fs.String("team", "", "team to submit for (required)")
			fs.String("gpu-type", "", "GPU `type`; e.g. T4")
			fs.String("J", "", "short alias")
			fs.String("server", "", "server (env ALLOT_URL)")
			if err := Parse(fs, args); err != nil {
				return 2
			}
			t.Error("Record ran the command")
			return 0
		},
		"token create": func(args []string) int {
			fs := flag.NewFlagSet("allot token create", flag.ContinueOnError)
			fs.String("name", "", "token name. More")
			fs.String("server", "", "server (env ALLOT_URL)")
			fs.String("Format", "", "capital")
			return map[bool]int{true: 2}[Parse(fs, args) != nil]
		},
		"plain": func(args []string) int { // the flag package's own Parse: stops at -h
			fs := flag.NewFlagSet("plain", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			if fs.Parse(args) == nil {
				t.Error("a command that does not use cliflag.Parse ran")
			}
			return 2
		},
	}
	var sets []*flag.FlagSet
	for _, c := range []string{"submit", "token create", "plain"} {
		fs := Record(func(args []string) { cmds[c](args) })
		if fs == nil {
			if c != "plain" {
				t.Fatalf("%s: nothing recorded", c)
			}
			continue
		}
		sets = append(sets, fs)
	}
	got := EnvTable(sets)
	want := "| Command | Variables |\n|---|---|\n" +
		"| every command with the flag | `ALLOT_SERVER` |\n" +
		"| `allot submit` | `ALLOT_SUBMIT_GPU_TYPE`, `ALLOT_SUBMIT_SERVER`, `ALLOT_SUBMIT_TEAM` |\n" +
		"| `allot token create` | `ALLOT_TOKEN_CREATE_NAME`, `ALLOT_TOKEN_CREATE_SERVER` |\n" +
		"| older variables, read as a flag's default (the variables above win) | `ALLOT_URL` (--server) |\n"
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if n := EnvNames("node", "token"); len(n) != 1 || n[0] != "ALLOT_TOKEN" {
		t.Errorf("node --token reads %v (ALLOT_NODE_TOKEN is the agent's)", n)
	}
}
