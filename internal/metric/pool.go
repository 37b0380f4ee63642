package metric

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Pool exports a pgx pool's statistics (pgxpool.Stat, read at scrape
// time) with the label pool=name. Register one per pool ("main", and e.g.
// "agent" for a second pool): the label keeps their descriptors apart.
type Pool struct {
	pool                                                   *pgxpool.Pool
	acquired, idle, total, max                             *prometheus.Desc
	acquires, emptyAcquires, acquireWait, canceledAcquires *prometheus.Desc
}

// NewPool returns the collector of pool p named name.
func NewPool(name string, p *pgxpool.Pool) *Pool {
	l := prometheus.Labels{"pool": name}
	d := func(n, help string) *prometheus.Desc { return prometheus.NewDesc(n, help, nil, l) }
	return &Pool{pool: p,
		acquired:         d("allot_db_pool_acquired_conns", "PostgreSQL connections of the pool in use now."),
		idle:             d("allot_db_pool_idle_conns", "Idle PostgreSQL connections of the pool."),
		total:            d("allot_db_pool_total_conns", "PostgreSQL connections of the pool (acquired, idle and being opened)."),
		max:              d("allot_db_pool_max_conns", "The pool's maximum number of connections."),
		acquires:         d("allot_db_pool_acquires_total", "Connections acquired from the pool."),
		emptyAcquires:    d("allot_db_pool_empty_acquires_total", "Acquires that had to wait for a connection (none was idle)."),
		acquireWait:      d("allot_db_pool_acquire_wait_seconds_total", "Total time spent acquiring connections from the pool, in seconds."),
		canceledAcquires: d("allot_db_pool_canceled_acquires_total", "Acquires given up because their context ended while waiting."),
	}
}

// Describe implements prometheus.Collector.
func (c *Pool) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquired, c.idle, c.total, c.max, c.acquires, c.emptyAcquires, c.acquireWait, c.canceledAcquires} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Pool) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	n := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	g(c.acquired, float64(s.AcquiredConns()))
	g(c.idle, float64(s.IdleConns()))
	g(c.total, float64(s.TotalConns()))
	g(c.max, float64(s.MaxConns()))
	n(c.acquires, float64(s.AcquireCount()))
	n(c.emptyAcquires, float64(s.EmptyAcquireCount()))
	n(c.acquireWait, s.AcquireDuration().Seconds())
	n(c.canceledAcquires, float64(s.CanceledAcquireCount()))
}
