package loadtest

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is a prometheus.Gatherer that reads a running process's /metrics
// over HTTP, with a bearer token when one is given (the portal's /metrics
// takes an admin's API token; a --metrics-addr listener takes none). It
// lets a run against --url read what a booted server's registry gives: the
// server's time per route, admission refusals, the worker's cycle phases.
type Scrape struct {
	URL, Token string
}

// Gather fetches and parses the exposition.
func (s Scrape) Gather() ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	if s.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", s.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", s.URL, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", s.URL, err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

var _ prometheus.Gatherer = Scrape{}

// Scrapes reads several processes (a server's and a worker's /metrics)
// and puts their families side by side: each reader of the report sums
// over every family of its name, and the processes' own series (go_*,
// process_*) may repeat.
type Scrapes []Scrape

// Gather reads each in turn; the first failure fails the reading.
func (ss Scrapes) Gather() ([]*dto.MetricFamily, error) {
	var out []*dto.MetricFamily
	for _, s := range ss {
		fams, err := s.Gather()
		if err != nil {
			return nil, err
		}
		out = append(out, fams...)
	}
	return out, nil
}
