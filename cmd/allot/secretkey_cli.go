package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/store"
)

const secretKeyUsage = `usage: allot secret-key new | reseal --secret-key-file FILE [--database-url URL]

  new     print a new key (32 random bytes, base64): allot secret-key new > /etc/allot/secret.key; chmod 600 it.
          To rotate, put a new key on the file's first line and keep the old ones below it.
  reseal  encrypt every job's stored secret values with the file's first key: those stored in clear
          before --secret-key-file was set, and those sealed by an older key (DATABASE_URL)
`

// cmdSecretKey runs `allot secret-key`.
func cmdSecretKey(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, secretKeyUsage)
		return 2
	}
	switch args[0] {
	case "new":
		fs := flag.NewFlagSet("secret-key new", flag.ContinueOnError)
		fs.SetOutput(stderr)
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return 2
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "allot secret-key new: takes no arguments\n%s", secretKeyUsage)
			return 2
		}
		fmt.Fprintf(stdout, "# allot secret-key: the first key seals jobs' secret env; older keys below it only open\n%s\n", store.NewSecretKey())
		return 0
	case "reseal":
		fs := flag.NewFlagSet("secret-key reseal", flag.ContinueOnError)
		fs.SetOutput(stderr)
		dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
		keyFile := fs.String("secret-key-file", "", "the servers' and workers' `file` of keys (its first key seals)")
		if err := cliflag.Parse(fs, args[1:]); err != nil {
			return 2
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "allot secret-key reseal: unexpected argument %q\n", fs.Arg(0))
			return 2
		}
		if *keyFile == "" {
			fmt.Fprintln(stderr, "allot secret-key reseal: give --secret-key-file")
			return 2
		}
		keys, err := store.LoadSecretKeys(*keyFile)
		if err != nil {
			fmt.Fprintf(stderr, "allot secret-key reseal: %v\n", err)
			return 2
		}
		url, err := databaseURL(*dbURL)
		if err != nil {
			fmt.Fprintf(stderr, "allot secret-key reseal: %v\n", err)
			return 2
		}
		ctx := context.Background()
		pool, err := store.Open(ctx, url)
		if err != nil {
			fmt.Fprintf(stderr, "allot secret-key reseal: %v\n", err)
			return 1
		}
		defer pool.Close()
		st := store.New(pool)
		st.Secrets = keys
		n, skipped, err := st.ResealSecrets(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "allot secret-key reseal: %v (%d jobs resealed before it)\n", err, n)
			return 1
		}
		fmt.Fprintf(stdout, "resealed the secrets of %d jobs with key %s\n", n, keys.KeyID())
		for _, s := range skipped {
			fmt.Fprintf(stderr, "allot secret-key reseal: left as it is: %s\n", s)
		}
		if len(skipped) > 0 {
			fmt.Fprintf(stderr, "allot secret-key reseal: %d jobs left as they are (add the key that sealed them to the file, below the first)\n", len(skipped))
			return 1
		}
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, secretKeyUsage)
		return 0
	}
	fmt.Fprintf(stderr, "allot secret-key: unknown subcommand %q\n%s", args[0], secretKeyUsage)
	return 2
}
