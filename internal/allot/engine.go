package allot

import (
	"context"
	"errors"
	"time"
)

// The backend seam (issue 14). Allot's control plane decides policy —
// tiers, budgets that demote, fair share, the bill — and an execution
// engine runs the jobs. Two engines exist:
//
//   - native: Allot's own scheduler places jobs on Allot's agents (the lease
//     lifecycle in lease.go); nothing goes through Engine, and its
//     behaviour is what it always was.
//   - slurm: Slurm places and runs the jobs; Allot submits them, watches
//     them and imports what ran (internal/backend).
//
// A GPU type is a node pool and names its engine (gpu_types.backend); a
// job's engine is its GPU type's. An Engine is what an external engine
// must offer: what to run (Submit), what is running (Jobs, Nodes), what
// ran (Runs), cancel and demote, drain and undrain. The reconciler in
// internal/backend works only through it, so another engine (Kueue) is
// one more implementation.

// Backend names.
const (
	BackendNative = "native"
	BackendSlurm  = "slurm"
)

// EngineState is an engine job's state in Allot's words.
type EngineState string

const (
	EnginePending   EngineState = "pending"
	EngineRunning   EngineState = "running"
	EngineCompleted EngineState = "completed"
	EngineFailed    EngineState = "failed"
	EngineCancelled EngineState = "cancelled"
	// EnginePreempted: the run was preempted; a requeued job comes back
	// as pending (its next run is another segment).
	EnginePreempted EngineState = "preempted"
)

// EngineSubmit is what Allot asks an engine to run.
type EngineSubmit struct {
	AllotJobID  int64
	Name        string
	Account     string // the team
	Tier        TierID // the class it runs as (preemptible when demoted)
	GPUs        int
	GPUsPerNode int // 0: the engine decides
	GPUType     string
	TimeLimit   time.Duration
	Command     []string
	Env         map[string]string
	WorkDir     string
}

// EngineJob is a job as the engine sees it now. Times are on Allot's
// clock (the engine's implementation translates).
type EngineJob struct {
	ExternalID int64
	AllotJobID int64 // 0: not submitted through Allot (e.g. sbatch)
	Name       string
	Account    string
	User       string // POSIX account it runs as
	Tier       TierID // from its QOS ("" = unknown)
	QOS        string
	Partition  string
	State      EngineState
	Code       string // the engine's own state name
	Reason     string // the engine's reason code
	Why        string // Reason in Allot's words
	Submit     time.Time
	Start      time.Time // for a pending job: the engine's expected start (zero: none)
	End        time.Time
	TimeLimit  time.Duration
	GPUs       int
	GPUType    string // the engine's GPU type name ("" = untyped)
	Nodes      []string
	GPUIndices map[string][]int // per node, when the engine says
	ExitCode   int
	Demoted    bool // moved to the preemptible class for budget
}

// EngineRun is one run (segment) of a job from the engine's accounting.
type EngineRun struct {
	ExternalID int64
	AllotJobID int64
	Name       string
	Account    string
	User       string
	Tier       TierID
	QOS        string
	State      EngineState
	Code       string
	Submit     time.Time
	Start      time.Time
	End        time.Time // zero while it runs
	TimeLimit  time.Duration
	GPUs       int
	GPUType    string
	Nodes      []string
	ExitCode   int
	// GPUUtilPct and GPUMemMiB: the run's mean GPU utilization and memory
	// when the engine measures them (Slurm's gres/gpuutil, gres/gpumem).
	GPUUtilPct *float64
	GPUMemMiB  *int64
}

// EngineNode is a node as the engine sees it.
type EngineNode struct {
	Name     string
	GPUs     int
	GPUType  string
	Down     bool
	Drained  bool // drained or draining
	Draining bool // drain requested, jobs still running
	Reason   string
}

// Engine is an external execution engine.
type Engine interface {
	Name() string
	// Check says whether the engine answers and accepts Allot's
	// credentials (a clear error when not).
	Check(ctx context.Context) error
	Submit(ctx context.Context, asUser string, j EngineSubmit) (id int64, message string, err error)
	Cancel(ctx context.Context, asUser string, id int64) error
	// Demote moves a queued job to the preemptible class.
	Demote(ctx context.Context, id int64, why string) error
	Jobs(ctx context.Context) ([]EngineJob, error)
	Runs(ctx context.Context, from, to time.Time) ([]EngineRun, error)
	Nodes(ctx context.Context) ([]EngineNode, error)
	Drain(ctx context.Context, node, reason string) error
	Undrain(ctx context.Context, node string) error
}

// ErrEngineRejected marks an engine error that retrying cannot fix (the
// engine refused the job: unknown account, bad request).
var ErrEngineRejected = errors.New("the engine refused the request")
