package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Who jobs run as, from the command line (admins): a person's POSIX
// account, and a team's service account.

const userUsage = `usage:
  allot user accounts                          list people and their POSIX accounts
  allot user set-account EMAIL ACCOUNT         jobs EMAIL submits run as ACCOUNT
  allot user set-account EMAIL ""              remove the mapping (the identity provider's claim or the team's service account apply)
  allot user disable EMAIL | enable EMAIL      stop or allow a person's sign-ins and tokens
flags: --server URL --token T --note TEXT
`

// cmdUser runs `allot user SUBCOMMAND`; flags may come before or after
// the subcommand and its arguments.
func cmdUser(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("user", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, userUsage) }
	newClient := clientFlags(fs)
	note := fs.String("note", "", "why, for the audit log")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, ok := parseInterleaved(fs, args)
	if !ok {
		return 2
	}
	if len(pos) == 0 {
		fmt.Fprint(stderr, userUsage)
		return 2
	}
	sub := pos[0]
	if sub == "disable" || sub == "enable" {
		i := slices.Index(args, sub)
		return cmdUserAccess(sub, append(slices.Clone(args[:i]), args[i+1:]...), stdout, stderr)
	}
	pos = pos[1:]
	ctx := context.Background()
	switch sub {
	case "accounts", "list":
		if len(pos) != 0 {
			fmt.Fprint(stderr, userUsage)
			return 2
		}
		users, err := newClient().Accounts(ctx)
		if err != nil {
			return reportErr(stderr, "user accounts", err)
		}
		if *asJSON {
			return printJSON(stdout, users)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "EMAIL\tNAME\tTEAMS\tACCOUNT (ADMIN)\tACCOUNT (IDENTITY PROVIDER)")
		for _, u := range users {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", u.Email, u.Name, strings.Join(u.Teams, ","), dash(u.PosixUser), dash(u.OIDCPosixUser))
		}
		tw.Flush()
		return 0
	case "set-account":
		if len(pos) != 2 {
			fmt.Fprint(stderr, userUsage)
			return 2
		}
		r, m, err := newClient().SetAccount(ctx, pos[0], pos[1], *note)
		if err != nil {
			return reportErr(stderr, "user set-account", err)
		}
		switch {
		case !r.Changed:
			fmt.Fprintf(stdout, "no change: %s already runs as %s\n", m.Email, dash(m.PosixUser))
		case m.PosixUser == "":
			fmt.Fprintf(stdout, "%s has no account of their own now (audit entry %d)\n", m.Email, r.AuditID)
		default:
			fmt.Fprintf(stdout, "jobs %s submits run as %s (audit entry %d)\n", m.Email, m.PosixUser, r.AuditID)
		}
		return 0
	}
	fmt.Fprintf(stderr, "allot user: unknown subcommand %q\n%s", sub, userUsage)
	return 2
}

func dash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
