// Package agentproto holds the wire types between `allot agent` (one per GPU
// node) and the Allot server, and a small client for them. Standard library
// only: the agent links nothing else of the server.
//
// The protocol is JSON over HTTP, authenticated with the node's token
// (Authorization: Bearer allot_node_…):
//
//	POST /api/agent/v1/register     Inventory            → Registration
//	POST /api/agent/v1/heartbeat    Heartbeat            → HeartbeatReply
//	GET  /api/agent/v1/orders?wait= (long poll)          → Orders
//	POST /api/agent/v1/leases/take  LeaseRef             → 204 (the agent is ready to run its part)
//	POST /api/agent/v1/leases/take-batch TakeBatch       → TakeBatchReply (several takes, and the starts now due)
//	POST /api/agent/v1/jobs/started JobStarted           → 204
//	POST /api/agent/v1/jobs/started-batch StartedBatch   → BatchReply (several starts)
//	POST /api/agent/v1/jobs/exited  JobExited            → 204
//	POST /api/agent/v1/jobs/log     JobLog               → 204
//
// A job's gang has one lease per node. The server offers leases; each agent
// takes its lease when it has verified it can run it (GPUs present and
// free); only when every lease of the gang is taken does the server send
// Start orders, so a gang starts on all nodes or on none. Stop orders carry
// the grace period: the agent sends SIGTERM to the job's process group,
// waits the grace, then SIGKILL.
//
// Errors are RFC 9457 problem documents (application/problem+json).
package agentproto

import (
	"net/http"
	"time"
)

// Version is the protocol version the agent speaks.
const Version = 1

// GPU is one GPU in a node's inventory.
type GPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Model     string `json:"model"`      // e.g. "NVIDIA H200"
	MemoryMiB int64  `json:"memory_mib"` // total framebuffer
	// NVLinkPeers lists the indices of GPUs reachable over NVLink, when NVML exposes it.
	NVLinkPeers []int `json:"nvlink_peers,omitempty"`
}

// Inventory is what an agent reports when it registers.
type Inventory struct {
	Hostname      string `json:"hostname"`
	AgentVersion  string `json:"agent_version"`
	Protocol      int    `json:"protocol"`
	GPUBackend    string `json:"gpu_backend"` // "nvml" or "fake"
	DriverVersion string `json:"driver_version,omitempty"`
	GPUs          []GPU  `json:"gpus"`
	// Domain is the interconnect (NVLink/IB) domain from the agent's
	// --domain label, "" when unset.
	Domain string `json:"domain,omitempty"`
	// Running lists the jobs the agent is still running, e.g. after a
	// server restart, a reconnect or an agent restart (the agent re-adopts
	// its jobs by their cgroups), so the server can re-attach them.
	Running []RunningJob `json:"running,omitempty"`
	// Isolation says how the agent confines jobs, e.g.
	// "uid,cgroup-v1,devices,memory,cpu,pids" or "none" (an agent that
	// cannot switch users: development only).
	Isolation string `json:"isolation,omitempty"`
	// Runtimes are the container runtimes the agent can run images with
	// ("podman", "docker"), empty when none is configured.
	Runtimes []string `json:"runtimes,omitempty"`
}

