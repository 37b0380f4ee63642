// Package slurmtest starts a private, real Slurm cluster for a test:
// Debian's unmodified Slurm 22.05 daemons, all on 127.0.0.1, on free ports,
// under a temporary directory of their own, stopped again (t.Cleanup) by
// exactly what was started.
//
// # Use
//
//	func TestX(t *testing.T) {
//		if ok, why := slurmtest.Available(); !ok {
//			t.Skip(why) // no Slurm here (CI installs it: .ci/run)
//		}
//		slurmtest.EnsureUser(t, "allot-st1")
//		c := slurmtest.Start(t, slurmtest.Options{Accounts: []string{"nlp"}, Users: []string{"allot-st1"}})
//		id := c.Sbatch(t, "allot-st1", "-A", "nlp", "--gres=gpu:2", "--wrap", "true")
//		c.WaitJob(t, id) // "COMPLETED"
//		tok := c.Token(t, "root", time.Minute) // for X-SLURM-USER-TOKEN against c.RestURL
//	}
//
// A cluster is:
//   - munged -F with its own key and socket (Dir/munge-run/munge.socket.2);
//   - slurmdbd -D on its own port, storing into its own database
//     allot_slurm_<random> on the MariaDB at 127.0.0.1:3306 (user root, no
//     password; slurmdbd creates the database, Stop drops it); none with
//     Options.NoDBD. Where no such server answers (a fresh CI image, whose
//     policy-rc.d keeps the package's service from starting) or with
//     ALLOT_SLURMTEST_DB=private, the test process starts a private mariadbd
//     (mariadb-install-db, ~2 s, once per process) on a free port under a
//     reaper; it stops, and its directory goes, when the process exits;
//   - slurmctld -D with ClusterName st<random>, SlurmUser=root;
//   - one slurmd -D -N <node> per node (Debian's slurmd has MULTIPLE_SLURMD),
//     node names NodePrefix01.. (default sn01, sn02), each with GPUsPerNode
//     emulated GPUs: gres.conf File= entries that are symlinks to /dev/null
//     (AutoDetect=off, task/none, proctrack/pgid, no cgroups, so they are never
//     opened; CUDA_VISIBLE_DEVICES is set in jobs as usual);
//   - slurmrestd (SLURM_JWT=daemon, rest_auth/jwt, openapi/v0.0.38 and
//     dbv0.0.38) as nobody:nogroup on RestURL; none with Options.NoRest.
//
// Options.GPUType makes the GRES typed (Gres=gpu:h100:4, gres.conf Type=h100,
// AccountingStorageTRES=gres/gpu,gres/gpu:h100): jobs ask --gres=gpu:h100:N
// or --gres=gpu:N, and sacct's AllocTRES has both gres/gpu=N and
// gres/gpu:h100=N (TestTypedGPUs).
//
// Both slurm.conf and slurmdbd.conf have AuthAltTypes=auth/jwt with
// AuthAltParameters=jwt_key=JWTKeyFile (32 random bytes). One partition
// (Options.Partition, default "gpu") holds every node; slurm.conf has
// AccountingStorageTRES=gres/gpu, SlurmdParameters=config_overrides,
// select/cons_tres, sched/backfill (1 s), priority/multifactor, MinJobAge=300
// (finished jobs stay in squeue -t all and GET /jobs for 5 minutes) and, only
// when Options.Enforce is set, AccountingStorageEnforce. Options.ConfExtra is
// appended; a Key=value there replaces the harness's own line for that key,
// and a PartitionName= line there replaces the default partition
// ("{{nodes}}" and "{{partition}}" are expanded). Options.JobSubmitLua is
// written next to slurm.conf as job_submit.lua with JobSubmitPlugins=lua.
// Options.Accounts are created with sacctmgr (fairshare=1), each with root and
// Options.Users; Start returns once slurmctld has those associations, every
// node is idle and slurmrestd listens.
//
// # API
//
//   - Available() (bool, string): root, the binaries, plugins and a database
//     server (or mariadbd to start one) are there; else the reason, for t.Skip.
//   - Start(t, Options) *Cluster; StartErr(t, Options) (*Cluster, error) for
//     starting from other goroutines; (*Cluster).Stop() error (idempotent;
//     Start registers it with t.Cleanup and fails the test if it finds a leak).
//   - Fields: Dir, Name, SlurmConf, RestURL, JWTKeyFile, SlurmUser ("root"),
//     Nodes, Partition, DBName, JobsDir (world-writable working directory for
//     jobs), StartupTime and StartupPhases (what the start spent where).
//   - Env() []string: the environment for Slurm CLI commands (SLURM_CONF=...,
//     the process's own SLURM_* variables and TMPDIR removed).
//   - Exec / Run(t, ...): a command as root against the cluster; ExecAs /
//     RunAs(t, user, ...): as a POSIX account (uid, gid, groups), in JobsDir.
//   - Sbatch(t, user, args...) int64: sbatch --parsable as user, the job id.
//   - JobState(id), WaitJob(t, id, states...) (default: any final state, 30 s),
//     WaitIdle(t).
//   - Token(t, user, lifespan): `scontrol token` (slurmctld mints it);
//     MintToken(user, lifespan): an HS256 JWT from JWTKeyFile with iat, exp,
//     sun, made the way Allot makes them. Both work with slurmrestd.
//   - StopRest/StartRest, StopCtld/StartCtld (state is kept; a running job
//     survives), StopDBD/StartDBD: for "Slurm is down, then catches up" tests.
//   - Reconfigure(t, confExtra, lua): rewrite slurm.conf with a new ConfExtra
//     (and job_submit.lua, if lua is not "") and
//     `scontrol reconfigure`.
//   - EnsureUser(t, name): a throw-away POSIX account (useradd -m, userdel -r
//     when the last test process using it is done; an existing account is used
//     as it is and never removed).
//   - MaybeReap(): see below; no TestMain needs to call it.
//
// Environment: ALLOT_SLURMTEST_LOGS=DIR makes Stop copy the cluster's logs
// to DIR/<Name>/ first; ALLOT_SLURMTEST_TRACE=1 prints every command and
// daemon stop with its duration.
//
// # Processes
//
// Every daemon runs in the foreground as the only child of its own reaper: a
// copy of the test binary, re-executed with ALLOT_SLURMTEST_REAPER=1, which
// makes itself a child subreaper (PR_SET_CHILD_SUBREAPER). slurmd's
// double-forked slurmstepd and the job processes under it (also ones a job
// daemonizes with setsid), and slurmctld's slurmscriptd, stay below that
// reaper, are reaped when they exit (PID 1 in a container often does not) and are killed
// (TERM, then KILL) when the daemon stops. The reaper's stdin is a pipe only
// the test process holds: closing it (Stop) or the test process dying (even by
// SIGKILL from `go test -timeout`) stops the daemon and everything below it
// (SIGTERM, SIGKILL after 5 s; Stop sends SIGUSR1 first: SIGKILL at once)
// within a few seconds (TestKilledTestBinaryLeavesNoProcess: ~2 s). The
// switch is in this package's init, so it works in every test binary that
// imports slurmtest, with no TestMain. Stop then kills anything still using
// Dir (command line, working directory or environment), drops the database,
// and removes Dir, and reports whatever it had to kill as an error.
//
// Several clusters can run at once, in one test binary and across test
// binaries: names, directories, database names and ports are distinct (ports
// come from the kernel and are never handed out twice by one process; a
// daemon that lost a port race makes Start retry, up to 3 times).
//
// # Measured (this 2-core machine)
//
// A 2-node cluster with accounting and REST is ready in 1.6-2.3 s (about 1.2 s
// of it slurmctld's first registration, in which slurmdbd adds the cluster,
// its tables and the gres/gpu TRES; ~0.4 s more with Accounts); 16 nodes × 8
// GPUs in 3.2 s; without slurmdbd, 0.15 s. Stop takes ~0.3 s:
// the cluster is thrown away, so its daemons and jobs get SIGKILL at once
// (StopCtld and the other single stops are graceful: SIGTERM, ~1.2-1.8 s for
// slurmctld). Two clusters started at once in one process: 1.7-2.4 s each; two
// test binaries each running clusters at once: 2.5-4.5 s each.
//
// # Findings on Slurm 22.05.8 (each is a test here)
//
//   - Authenticating proxy works: a root (SlurmUser) token in
//     X-SLURM-USER-TOKEN with X-SLURM-USER-NAME: allot-st1 submits the job as
//     allot-st1 and it runs as that account (TestRestProxyAsUser), with a token
//     from `scontrol token` or one minted from the key. A user's own token
//     with its own name works; with another user's name it is refused: HTTP 500, error 5005 "Zero Bytes were
//     transmitted or received" (slurmctld logs "auth_p_verify: attempt to
//     authenticate as alternate user ... from non-SlurmUser ...").
//   - The JWT key needs no particular owner or mode (22.05 checks neither):
//     slurmctld accepted it as
//     0644 root, 0600 nobody and 0400 root (TestJWTKeyPermissions); it only has
//     to be readable by slurmctld and slurmdbd (root here). slurmrestd with
//     SLURM_JWT=daemon never reads it.
//   - slurmrestd refuses to run as root: "fatal: slurmrestd should not be run as
//     the root user." (TestRestAsRoot); hence -u nobody -g nogroup. With
//     openapi/dbv0.0.38 it is fatal without slurmdbd ("slurm not configured
//     with slurmdbd"), so NoDBD clusters load openapi/v0.0.38 only.
//   - AccountingStorageEnforce=associations,limits,qos works with QOS created
//     by sacctmgr after slurmctld started: slurmdbd pushes them, a job with the
//     new QOS was accepted ~15 ms after sacctmgr returned, the association's
//     DefaultQOS applies, a QOS the association lacks is refused ("Invalid qos
//     specification"), so is an unknown account (TestEnforceQOSCreatedAfterStart).
//   - slurmctld registers its cluster with slurmdbd by itself (no `sacctmgr add
//     cluster` needed); accounts can be added once it is listed.
//   - squeue against a stopped slurmctld waits for MessageTimeout (10 s) before
//     failing: tests should not use it to probe "is it down".
package slurmtest
