package views

// FinancePage is the finance page: the chargeback statement (Finance), its
// charts, the exports, and (for finance and admins) the month's capacity.
type FinancePage struct {
	Finance
	// Exports: the FOCUS 1.2 CSV of the month, and the date-range form's
	// defaults (the month as [from, to), dates).
	FOCUSURL         string
	RangeFrom        string
	RangeTo          string
	CostByTeam       LineChart // the last 12 months, one line per team
	CostByTeamMonths []string  // the x axis' months, for the table below it
	CostByTeamRows   []CostSeriesRow
	CostByGPUType    BarChart         // the month
	CostByTier       BarChart         // the month
	Capacity         *FinanceCapacity // nil: not shown (team leads)
}

// CostSeriesRow is one team's amounts month by month (the chart's figures).
type CostSeriesRow struct {
	Name    string
	Amounts []string
}

// FinanceCapacity is the month's capacity section.
type FinanceCapacity struct {
	Period   string // "2026-11-01 00:00 – 2026-12-01 00:00 UTC"
	Currency string
	Chart    BarChart
	Rows     []CapacityRow
	Total    CapacityRow
	Outside  string // allocated GPU-hours outside registered capacity; "" when none
	JSONURL  string
	CSVURL   string
}

// CapacityRow is one GPU type at one site (or the total).
type CapacityRow struct {
	GPUType, Site                                 string
	Registered, Allocated, Idle, DrainedDown      string // GPU-hours
	AllocatedPct                                  string
	CostPerGPUHour, CapacityCost, UnrecoveredCost string // "" when no cost is set
}
