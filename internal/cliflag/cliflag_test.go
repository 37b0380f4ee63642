package cliflag

import (
	"bytes"
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