// RunningJob is a job process alive on the node.
type RunningJob struct {
	JobID   int64     `json:"job_id"`
	Segment int       `json:"segment"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
}

// DefaultHeartbeatInterval is how often agents heartbeat unless the
// server says otherwise (Registration.HeartbeatInterval): the server's,
// the worker's and the agent's default.
const DefaultHeartbeatInterval = 10 * time.Second

// Registration is the server's answer to Register.
type Registration struct {
	Node              string        `json:"node"`
	HeartbeatInterval time.Duration `json:"heartbeat_interval_ns"`
	// Unknown lists jobs from Inventory.Running the server no longer knows
	// as running on this node: the agent stops them.
	Unknown []int64 `json:"unknown,omitempty"`
	// UnknownLeases is Unknown per lease (job and segment); an agent that
	// reads it kills exactly those leases' processes.
	UnknownLeases []LeaseRef `json:"unknown_leases,omitempty"`
}

// GPUMetrics are one GPU's readings at heartbeat time, named after
// dcgm-exporter's fields.
type GPUMetrics struct {
	Index           int     `json:"index"`
	UUID            string  `json:"uuid"`
	UtilPct         float64 `json:"util_pct"`           // DCGM_FI_DEV_GPU_UTIL
	MemUsedMiB      int64   `json:"mem_used_mib"`       // DCGM_FI_DEV_FB_USED
	MemTotalMiB     int64   `json:"mem_total_mib"`      // FB_USED + FB_FREE
	TempC           float64 `json:"temp_c"`             // DCGM_FI_DEV_GPU_TEMP
	PowerW          float64 `json:"power_w"`            // DCGM_FI_DEV_POWER_USAGE
	ECCSingleVol    int64   `json:"ecc_sbe_vol"`        // DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
	ECCDoubleVol    int64   `json:"ecc_dbe_vol"`        // DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
	ThrottleReasons uint64  `json:"throttle_reasons"`   // NVML clocks-event reason bitmask
	XIDErrors       int64   `json:"xid_errors"`         // count of XID events since agent start
	LastXID         int     `json:"last_xid,omitempty"` // DCGM_FI_DEV_XID_ERRORS: the last XID seen
	// XIDs are the XID codes seen since the previous heartbeat the server
	// accepted (at most 64, oldest first).
	XIDs []int `json:"xids,omitempty"`
}

// JobStats are a running job's process statistics.
type JobStats struct {
	JobID      int64   `json:"job_id"`
	Segment    int     `json:"segment"`
	PID        int     `json:"pid"`
	CPUSeconds float64 `json:"cpu_seconds"`
	RSSBytes   int64   `json:"rss_bytes"`
	// LastCheckpoint is the newest modification time in the job's
	// ALLOT_CHECKPOINT_DIR (checkpointable jobs only).
	LastCheckpoint *time.Time `json:"last_checkpoint,omitempty"`
}

// Heartbeat is sent every interval.
type Heartbeat struct {
	Time time.Time    `json:"time"`
	GPUs []GPUMetrics `json:"gpus"`
	Jobs []JobStats   `json:"jobs"`
	// Health is the output of the node's health-check command (--health-cmd)
	// when it failed, "" when it passed or none is configured. GPUs missing
	// from the node's inventory are the ones absent from GPUs.
	Health string `json:"health,omitempty"`
	// MetricsError is set when reading the GPUs failed (the driver did not
	// answer): GPUs is then empty, and the server must not read that as
	// GPUs missing from the node.
	MetricsError string `json:"metrics_error,omitempty"`
}

// HeartbeatReply is the server's answer to a heartbeat.
type HeartbeatReply struct {
	NodeState string `json:"node_state"` // up, draining, drained, down
	// Kill lists leases the heartbeat reported running that have ended on
	// the server (cancelled, lost, requeued elsewhere): the agent kills
	// their processes at once, without grace.
	Kill []LeaseRef `json:"kill,omitempty"`
}

// Lease is a node's part of a job's gang.
type Lease struct {
	JobID     int64             `json:"job_id"`
	Segment   int               `json:"segment"` // run number: 1, then +1 after each requeue
	Team      string            `json:"team"`
	Command   []string          `json:"command"`
	Env       map[string]string `json:"env"` // complete: user env + CUDA_VISIBLE_DEVICES + ALLOT_* + MASTER_ADDR… for gangs
	WorkDir   string            `json:"workdir,omitempty"`
	GPUs      []int             `json:"gpus"`
	TimeLimit time.Duration     `json:"time_limit_ns"`
	// CheckpointDir is set for checkpointable jobs; it stays the same across
	// segments so a requeued job finds its checkpoint.
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
	// User is the POSIX account the job runs as (resolved on the node);
	// "" = the agent's --job-user. Never root, never the agent's account.
	User string `json:"user,omitempty"`
	// Submitter is the Allot user (e-mail) who submitted the job.
	Submitter string `json:"submitter,omitempty"`
	// Image is an OCI image to run the command in ("" = on the host).
	Image string `json:"image,omitempty"`
	// MemoryBytes and MilliCPUs limit this node's part of the job (its
	// cgroup); 0 = the agent's default per GPU.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	MilliCPUs   int64 `json:"milli_cpus,omitempty"`
}

// LeaseRef names one lease.
type LeaseRef struct {
	JobID   int64 `json:"job_id"`
	Segment int   `json:"segment"`
}

// Stop orders a running job to stop.
type Stop struct {
	JobID   int64         `json:"job_id"`
	Segment int           `json:"segment"`
	Grace   time.Duration `json:"grace_ns"` // SIGTERM → SIGKILL
	Reason  string        `json:"reason"`   // "preempted", "cancelled", "time_limit", "drain"
}

// Orders is what the agent must do now.
type Orders struct {
	// Offer: leases to take (check GPUs, then POST leases/take).
	Offer []Lease `json:"offer,omitempty"`
	// Start: leases whose whole gang is taken: start the process now.
	Start []LeaseRef `json:"start,omitempty"`
	// Stop: jobs to stop.
	Stop []Stop `json:"stop,omitempty"`
}

// Empty reports whether there is nothing to do.
func (o *Orders) Empty() bool { return len(o.Offer) == 0 && len(o.Start) == 0 && len(o.Stop) == 0 }

// TakeBatch takes several leases in one request (at most MaxBatch).
type TakeBatch struct {
	Leases []LeaseRef `json:"leases"`
}

// MaxBatch is the most leases one batched request may name.
const MaxBatch = 64

// LeaseResult is one lease's outcome in a batched request: Status 0 when
// done, else the status the single request would have been answered with
// (404: the node holds no such lease; 409: its state forbids the report)
// and the reason.
type LeaseResult struct {
	JobID   int64  `json:"job_id"`
	Segment int    `json:"segment"`
	Status  int    `json:"status,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// Err is the result as an error (nil when done); ErrorStatus reads its
// status.
func (r LeaseResult) Err() error {
	if r.Status == 0 {
		return nil
	}
	return &Problem{Title: http.StatusText(r.Status), Status: r.Status, Detail: r.Detail}
}

// BatchReply answers a batched report: one result per lease, in the
// request's order.
type BatchReply struct {
	Results []LeaseResult `json:"results"`
}

// TakeBatchReply answers a TakeBatch: one result per lease, and the start
// orders now due on this node (leases whose whole gang is taken, a
// single-node job's at once), which the server will not send again.
type TakeBatchReply struct {
	Results []LeaseResult `json:"results"`
	Start   []LeaseRef    `json:"start,omitempty"`
}

// StartedBatch reports several started processes in one request (at most
// MaxBatch).
type StartedBatch struct {
	Started []JobStarted `json:"started"`
}

// JobStarted reports that the job's process started.
type JobStarted struct {
	JobID   int64     `json:"job_id"`
	Segment int       `json:"segment"`
	PID     int       `json:"pid"`
	Time    time.Time `json:"time"`
}

// JobExited reports the end of a job's process on this node.
type JobExited struct {
	JobID    int64     `json:"job_id"`
	Segment  int       `json:"segment"`
	ExitCode int       `json:"exit_code"`         // -1 when killed by a signal
	Signal   string    `json:"signal,omitempty"`  // e.g. "SIGTERM", "SIGKILL"
	Reason   string    `json:"reason,omitempty"`  // why the agent ended it: the Stop reason, "time_limit", "start_failed"
	Message  string    `json:"message,omitempty"` // e.g. exec error
	Time     time.Time `json:"time"`
	// LastCheckpoint is as in JobStats, read after the process ended (a
	// job checkpoints in its grace period when preempted).
	LastCheckpoint *time.Time `json:"last_checkpoint,omitempty"`
}

// JobLog carries new lines of a job's stdout/stderr (the server keeps the tail).
type JobLog struct {
	JobID   int64    `json:"job_id"`
	Segment int      `json:"segment"`
	Lines   []string `json:"lines"`
	// Ends, when present, has one entry per line: the byte offset at which
	// the line ends in the job's output file (0: a line not from the file,
	// such as the agent's own messages). The server drops lines that end at
	// or before what it already has for the lease, so a batch resent after
	// an agent restart is not shown twice.
	Ends []int64 `json:"ends,omitempty"`
}

// Problem is an error answer from the server.
type Problem struct {
	Type   string            `json:"type"`
	Title  string            `json:"title"`
	Status int               `json:"status"`
	Detail string            `json:"detail,omitempty"`
	Errors map[string]string `json:"errors,omitempty"`
}

func (p *Problem) Error() string {
	if p.Detail != "" {
		return p.Detail
	}
	return p.Title
}
