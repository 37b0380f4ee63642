package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/web"
)

const teamUsage = `usage:
  allot team list                                   every team: budget, weight, guarantees, service account
  allot team create SLUG --name NAME [--cost-center CC] [--budget-gpu-hours N] [--fair-share-weight W]
                    [--guarantee TYPE=N ...] [--service-account ACCOUNT] [--webhook URL] [--note TEXT]
  allot team set SLUG [the same flags]              edit: only the flags given change
                    (--guarantee replaces all guarantees; --guarantee "" removes them)
  allot team set-account TEAM ACCOUNT               the team's service account: its jobs run as it when their submitter has no account
  allot team set-account TEAM ""                    no service account
flags: --server URL (env ALLOT_URL)  --token T (env ALLOT_TOKEN; an admin's for all but list)
`

// guaranteeFlag is a repeatable TYPE=N flag; "" clears the guarantees.
type guaranteeFlag struct {
	m   map[string]int
	set bool
}

func (g *guaranteeFlag) String() string { return "" }

func (g *guaranteeFlag) Set(v string) error {
	if g.m == nil {
		g.m = map[string]int{}
	}
	g.set = true
	if v == "" {
		return nil
	}
	typ, n, ok := strings.Cut(v, "=")
	count, err := strconv.Atoi(strings.TrimSpace(n))
	if !ok || strings.TrimSpace(typ) == "" || err != nil {
		return fmt.Errorf("%q is not TYPE=N (e.g. A100-80GB=8)", v)
	}
	g.m[strings.TrimSpace(typ)] = count
	return nil
}

// splitVerb takes the subcommand out of args: the first argument that is
// not a flag or a flag's value (every flag of the command takes a value;
// --flag=value is one argument), so `allot team --server URL list` works
// as `allot team list --server URL` does. -h and --help are no values.
func splitVerb(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return a, append(append([]string{}, args[:i]...), args[i+1:]...)
		}
		if a == "--" {
			break
		}
		if !strings.Contains(a, "=") && a != "-h" && a != "--help" && a != "-help" {
			i++ // its value
		}
	}
	return "", args
}

// cmdTeam is `allot team`, through the JSON API.
func cmdTeam(args []string, stdout, stderr io.Writer) int {
	verb, args := splitVerb(args)
	if verb == "" {
		fmt.Fprint(stderr, teamUsage)
		return 2
	}
	fs := flag.NewFlagSet("team "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, teamUsage) }
	newClient := clientFlags(fs)
	note := new(string)
	if verb != "list" {
		note = fs.String("note", "", "why, for the audit log")
	}
	usage := func() int {
		fmt.Fprint(stderr, teamUsage)
		return 2
	}
	var req web.TeamJSON
	var guarantees guaranteeFlag
	strFlag := func(dst **string, name, help string) {
		fs.Func(name, help, func(v string) error { *dst = &v; return nil })
	}
	intFlag := func(name, help string, set func(int64)) {
		fs.Func(name, help, func(v string) error {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return fmt.Errorf("%q is not a whole number", v)
			}
			set(n)
			return nil
		})
	}
	if verb == "create" || verb == "set" {
		strFlag(&req.Name, "name", "the team's display name")
		strFlag(&req.CostCenter, "cost-center", "the cost center its bill goes to")
		intFlag("budget-gpu-hours", "monthly budget in GPU-hours (0: none)", func(n int64) { req.MonthlyBudgetGPUHours = &n })
		intFlag("fair-share-weight", "fair-share weight (default 1)", func(n int64) { w := int(n); req.FairShareWeight = &w })
		fs.Var(&guarantees, "guarantee", "GPUs of a type the team can always get back, TYPE=N (repeat for more types)")
		strFlag(&req.PosixAccount, "service-account", `POSIX account its jobs run as when their submitter has none ("" none)`)
		strFlag(&req.WebhookURL, "webhook", `URL for the team's budget alerts ("" none)`)
	}
	pos, ok := parseInterleaved(fs, args)
	if !ok {
		return 2
	}
	ctx := context.Background()
	switch verb {
	case "list":
		if len(pos) != 0 {
			return usage()
		}
		teams, err := newClient().Teams(ctx)
		if err != nil {
			return reportErr(stderr, "team list", err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TEAM\tNAME\tCOST_CENTER\tBUDGET_GPU_H\tWEIGHT\tGUARANTEES\tSERVICE_ACCOUNT")
		for _, t := range teams {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", t.Slug, t.Name, dash(t.CostCenter), t.MonthlyBudgetGPUHours,
				t.FairShareWeight, dash(guaranteeText(t.Guarantees)), dash(t.PosixAccount))
		}
		tw.Flush()
		return 0
	case "create", "set":
		if len(pos) != 1 {
			return usage()
		}
		req.Note = *note
		if guarantees.set {
			req.Guarantees = guarantees.m
		}
		var r client.TeamChange
		var err error
		if verb == "create" {
			if req.Name == nil {
				fmt.Fprintln(stderr, "allot team create: give --name")
				return 2
			}
			req.Slug = &pos[0]
			r, err = newClient().CreateTeam(ctx, req)
		} else {
			if req.Name == nil && req.CostCenter == nil && req.MonthlyBudgetGPUHours == nil && req.FairShareWeight == nil && req.PosixAccount == nil && req.WebhookURL == nil && !guarantees.set {
				fmt.Fprintln(stderr, "allot team set: give at least one of --name, --cost-center, --budget-gpu-hours, --fair-share-weight, --guarantee, --service-account, --webhook")
				return 2
			}
			r, err = newClient().UpdateTeam(ctx, pos[0], req)
		}
		if err != nil {
			return reportErr(stderr, "team "+verb, err)
		}
		if !r.Changed {
			fmt.Fprintf(stdout, "no change: team %s already has these values\n", pos[0])
			return 0
		}
		fmt.Fprintf(stdout, "team %s (%s): budget %d GPU-h/month, weight %d, guarantees %s, service account %s (policy version %d, audit entry %d)\n",
			r.Value.Slug, r.Value.Name, r.Value.MonthlyBudgetGPUHours, r.Value.FairShareWeight, dash(guaranteeText(r.Value.Guarantees)),
			dash(r.Value.PosixAccount), r.PolicyVersion, r.AuditID)
		return 0
	case "set-account":
		if len(pos) != 2 {
			return usage()
		}
		team, account := pos[0], pos[1]
		r, err := newClient().SetTeamAccount(ctx, team, account, *note)
		if err != nil {
			return reportErr(stderr, "team set-account", err)
		}
		switch {
		case !r.Changed:
			fmt.Fprintf(stdout, "no change: team %s already has service account %s\n", team, dash(account))
		case account == "":
			fmt.Fprintf(stdout, "team %s has no service account now (audit entry %d)\n", team, r.AuditID)
		default:
			fmt.Fprintf(stdout, "team %s's service account is %s (audit entry %d)\n", team, account, r.AuditID)
		}
		return 0
	}
	fmt.Fprintf(stderr, "allot team: unknown subcommand %q\n", verb)
	return usage()
}

// guaranteeText is "A100-80GB=8,T4=2".
func guaranteeText(g map[string]int) string {
	var parts []string
	for typ, n := range g {
		parts = append(parts, fmt.Sprintf("%s=%d", typ, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
