package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/allotlabs/allot/internal/client"
)

type envFlag map[string]string

func (e envFlag) String() string { return "" }
func (e envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=value, got %q", s)
	}
	e[k] = v
	return nil
}

// secretEnvFlag is --secret-env: KEY=value, or KEY alone to take the value
// from the environment of the same name, so that the secret is not on the
// command line (which every user of the machine can read in ps).
type secretEnvFlag map[string]string

func (e secretEnvFlag) String() string { return "" }
func (e secretEnvFlag) Set(s string) error {
	if !strings.Contains(s, "=") {
		v, ok := os.LookupEnv(s)
		if s == "" || !ok {
			return fmt.Errorf("want KEY=value, or KEY with $%s set in the environment", s)
		}
		e[s] = v
		return nil
	}
	return envFlag(e).Set(s)
}

// reportErr prints a CLI error and returns the exit code: 1 for errors the
// server reported (bad input, not found, not allowed) or transport errors.
func reportErr(stderr io.Writer, cmd string, err error) int {
	var p *client.Error
	if errors.As(err, &p) {
		fmt.Fprintf(stderr, "allot %s: %s\n", cmd, p.Error())
		return 1
	}
	fmt.Fprintf(stderr, "allot %s: %v\n", cmd, err)
	return 1
}

func printJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return 1
	}
	return 0
}
