package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

const nodeTokenUsage = `usage:
  allot node-token create NODE [--gpu-type T --gpus 8 --label k=v --site onprem --domain D --rack R]
                                      make a token for NODE's agent (printed once); adds NODE if it is new
  allot node-token list [NODE]        list node tokens: prefix, node, who made them, when, last use, revoked (never a secret)
  allot node-token revoke ID|PREFIX   revoke one token: its agent is refused (401) from its next request
  allot node-token revoke --node NODE revoke every token of NODE
  allot node-token rotate NODE        make a new token for NODE (printed once) and revoke its others
flags: --database-url URL (default: env DATABASE_URL)  --by WHO (recorded as the actor in the audit log; default cli)
`

// cmdNodeTokenAdmin is `allot node-token list|revoke|rotate`: admin
// commands that, like `allot node-token create`, talk to the database
// directly. The admin API (/api/v1/node-tokens) and the portal
// (/admin/node-tokens) do the same.
func cmdNodeTokenAdmin(verb string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("node-token "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, nodeTokenUsage) }
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
	by := fs.String("by", "cli", "who does this (recorded in the audit log)")
	node := ""
	if verb == "revoke" {
		fs.StringVar(&node, "node", "", "revoke every token of this node")
	}
	pos, ok := parseInterleaved(fs, args)
	if !ok {
		return 2
	}
	usage := func() int {
		fmt.Fprint(stderr, nodeTokenUsage)
		return 2
	}
	switch {
	case verb == "list" && len(pos) <= 1:
	case verb == "revoke" && (len(pos) == 1) != (node != ""):
	case verb == "rotate" && len(pos) == 1:
	default:
		if verb != "list" && verb != "revoke" && verb != "rotate" {
			fmt.Fprintf(stderr, "allot node-token: unknown subcommand %q\n", verb)
		}
		return usage()
	}
	url, err := databaseURL(*dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "allot node-token %s: %v\n", verb, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := store.Open(ctx, url)
	if err != nil {
		fmt.Fprintf(stderr, "allot node-token %s: %v\n", verb, err)
		return 1
	}
	defer pool.Close()
	st := store.New(pool)
	fail := func(err error) int {
		fmt.Fprintf(stderr, "allot node-token %s: %s\n", verb, cliError(err))
		return 1
	}
	switch verb {
	case "list":
		n := ""
		if len(pos) == 1 {
			n = pos[0]
		}
		list, err := st.ListNodeTokens(ctx, n)
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNODE\tPREFIX\tSTATUS\tCREATED BY\tCREATED\tLAST USED\tREVOKED")
		for _, t := range list {
			status, revoked := "active", "-"
			if !t.Active() {
				status, revoked = "revoked", cliTime(&t.RevokedAt)
				if t.RevokedBy != "" {
					revoked += " by " + t.RevokedBy
				}
			}
			fmt.Fprintf(tw, "%d\t%s\t%s…\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Node, t.Prefix, status, dashIfEmpty(t.CreatedBy), cliTime(&t.CreatedAt), cliTime(&t.LastUsedAt), revoked)
		}
		tw.Flush()
		return 0
	case "rotate":
		res, err := st.IssueNodeToken(ctx, pos[0], *by, true)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintln(stdout, res.Secret)
		fmt.Fprintf(stderr, "node token %d for %s made; it is shown only this once\n", res.Token.ID, res.Token.Node)
		for _, t := range res.Revoked {
			fmt.Fprintf(stderr, "revoked node token %d (%s…)\n", t.ID, t.Prefix)
		}
		fmt.Fprintf(stderr, "give it to the agent on %s (ALLOT_NODE_TOKEN or --token-file); until then it is refused\n", res.Token.Node)
		return 0
	}
	// revoke
	if node != "" {
		list, err := st.RevokeNodeTokensOf(ctx, node, *by)
		if err != nil {
			return fail(err)
		}
		if len(list) == 0 {
			fmt.Fprintf(stdout, "%s has no active node tokens\n", node)
		}
		for _, t := range list {
			fmt.Fprintf(stdout, "revoked node token %d (%s…) of %s\n", t.ID, t.Prefix, t.Node)
		}
		return 0
	}
	var t store.NodeToken
	var changed bool
	if id, perr := strconv.ParseInt(pos[0], 10, 64); perr == nil {
		t, changed, err = st.RevokeNodeToken(ctx, id, *by)
	} else {
		t, changed, err = st.RevokeNodeTokenPrefix(ctx, pos[0], *by)
	}
	if err != nil {
		return fail(err)
	}
	if !changed {
		fmt.Fprintf(stdout, "node token %d (%s…) of %s was already revoked\n", t.ID, t.Prefix, t.Node)
		return 0
	}
	fmt.Fprintf(stdout, "revoked node token %d (%s…) of %s\n", t.ID, t.Prefix, t.Node)
	return 0
}

// cliError is err as one line for the terminal: the message, and each
// field's problem.
func cliError(err error) string {
	f := allot.Fields(err)
	switch {
	case allot.ErrorCode(err) == allot.EInternal:
		return err.Error()
	case len(f) == 0:
		return allot.ErrorMessage(err)
	}
	return strings.TrimSuffix(f.String(), ".")
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
