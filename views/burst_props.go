package views

// Burst is the cloud-burst page.
type Burst struct {
	Page
	Enabled  bool
	Provider string // "exec", "local"; "" when off
	Shape    string // "8 × A100-spot at 1.40 USD per GPU-hour"
	// The rule, from the live policy.
	Thresholds []BurstThreshold
	// What the rule sees now.
	PendingGPUHours, MeanWait string
	PendingJobs, InFlight     int
	Decision, Reason          string
	MonthSpent                string
	Nodes                     []BurstNodeRow
	Events                    []BurstEventRow
}

// BurstThreshold is one setting of the burst rule.
type BurstThreshold struct {
	Name, Value, Help string
}

// BurstNodeRow is one burst node alive.
type BurstNodeRow struct {
	Name, State, Since, Cost string
	EventID                  int64
	Registered, Idle         bool
	Releasing                bool // release started, not confirmed by the provider: still billed
}

// BurstEventRow is one burst event.
type BurstEventRow struct {
	ID                         int64
	At, Kind, Status, Provider string
	Reason                     string
	PendingGPUHours, MeanWait  string
	Nodes                      int
	NodeNames                  string
	Attempts                   int
	Error                      string
	Cost                       string
}
