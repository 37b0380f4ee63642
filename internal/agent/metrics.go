package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultMetricsAddr is where the agent serves /metrics by default: not
// dcgm-exporter's 9400 (most GPU nodes run dcgm-exporter), but next to it.
const DefaultMetricsAddr = ":9402"

// dcgmLabels are dcgm-exporter's per-GPU labels plus the Allot job running
// on the GPU and its team. They are allot_job and allot_team, never job
// (Prometheus's own target label: a scraped "job" becomes "exported_job")
// or a bare team that a site's relabelling may own.
var dcgmLabels = []string{"gpu", "UUID", "device", "modelName", "Hostname", "allot_job", "allot_team"}

// The dcgm-exporter default fields beyond the agent's heartbeat readings
// that NVML can read (see metrics_nvml.go); exported where the backend
// reads them.
const (
	fieldSMClock        = "DCGM_FI_DEV_SM_CLOCK"
	fieldMemClock       = "DCGM_FI_DEV_MEM_CLOCK"
	fieldMemTemp        = "DCGM_FI_DEV_MEMORY_TEMP"
	fieldEnergy         = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
	fieldPCIeReplay     = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
	fieldMemCopyUtil    = "DCGM_FI_DEV_MEM_COPY_UTIL"
	fieldEncUtil        = "DCGM_FI_DEV_ENC_UTIL"
	fieldDecUtil        = "DCGM_FI_DEV_DEC_UTIL"
	fieldFBReserved     = "DCGM_FI_DEV_FB_RESERVED"
	fieldCorrRemapped   = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
	fieldUncorrRemapped = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
	fieldRemapFailure   = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
)

// extraFields are those fields with their help and type, as in
// dcgm-exporter's default-counters.csv.
var extraFields = []struct {
	name, help string
	counter    bool
}{
	{fieldSMClock, "SM clock frequency (in MHz).", false},
	{fieldMemClock, "Memory clock frequency (in MHz).", false},
	{fieldMemTemp, "Memory temperature (in C).", false},
	{fieldEnergy, "Total energy consumption since boot (in mJ).", true},
	{fieldPCIeReplay, "Total number of PCIe retries.", true},
	{fieldMemCopyUtil, "Memory utilization (in %).", false},
	{fieldEncUtil, "Encoder utilization (in %).", false},
	{fieldDecUtil, "Decoder utilization (in %).", false},
	{fieldFBReserved, "Framebuffer memory reserved (in MiB).", false},
	{fieldCorrRemapped, "Number of remapped rows for correctable errors.", true},
	{fieldUncorrRemapped, "Number of remapped rows for uncorrectable errors.", true},
	{fieldRemapFailure, "Whether remapping of rows has failed.", false},
}

// extraMetricsSource is a backend that reads extraFields (NVML).
type extraMetricsSource interface {
	extraMetrics() map[int]map[string]float64
}

// dcgmCollector exports the backend's readings under dcgm-exporter's
// metric names and types (default-counters.csv), so dashboards built for
// dcgm-exporter work unchanged.
type dcgmCollector struct {
	a                                                       *Agent
	util, fbUsed, fbFree, temp, power, xid, sbe, dbe, thrtl *prometheus.Desc
	healthFailed                                            *prometheus.Desc
	extra                                                   map[string]*prometheus.Desc
}

func newDCGMCollector(a *Agent) *dcgmCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, dcgmLabels, nil) }
	extra := map[string]*prometheus.Desc{}
	for _, f := range extraFields {
		extra[f.name] = d(f.name, f.help)
	}
	return &dcgmCollector{
		extra:  extra,
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
	for _, f := range extraFields {
		ch <- c.extra[f.name]
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
	var extra map[int]map[string]float64
	if src, ok := a.cfg.Backend.(extraMetricsSource); ok {
		extra = src.extraMetrics()
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
		for _, f := range extraFields {
			v, ok := extra[m.Index][f.name]
			if !ok {
				continue
			}
			t := prometheus.GaugeValue
			if f.counter {
				t = prometheus.CounterValue
			}
			ch <- prometheus.MustNewConstMetric(c.extra[f.name], t, v, lv...)
		}
	}
}

// MetricsHandler serves the node's GPU metrics in dcgm-exporter's format
// (its own registry: many agents may live in one process).
func (a *Agent) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newDCGMCollector(a))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// ServeMetrics serves /metrics on addr until ctx ends. A taken (or
// otherwise unusable) address is logged, not fatal: the agent runs its
// jobs without it, and tries the address again every retry (0: never).
func (a *Agent) ServeMetrics(ctx context.Context, addr string, retry time.Duration, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.MetricsHandler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	for warned := false; ; {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			log.Info("serving metrics", "addr", ln.Addr().String())
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", "addr", addr, "err", err)
			}
			return
		}
		if !warned {
			log.Error("cannot serve metrics; running without them (is dcgm-exporter or another exporter on this port? choose another with --metrics-addr)",
				"addr", addr, "err", err, "retry_every", retry.String())
			warned = true
		}
		if retry <= 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// SyncDCGMJobMapping keeps dir in dcgm-exporter's HPC job-mapping format
// (its --hpc-job-mapping-dir): one file per GPU index, named by the index
// ("0", "1", …), holding the Allot job id of the job running on that GPU,
// one per line; no file for a GPU no job holds. dcgm-exporter then labels
// that GPU's series hpc_job="<id>". Files are replaced atomically and
// rewritten only when they change; it runs every interval until ctx ends.
func (a *Agent) SyncDCGMJobMapping(ctx context.Context, dir string, interval time.Duration, log *slog.Logger) {
	failing := false
	for {
		err := a.writeDCGMJobMapping(dir)
		switch {
		case err != nil && !failing:
			log.Error("cannot write dcgm-exporter's job-mapping files", "dir", dir, "err", err)
			failing = true
		case err == nil && failing:
			log.Info("writing dcgm-exporter's job-mapping files again", "dir", dir)
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// writeDCGMJobMapping writes the mapping once (see SyncDCGMJobMapping).
func (a *Agent) writeDCGMJobMapping(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_, owner := a.busyGPUs()
	want := map[string][]byte{}
	for idx, j := range owner {
		want[strconv.Itoa(idx)] = []byte(strconv.FormatInt(j.ref.JobID, 10) + "\n")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.IsDir() {
			continue // not a mapping file
		}
		if _, ok := want[e.Name()]; !ok {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		path := filepath.Join(dir, n)
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, want[n]) {
			continue
		}
		// A name dcgm-exporter skips (not a number) until it is complete.
		tmp := filepath.Join(dir, fmt.Sprintf(".%s.allot-tmp", n))
		if err := os.WriteFile(tmp, want[n], 0o644); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Rename(tmp, path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
