package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

const bootstrapUsage = `usage: allot bootstrap-admin --email ops@corp.example [--name NAME] [--ttl 24h] [--force]
  On a migrated database (allot migrate), makes EMAIL an admin (a new user,
  linked at their first single sign-on with the same verified email; or an
  existing one) and prints a new API token for them, once, on stdout.
  Refused when the organisation has an admin already, unless --force.
flags: --database-url URL (default: env DATABASE_URL)  --by WHO (the audit log's actor; default cli)
`

// cmdBootstrapAdmin is `allot bootstrap-admin`: the first admin of an
// empty organisation, straight in the database (like allot migrate).
func cmdBootstrapAdmin(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bootstrap-admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, bootstrapUsage) }
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
	email := fs.String("email", "", "the admin's email address (required)")
	name := fs.String("name", "", "the admin's name (default: the email's local part)")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token works (0: until revoked)")
	force := fs.Bool("force", false, "make the admin and token even when an admin exists")
	by := fs.String("by", "cli", "who does this (recorded in the audit log)")
	pos, ok := parseInterleaved(fs, args)
	if !ok {
		return 2
	}
	if len(pos) > 0 {
		fmt.Fprintf(stderr, "allot bootstrap-admin: unexpected argument %q\n\n%s", pos[0], bootstrapUsage)
		return 2
	}
	if strings.TrimSpace(*email) == "" {
		fmt.Fprintf(stderr, "allot bootstrap-admin: --email is required\n\n%s", bootstrapUsage)
		return 2
	}
	url, err := databaseURL(*dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "allot bootstrap-admin: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := store.Open(ctx, url)
	if err != nil {
		fmt.Fprintf(stderr, "allot bootstrap-admin: %v\n", err)
		return 1
	}
	defer pool.Close()
	ms, err := store.Migrations()
	if err != nil {
		fmt.Fprintf(stderr, "allot bootstrap-admin: %v\n", err)
		return 1
	}
	var applied int
	var migrated bool
	err = pool.QueryRow(ctx, `SELECT to_regclass('allot_migrations') IS NOT NULL`).Scan(&migrated)
	if err == nil && migrated {
		err = pool.QueryRow(ctx, `SELECT count(*) FROM allot_migrations`).Scan(&applied)
	}
	if err != nil {
		fmt.Fprintf(stderr, "allot bootstrap-admin: %v\n", err)
		return 1
	}
	if applied < len(ms) {
		fmt.Fprintf(stderr, "allot bootstrap-admin: the database is not migrated (%d of %d migrations applied): run `allot migrate` first\n", applied, len(ms))
		return 1
	}
	r, err := store.New(pool).BootstrapAdminUser(ctx, *email, *name, *by, *force, *ttl)
	if err != nil {
		fmt.Fprintf(stderr, "allot bootstrap-admin: %s\n", cliError(err))
		return 1
	}
	fmt.Fprintln(stdout, r.Secret)
	switch {
	case r.Created:
		fmt.Fprintf(stderr, "made %s an admin (a new user; audit entry %d)\n", r.User.Email, r.AuditID)
	case r.Promoted:
		fmt.Fprintf(stderr, "made the existing user %s an admin (audit entry %d)\n", r.User.Email, r.AuditID)
	default:
		fmt.Fprintf(stderr, "%s is an admin already; made a new token (audit entry %d)\n", r.User.Email, r.AuditID)
	}
	if len(r.Admins) > 0 {
		fmt.Fprintf(stderr, "(--force: the admins there were already: %s)\n", strings.Join(r.Admins, ", "))
	}
	exp := "it works until revoked"
	if !r.Token.ExpiresAt.IsZero() {
		exp = "it expires at " + r.Token.ExpiresAt.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(stderr, "API token %s… (above) is shown only this once; %s.\n", r.Token.Prefix, exp)
	fmt.Fprintln(stderr, "Use it as ALLOT_TOKEN for the CLI and the API (Authorization: Bearer …); make lasting tokens with `allot token create`, or sign in through OIDC as a member of the admin group.")
	return 0
}

const gpuTypeUsage = `usage:
  allot gpu-type list                                         the GPU types, with memory, rate in force, nodes
  allot gpu-type create NAME --memory-gb 80 --rate 4.10 [--currency USD] [--backend native|slurm] [--note TEXT]
  allot gpu-type set NAME [--memory-gb N] [--rate R] [--capacity-cost C] [--note TEXT]   edit (a rate applies from now on;
                                                             C: one GPU-hour of owned capacity's cost, "" clears it)
  allot gpu-type retire NAME [--note TEXT]                   no new nodes of it; its nodes and history stay
  allot gpu-type reinstate NAME [--note TEXT]
flags: --server URL (env ALLOT_URL)  --token T (env ALLOT_TOKEN; an admin's for all but list)
`

// cmdGPUType is `allot gpu-type`, through the JSON API.
func cmdGPUType(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, gpuTypeUsage)
		return 2
	}
	verb := args[0]
	fs := flag.NewFlagSet("gpu-type "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, gpuTypeUsage) }
	newClient := clientFlags(fs)
	mem := fs.Int("memory-gb", 0, "memory per GPU in GB")
	rate := fs.String("rate", "", "price of one GPU-hour at multiplier 1, decimal (e.g. 4.10)")
	currency := fs.String("currency", "", "currency of the rate (default: the rate card's, else USD)")
	note := fs.String("note", "", "why, for the audit log")
	backend := fs.String("backend", "", "create: the engine that runs this pool's jobs: native (Allot's agents, the default) or slurm")
	capCost := fs.String("capacity-cost", "", `cost of one GPU-hour of owned capacity, decimal, for the capacity report's unrecovered cost ("" clears it)`)
	pos, ok := parseInterleaved(fs, args[1:])
	if !ok {
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	usage := func() int {
		fmt.Fprint(stderr, gpuTypeUsage)
		return 2
	}
	ctx := context.Background()
	switch verb {
	case "list":
		if len(pos) != 0 {
			return usage()
		}
		list, err := newClient().GPUTypes(ctx)
		if err != nil {
			return reportErr(stderr, "gpu-type list", err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tMEMORY\tRATE/GPU-HOUR\tNODES\tBACKEND\tSTATUS")
		for _, g := range list {
			status := "in use"
			if g.Retired {
				status = "retired"
			}
			fmt.Fprintf(tw, "%s\t%d GB\t%s %s\t%d\t%s\t%s\n", g.Name, g.MemoryGB, g.HourlyRate, g.Currency, g.Nodes, g.Backend, status)
		}
		tw.Flush()
		return 0
	case "create":
		if len(pos) != 1 {
			return usage()
		}
		req := web.GPUTypeRequest{Name: pos[0], Currency: *currency, Note: *note, Backend: *backend}
		if set["memory-gb"] {
			req.MemoryGB = mem
		}
		if set["rate"] {
			req.HourlyRate = rate
		}
		r, err := newClient().CreateGPUType(ctx, req)
		if err != nil {
			return reportErr(stderr, "gpu-type create", err)
		}
		fmt.Fprintf(stdout, "GPU type %s: %d GB, %s %s per GPU-hour (policy version %d, audit entry %d)\n",
			r.Value.Name, r.Value.MemoryGB, r.Value.HourlyRate, r.Value.Currency, r.PolicyVersion, r.AuditID)
		return 0
	case "set", "retire", "reinstate":
		if len(pos) != 1 || set["backend"] || verb != "set" && (set["memory-gb"] || set["rate"] || set["capacity-cost"]) {
			return usage()
		}
		req := web.GPUTypeRequest{Currency: *currency, Note: *note}
		switch verb {
		case "set":
			if !set["memory-gb"] && !set["rate"] && !set["capacity-cost"] {
				fmt.Fprintln(stderr, "allot gpu-type set: give --memory-gb, --rate or --capacity-cost")
				return 2
			}
			if set["capacity-cost"] {
				req.CapacityCost = capCost
			}
			if set["memory-gb"] {
				req.MemoryGB = mem
			}
			if set["rate"] {
				req.HourlyRate = rate
			}
		default:
			retired := verb == "retire"
			req.Retired = &retired
		}
		r, err := newClient().UpdateGPUType(ctx, pos[0], req)
		if err != nil {
			return reportErr(stderr, "gpu-type "+verb, err)
		}
		status := ""
		if r.Value.Retired {
			status = ", retired"
		}
		if !r.Changed {
			fmt.Fprintf(stdout, "no change: GPU type %s is already %d GB, %s %s per GPU-hour%s\n", r.Value.Name, r.Value.MemoryGB, r.Value.HourlyRate, r.Value.Currency, status)
			return 0
		}
		if r.Value.CapacityCost != "" {
			status += ", owned capacity " + r.Value.CapacityCost + " " + r.Value.Currency + " per GPU-hour"
		}
		fmt.Fprintf(stdout, "GPU type %s: %d GB, %s %s per GPU-hour%s (policy version %d, audit entry %d)\n",
			r.Value.Name, r.Value.MemoryGB, r.Value.HourlyRate, r.Value.Currency, status, r.PolicyVersion, r.AuditID)
		return 0
	}
	fmt.Fprintf(stderr, "allot gpu-type: unknown subcommand %q\n", verb)
	return usage()
}

// cmdBilling is `allot billing rollup`: the worker's hourly billing
// rollup, now (idempotent: running it again changes nothing), straight in
// the database.
func cmdBilling(args []string, stdout, stderr io.Writer) int {
	const usage = "usage: allot billing rollup [--database-url URL]\n  recompute the charge lines of every open month now (the worker does it every hour)\n"
	if len(args) == 0 || args[0] != "rollup" {
		fmt.Fprint(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("billing rollup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
	if err := cliflag.Parse(fs, args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	url, err := databaseURL(*dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "allot billing rollup: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pool, err := store.Open(ctx, url)
	if err != nil {
		fmt.Fprintf(stderr, "allot billing rollup: %v\n", err)
		return 1
	}
	defer pool.Close()
	st := store.New(pool)
	res, err := jobs.Rollup(ctx, st, st.Now())
	if err != nil {
		fmt.Fprintf(stderr, "allot billing rollup: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "billing rolled up: %+v\n", res)
	return 0
}
