package agent

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// dcgmLabels are dcgm-exporter's per-GPU labels plus the job running on it.
var dcgmLabels = []string{"gpu", "UUID", "device", "modelName", "Hostname", "job", "team"}

// dcgmCollector exports the backend's readings under dcgm-exporter's
// metric names and types (default-counters.csv), so dashboards built for
// dcgm-exporter work unchanged.
type dcgmCollector struct {
	a                                                       *Agent
	util, fbUsed, fbFree, temp, power, xid, sbe, dbe, thrtl *prometheus.Desc
	healthFailed                                            *prometheus.Desc
}

func newDCGMCollector(a *Agent) *dcgmCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, dcgmLabels, nil) }
	return &dcgmCollector{
		a:      a,
		util:   d("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
		fbUsed: d("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
		fbFree: d("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
		temp:   d("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
		power:  d("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
		xid:    d("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
		sbe:    d("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors."),
		dbe:    d("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors."),
		thrtl:  d("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask)."),
		healthFailed: prometheus.NewDesc("allot_agent_health_check_failed", "1 while the node's --health-cmd fails, else 0.",
			[]string{"Hostname"}, nil),
	}
}

func (c *dcgmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.util, c.fbUsed, c.fbFree, c.temp, c.power, c.xid, c.sbe, c.dbe, c.thrtl, c.healthFailed} {
		ch <- d
	}
}

func (c *dcgmCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	if a.cfg.Backend == nil {
		return
	}
	failed := 0.0
	if a.HealthReport() != "" {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(c.healthFailed, prometheus.GaugeValue, failed, a.cfg.Hostname)
	busy, owner := a.busyGPUs()
	ms, err := a.cfg.Backend.Metrics(busy)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.util, err)
		return
	}
	models := map[int]string{}
	if inv, err := a.cfg.Backend.Inventory(); err == nil {
		for _, g := range inv.GPUs {
			models[g.Index] = g.Model
		}
	}
	for _, m := range ms {
		job, team := "", ""
		if j := owner[m.Index]; j != nil {
			job, team = strconv.FormatInt(j.ref.JobID, 10), j.lease.Team
		}
		lv := []string{strconv.Itoa(m.Index), m.UUID, "nvidia" + strconv.Itoa(m.Index), models[m.Index], a.cfg.Hostname, job, team}
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		g(c.util, m.UtilPct)
		g(c.fbUsed, float64(m.MemUsedMiB))
		g(c.fbFree, float64(max(m.MemTotalMiB-m.MemUsedMiB, 0)))
		g(c.temp, m.TempC)
		g(c.power, m.PowerW)
		g(c.xid, float64(m.LastXID))
		ch <- prometheus.MustNewConstMetric(c.sbe, prometheus.CounterValue, float64(m.ECCSingleVol), lv...)
		ch <- prometheus.MustNewConstMetric(c.dbe, prometheus.CounterValue, float64(m.ECCDoubleVol), lv...)
		g(c.thrtl, float64(m.ThrottleReasons))
	}
}

// MetricsHandler serves the node's GPU metrics in dcgm-exporter's format
// (its own registry: many agents may live in one process).
func (a *Agent) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newDCGMCollector(a))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
