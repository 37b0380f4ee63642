// Package sim replays a GPU-cluster job trace in virtual time through the
// scheduler core, comparing Allot's policy with Slurm-style baselines
// (`allot sim`).
//
// # Replay
//
// The trace (schema in ../shared/traces/README.md) is clipped to --window by
// submit time and rebased so the window starts at 0, filtered to --team, and
// its inter-arrival times are divided by --time-scale (durations are not
// scaled). The cluster is --nodes nodes of --gpus-per-node GPUs, all up and
// on-premise, of GPU type ""; every --domain-nodes consecutive nodes share an
// interconnect domain ("d000", "d001", …), and --domain-nodes 0 leaves Domain
// "" (no topology: one flat domain). Without --nodes the cluster is the teams
// file's total GPUs / --gpus-per-node (Philly: 2,816 GPUs = 352 × 8).
//
// Each job becomes a scheduler.Job: ID = its 1-based position in the replayed
// trace, tier from --tier-mix by a seeded hash of the trace job id (FNV-1a
// then a splitmix64 finaliser), time limit = duration × --walltime-factor
// (rounded up to a second; with A:B a per-user factor, see Start
// estimates). Team guarantees come from --teams (guarantee =
// gpus, keyed by GPU type ""); Team.Weight = the guarantee (1 for a team
// without one). Team.Usage is each team's GPU-seconds decayed continuously
// with Policy.HalfLife (7 days) in virtual time. Team.OverBudget is always
// false: traces carry no money, so budget demotion is not exercised.
//
// Events are processed in virtual time; at each event time: first every
// finish (and time-limit kill) and every end of a preemption grace period,
// then every arrival, then one scheduling cycle. Equal-time events are thus
// release-before-start, like the reference. A cycle builds a
// Snapshot (no copying: the running and pending slices are maintained
// incrementally and passed as they are; the core never mutates them), calls
// Config.Schedule (scheduler.Schedule by default), and applies the plan:
//
//   - a Start records start time, placement and RunAs; the job ends at
//     now + min(remaining work, time limit) (killed at the time limit if
//     that comes first);
//   - a Preemption marks the victim Terminating with GraceEnd =
//     now + Policy.GracePeriod and PreemptedBy = Preemption.By (as the live
//     loop does, so that the core holds the GPUs coming free for the
//     preemptor); it holds its GPUs until then (a job that completes within
//     the grace period just completes); at GraceEnd its GPUs are freed and
//     it is requeued with its original submit time.
//
// Plans are checked: a start of a job that is not pending, a GPU already in
// use, a gang of the wrong size or a preemption of a job that is not running
// fails the replay with an error naming the cycle.
//
// Cycles run on every event time and, with --cycle > 0, periodically every
// --cycle of virtual time while jobs are pending (ModeAllot only; see below).
// Provably idle cycles are skipped and not counted in `cycles`: none runs
// with an empty queue; the baselines never run one when no GPU is free, nor
// when only arrivals happened since the last cycle and none of them could
// start (strict FIFO: the queue was not empty; partitioned: the team's queue
// was not empty; any policy: the job fits in no free GPUs). Periodic cycles
// of the baselines are no-ops (their decisions depend only on the queue and
// the free GPUs) and are skipped too. TestSkippingChangesNothing checks that
// the skipping leaves every metric unchanged.
//
// # Checkpoint model
//
// A fraction --checkpointable (default 0.5) of the jobs, by a seeded hash of
// the trace job id, is checkpointable; such a job saves its progress every
// --checkpoint-interval (default 30 min) of run time (Job.LastCheckpoint is
// kept current in the snapshot). When a preempted job's grace period ends,
// the work since its last checkpoint — or since its start when it does not
// checkpoint or has not checkpointed yet — is lost:
// gpu_s_lost_to_preemption += GPUs × (GraceEnd − last checkpoint). The job's
// remaining work is its duration minus all checkpointed progress. (The grace
// period is counted as lost work: the model does not assume a checkpoint on
// SIGTERM, which makes it conservative.)
//
// # Cloud burst
//
// With --burst, allot is replayed a second time as "allot+burst" with
// Config.Burst: every virtual minute the live worker's rule (burst.Decide,
// the same function) sees the pending jobs; a request's nodes (site cloud,
// --burst-gpu-type, --burst-gpus GPUs, Domain "") come up --burst-delay
// later; idle nodes the rule releases go down at once. Burst node time is
// priced exactly at --burst-rate per GPU-hour from arrival to release (or
// the end of the replay). The JSON of allot+burst has a "burst" object:
// requests, nodes_provisioned, releases, max_alive, gpu_hours, cost, and
// the wait saved against the allot replay (wait_mean_saved_s,
// wait_p95_saved_s, wait_p99_saved_s, job_hours_of_wait_saved). Utilization
// and the fair-share baselines stay relative to the on-premise GPUs.
//
// # Metrics (per policy; the JSON keys)
//
//   - jobs: jobs in the replayed trace; dropped: those that can never run (a
//     gang larger than the cluster or than one domain's nodes; in
//     fifo-partitioned also a team without a guarantee or a job larger than
//     the team's partition), plus any still pending when the cluster is empty
//     and no event is left. Every other metric is over the jobs that ran.
//   - makespan_s: first submit to last finish. utilization: Σ GPUs × run time
//     actually completed (lost work excluded) ÷ (total GPUs × makespan);
//     offered_load: Σ GPUs × duration of all jobs ÷ the same.
//   - utilization_span, offered_load_span: the same over the arrival period
//     (first to last submit): GPU-seconds allocated inside it minus work lost
//     to preemption inside it, and Σ GPUs × |[submit, submit+duration] ∩
//     period| (the load if every job started when submitted).
//   - wait = first start − submit; wait_p* by linear interpolation between
//     closest ranks (NumPy's default); jct = finish − submit;
//     bounded_slowdown = mean of max(1, jct / max(run, 10 s)), run = the
//     trace duration (or the time limit for a killed job).
//   - jain_fairness: D_t(x) = GPUs of team t's submitted, unfinished jobs;
//     f_t(x) = the max-min (water-filling) split of all GPUs among teams with
//     D_t > 0, capped at D_t, equal weights, recomputed at every event and
//     integrated piecewise constant: F_t = ∫ f_t dx; R_t = GPU-seconds
//     allocated to t (including grace periods and lost work);
//     share_ratio = R_t / F_t; Jain = (Σ r)² / (n Σ r²) over teams with
//     F_t > 0. by_tier's share_ratio uses the same construction with tiers
//     in place of teams. by_team lists the teams with a job that ran.
//   - cycles, cycle_mean_us, cycle_p99_us: Schedule calls and their wall
//     time; sim_wall_s: the policy's whole replay.
//
// The JSON has exactly these keys. For other cuts (a tier's p99, a team's
// multi-node jobs) --waits FILE writes one CSV row per job that ran and
// policy: policy, job_id (the trace's), team, tier (5 = preemptible), gpus,
// submit_s, first_start_s (virtual seconds after the window start, after
// --time-scale), wait_s and preemptions (times the job was preempted).
// The stdout table's by-tier rows show p99 as well.
//
// # Start estimates (ETA)
//
// With --eta (the default), for every job the simulator records the start
// the scheduler predicts at the job's first cycle after submit, and at its
// first cycle one hour after submit if it is still pending then, and
// compares it with the job's actual first start: the eta_at_submit and
// eta_at_1h objects of the JSON (jobs: those still pending after that
// cycle and that ran; for each estimator with_estimate, the fraction with
// an estimate, median_abs_error_s, p90_abs_error_s and median_error_s, the
// signed median; prod_*: the same over the tier 1-2 jobs). Estimators:
// forecast (PendingInfo.EstStart, scheduler.ETAForecast), limits
// (PendingInfo.EstStartLimits, the scheduler's earlier estimate) and naive
// (the old job page's: earliest time enough GPUs are free by running jobs'
// time limits, ignoring the queue). Only cycles with a job to predict
// compute pending info, for those jobs only (Policy.EstimateFor).
// Job.Expected, which only the forecast reads, is learned: the median run
// time / time limit of the user's last 32 completed jobs (at least 3),
// else the team's, times the limit; once a job has run past it, the
// median of the ratios above the fraction already run. A job's own future
// is never used. With a single --walltime-factor every limit is the same
// multiple of the run time, so the learned ratio is exact;
// --walltime-factor A:B gives each user (seeded hash) a factor in [A, B]
// and each job a jitter of ×0.8–1.25 (at least 1), as users ask alike but
// not exactly.
//
// # Learned run times for scheduling (options)
//
// The same learned run time (at the job's arrival, from jobs completed
// before it) can feed allot's decisions: --allot-predicted-backfill sets
// Policy.PredictedBackfill and fills Job.Predicted (reservations and
// backfill assume it instead of the time limit; a running job that
// outlives it is predicted twice as long, at most its limit);
// --allot-learned-order fills Job.Estimate (the response order's T). Both
// are off by default; sim/RESULTS.md has what they did on the suite.
//
// The four policies of one invocation replay concurrently, one goroutine
// each, at most GOMAXPROCS at a time.
package sim
