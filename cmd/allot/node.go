package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// cmdNodeToken is `allot node-token create NAME`: an admin command that
// talks to the database directly (like `allot migrate`).
func cmdNodeToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "create" {
		fmt.Fprintln(stderr, "usage: allot node-token create NAME [--gpu-type T --gpus 8 --site onprem --domain D --rack R]")
		return 2
	}
	fs := flag.NewFlagSet("node-token create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
	gpuType := fs.String("gpu-type", "", "GPU type of a new node (e.g. A100-80GB); needed when the node does not exist yet")
	gpus := fs.Int("gpus", 8, "GPUs of a new node (the agent's inventory corrects it)")
	site := fs.String("site", allot.SiteOnPrem, "site of a new node: onprem or cloud")
	domain := fs.String("domain", "", "interconnect (NVLink/IB) domain of a new node")
	rack := fs.String("rack", "", "rack of a new node")
	by := fs.String("by", "cli", "who creates the token (recorded)")
	name, rest := "", args[1:]
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return 2
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	}
	if name == "" {
		fmt.Fprintln(stderr, "allot node-token create: the node name is missing")
		return 2
	}
	url, err := databaseURL(*dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "allot node-token: %v\n", err)
		return 2
	}
	ctx := context.Background()
	pool, err := store.Open(ctx, url)
	if err != nil {
		fmt.Fprintf(stderr, "allot node-token: %v\n", err)
		return 1
	}
	defer pool.Close()
	st := store.New(pool)
	nodes, err := st.ListNodes(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "allot node-token: %v\n", err)
		return 1
	}
	exists := false
	for _, n := range nodes {
		exists = exists || n.Name == name
	}
	if !exists {
		if *gpuType == "" {
			fmt.Fprintf(stderr, "allot node-token: node %q does not exist: give --gpu-type (and --domain, --site) to add it\n", name)
			return 1
		}
		n := allot.Node{Name: name, GPUType: *gpuType, GPUCount: *gpus, Site: *site, Domain: *domain, Rack: *rack, State: allot.NodeDown}
		if err := st.CreateNode(ctx, &n); err != nil {
			fmt.Fprintf(stderr, "allot node-token: %v\n", err)
			return 1
		}
	}
	secret, err := st.CreateNodeToken(ctx, name, *by)
	if err != nil {
		fmt.Fprintf(stderr, "allot node-token: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n\nOn %s run:\n  ALLOT_NODE_TOKEN=%s allot agent --server https://allot.example.com --gpu nvml\n", secret, name, secret)
	return 0
}

// startDevAgents runs one in-process agent with fake GPUs for every node,
// so demo jobs really run. They stop when ctx ends.
func startDevAgents(ctx context.Context, m *Main, log *slog.Logger) (func(), error) {
	nodes, err := m.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, len(nodes))
	for _, n := range nodes {
		if err := m.Store.RevokeNodeTokens(ctx, n.Name, "allot dev"); err != nil {
			cancel()
			return nil, err
		}
		tok, err := m.Store.CreateNodeToken(ctx, n.Name, "allot dev")
		if err != nil {
			cancel()
			return nil, err
		}
		mem := int64(81920)
		if n.GPUType == "T4" {
			mem = 15360
		}
		a := agent.New(agent.Config{Server: m.URL(), Token: tok, Hostname: n.Name, Domain: n.Domain, HeartbeatInterval: m.HeartbeatInterval,
			Backend: agent.NewFake(agent.FakeOptions{GPUs: n.GPUCount, Model: n.GPUType, MemoryMiB: mem, Hostname: n.Name}),
			Logger:  log.With("node", n.Name), ShutdownGrace: 5e9})
		go func() {
			if err := a.Run(actx); err != nil && actx.Err() == nil {
				log.Error("agent stopped", "node", n.Name, "err", err)
			}
			done <- struct{}{}
		}()
	}
	return func() {
		cancel()
		for range nodes {
			<-done
		}
	}, nil
}
