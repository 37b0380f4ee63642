package web

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// The policy documentation is built from the live policy at every request,
// so it cannot drift from what the scheduler and billing do: every figure
// on it comes from the store, and the worked billing example is computed
// by internal/billing.

// Worked example: a job of this many GPUs of the first GPU type, running
// this long.
const (
	docsExampleGPUs     = 8
	docsExampleDuration = 3*time.Hour + 30*time.Minute
)

func (s *Server) docsPage(c echo.Context) error {
	d, err := s.docs(c)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.DocsView(d))
}

// serverURL is the address people reach this server at.
func serverURL(c echo.Context) string {
	return c.Scheme() + "://" + c.Request().Host
}

func (s *Server) docs(c echo.Context) (views.Docs, error) {
	ctx := c.Request().Context()
	p, err := s.st.CurrentPolicy(ctx)
	if err != nil {
		return views.Docs{}, err
	}
	tiers, err := s.st.ListTiers(ctx)
	if err != nil {
		return views.Docs{}, err
	}
	types, err := s.st.ListGPUTypes(ctx)
	if err != nil {
		return views.Docs{}, err
	}
	hist, err := s.st.RateHistory(ctx)
	if err != nil {
		return views.Docs{}, err
	}
	teams, err := s.st.ListTeams(ctx)
	if err != nil {
		return views.Docs{}, err
	}
	d := views.Docs{Page: s.page(c, "Policy documentation"), Version: p.Version, VersionAt: fmtTime(p.CreatedAt), ServerURL: serverURL(c),
		GracePeriod: allot.FormatDuration(p.GracePeriod), MinRuntime: allot.FormatDuration(p.MinRuntime), Cycle: allot.FormatDuration(p.Cycle),
		Weights: views.DocWeights{Order: p.QueueOrder, Tier1FIFO: p.Tier1FIFO, FairShare: p.WeightFairShare, Size: p.WeightSize, Age: p.WeightAge,
			HalfLife: allot.FormatDuration(p.HalfLife), MaxAge: allot.FormatDuration(p.MaxAge)},
		BudgetWarnPct: p.BudgetWarnPct, BudgetDemotePct: p.BudgetDemotePct, HeartbeatMissedAfter: allot.FormatDuration(p.LostAfter(s.cfg.HeartbeatInterval)),
		MaxLossRequeues: p.MaxLossRequeues}
	if p.AutoUndrainAfter > 0 {
		d.AutoUndrainAfter = allot.FormatDuration(p.AutoUndrainAfter)
	}
	now := s.st.Now()
	for _, g := range types {
		r := views.DocRate{GPUType: g.Name, MemoryGB: g.MemoryGB, Rate: g.HourlyRate.String()}
		for _, h := range hist { // newest first per type
			if h.GPUType != g.Name {
				continue
			}
			if h.EffectiveFrom.After(now) {
				r.Next = fmt.Sprintf("%s %s from %s", h.Rate, h.Currency, fmtTime(h.EffectiveFrom))
			} else {
				r.Since = fmtSince(h.EffectiveFrom)
				break
			}
		}
		if d.Currency == "" {
			d.Currency = g.HourlyRate.Currency
		}
		d.Rates = append(d.Rates, r)
	}
	for _, t := range tiers {
		dt := views.DocTier{ID: string(t.ID), Name: t.Name, Description: t.Description, ClassOrder: t.ClassOrder, Production: t.ID.Production(),
			MaxRuntime: allot.FormatDuration(t.MaxRuntime), Multiplier: t.Multiplier(), ReservedGPUs: t.ReservedGPUs}
		for _, m := range t.MayPreempt {
			dt.MayPreempt = append(dt.MayPreempt, "tier "+string(m))
		}
		for _, o := range tiers {
			if slices.Contains(o.MayPreempt, t.ID) {
				dt.PreemptedBy = append(dt.PreemptedBy, "tier "+string(o.ID))
			}
		}
		d.Tiers = append(d.Tiers, dt)
	}
	if len(types) > 0 {
		if d.Example, err = docsExample(types[0], tiers); err != nil {
			return views.Docs{}, err
		}
	}
	for _, t := range teams {
		dt := views.DocTeam{Slug: t.Slug, Name: t.Name, Weight: t.FairShareWeight, Budget: "none", WarnAt: "—", DemoteAt: "—",
			HasBudget: t.MonthlyBudgetGPUHours > 0, BudgetHours: t.MonthlyBudgetGPUHours}
		if dt.HasBudget {
			dt.Budget = strconv.FormatInt(t.MonthlyBudgetGPUHours, 10)
			dt.WarnAt = allot.Hours(t.MonthlyBudgetGPUHours*3600*int64(p.BudgetWarnPct)/100) + " h"
			dt.DemoteAt = allot.Hours(t.MonthlyBudgetGPUHours*3600*int64(p.BudgetDemotePct)/100) + " h"
		}
		var g []string
		for _, typ := range slices.Sorted(maps.Keys(t.Guarantees)) {
			if n := t.Guarantees[typ]; n > 0 {
				g = append(g, fmt.Sprintf("%d × %s", n, typ))
			}
		}
		dt.Guarantees = "none"
		if len(g) > 0 {
			dt.Guarantees = strings.Join(g, ", ")
		}
		d.Teams = append(d.Teams, dt)
	}
	d.Burst = views.DocBurst{PendingGPUHours: p.BurstPendingGPUHours, ReleaseGPUHours: p.BurstReleaseGPUHours,
		MeanWait: allot.FormatDuration(p.BurstMeanWait), MaxNodes: p.BurstMaxNodes,
		NoProvider: s.cfg.Burst.Provider == nil, Every: allot.FormatDuration(s.cfg.Burst.Every())}
	if p.BurstMonthlyBudget.Micros > 0 {
		d.Burst.MonthlyBudget = allot.Money{Micros: p.BurstMonthlyBudget.Micros, Currency: d.Currency}.String()
	}
	for _, r := range p.HealthRules {
		d.HealthRules = append(d.HealthRules, docHealthRule(r))
	}
	if d.Slurm, err = s.slurmDocs(ctx); err != nil {
		return views.Docs{}, err
	}
	return d, nil
}

