package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
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
	nodeToken := cliflag.Secret(fs, "token", "ALLOT_NODE_TOKEN", "node `token` from allot node-token create (prefer --token-file: a command line is readable by every process of the node)")
	tokenFile := fs.String("token-file", "", "root-only file (mode 0600 or 0400) holding the node token")
	stateDir := fs.String("state-dir", "", "directory of the agent's leases, root-only (default /var/lib/allot/agent/HOSTNAME)")
	jobUser := fs.String("job-user", "", "POSIX account of jobs whose submitter maps to none (never root)")
	runAsAgent := fs.Bool("insecure-run-as-agent", false, "development only: run jobs as the agent's own (non-root) account, without cgroups; jobs can read the agent's token")
	cgroupsMode := fs.String("cgroups", "auto", "a cgroup per job: auto (required when root) or off (development only)")
	cgroupParent := fs.String("cgroup-parent", "", "cgroup under which the job cgroups are made (default allot/HOSTNAME)")
	memPerGPU := fs.String("memory-per-gpu", "", "memory limit per GPU of jobs that set none, e.g. 120GiB (default: the node's memory / its GPUs)")
	cpusPerGPU := fs.Float64("cpus-per-gpu", 0, "CPU limit per GPU of jobs that set none (default: the node's CPUs / its GPUs)")
	pidsMax := fs.Int64("pids-max", 16384, "most processes and threads of one job")
	runtimeName := fs.String("container-runtime", "", "runs jobs that name an image: podman or docker (default: none)")
	runtimePath := fs.String("container-runtime-path", "", "path of the container runtime program (default: found in PATH)")
	var runtimeArgs []string
	fs.Func("container-runtime-arg", "a global flag of the container runtime, put before its subcommand (repeat it), e.g. --container-runtime-arg=-H --container-runtime-arg=unix:///run/docker.sock", func(v string) error {
		runtimeArgs = append(runtimeArgs, v)
		return nil
	})
	keepJobs := fs.Bool("keep-jobs", true, "leave running jobs alone when the agent stops: the next agent adopts them (false: stop them, SIGTERM then SIGKILL after 10 s)")
	gpu := fs.String("gpu", "nvml", "GPU backend: nvml (NVIDIA driver) or fake (no GPUs needed)")
	fakeGPUs := fs.Int("fake-gpus", 8, "number of GPUs of the fake backend")
	fakeModel := fs.String("fake-model", "A100-80GB", "GPU model name of the fake backend")
	fakeMem := fs.Int64("fake-memory-mib", 81920, "GPU memory (MiB) of the fake backend")
	domain := fs.String("domain", "", "interconnect (NVLink/InfiniBand) domain label of this node")
	hostname := fs.String("hostname", "", "node name reported to the server (default: the host name)")
	heartbeat := fs.Duration("heartbeat", agentproto.DefaultHeartbeatInterval, "heartbeat interval (the server may override it)")
	metricsAddr := fs.String("metrics-addr", DefaultMetricsAddr, `listen address of /metrics (dcgm-exporter's names; not its port 9400); "" disables; a taken port is logged and retried, not fatal`)
	dcgmJobMapping := fs.String("dcgm-job-mapping", "", "`dir`ectory to keep dcgm-exporter's HPC job-mapping files in (its --hpc-job-mapping-dir): one file per GPU index naming the Allot job on it")
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
	// The token must not reach a job: jobs run as other users and cannot
	// read the agent's /proc environ, and no job environment is built from
	// the agent's.
	_ = os.Unsetenv("ALLOT_NODE_TOKEN")
	if *tokenFile != "" {
		t, err := readTokenFile(*tokenFile)
		if err != nil {
			return bad("--token-file: %v", err)
		}
		token = t
	}
	if token == "" {
		return bad("--token-file or --token is required (or set ALLOT_NODE_TOKEN); an admin creates one with `allot node-token create <node>`")
	}
	if *cgroupsMode != "auto" && *cgroupsMode != "off" {
		return bad("--cgroups %q: use auto or off", *cgroupsMode)
	}
	if *runtimeName != "" && *runtimeName != "podman" && *runtimeName != "docker" {
		return bad("--container-runtime %q: use podman or docker", *runtimeName)
	}
	if *cpusPerGPU < 0 {
		return bad("--cpus-per-gpu must not be negative, got %v", *cpusPerGPU)
	}
	if *pidsMax <= 0 {
		return bad("--pids-max must be positive, got %d", *pidsMax)
	}
	var memPer int64
	if *memPerGPU != "" {
		n, err := parseBytes(*memPerGPU)
		if err != nil {
			return bad("--memory-per-gpu %q: %v", *memPerGPU, err)
		}
		memPer = n
	}
	if *jobUser == "root" {
		return bad("--job-user root: jobs never run as root")
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
		StateDir: *stateDir, JobUser: *jobUser, CgroupParent: *cgroupParent, RunAsAgent: *runAsAgent, Cgroups: *cgroupsMode,
		MemoryPerGPU: memPer, MilliCPUsPerGPU: int64(*cpusPerGPU * 1000), PidsMax: *pidsMax,
		ContainerRuntime: *runtimeName, ContainerRuntimePath: *runtimePath, ContainerRuntimeArgs: runtimeArgs, KeepJobsOnExit: *keepJobs,
	})

	mctx, stopMetrics := context.WithCancel(ctx)
	defer stopMetrics()
	if *metricsAddr != "" {
		go a.ServeMetrics(mctx, *metricsAddr, 30*time.Second, logger)
	}
	if *dcgmJobMapping != "" {
		go a.SyncDCGMJobMapping(mctx, *dcgmJobMapping, time.Second, logger)
	}
	fmt.Fprintf(stdout, "allot agent %s: node %s, %s GPUs, server %s\n", Version, *hostname, *gpu, *server)
	if err := a.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "allot agent: %v\n", err)
		return 1
	}
	return 0
}

// readTokenFile reads a node token from a file only its owner can read.
func readTokenFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s is readable by others (mode %04o): chmod 600 it, jobs must not read the node's token", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return t, nil
}

// parseBytes reads a size such as 512MiB, 64GiB, 1TiB or a byte count.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"B", 1}}
	mult := int64(1)
	num := s
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = strings.TrimSpace(v), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("want a positive size such as 512MiB or 64GiB")
	}
	return n * mult, nil
}
