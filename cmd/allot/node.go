package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// cmdNodeToken is `allot node-token create NAME` (and list, revoke,
// rotate: nodetoken_cli.go): admin commands that talk to the database
// directly (like `allot migrate`).
func cmdNodeToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, nodeTokenUsage)
		return 2
	}
	if args[0] != "create" {
		return cmdNodeTokenAdmin(args[0], args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("node-token create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
	gpuType := fs.String("gpu-type", "", "GPU type of a new node (e.g. A100-80GB); needed when the node does not exist yet")
	gpus := fs.Int("gpus", 8, "GPUs of a new node (the agent's inventory corrects it; a difference is shown on the node's page)")
	labels := envFlag{}
	fs.Var(labels, "label", "`key=value` label of a new node (repeatable)")
	site := fs.String("site", allot.SiteOnPrem, "site of a new node: onprem or cloud")
	domain := fs.String("domain", "", "interconnect (NVLink/IB) domain of a new node")
	rack := fs.String("rack", "", "rack of a new node")
	by := fs.String("by", "cli", "who creates the token (recorded)")
	name, rest := "", args[1:]
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	if err := cliflag.Parse(fs, rest); err != nil {
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
			fmt.Fprintf(stderr, "allot node-token: node %q does not exist: give --gpu-type (and --gpus, --domain, --site) to add it\n", name)
			return 1
		}
		n := allot.Node{Name: name, GPUType: *gpuType, GPUCount: *gpus, Site: *site, Domain: *domain, Rack: *rack, State: allot.NodeDown}
		if err := st.CreateNodeDeclared(ctx, *by, n, allot.NodeLabels(labels)); err != nil { // audited
			fmt.Fprintf(stderr, "allot node-token: %s\n", cliError(err))
			return 1
		}
	} else if *gpuType != "" || len(labels) > 0 {
		fmt.Fprintf(stderr, "allot node-token: node %s exists already: --gpu-type, --gpus, --label and the other node flags are for a new node, and were ignored\n", name)
	}
	res, err := st.IssueNodeToken(ctx, name, *by, false) // audited
	if err != nil {
		fmt.Fprintf(stderr, "allot node-token: %s\n", cliError(err))
		return 1
	}
	secret := res.Secret
	fmt.Fprintf(stdout, "%s\n\nOn %s, as root, put it in a root-only file and start the agent:\n"+
		"  install -m 0600 /dev/stdin /etc/allot/node-token <<< '%s'\n"+
		"  ALLOT_URL=https://allot.example.com allot agent --gpu nvml --token-file /etc/allot/node-token\n"+
		"(or deploy/allot-agent.service). It is shown only this once.\n", secret, name, secret)
	return 0
}

// startDevAgents runs one in-process agent with fake GPUs for every node,
// so demo jobs really run. They stop when ctx ends.
func startDevAgents(ctx context.Context, m *Main, log *slog.Logger) (func(), error) {
	return startDevAgentsWithFaults(ctx, m, log, "", "")
}

// startDevAgentsWithFaults is startDevAgents whose agents read injected
// GPU faults from faultsDir/<node>.json ("": none) and run jobs that name
// no working directory in workDir ("": the process's own).
func startDevAgentsWithFaults(ctx context.Context, m *Main, log *slog.Logger, faultsDir, workDir string) (func(), error) {
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
		a := agent.New(agent.Local(agent.Config{Server: m.URL(), Token: tok, Hostname: n.Name, Domain: n.Domain, HeartbeatInterval: m.HeartbeatInterval,
			Backend: agent.NewFake(agent.FakeOptions{GPUs: n.GPUCount, Model: n.GPUType, MemoryMiB: mem, Hostname: n.Name,
				FaultFile: devFaultFile(faultsDir, n.Name)}),
			Logger: log.With("node", n.Name), ShutdownGrace: 5e9, WorkDir: workDir, ContainerRuntime: devRuntime()}))
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

// devFaultFile is where the `allot dev` agent of node reads injected GPU
// faults: one folder per dev instance (--faults-dir, by default next to
// its --data-dir: .allot/faults), e.g.
// echo '{"gpus":[{"index":0,"ecc_dbe":1}]}' > .allot/faults/gpu03.json
func devFaultFile(dir, node string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, node+".json")
}

// cmdNode is `allot node list|drain|undrain`: admin node operations over
// the JSON API.
func cmdNode(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := os.Getenv("ALLOT_URL")
	if def == "" {
		def = "http://localhost:8080"
	}
	server := fs.String("server", def, "Allot server URL (env ALLOT_URL)")
	token := cliflag.Secret(fs, "token", "ALLOT_TOKEN", "API `token`")
	reason := fs.String("reason", "", "drain: why (required)")
	requeue := fs.Bool("requeue", false, "drain: also stop the node's running jobs with the policy's grace and requeue them")
	note := fs.String("note", "", "undrain: why the node is fit again (required); set: why it is declared again")
	gpuType := fs.String("gpu-type", "", "set: the node's GPU type (one of allot gpu-type list)")
	gpus := fs.Int("gpus", 0, "set: how many GPUs it has")
	usage := func() int {
		fmt.Fprintln(stderr, "usage: allot node list | drain NAME --reason R [--requeue] | undrain NAME --note N | set NAME --gpu-type T --gpus N [--note N]")
		return 2
	}
	// Flags may come before and after the verb and the name.
	var pos []string
	for rest := args; ; {
		if err := cliflag.Parse(fs, rest); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) == 0 {
		return usage()
	}
	type call struct{ method, path, body string }
	var c call
	switch {
	case pos[0] == "list" && len(pos) == 1:
		c = call{"GET", "/api/v1/nodes", ""}
	case pos[0] == "drain" && len(pos) == 2:
		b, _ := json.Marshal(web.DrainJSON{Reason: *reason, Requeue: *requeue})
		c = call{"POST", "/api/v1/nodes/" + url.PathEscape(pos[1]) + "/drain", string(b)}
	case pos[0] == "undrain" && len(pos) == 2:
		b, _ := json.Marshal(web.UndrainJSON{Note: *note})
		c = call{"POST", "/api/v1/nodes/" + url.PathEscape(pos[1]) + "/undrain", string(b)}
	case pos[0] == "set" && len(pos) == 2:
		if *gpuType == "" || *gpus <= 0 {
			fmt.Fprintln(stderr, "allot node set: give --gpu-type and --gpus (a positive count)")
			return 2
		}
		b, _ := json.Marshal(web.InventoryJSON{GPUType: *gpuType, GPUs: *gpus, Note: *note})
		c = call{"PUT", "/api/v1/nodes/" + url.PathEscape(pos[1]) + "/inventory", string(b)}
	default:
		return usage()
	}
	req, err := http.NewRequest(c.method, strings.TrimRight(*server, "/")+c.path, strings.NewReader(c.body))
	if err != nil {
		fmt.Fprintf(stderr, "allot node: %v\n", err)
		return 2
	}
	req.Header.Set("Authorization", "Bearer "+token())
	req.Header.Set("Accept", "application/json")
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "allot node: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode >= 300 {
		var p web.Problem
		if json.Unmarshal(body, &p) == nil && p.Detail != "" {
			msg := p.Detail
			for k, v := range p.Errors {
				msg += fmt.Sprintf("; %s: %s", k, v)
			}
			fmt.Fprintf(stderr, "allot node %s: %s\n", pos[0], msg)
		} else {
			fmt.Fprintf(stderr, "allot node %s: %s\n", pos[0], resp.Status)
		}
		return 1
	}
	if pos[0] == "list" {
		var out struct {
			Nodes []web.NodeJSON `json:"nodes"`
		}
		if err := json.Unmarshal(body, &out); err != nil {
			fmt.Fprintf(stderr, "allot node list: %v\n", err)
			return 1
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tSTATE\tGPUS\tSITE\tJOBS\tEVENTS\tREASON")
		for _, n := range out.Nodes {
			fmt.Fprintf(tw, "%s\t%s\t%d× %s\t%s\t%d\t%d\t%s\n", n.Name, n.State, n.GPUs, n.GPUType, n.Site, n.RunningJobs, n.OpenEvents, n.Reason)
		}
		tw.Flush()
		return 0
	}
	var out struct {
		Node     web.NodeJSON `json:"node"`
		Requeued []int64      `json:"requeued"`
		Changed  *bool        `json:"changed"`
	}
	json.Unmarshal(body, &out) //nolint:errcheck
	if pos[0] == "set" {
		what := "declared"
		if out.Changed != nil && !*out.Changed {
			what = "already declared"
		}
		fmt.Fprintf(stdout, "node %s %s as %d × %s\n", out.Node.Name, what, *gpus, *gpuType)
		if out.Node.InventoryNote != "" {
			fmt.Fprintf(stdout, "its agent differs: %s\n", out.Node.InventoryNote)
		}
		return 0
	}
	fmt.Fprintf(stdout, "node %s is %s\n", out.Node.Name, out.Node.State)
	if len(out.Requeued) > 0 {
		fmt.Fprintf(stdout, "requeueing jobs %v\n", out.Requeued)
	}
	return 0
}

// devRuntime is the container runtime of allot dev's agents: podman where
// it is installed and dev runs as root (jobs with an image then run in
// it), else none.
func devRuntime() string {
	if os.Geteuid() != 0 {
		return ""
	}
	if _, err := exec.LookPath("podman"); err != nil {
		return ""
	}
	return "podman"
}
