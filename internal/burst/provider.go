package burst

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/agent"
)

// Request asks a provider for Count nodes. It is also the JSON the exec
// provider writes to its command's stdin (with "action": "provision").
type Request struct {
	EventID     int64  `json:"event_id"`      // the burst event (idempotency key for the provider)
	Count       int    `json:"count"`         // nodes wanted
	GPUType     string `json:"gpu_type"`      // e.g. "A100-spot"
	GPUsPerNode int    `json:"gpus_per_node"` // e.g. 8
	Site        string `json:"site"`          // always "cloud"
	// Server is the URL the nodes' agents must reach ("" when not
	// configured: the command knows it).
	Server string `json:"server,omitempty"`
	// NodeTokens holds one node token per node: the i-th node returned
	// must run its agent with ALLOT_NODE_TOKEN = NodeTokens[i]. Allot
	// stores the tokens only once the provider has answered.
	NodeTokens []string `json:"node_tokens"`
}

// Provider creates and removes burst nodes.
type Provider interface {
	// Name identifies the provider in burst events ("exec", "local").
	Name() string
	// Provision creates req.Count nodes and returns their names, in the
	// order of req.NodeTokens. An error means no node was created (the
	// provider cleans up after itself).
	Provision(ctx context.Context, req Request) ([]string, error)
	// Release removes the named nodes; nothing runs on them any more.
	Release(ctx context.Context, names []string) error
}

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,62}[a-z0-9])?$`)

// CheckNames validates a provider's answer to req: exactly req.Count
// distinct lower-case host names.
func CheckNames(req Request, names []string) error {
	if len(names) != req.Count {
		return fmt.Errorf("asked for %d nodes, got %d names", req.Count, len(names))
	}
	seen := map[string]bool{}
	for _, n := range names {
		if !nodeNameRE.MatchString(n) {
			return fmt.Errorf("node name %q is not a lower-case host name", n)
		}
		if seen[n] {
			return fmt.Errorf("node name %q returned twice", n)
		}
		seen[n] = true
	}
	return nil
}

// ExecProvider runs an admin-configured command (a Terraform or cloud-CLI
// wrapper) for each provision and release.
//
// Provision: the command gets the Request as JSON on stdin, with
// "action": "provision":
//
//	{"action":"provision","event_id":7,"count":2,"gpu_type":"A100-spot","gpus_per_node":8,
//	 "site":"cloud","server":"https://allot.example.com","node_tokens":["allot_node_…","allot_node_…"]}
//
// and must print on stdout, exiting 0:
//
//	{"nodes":[{"name":"spot-a100-7-0"},{"name":"spot-a100-7-1"}]}
//
// with exactly count names (lower-case host names), the i-th node running
// `allot agent` with node_tokens[i]. Release: stdin
//
//	{"action":"release","nodes":["spot-a100-7-0"]}
//
// exit 0 (stdout is ignored). A non-zero exit, a timeout or (for
// provision) output that is not that JSON is a failure; the error carries
// the command's stderr.
type ExecProvider struct {
	Command string        // path of the command
	Args    []string      // extra arguments
	Timeout time.Duration // per call, default 15 min
}

// Name is "exec".
func (p *ExecProvider) Name() string { return "exec" }

type execProvision struct {
	Action string `json:"action"`
	Request
}

type execRelease struct {
	Action string   `json:"action"`
	Nodes  []string `json:"nodes"`
}

// ExecAnswer is what a provision command prints.
type ExecAnswer struct {
	Nodes []struct {
		Name string `json:"name"`
	} `json:"nodes"`
}

func (p *ExecProvider) run(ctx context.Context, in any) ([]byte, error) {
	if p.Command == "" {
		return nil, errors.New("exec provider: no command configured (--burst-exec)")
	}
	to := p.Timeout
	if to <= 0 {
		to = 15 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	body, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, p.Command, p.Args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(body), &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		if ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("timed out after %s", to)
		}
		if msg == "" {
			return nil, fmt.Errorf("%s: %w", p.Command, err)
		}
		return nil, fmt.Errorf("%s: %w: %s", p.Command, err, msg)
	}
	return stdout.Bytes(), nil
}

// Provision runs the command with the request (see ExecProvider).
func (p *ExecProvider) Provision(ctx context.Context, req Request) ([]string, error) {
	out, err := p.run(ctx, execProvision{Action: "provision", Request: req})
	if err != nil {
		return nil, err
	}
	var ans ExecAnswer
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ans); err != nil {
		return nil, fmt.Errorf("%s: output is not {\"nodes\":[{\"name\":…}]}: %v (got %.200q)", p.Command, err, out)
	}
	names := make([]string, len(ans.Nodes))
	for i, n := range ans.Nodes {
		names[i] = n.Name
	}
	if err := CheckNames(req, names); err != nil {
		return names, fmt.Errorf("%s: %w", p.Command, err)
	}
	return names, nil
}

// Release runs the command with the names to release.
func (p *ExecProvider) Release(ctx context.Context, names []string) error {
	_, err := p.run(ctx, execRelease{Action: "release", Nodes: names})
	return err
}

// LocalProvider starts burst nodes as agents with fake GPUs in this
// process (the demo and the tests): each node's agent registers with its
// node token like any other and runs jobs as local processes. An agent
// started before Allot has stored its token (the provider answers first)
// retries until the token is known, as a cloud VM's agent restarted by
// systemd would.
type LocalProvider struct {
	Server            func() string // the server's URL (known once it listens)
	HeartbeatInterval time.Duration
	Logger            *slog.Logger
	// Fail makes Provision fail with this error (for demonstrations).
	Fail error

	mu     sync.Mutex
	seq    int
	agents map[string]*localAgent
}

type localAgent struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Name is "local".
func (p *LocalProvider) Name() string { return "local" }

// Provision starts req.Count agents named burst-<event>-<n>.
func (p *LocalProvider) Provision(ctx context.Context, req Request) ([]string, error) {
	if p.Fail != nil {
		return nil, p.Fail
	}
	if len(req.NodeTokens) != req.Count {
		return nil, fmt.Errorf("local provider: %d tokens for %d nodes", len(req.NodeTokens), req.Count)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.agents == nil {
		p.agents = map[string]*localAgent{}
	}
	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	names := make([]string, req.Count)
	for i := range req.Count {
		p.seq++
		name := fmt.Sprintf("burst-%d-%d", req.EventID, p.seq)
		names[i] = name
		actx, cancel := context.WithCancel(context.Background())
		la := &localAgent{cancel: cancel, done: make(chan struct{})}
		p.agents[name] = la
		token := req.NodeTokens[i]
		go func() {
			defer close(la.done)
			for actx.Err() == nil {
				a := agent.New(agent.Local(agent.Config{Server: p.Server(), Token: token, Hostname: name, HeartbeatInterval: p.HeartbeatInterval,
					Backend: agent.NewFake(agent.FakeOptions{GPUs: req.GPUsPerNode, Model: req.GPUType, MemoryMiB: 81920, Hostname: name}),
					Logger:  log.With("node", name), ShutdownGrace: 5 * time.Second, RetryMax: time.Second}))
				if err := a.Run(actx); err == nil || actx.Err() != nil {
					return
				}
				select { // the token is not stored yet: retry
				case <-actx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
	}
	return names, nil
}

// Release stops the named agents (unknown names are ignored: released
// already, or started by an earlier process).
func (p *LocalProvider) Release(ctx context.Context, names []string) error {
	p.mu.Lock()
	var stop []*localAgent
	for _, n := range names {
		if a := p.agents[n]; a != nil {
			stop = append(stop, a)
			delete(p.agents, n)
		}
	}
	p.mu.Unlock()
	for _, a := range stop {
		a.cancel()
	}
	for _, a := range stop {
		select {
		case <-a.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Running returns the names of the agents this provider runs now.
func (p *LocalProvider) Running() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for n := range p.agents {
		out = append(out, n)
	}
	return out
}

// Close stops every agent.
func (p *LocalProvider) Close() {
	_ = p.Release(context.Background(), p.Running())
}
