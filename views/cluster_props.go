package views

// ClusterPage is the cluster dashboard; Live is the part that refreshes
// itself.
type ClusterPage struct {
	Page
	Live ClusterLive
}

// ClusterLive is the cluster dashboard's refreshing fragment.
type ClusterLive struct {
	AsOf          string
	AllocatedPct  string // allocated ÷ in service, now
	Allocated     int
	InService     int
	Total         int
	Running       int
	Pending       int
	QueueGPUHours string
	Types         BarChart  // per GPU type: allocated, idle in service, out of service
	History       LineChart // 7 days, hourly: allocation %, mean utilization %
	Queue         BarChart  // pending GPU-hours by GPU type
	Nodes         BarChart  // nodes by site, stacked by state
	NodeRows      []NodeStateRow
	Waits         []WaitRow
	HistoryDays   int
}

// NodeStateRow is the node count of one site by state.
type NodeStateRow struct {
	Site                         string
	Up, Draining, Drained, Down  int
	GPUsUp, GPUsOut, Total, GPUs int
}

// WaitRow is one tier's queueing delay.
type WaitRow struct {
	Tier                      string
	Started                   int
	P50, P95                  string
	Pending                   int
	PendingP50, OldestPending string
}
