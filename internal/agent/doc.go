// Package agent is the node agent, `allot agent`: one per GPU node. It
// registers the node's GPUs with the server (internal/agentproto), sends a
// heartbeat with per-GPU metrics and per-job process statistics, long-polls
// for orders, takes job leases whose GPUs are present and free, runs each
// job as its own process group with the lease's environment, streams the
// tail of its output, enforces time limits and stop orders (SIGTERM, grace,
// SIGKILL), and reports every start and exit reliably: reports are queued
// and retried until the server acknowledges them, and running jobs survive a
// server restart (the agent re-registers and re-reports them).
//
// GPUs are read through a GPUBackend: NVML (github.com/NVIDIA/go-nvml,
// loaded at run time) on real nodes, or Fake, which stands in for GPUs
// wherever none are present. MetricsHandler serves the readings in
// dcgm-exporter's format.
//
// The agent links nothing of the server: no database, web framework or
// queue packages.
package agent