// docsExample prices the example job at every tier with the billing
// package's own line arithmetic (exact, rounded once to the cent).
func docsExample(g allot.GPUType, tiers []allot.Tier) (views.DocExample, error) {
	gpuSeconds := int64(docsExampleGPUs) * int64(docsExampleDuration/time.Second)
	ex := views.DocExample{GPUs: docsExampleGPUs, GPUType: g.Name, Duration: allot.FormatDuration(docsExampleDuration),
		GPUHours: allot.Hours(gpuSeconds), Rate: g.HourlyRate.String()}
	for _, t := range tiers {
		amount, err := billing.LineAmount(gpuSeconds, g.HourlyRate.Micros, t.MultiplierBP, g.HourlyRate.Currency)
		if err != nil {
			return views.DocExample{}, err
		}
		ex.Lines = append(ex.Lines, views.DocExampleLine{Tier: string(t.ID), Multiplier: t.Multiplier(), Amount: amount.String()})
	}
	return ex, nil
}

func docHealthRule(r allot.HealthRule) views.DocHealthRule {
	out := views.DocHealthRule{Name: r.Name, Metric: r.Metric, Severity: r.Severity, Action: r.Action, Match: "any", Over: "—", For: "at once"}
	if len(r.Match) > 0 {
		m := make([]string, len(r.Match))
		for i, v := range r.Match {
			m[i] = strconv.Itoa(v)
		}
		out.Match = strings.Join(m, ", ")
	}
	if r.Over != 0 {
		out.Over = strconv.FormatFloat(r.Over, 'f', -1, 64)
	}
	if r.For > 0 {
		out.For = allot.FormatDuration(r.For)
	}
	return out
}
