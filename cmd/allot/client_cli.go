package main

import (
	"flag"
	"os"

	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/internal/cliflag"
)

// clientFlags adds --server and --token (defaults from ALLOT_URL and
// ALLOT_TOKEN) to fs.
func clientFlags(fs *flag.FlagSet) func() *client.Client {
	def := os.Getenv("ALLOT_URL")
	if def == "" {
		def = "http://localhost:8080"
	}
	server := fs.String("server", def, "Allot server URL (env ALLOT_URL)")
	token := cliflag.Secret(fs, "token", "ALLOT_TOKEN", "API `token`")
	return func() *client.Client { return client.New(*server, token()) }
}
