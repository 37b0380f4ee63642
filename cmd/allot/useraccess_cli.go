package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/allotlabs/allot/internal/cliflag"
	"io"
	"time"
)

const userAccessUsage = `usage:
  allot user disable EMAIL [--note TEXT]   disable a person (admin): their API tokens are revoked, their sessions end, they cannot sign in
  allot user enable EMAIL [--note TEXT]    let them sign in again (their revoked tokens stay revoked)
flags: --server URL --token T
`

// cmdUserAccess is `allot user disable|enable EMAIL` over the JSON API
// (EMAIL may also be the user's ID).
func cmdUserAccess(verb string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("user "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, userAccessUsage) }
	newClient := clientFlags(fs)
	note := fs.String("note", "", "why, for the audit log")
	pos, ok := parseInterleaved(fs, args)
	if !ok {
		return 2
	}
	if len(pos) != 1 || (verb != "disable" && verb != "enable") {
		fmt.Fprint(stderr, userAccessUsage)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	change := newClient().EnableUser
	if verb == "disable" {
		change = newClient().DisableUser
	}
	res, err := change(ctx, pos[0], *note)
	if err != nil {
		return reportErr(stderr, "user "+verb, err)
	}
	switch {
	case !res.Changed:
		fmt.Fprintf(stdout, "%s was already %sd\n", res.User.Email, verb)
	case verb == "disable":
		fmt.Fprintf(stdout, "disabled %s: %d API token(s) revoked, %d session(s) ended\n", res.User.Email, res.TokensRevoked, res.SessionsEnded)
	default:
		fmt.Fprintf(stdout, "enabled %s: they can sign in again (make new API tokens; the old ones stay revoked)\n", res.User.Email)
	}
	return 0
}

// parseInterleaved parses fs over args whose flags may come before,
// between and after the positional arguments, and returns those.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, bool) {
	var pos []string
	for rest := args; ; {
		if err := cliflag.Parse(fs, rest); err != nil {
			return nil, false
		}
		if fs.NArg() == 0 {
			return pos, true
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
}
