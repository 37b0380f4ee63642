package store

import "context"

// For the tests of the team page's kept sums (package store_test).
var (
	TeamPageUsageQuery = (*Store).teamPageUsageQuery
	TeamPageKeptViews  = teamPageKeptViews.Load
)

// The heartbeat's transactional paths (what RecordHeartbeatAsync and
// HeartbeatJobsAsync did for every heartbeat before issue 16), for
// BenchmarkHeartbeatPath.
func (s *Store) RecordHeartbeatTx(ctx context.Context, node string, samples []GPUSample) (HeartbeatOutcome, error) {
	var out HeartbeatOutcome
	err := s.inAsyncTx(ctx, "recording heartbeat", func(tx *Store) error {
		var err error
		out, err = tx.RecordHeartbeat(ctx, node, samples, "")
		return err
	})
	return out, err
}

func (s *Store) HeartbeatJobsTx(ctx context.Context, node string, stats []JobStat) ([]Orphan, error) {
	return s.heartbeatJobsTx(ctx, node, stats)
}
