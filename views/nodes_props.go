package views

// NodeRow is one line of /nodes.
type NodeRow struct {
	Name, State, Reason, GPUType, Site, Labels, LastHeartbeat string
	GPUs                                                      int
	Health                                                    string // "ok", or open events / failed check
	HealthClass                                               string // ok, warning, critical
	Jobs                                                      int
	InventoryNote                                             string // the agent's GPUs differ from the declaration
}

// HealthEventRow is one health event.
type HealthEventRow struct {
	ID                                            int64
	Node, At, Since, Rule, Metric, Value, GPUs    string
	Detail, Severity, Action, NodeState, Requeued string
	Resolved, Acknowledged                        string // "" while open / not acknowledged
	Link                                          string // the node page showing its history
}

// NotificationRow is one admin notification.
type NotificationRow struct {
	At, Severity, Kind, Message, Link string
	Unread                            bool
}

// NodesList is /nodes.
type NodesList struct {
	Page
	Rows          []NodeRow
	OpenEvents    []HealthEventRow
	Notifications []NotificationRow // admins only
	Unread        int
	Admin         bool
	Counts        []Option // state → count
}

// AuditLine is one audit entry about a node.
type AuditLine struct {
	At, Actor, Action, Note string
}

// NodeDetail is /nodes/:name.
type NodeDetail struct {
	Page
	Node          NodeRow
	Why           string // why it is draining/drained/down ("" when up)
	DrainedBy     string // "Drained by an admin; no jobs left on it since …."
	HealthOutput  string
	HealthOKSince string
	Hostname      string
	Agent         string
	LabelsText    string // key=value lines, for the form
	Events        []HealthEventRow
	Charts        []LineChart // the fired rule's metric, temperature, utilization
	ChartNote     string
	ChartEvent    int64
	Audit         []AuditLine
	Admin         bool
	CanDrain      bool
	CanUndrain    bool
	Errors        map[string]string
	Form          map[string]string // values typed, after an error
	Saved         string
}

// HealthRuleRow is one editable rule on /admin/health.
type HealthRuleRow struct {
	Index                                            int
	Name, Metric, Match, Over, For, Severity, Action string
	New                                              bool
}

// HealthRulesEdit is /admin/health.
type HealthRulesEdit struct {
	Page
	Version     int64
	Rules       []HealthRuleRow
	AutoUndrain string
	Webhook     string
	Metrics     []Option
	Severities  []string
	Actions     []string
	Errors      map[string]string
	Saved       string
	Deliveries  []NotificationRow // admin webhook delivery log (At, Severity=status, Message=url/error)
}

func metricKnown(ms []Option, m string) bool {
	for _, o := range ms {
		if o.Value == m {
			return true
		}
	}
	return false
}
