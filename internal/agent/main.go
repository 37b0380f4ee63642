package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/clock"
)

// Main runs `allot agent` with args (without the subcommand name) and
// returns the process exit code: 0 after a clean stop (SIGINT/SIGTERM), 1
// on a runtime error (no driver, token refused), 2 on bad flags.
//
// On SIGINT/SIGTERM the agent stops its running jobs (SIGTERM, 10 s grace,
// SIGKILL; reason "agent_shutdown"), reports their exits and exits. To keep
// jobs across an agent upgrade, drain the node first.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return MainContext(ctx, args, stdout, stderr)
}

// MainContext is Main until ctx ends instead of a signal (tests run the
// agent's command line in-process with it).
func MainContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("allot agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", os.Getenv("ALLOT_URL"), "Allot server base URL (env ALLOT_URL)")
	nodeToken := cliflag.Secret(fs, "token", "ALLOT_NODE_TOKEN", "node `token` from allot node-token create")
	gpu := fs.String("gpu", "nvml", "GPU backend: nvml (NVIDIA driver) or fake (no GPUs needed)")
	fakeGPUs := fs.Int("fake-gpus", 8, "number of GPUs of the fake backend")
	fakeModel := fs.String("fake-model", "A100-80GB", "GPU model name of the fake backend")
	fakeMem := fs.Int64("fake-memory-mib", 81920, "GPU memory (MiB) of the fake backend")
	domain := fs.String("domain", "", "interconnect (NVLink/InfiniBand) domain label of this node")
	hostname := fs.String("hostname", "", "node name reported to the server (default: the host name)")
	heartbeat := fs.Duration("heartbeat", 10*time.Second, "heartbeat interval (the server may override it)")
	metricsAddr := fs.String("metrics-addr", ":9400", `listen address of /metrics (dcgm-exporter format); "" disables`)
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	healthCmd := fs.String("health-cmd", "", "health check program run every --health-interval; a non-zero exit reports the node unhealthy with its output")
	healthEvery := fs.Duration("health-interval", 60*time.Second, "how often --health-cmd runs (also its timeout, at most 5m)")
	workDir := fs.String("workdir", "", "absolute working directory of jobs that name none (default: the agent's own)")
	fakeFaults := fs.String("fake-faults", "", `fake backend: JSON file of injected faults, re-read at every reading, e.g. {"gpus":[{"index":3,"ecc_dbe":1}]}`)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot agent --server URL --token TOKEN [flags]")
		fmt.Fprintln(stderr, "Runs the node agent: registers this node's GPUs and runs the jobs Allot places here.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "allot agent: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	if *server == "" {
		return bad("--server is required (or set ALLOT_URL), e.g. --server https://allot.example.com")
	}
	if !strings.HasPrefix(*server, "http://") && !strings.HasPrefix(*server, "https://") {
		return bad("--server %q must be an http:// or https:// URL", *server)
	}
	token := nodeToken()
	if token == "" {
		return bad("--token is required (or set ALLOT_NODE_TOKEN); an admin creates one with `allot node-token create <node>`")
	}
	if *heartbeat <= 0 {
		return bad("--heartbeat must be positive, got %s", *heartbeat)
	}
	if *healthEvery <= 0 {
		return bad("--health-interval must be positive, got %s", *healthEvery)
	}
	if *healthCmd != "" {
		if st, err := os.Stat(*healthCmd); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return bad("--health-cmd %s is not an executable file", *healthCmd)
		}
	}
	if *workDir != "" {
		if st, err := os.Stat(*workDir); !strings.HasPrefix(*workDir, "/") || err != nil || !st.IsDir() {
			return bad("--workdir %q must be an absolute path to a directory", *workDir)
		}
	}
	if *fakeFaults != "" && *gpu != "fake" {
		return bad("--fake-faults needs --gpu fake")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return bad("--log-level %q: use debug, info, warn or error", *logLevel)
	}
	if *hostname == "" {
		h, err := os.Hostname()
		if err != nil {
			return bad("cannot read the host name (%v); set --hostname", err)
		}
		*hostname = h
	}
	var backend GPUBackend
	switch *gpu {
	case "fake":
		if *fakeGPUs <= 0 || *fakeGPUs > 64 {
			return bad("--fake-gpus must be between 1 and 64, got %d", *fakeGPUs)
		}
		if *fakeMem <= 0 {
			return bad("--fake-memory-mib must be positive, got %d", *fakeMem)
		}
		backend = NewFake(FakeOptions{GPUs: *fakeGPUs, Model: *fakeModel, MemoryMiB: *fakeMem, Hostname: *hostname, FaultFile: *fakeFaults})
	case "nvml":
		b, err := NewNVML()
		if err != nil {
			fmt.Fprintf(stderr, "allot agent: %v\n", err)
			return 1
		}
		backend = b
	default:
		return bad("--gpu %q: use nvml or fake", *gpu)
	}
	defer backend.Close()

	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level, ReplaceAttr: clock.LogTime}))
	a := New(Config{
		Server: *server, Token: token, Hostname: *hostname, Domain: *domain,
		Backend: backend, HeartbeatInterval: *heartbeat, Logger: logger,
		HealthCmd: *healthCmd, HealthInterval: *healthEvery, WorkDir: *workDir,
	})

	if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			fmt.Fprintf(stderr, "allot agent: --metrics-addr %s: %v\n", *metricsAddr, err)
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", a.MetricsHandler())
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		logger.Info("serving metrics", "addr", ln.Addr().String())
	}
	fmt.Fprintf(stdout, "allot agent %s: node %s, %s GPUs, server %s\n", Version, *hostname, *gpu, *server)
	if err := a.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "allot agent: %v\n", err)
		return 1
	}
	return 0
}
