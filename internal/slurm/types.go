package slurm

import (
	"strings"
	"time"
)

// Config says where slurmrestd is and how to authenticate. Exactly one of
// JWTKeyFile and TokenFile must be set.
type Config struct {
	// URL of slurmrestd, e.g. "http://127.0.0.1:6820" (no path).
	URL string
	// Version of the REST API to speak: "v0.0.38", "v0.0.40", "v0.0.41", or
	// "" / "auto" to detect it from GET /openapi/v3 (then by probing
	// /slurm/vX/ping) on first use.
	Version string
	// TokenUser is the user the token is for (the SlurmUser or root, so that
	// it may act as an authenticating proxy for engineers). Default "root".
	TokenUser string
	// JWTKeyFile is the HS256 key slurmctld and slurmdbd verify tokens with
	// (AuthAltParameters=jwt_key=...). Allot mints short-lived tokens from it.
	JWTKeyFile string
	// TokenFile holds a static token (as printed by `scontrol token`, with or
	// without the "SLURM_JWT=" prefix). It is re-read when it changes.
	TokenFile string
	// TokenLifespan of minted tokens; default 5 minutes. Tokens are renewed
	// when less than a third of their life is left.
	TokenLifespan time.Duration
	// SlurmConf is the slurm.conf path handed to CLI fallbacks (scontrol on
	// REST v0.0.38, sacct) as SLURM_CONF. Empty: the CLI's default.
	SlurmConf string
	// Timeout of one HTTP request; default 30 s.
	Timeout time.Duration
}

// Info is what Ping learns about the cluster.
type Info struct {
	Version string // REST API version in use, e.g. "v0.0.38"
	Release string // Slurm release, e.g. "22.05.8"
	// Controllers: slurmctld hosts and their state as slurmrestd reports them
	// ("UP" / "DOWN").
	Controllers map[string]string
}

// JobSubmit is one batch job to submit. GPUs (per job) or GPUsPerNode
// (with Nodes) asks for GPUs; GRESType narrows them to a type ("h100").
type JobSubmit struct {
	Name, Account, QOS, Partition, Comment, Workdir, Script string
	// Env is the job's whole environment (Slurm does not add the
	// submitter's). PATH defaults to "/usr/local/bin:/usr/bin:/bin".
	Env         map[string]string
	GPUs        int
	Nodes       int
	GPUsPerNode int
	GRESType    string
	TimeLimit   time.Duration // rounded up to whole minutes; 0: partition default
	Requeue     bool
	Hold        bool
	// CPUsPerTask: 0 leaves Slurm's default.
	CPUsPerTask int
	// Output is the batch script's stdout and stderr file, relative to
	// Workdir ("%j" is the job id); "" leaves Slurm's slurm-%j.out.
	Output string
}

// JobUpdate changes a queued or running job; nil fields are left alone.
type JobUpdate struct {
	QOS, Partition, Comment *string
}

// Job is one job as slurmctld knows it now (GET /slurm/vX/jobs). Times are
// UTC; zero means unknown.
type Job struct {
	ID                                  int64
	Name, Account, User, QOS, Partition string
	State                               string // base state, upper case: PENDING, RUNNING, COMPLETED, ...
	Flags                               []string
	Reason                              string // Slurm reason code ("Resources"); "" when "None"
	Comment                             string
	Submit, Eligible                    time.Time
	Start                               time.Time // of a PENDING job: Slurm's expected start (the squeue --start estimate), zero if none
	End                                 time.Time // only for finished jobs
	TimeLimit                           time.Duration
	GPUs                                int    // allocated when running, else requested (whole job)
	GRESType                            string // "h100" when the request or allocation names a type
	Nodes                               []string
	GPUIndices                          map[string][]int // node → GPU indices (from gres_detail) while running
	Restarts                            int
	ExitCode                            int // process exit status; 128+signal when killed by a signal
	Constraints                         string
	Switches                            int // requested leaf switches (topology), 0 if none
}

// Node is one Slurm node (GET /slurm/vX/nodes).
type Node struct {
	Name     string
	GPUs     int
	GRESType string
	State    string   // base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...
	Flags    []string // DRAIN, PLANNED, NOT_RESPONDING, ...
	Drain    bool
	Reason   string
}

// Run is one run segment from accounting. A job that was preempted and
// requeued has several records with the same JobID, told apart by Submit
// (each requeue starts a new record, submitted at the requeue) and Start;
// they are returned in (JobID, Submit, Start) order.
type Run struct {
	JobID                                      int64
	Name, Account, User, QOS, Partition, State string
	Comment                                    string
	Submit, Eligible, Start, End               time.Time // Start zero: never started; End zero while running
	TimeLimit                                  time.Duration
	GPUs                                       int
	GRESType                                   string
	Nodes                                      []string
	ExitCode                                   int
	// Right-sizing, where the site gathers gres/gpuutil and gres/gpumem
	// (AccountingStorageTRES=gres/gpu + JobAcctGatherType with NVML): the
	// average SM utilization per allocated GPU in percent, and the average
	// GPU memory in MiB, of the job's busiest step. Nil when not gathered.
	GPUUtilPct *float64
	GPUMemMiB  *int64
}

// Key identifies a run segment for idempotent import: the same record
// always gives the same key, and the records of a requeued job differ.
func (r Run) Key() string {
	return itoa(r.JobID) + "@" + itoa(r.Submit.Unix())
}

// CommentTag marks jobs Allot submitted: the Slurm comment carries
// "allot:job=<id>" (other words may surround it).
const CommentTag = "allot:job="

// AllotJobID finds "allot:job=<id>" in a Slurm comment.
func AllotJobID(comment string) (string, bool) {
	for _, w := range strings.FieldsFunc(comment, func(r rune) bool { return r == ' ' || r == ',' || r == ';' }) {
		if id, ok := strings.CutPrefix(w, CommentTag); ok && id != "" {
			return id, true
		}
	}
	return "", false
}
