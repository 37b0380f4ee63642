package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// defaultWorkerMetricsAddr is where `allot worker` serves /metrics unless
// told otherwise (9401: next to dcgm-exporter's 9400 on GPU nodes).
const defaultWorkerMetricsAddr = ":9401"

// metricsServer is the /metrics listener of Config.MetricsAddr.
type metricsServer struct {
	ln   net.Listener
	http *http.Server
}

// serveMetrics starts the /metrics listener of Config.MetricsAddr, if set.
// It serves this process's registry without authentication: bind it to an
// address only the Prometheus network reaches (the portal's /metrics, on
// the public port, needs a token instead).
func (m *Main) serveMetrics(ctx context.Context) error {
	if m.MetricsAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", m.MetricsAddr)
	if err != nil {
		return fmt.Errorf("metrics: listening on %s: %w", m.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	// ContinueOnError: one collector failing (PostgreSQL unreachable for
	// the live-state gauges) still leaves the others' series, and
	// allot_metrics_state_errors_total says what is missing.
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, Timeout: 20 * time.Second}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	m.metrics = &metricsServer{ln: ln, http: srv}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.Logger.Error("metrics listener stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	m.Logger.Info("serving metrics", "url", m.MetricsURL())
	return nil
}

// closeMetrics stops it.
func (m *Main) closeMetrics(ctx context.Context) error {
	if m.metrics == nil {
		return nil
	}
	err := m.metrics.http.Shutdown(ctx)
	m.metrics = nil
	return err
}

// MetricsURL is the URL of the /metrics listener ("" without one).
func (m *Main) MetricsURL() string {
	if m.metrics == nil {
		return ""
	}
	addr := m.metrics.ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "localhost"
	}
	return fmt.Sprintf("http://%s/metrics", net.JoinHostPort(host, fmt.Sprint(addr.Port)))
}

// metricsFlags adds --metrics-addr (all of server and worker) and, for
// the server, --metrics-token-file; the returned function applies them to
// cfg once the flags are parsed.
func metricsFlags(fs *flag.FlagSet, name string) func(cfg *Config) error {
	def := ""
	if name == "worker" {
		def = defaultWorkerMetricsAddr
	}
	if v, ok := os.LookupEnv("ALLOT_METRICS_ADDR"); ok {
		def = v
	}
	addr := fs.String("metrics-addr", def, "listen `address` of a /metrics listener of this process's own, without authentication (\"\": none; env ALLOT_METRICS_ADDR; default \":9401\" for the worker, none for the server)")
	var tokenFile *string
	if name == "server" {
		tokenFile = fs.String("metrics-token-file", os.Getenv("ALLOT_METRICS_TOKEN_FILE"),
			"`file` holding the scrape token that Prometheus sends as Authorization: Bearer to the portal's /metrics (an admin's API token works too; env ALLOT_METRICS_TOKEN_FILE)")
	}
	return func(cfg *Config) error {
		cfg.MetricsAddr = *addr
		if tokenFile == nil || *tokenFile == "" {
			return nil
		}
		tok, err := readMetricsToken(*tokenFile)
		if err != nil {
			return err
		}
		cfg.MetricsToken = tok
		return nil
	}
}

// readMetricsToken reads a scrape token file: one line, at least 16
// characters (a guessable token would open the metrics to anyone).
func readMetricsToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--metrics-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case tok == "":
		return "", fmt.Errorf("--metrics-token-file %s is empty", path)
	case strings.ContainsAny(tok, " \t\r\n"):
		return "", fmt.Errorf("--metrics-token-file %s: the token must be one word on one line", path)
	case len(tok) < 16:
		return "", fmt.Errorf("--metrics-token-file %s: the token has %d characters; use at least 16 (e.g. openssl rand -hex 32)", path, len(tok))
	}
	return tok, nil
}
