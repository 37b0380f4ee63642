package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/jobs"
)

// burstFlags are the cloud-burst flags of `allot worker` and `allot dev`.
type burstFlags struct {
	provider, exec, gpuType, server string
	gpus                            int
	horizon, registerTimeout        time.Duration
}

func addBurstFlags(fs *flag.FlagSet, defaultProvider string) *burstFlags {
	b := &burstFlags{}
	fs.StringVar(&b.provider, "burst-provider", envOr("ALLOT_BURST_PROVIDER", defaultProvider),
		"cloud burst provider: exec (runs --burst-exec), local (in-process agents with fake GPUs, allot dev only) or none (env ALLOT_BURST_PROVIDER)")
	fs.StringVar(&b.exec, "burst-exec", os.Getenv("ALLOT_BURST_EXEC"),
		"command the exec provider runs with the request as JSON on stdin (env ALLOT_BURST_EXEC)")
	fs.StringVar(&b.gpuType, "burst-gpu-type", envOr("ALLOT_BURST_GPU_TYPE", "A100-spot"),
		"GPU type of burst nodes; its rate in the rate card is the spot price")
	fs.IntVar(&b.gpus, "burst-gpus", 8, "GPUs per burst node")
	fs.StringVar(&b.server, "burst-server", os.Getenv("ALLOT_BURST_SERVER"), "server URL the burst nodes' agents connect to (passed to the provider)")
	fs.DurationVar(&b.horizon, "burst-horizon", burst.DefaultHorizon, "planning horizon: request enough nodes to run the pending work within it")
	fs.DurationVar(&b.registerTimeout, "burst-register-timeout", 15*time.Minute, "release (as failed) burst nodes whose agent has not registered within this")
	return b
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// config builds the worker's burst configuration; local is the provider
// to use for "local" (nil where it is not allowed).
func (b *burstFlags) config(local burst.Provider) (jobs.BurstConfig, error) {
	cfg := jobs.BurstConfig{GPUType: b.gpuType, GPUsPerNode: b.gpus, Horizon: b.horizon, RegisterTimeout: b.registerTimeout, Server: b.server}
	if b.gpus < 1 || b.gpus > 64 {
		return cfg, fmt.Errorf("--burst-gpus must be between 1 and 64, got %d", b.gpus)
	}
	if b.horizon <= 0 || b.registerTimeout <= 0 {
		return cfg, fmt.Errorf("--burst-horizon and --burst-register-timeout must be positive")
	}
	switch strings.ToLower(b.provider) {
	case "", "none":
	case "exec":
		if b.exec == "" {
			return cfg, fmt.Errorf("--burst-provider exec needs --burst-exec COMMAND")
		}
		cfg.Provider = &burst.ExecProvider{Command: b.exec}
	case "local":
		if local == nil {
			return cfg, fmt.Errorf("--burst-provider local runs agents in this process: only allot dev can use it")
		}
		cfg.Provider = local
	default:
		return cfg, fmt.Errorf("--burst-provider must be exec, local or none, got %q", b.provider)
	}
	return cfg, nil
}

// newLocalBurst is the local provider of a Main: agents with fake GPUs
// connecting to m's own server.
func newLocalBurst(m *Main, log *slog.Logger) *burst.LocalProvider {
	return &burst.LocalProvider{Server: m.URL, HeartbeatInterval: m.HeartbeatInterval, Logger: log}
}

// devSpotRate is the demo's spot price of a burst GPU-hour.
var devSpotRate = allot.Money{Micros: 1_400_000, Currency: "USD"}

// ensureBurstGPUType adds the burst GPU type with the demo's spot price
// when the rate card lacks it (allot dev only).
func ensureBurstGPUType(ctx context.Context, st *store.Store, gpuType string) error {
	types, err := st.ListGPUTypes(ctx)
	if err != nil {
		return err
	}
	for _, g := range types {
		if g.Name == gpuType {
			return nil
		}
	}
	return st.CreateGPUType(ctx, &allot.GPUType{Name: gpuType, MemoryGB: 80, HourlyRate: devSpotRate}, store.MonthStart(st.Now()).AddDate(-1, 0, 0))
}
