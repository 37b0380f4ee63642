package store

// For the tests of the team page's kept sums (package store_test).
var (
	TeamPageUsageQuery = (*Store).teamPageUsageQuery
	TeamPageKeptViews  = teamPageKeptViews.Load
)
