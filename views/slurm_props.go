package views

// SlurmFiles are the four files Allot renders for Slurm from the live
// policy (internal/slurmpolicy).
type SlurmFiles struct {
	PolicyVersion  int64
	SlurmConf      string
	Sacctmgr       string
	JobSubmitLua   string
	OverBudgetList string
	OverBudgetFile string // where job_submit.lua reads the list
	OverBudget     []string
	// NoUsers: the accounts' users were left out (the /docs page: who is
	// in which account is for admins).
	NoUsers bool
}

// SlurmChange is one difference between Allot's policy and the cluster.
type SlurmChange struct{ Text, Command string }

// AdminSlurm is /admin/slurm: the rendered files and, with a cluster, the
// diff against what it runs and the sync button.
type AdminSlurm struct {
	Page
	Files      SlurmFiles
	Configured bool   // a Slurm cluster is configured
	Env        string // the environment sacctmgr runs with (SLURM_CONF=…)
	ReadError  string // reading the cluster failed
	Changes    []SlurmChange
	Saved      string // after a sync
	SyncError  string // a sync that failed
	// Sync is the worker's last sync with the cluster.
	Sync SlurmSyncState
}

// SlurmSyncState is what the worker's syncs with Slurm last said ("":
// never).
type SlurmSyncState struct {
	Cluster, Version, LastOK, LastError, DownSince, Cursor string
	Runs, Jobs                                             string // runs and sbatch jobs imported so far
	Unmapped                                               []string
}
