package views

// RightSizingRow is a team's or a user's line of the right-sizing report.
type RightSizingRow struct {
	Team, User        string
	GPUHours          string
	MeanUtil, MeanMem string // "37.2 %", "—" without samples
	Cost              string
	Jobs, Flagged     int
	Savings           string
}

// RightSizingJob is one flag of a flagged job.
type RightSizingJob struct {
	JobID                       int64
	JobURL                      string
	Name, Team, User, GPUType   string
	Tier                        string // as run: the tier whose rules the suggestion follows
	GPUs                        int
	GPUHours, MeanUtil, PeakMem string
	Cost                        string
	Rule, Suggestion, Savings   string
}

// RightSizing is the right-sizing report page.
type RightSizing struct {
	Page
	From, To   string // RFC 3339
	FromDate   string // YYYY-MM-DD for the date inputs
	ToDate     string
	Period     string // "week", "month" or "" (custom)
	Currency   string
	Scope      string // whose usage this is, in words
	Total      RightSizingRow
	Teams      []RightSizingRow
	Users      []RightSizingRow
	Jobs       []RightSizingJob
	CSVURL     string
	Thresholds string
}
