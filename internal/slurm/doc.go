// Package slurm is Allot's client for slurmrestd: what its Slurm backend
// submits, lists, cancels, drains and imports.
//
// # API
//
//	c, err := slurm.New(slurm.Config{URL, Version, TokenUser, JWTKeyFile | TokenFile, SlurmConf, Timeout})
//	c.Ping(ctx) (Info, error)                        // version, release, controllers; typed errors
//	c.Submit(ctx, asUser, JobSubmit) (id, userMsg, error)
//	c.Cancel(ctx, asUser, id)                        // an ended job is not an error
//	c.UpdateJob(ctx, id, JobUpdate{QOS, Partition, Comment *string})
//	c.Jobs(ctx) ([]Job, error)                       // slurmctld's view, with expected starts
//	c.Nodes(ctx) ([]Node, error)
//	c.Drain(ctx, node, reason) / c.Resume(ctx, node) // REST from v0.0.40, scontrol on v0.0.38
//	c.Accounting(ctx, from, to) ([]Run, error)       // every run segment from slurmdbd
//	c.Sacct(ctx, from, to) ([]Run, error)            // the same from the sacct CLI
//	c.JobsCLI(ctx) ([]Job, error)                    // squeue --json: same decoder as GET /jobs
//	slurm.ParseSacct(r) / SacctArgs(from, to) / SacctFields() / c.CLIEnv()
//	slurm.ExplainReason(reason, job) string          // "waiting for 16 GPUs in one IB domain"
//	slurm.MintJWT(key, user, iat, lifespan)
//	slurm.AllotJobID(comment) (id, ok)               // "allot:job=<id>" in a Slurm comment
//
// Errors: errors.Is(err, ErrConfig | ErrUnreachable | ErrUnauthorized |
// ErrUnsupported | ErrNotFound | ErrRejected); *APIError carries Slurm's own
// errors[] (e.g. "Invalid account or account/partition combination
// specified (2045)", `Unknown key "tres_per_job"`).
//
// # Versions
//
// One adapter per REST version, one file each: v0038.go (Slurm 22.05–24.05),
// v0040.go (23.11–25.05), v0041.go (24.05–25.11). Config.Version picks one;
// "" or "auto" reads the paths of GET /openapi/v3 and takes the newest with an
// adapter (falling back to probing /slurm/vX/ping). A slurmrestd that offers
// only other versions (v0.0.39 of 23.02, v0.0.42+) gets ErrUnsupported naming
// what it offers. A new version is one file: its request bodies, plus the
// shared decoders (num, strList and exitCode absorb the number-object,
// flag-array and verbose-exit-code encodings of v0.0.40+).
//
// v0.0.38 is tested for real, against a private Debian 22.05.8 cluster
// (internal/slurmtest) and against responses recorded from one
// (testdata/v0038_*, dbv0038_*, sacct_v0038_*). v0.0.40 and v0.0.41 are
// tested only against SYNTHETIC responses (testdata/v0040_*, v0041_*,
// dbv0040_*, dbv0041_*), written from the data_parser schemas in Slurm's
// source (src/plugins/data_parser/v0.0.40/parsers.c at slurm-23-11-0-1,
// v0.0.41 at slurm-24-05-0-1) and replayed through the client by a stand-in
// server; no newer slurmrestd ran here.
//
// # Figures
//
// On this machine (2 cores, loopback; TestLiveFigures with
// ALLOT_SLURM_FIGURES=1, BenchmarkDecodeAccountingV0038): 200 sequential REST submits as a user (v0.0.38, 1 GPU each): p50 8.2 ms,
// p99 32 ms, max 78 ms; plain sbatch (fork+exec, 20): p50 10.3 ms, p99
// 13 ms. Accounting import of 220 runs: 0.55 s through REST (≈400 runs/s,
// slurmdbd-bound, 1.3 MiB), decode alone ≈7,800–8,800 runs/s.
//
// # Auth
//
// With JWTKeyFile the client mints HS256 tokens itself (claims iat, exp,
// sun=TokenUser; 5 minutes by default, renewed when a third of the life is
// left); with TokenFile it sends that token (re-read when the file changes).
// Every request carries X-SLURM-USER-TOKEN and X-SLURM-USER-NAME: the
// engineer for Submit and Cancel, TokenUser otherwise.
//
// # Findings on Slurm 22.05.8 (REST v0.0.38), verified here
//
// Proxy as user works: a root token with X-SLURM-USER-NAME=<engineer>
// submits a job that squeue, /jobs and accounting show as the engineer's
// (user_name, association). The engineer must have an association in the
// account, else 2045 "Invalid account or account/partition combination"
// (the same error as a wrong account). A non-root token may not act for
// another user: slurmctld drops the connection and the answer is 5005 "Zero
// Bytes were transmitted or received". Cancel as the engineer of someone
// else's job: 2002 "Access/permission denied".
//
// Bad tokens: slurmrestd with SLURM_JWT=daemon passes any token on;
// slurmctld rejects it but /slurm/v0.0.38/* answer only "Unspecified error"
// (ping: "slurmctld config is unable to load", HTTP 500), the same as when
// slurmctld is down. slurmdbd names it (1007 "Protocol authentication
// error"), so on such a generic error the client asks GET /slurmdb/vX/tres
// and reports ErrUnauthorized or ErrUnreachable. A request without a token is
// HTTP 401 "Authentication failure" from slurmrestd itself.
//
// Requeued runs: GET /slurmdb/v0.0.38/jobs returns one record per run of a
// preempted and requeued job (PREEMPTED, PREEMPTED, ..., then the current
// PENDING or RUNNING one), but ONLY when the query has a parameter: without
// one the handler passes no job condition and slurmdbd returns just the last
// record per job (and fills time.end of running jobs with "now"). With any
// parameter it sets JOBCOND_FLAG_DUP|NO_TRUNC. The records share job_id;
// v0.0.38 has no db_index. They differ by time.submission, which a requeue
// resets to the requeue time (then time.start); Run.Key is job_id@submission
// and is the same in sacct -D (Submit). The requeued (PENDING) record is
// not always written at once: seen both right after a preemption and only
// when the job started again (BeginTime ~2 minutes later). A run preempted
// within a second of starting had a PREEMPTED record with time.start 0
// (slurmctld's start message had not reached slurmdbd): zero usage. Accounting passes start_time and
// end_time as "uts<epoch>", parse_time's time-zone-free form (a plain epoch is
// rejected; "2026-12-01T19:00:00" would be slurmrestd's local time and its
// ':' must be escaped).
//
// GPU indices of a running job: /slurm/v0.0.38/jobs gres_detail, one string
// per allocated node in hostlist order, e.g. ["gpu:h100:4(IDX:0-3)",
// "gpu:h100:4(IDX:0-3)"] for nodes gpu[01-02] → Job.GPUIndices. Nodes show
// the same in gres_used ("gpu:h100:2(IDX:0-1)"). GPU counts come from
// tres_alloc_str / tres_req_str ("gres/gpu=8,gres/gpu:h100=8": whole job);
// accounting from tres.allocated entries {"type":"gres","name":"gpu"} and
// "gpu:h100" for the type (only with AccountingStorageTRES listing the typed
// TRES, e.g. gres/gpu,gres/gpu:h100).
//
// Expected start of a pending job: its start_time in /jobs is the backfill
// estimate squeue --start prints (e.g. the end of the job in the way, by its
// time limit), with end_time = start + limit. 0 while the scheduler has not
// looked (state_reason "None" just after submit), for held jobs
// (JobHeldUser) and for unresolved dependencies. A job requeued after
// preemption is PENDING with reason BeginTime, restart_cnt+1, and
// start_time = eligible_time = the requeue time + ~2 minutes.
//
// Other surprises: the job comment (allot:job=<id>) reaches accounting only
// with AccountingStoreFlags=job_comment in slurm.conf (comment.job is null
// otherwise). dbv0.0.38 reports exit_code SUCCESS/0 for a job that exited 3
// (sacct shows 3:0): take exit codes from /jobs or sacct, not REST
// accounting, on v0.0.38. A submit with hold answers error 2042 "Job is in
// held state" and still returns the job id (treated as success). A submit
// asking for more GPUs than a node has fails with 2014 "Requested node
// configuration is not available", yet leaves a FAILED job (BadConstraints,
// exit 1) in /jobs and accounting. Without AccountingStorageEnforce any
// account and QOS name is accepted (unknown QOS: the job gets qos "" and no
// time limit). Unknown JSON keys are rejected (9001, `Unknown key
// "tres_per_job"`), environment is required (2127). DELETE /job/{id}
// signals KILL.
//
// Right-sizing: Run.GPUUtilPct / GPUMemMiB come from gres/gpuutil and
// gres/gpumem in the steps' TRES usage (REST steps[].tres.requested.average;
// sacct TRESUsageInAve on step lines, i.e. without -X), where a site gathers
// them (AccountingStorageTRES=gres/gpu with an NVML-enabled
// JobAcctGatherType). gpuutil is summed over a step's GPUs, so it is divided
// by the run's GPUs; gpumem is bytes. The busiest step counts. This machine
// has no GPUs: only synthetic fixtures test it.
package slurm
