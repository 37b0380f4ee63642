// Package cliflag has the flag helpers the allot subcommands share.
package cliflag

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// secret is a string flag whose value is never printed: usage and -h
// screens show where the default comes from, not what it is.
type secret struct {
	value string
	set   bool
}

func (s *secret) String() string     { return "" }
func (s *secret) Set(v string) error { s.value, s.set = v, true; return nil }

// Secret registers a string flag that defaults to the environment variable
// env and returns a function that gives its value after parsing. The -h
// screen says "(default: env ENV, set)" or "(env ENV, unset)" and never
// the value itself.
func Secret(fs *flag.FlagSet, name, env, usage string) func() string {
	s := &secret{}
	state := "unset"
	if os.Getenv(env) != "" {
		state = "set"
	}
	fs.Var(s, name, fmt.Sprintf("%s (default: env %s, %s)", usage, env, state))
	return func() string {
		if s.set {
			return s.value
		}
		return os.Getenv(env)
	}
}

// Level is a log level flag: debug, info, warn or error.
type Level struct{ slog.Level }

// Set parses debug, info, warn (warning) or error, in any case.
func (l *Level) Set(v string) error {
	switch strings.ToLower(v) {
	case "debug":
		l.Level = slog.LevelDebug
	case "info":
		l.Level = slog.LevelInfo
	case "warn", "warning":
		l.Level = slog.LevelWarn
	case "error":
		l.Level = slog.LevelError
	default:
		return fmt.Errorf("want debug, info, warn or error")
	}
	return nil
}

func (l *Level) String() string {
	if l == nil {
		return ""
	}
	return strings.ToLower(l.Level.String())
}

// LogLevel registers --log-level with the default def.
func LogLevel(fs *flag.FlagSet, def slog.Level, usage string) *Level {
	l := &Level{def}
	fs.Var(l, "log-level", usage)
	return l
}
