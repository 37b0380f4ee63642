package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/web"
)

const tokenUsage = `usage:
  allot token create --name NAME [--expires 2026-12-31]   make a personal API token (printed once)
  allot token list                                        list your tokens
  allot token revoke ID                                   revoke a token
`

// cmdToken manages personal API tokens through the API (it needs a token
// to start with: make the first one on the portal's /tokens page).
func cmdToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, tokenUsage)
		return 2
	}
	fs := flag.NewFlagSet("token "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch args[0] {
	case "create":
		name := fs.String("name", "", "token name, e.g. laptop (required)")
		expires := fs.String("expires", "", "last day it works (2026-12-31) or an RFC 3339 time; default: until revoked")
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return 2
		}
		t, err := newClient().CreateToken(ctx, web.TokenRequest{Name: *name, ExpiresAt: *expires})
		if err != nil {
			return reportErr(stderr, "token create", err)
		}
		fmt.Fprintln(stdout, t.Token)
		fmt.Fprintf(stderr, "token %d %q created; it is shown only this once\n", t.ID, t.Name)
		return 0
	case "list":
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return 2
		}
		list, err := newClient().Tokens(ctx)
		if err != nil {
			return reportErr(stderr, "token list", err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tPREFIX\tSTATUS\tCREATED\tLAST USED\tEXPIRES")
		for _, t := range list {
			fmt.Fprintf(tw, "%d\t%s\t%s…\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Prefix, t.Status, cliTime(&t.CreatedAt), cliTime(t.LastUsedAt), cliTime(t.ExpiresAt))
		}
		tw.Flush()
		return 0
	case "revoke":
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return 2
		}
		id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
		if fs.NArg() != 1 || err != nil || id < 1 {
			fmt.Fprint(stderr, tokenUsage)
			return 2
		}
		if err := newClient().RevokeToken(ctx, id); err != nil {
			return reportErr(stderr, "token revoke", err)
		}
		fmt.Fprintf(stdout, "revoked token %d\n", id)
		return 0
	}
	fmt.Fprintf(stderr, "allot token: unknown subcommand %q\n%s", args[0], tokenUsage)
	return 2
}

func cliTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04")
}
