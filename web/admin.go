package web

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/webhook"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// Admin policy editing: tiers, the rate card, teams and the policy's
// settings, each as a page of plain forms (POST → 303, inline errors that
// keep what was typed) and as JSON API calls. Every change goes through the
// store's ChangePolicy: the change, a new policy version and an audit entry
// in one transaction; bad input changes nothing, and a change to the values
// already in force makes no version.

// AdminChangeJSON is the answer to an admin change through the API.
type AdminChangeJSON struct {
	Changed       bool  `json:"changed"`
	PolicyVersion int64 `json:"policy_version,omitempty"`
	AuditID       int64 `json:"audit_id,omitempty"`
	Value         any   `json:"value"`
}

func changeJSON(r store.AdminResult, v any) AdminChangeJSON {
	return AdminChangeJSON{Changed: r.Changed, PolicyVersion: r.Entry.PolicyVersion, AuditID: r.Entry.ID, Value: v}
}

func policyChange(u *allot.User, action, object, note string) store.PolicyChange {
	return store.PolicyChange{Actor: u.Email, Action: action, Object: object, Note: strings.TrimSpace(note)}
}

// savedMessage is the confirmation shown after a form saved (or found
// nothing to change).
func savedMessage(c echo.Context, what string) string {
	v := c.QueryParam("v")
	switch {
	case v == "":
		return ""
	case v == "0":
		return "No change: " + what + " already had these values."
	default:
		return "Saved " + what + " as policy version " + v + "."
	}
}

func savedURL(path, key string, r store.AdminResult, anchor string) string {
	return fmt.Sprintf("%s?saved=%s&v=%d#%s", path, url.QueryEscape(key), r.Entry.PolicyVersion, anchor)
}

// formDone ends an admin form: with no error a 303 to next; with field
// errors or a refusal the page again (422), built by page with the errors.
func formDone(c echo.Context, err error, next string, page func(errs map[string]string) (templ.Component, error)) error {
	if err == nil {
		return redirect(c, next)
	}
	errs, err := formErrors(err)
	if err != nil {
		return err
	}
	view, err := page(errs)
	if err != nil {
		return err
	}
	return render(c, http.StatusUnprocessableEntity, view)
}

// formErrors turns a store or parse error into a form's error map: field
// errors by field, a refusal (conflict, invalid) under "_form". Other
// errors are returned to be handled as errors.
func formErrors(err error) (map[string]string, error) {
	if f := allot.Fields(err); f != nil {
		return f, nil
	}
	switch allot.ErrorCode(err) {
	case allot.EInvalid, allot.EConflict:
		return map[string]string{"_form": allot.ErrorMessage(err)}, nil
	}
	return nil, err
}

// parseMultiplier reads a decimal multiplier ("1.5", "0.3") as basis points.
func parseMultiplier(s string) (int, error) {
	s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "×"))
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > 4 || strings.Trim(whole, "0123456789") != "" || strings.Trim(frac, "0123456789") != "" {
		return 0, fmt.Errorf("must be a decimal number with at most 4 decimal places, e.g. 1.5")
	}
	w, err := strconv.Atoi(whole)
	if err != nil || w > 10 {
		return 0, fmt.Errorf("must be between 0 and 10")
	}
	f, _ := strconv.Atoi((frac + "0000")[:4])
	bp := w*10000 + f
	if bp > 100000 {
		return 0, fmt.Errorf("must be between 0 and 10")
	}
	return bp, nil
}

// webhookProblem says what is wrong with an alert webhook URL ("" if
// nothing): an http(s) URL whose host is, and resolves only to, public
// addresses (internal/webhook holds the policy; deliveries check it again
// when they connect).
func webhookProblem(ctx context.Context, raw string) string {
	return webhook.Problem(ctx, raw, nil)
}

// ---- Overview

func (s *Server) adminPage(c echo.Context) error {
	ctx := c.Request().Context()
	p, err := s.st.CurrentPolicy(ctx)
	if err != nil {
		return err
	}
	tiers, err := s.st.ListTiers(ctx)
	if err != nil {
		return err
	}
	types, err := s.st.ListGPUTypes(ctx)
	if err != nil {
		return err
	}
	teams, err := s.st.ListTeams(ctx)
	if err != nil {
		return err
	}
	recent, err := s.st.AuditLog(ctx, store.AuditFilter{Limit: 8})
	if err != nil {
		return err
	}
	o := views.AdminOverview{Page: s.page(c, "Admin"), Version: p.Version, VersionAt: fmtTime(p.CreatedAt), VersionBy: p.CreatedBy,
		Comment: p.Comment, Tiers: len(tiers), GPUTypes: len(types), Teams: len(teams)}
	for _, e := range recent {
		o.Recent = append(o.Recent, auditRow(e))
	}
	return render(c, http.StatusOK, views.AdminOverviewView(o))
}

// ---- Tiers

// TierPatchJSON is the body of PUT /api/v1/tiers/{tier}: the fields to
// change (absent fields keep their value) and an optional note.
type TierPatchJSON struct {
	Name         *string   `json:"name"`
	Description  *string   `json:"description"`
	ClassOrder   *int      `json:"class_order"`
	MayPreempt   *[]string `json:"may_preempt"`
	ReservedGPUs *int      `json:"reserved_gpus"`
	Multiplier   *string   `json:"multiplier"` // decimal, e.g. "0.3"
	MaxRuntimeS  *int64    `json:"max_runtime_s"`
	Note         string    `json:"note"`
}

// apply returns the change as a function over a tier, or the field errors
// of values that cannot be read.
func (p *TierPatchJSON) apply() (func(*allot.Tier), error) {
	f := allot.FieldErrors{}
	bp := -1
	if p.Multiplier != nil {
		v, err := parseMultiplier(*p.Multiplier)
		if err != nil {
			f.Add("multiplier", "%v", err)
		}
		bp = v
	}
	var mp []allot.TierID
	if p.MayPreempt != nil {
		for _, v := range *p.MayPreempt {
			t, ok := allot.ParseTier(v)
			if !ok {
				f.Add("may_preempt", "unknown tier %q", v)
				continue
			}
			if !slices.Contains(mp, t) {
				mp = append(mp, t)
			}
		}
		slices.SortFunc(mp, func(a, b allot.TierID) int { return a.Class() - b.Class() })
	}
	var maxRuntime time.Duration
	if p.MaxRuntimeS != nil {
		// A job asks for at most a year (see the jobs API); bounded before
		// the seconds become a duration, which would wrap around.
		maxRuntime = store.CheckSecs(f, "max_runtime_s", *p.MaxRuntimeS, 365*24*3600)
	}
	if err := f.Err(); err != nil {
		return nil, err
	}
	return func(t *allot.Tier) {
		if p.Name != nil {
			t.Name = strings.TrimSpace(*p.Name)
		}
		if p.Description != nil {
			t.Description = strings.TrimSpace(*p.Description)
		}
		if p.ClassOrder != nil {
			t.ClassOrder = *p.ClassOrder
		}
		if p.MayPreempt != nil {
			t.MayPreempt = mp
		}
		if p.ReservedGPUs != nil {
			t.ReservedGPUs = *p.ReservedGPUs
		}
		if bp >= 0 {
			t.MultiplierBP = bp
		}
		if p.MaxRuntimeS != nil {
			t.MaxRuntime = maxRuntime
		}
	}, nil
}

// tierFormPatch reads a tier form into a patch (every field is present).
func tierFormPatch(c echo.Context) (views.TierFormValues, TierPatchJSON, error) {
	v := views.TierFormValues{Name: c.FormValue("name"), Description: c.FormValue("description"), ClassOrder: c.FormValue("class_order"),
		Multiplier: c.FormValue("multiplier"), MaxRuntime: c.FormValue("max_runtime_s"), ReservedGPUs: c.FormValue("reserved_gpus"),
		Note: c.FormValue("note"), MayPreempt: map[string]bool{}}
	form, err := c.FormParams()
	if err != nil {
		return v, TierPatchJSON{}, &badRequest{"malformed form"}
	}
	mp := form["may_preempt"]
	for _, t := range mp {
		v.MayPreempt[t] = true
	}
	p := TierPatchJSON{Name: &v.Name, Description: &v.Description, Multiplier: &v.Multiplier, MayPreempt: &mp, Note: v.Note}
	f := allot.FieldErrors{}
	atoi := func(name, s string) *int {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			f.Add(name, "must be a whole number")
		}
		return &n
	}
	if _, err := p.apply(); err != nil {
		maps.Copy(f, allot.Fields(err))
	}
	p.ClassOrder = atoi("class_order", v.ClassOrder)
	p.ReservedGPUs = atoi("reserved_gpus", v.ReservedGPUs)
	if d, err := allot.ParseDuration(v.MaxRuntime); err != nil {
		f.Add("max_runtime_s", "%v", err)
	} else {
		secs := int64(d / time.Second)
		p.MaxRuntimeS = &secs
	}
	return v, p, f.Err()
}

func tierFormValues(t allot.Tier) views.TierFormValues {
	v := views.TierFormValues{Name: t.Name, Description: t.Description, ClassOrder: strconv.Itoa(t.ClassOrder), Multiplier: t.Multiplier(),
		MaxRuntime: allot.FormatDuration(t.MaxRuntime), ReservedGPUs: strconv.Itoa(t.ReservedGPUs), MayPreempt: map[string]bool{}}
	for _, m := range t.MayPreempt {
		v.MayPreempt[string(m)] = true
	}
	return v
}

// preemptOptions are the tiers a tier may be given the right to preempt:
// never the production tiers.
func preemptOptions() []views.Option {
	var out []views.Option
	for _, t := range allot.Tiers {
		if !t.Production() {
			out = append(out, views.Option{Value: string(t), Label: "tier " + string(t)})
		}
	}
	return out
}

// tiersView builds /admin/tiers; edited, when set, replaces its tier's form.
func (s *Server) tiersView(c echo.Context, edited *views.TierForm) (views.AdminTiers, error) {
	ctx := c.Request().Context()
	tiers, err := s.st.ListTiers(ctx)
	if err != nil {
		return views.AdminTiers{}, err
	}
	mults, err := s.st.MultiplierHistory(ctx)
	if err != nil {
		return views.AdminTiers{}, err
	}
	now := s.st.Now()
	a := views.AdminTiers{Page: s.page(c, "Tiers · Admin")}
	for _, t := range tiers {
		f := views.TierForm{ID: string(t.ID), Name: t.Name, Multiplier: t.Multiplier(), Values: tierFormValues(t), Errors: map[string]string{}}
		if t.ID.Production() { // only production tiers preempt by tier right
			f.Preempts = preemptOptions()
		}
		for _, m := range mults { // newest first per tier
			if m.Tier == string(t.ID) && !m.EffectiveFrom.After(now) {
				f.Since = fmtSince(m.EffectiveFrom)
				break
			}
		}
		if c.QueryParam("saved") == string(t.ID) {
			f.Saved = savedMessage(c, "tier "+string(t.ID))
		}
		if edited != nil && edited.ID == f.ID {
			edited.Name, edited.Multiplier, edited.Since, edited.Preempts = f.Name, f.Multiplier, f.Since, f.Preempts
			f = *edited
		}
		a.Tiers = append(a.Tiers, f)
	}
	return a, nil
}

// fmtSince formats a version's start; the first versions start at the
// epoch ("always").
func fmtSince(t time.Time) string {
	if t.Unix() <= 0 {
		return "the start"
	}
	return fmtTime(t)
}

func (s *Server) adminTiersPage(c echo.Context) error {
	a, err := s.tiersView(c, nil)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.AdminTiersView(a))
}

func (s *Server) updateTier(c echo.Context, u *allot.User, id allot.TierID, p *TierPatchJSON) (store.AdminResult, error) {
	apply, err := p.apply()
	if err != nil {
		return store.AdminResult{}, err
	}
	return s.st.UpdateTier(c.Request().Context(), policyChange(u, "tier.update", "tier:"+string(id), p.Note), id, apply)
}

func (s *Server) adminTierForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	id, ok := allot.ParseTier(c.Param("tier"))
	if !ok {
		return allot.Errorf(allot.ENotFound, "no tier %q", c.Param("tier"))
	}
	v, p, err := tierFormPatch(c)
	var r store.AdminResult
	if err == nil {
		r, err = s.updateTier(c, u, id, &p)
	}
	return formDone(c, err, savedURL("/admin/tiers", string(id), r, "tier-"+string(id)), func(errs map[string]string) (templ.Component, error) {
		a, err := s.tiersView(c, &views.TierForm{ID: string(id), Values: v, Errors: errs})
		return views.AdminTiersView(a), err
	})
}

func (s *Server) apiListTiers(c echo.Context) error {
	tiers, err := s.st.ListTiers(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]store.TierValues, 0, len(tiers))
	for _, t := range tiers {
		out = append(out, store.TierValuesOf(t))
	}
	return writeJSON(c, http.StatusOK, map[string]any{"tiers": out})
}

func (s *Server) apiUpdateTier(c echo.Context) error {
	id, ok := allot.ParseTier(c.Param("tier"))
	if !ok {
		return allot.Errorf(allot.ENotFound, "no tier %q", c.Param("tier"))
	}
	u, p, err := userAndBody[TierPatchJSON](c)
	if err != nil {
		return err
	}
	r, err := s.updateTier(c, u, id, &p)
	if err != nil {
		return err
	}
	t, err := s.st.GetTier(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, store.TierValuesOf(t)))
}

// ---- Rate card

// RatePutJSON is the body of PUT /api/v1/rates/{gpu_type}.
type RatePutJSON struct {
	Rate          string     `json:"rate"`           // per GPU-hour, decimal
	Currency      string     `json:"currency"`       // default: the rate card's
	EffectiveFrom *time.Time `json:"effective_from"` // default: now
	Note          string     `json:"note"`
}

func (s *Server) cardCurrency(c echo.Context) (string, error) {
	types, err := s.st.ListGPUTypes(c.Request().Context())
	if err != nil {
		return "", err
	}
	for _, t := range types {
		if t.HourlyRate.Currency != "" {
			return t.HourlyRate.Currency, nil
		}
	}
	return "USD", nil
}

func (s *Server) setRate(c echo.Context, u *allot.User, gpuType string, p RatePutJSON) (store.AdminResult, error) {
	f := allot.FieldErrors{}
	cur := p.Currency
	if cur == "" {
		var err error
		if cur, err = s.cardCurrency(c); err != nil {
			return store.AdminResult{}, err
		}
	}
	m, err := allot.ParseMoney(p.Rate, cur)
	if err != nil {
		f.Add("rate", "%v", err)
	}
	from := s.st.Now()
	if p.EffectiveFrom != nil {
		from = *p.EffectiveFrom
	}
	if err := f.Err(); err != nil {
		return store.AdminResult{}, err
	}
	return s.st.SetRatePolicy(c.Request().Context(), policyChange(u, "rate.set", "rate:"+gpuType, p.Note), gpuType, m, from)
}

func (s *Server) ratesView(c echo.Context, edited *views.RateForm) (views.AdminRates, error) {
	ctx := c.Request().Context()
	types, err := s.st.ListGPUTypes(ctx)
	if err != nil {
		return views.AdminRates{}, err
	}
	hist, err := s.st.RateHistory(ctx)
	if err != nil {
		return views.AdminRates{}, err
	}
	now := s.st.Now()
	a := views.AdminRates{Page: s.page(c, "Rate card · Admin")}
	for _, g := range types {
		f := views.RateForm{GPUType: g.Name, Current: g.HourlyRate.String(), Currency: g.HourlyRate.Currency, Errors: map[string]string{}}
		inForce := false
		for _, h := range hist {
			if h.GPUType != g.Name {
				continue
			}
			row := views.RateRow{Rate: h.Rate + " " + h.Currency, EffectiveFrom: fmtSince(h.EffectiveFrom), Recorded: fmtTime(h.CreatedAt)}
			if h.EffectiveFrom.After(now) {
				row.Future = true
			} else if !inForce {
				row.InForce, inForce = true, true
			}
			f.History = append(f.History, row)
		}
		if c.QueryParam("saved") == g.Name {
			f.Saved = savedMessage(c, "the "+g.Name+" rate")
		}
		if edited != nil && edited.GPUType == g.Name {
			edited.Current, edited.Currency, edited.History = f.Current, f.Currency, f.History
			f = *edited
		}
		a.Types = append(a.Types, f)
	}
	return a, nil
}

func (s *Server) adminRatesPage(c echo.Context) error {
	a, err := s.ratesView(c, nil)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.AdminRatesView(a))
}

func (s *Server) adminRateForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	gpuType := c.Param("gpu_type")
	v := views.RateFormValues{Rate: c.FormValue("rate"), EffectiveFrom: c.FormValue("effective_from"), Note: c.FormValue("note")}
	p := RatePutJSON{Rate: v.Rate, Note: v.Note}
	if from := strings.TrimSpace(v.EffectiveFrom); from != "" {
		t, perr := parseFormTime(from)
		if perr != nil {
			err = (allot.FieldErrors{"effective_from": "must be a date and time, e.g. 2026-12-01T00:00"}).Err()
		}
		p.EffectiveFrom = &t
	}
	var r store.AdminResult
	if err == nil {
		r, err = s.setRate(c, u, gpuType, p)
	}
	return formDone(c, err, savedURL("/admin/rates", gpuType, r, "rate-"+gpuType), func(errs map[string]string) (templ.Component, error) {
		a, err := s.ratesView(c, &views.RateForm{GPUType: gpuType, Values: v, Errors: errs})
		return views.AdminRatesView(a), err
	})
}

// parseFormTime reads a datetime-local value (UTC) or RFC 3339.
func parseFormTime(s string) (time.Time, error) {
	for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339, "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("bad time %q", s)
}

// RatesJSON is GET /api/v1/rates: every rate and multiplier version.
type RatesJSON struct {
	Rates       []store.RateVersion       `json:"rates"`
	Multipliers []store.MultiplierVersion `json:"multipliers"`
}

func (s *Server) apiRates(c echo.Context) error {
	ctx := c.Request().Context()
	rates, err := s.st.RateHistory(ctx)
	if err != nil {
		return err
	}
	mults, err := s.st.MultiplierHistory(ctx)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, RatesJSON{Rates: rates, Multipliers: mults})
}

func (s *Server) apiSetRate(c echo.Context) error {
	u, p, err := userAndBody[RatePutJSON](c)
	if err != nil {
		return err
	}
	r, err := s.setRate(c, u, c.Param("gpu_type"), p)
	if err != nil {
		return err
	}
	var after store.RateValues
	if r.Changed {
		if err := json.Unmarshal(r.Entry.After, &after); err != nil {
			return err
		}
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, after))
}

// ---- Teams

// TeamJSON is the body of POST /api/v1/teams and PUT /api/v1/teams/{team}
// (absent fields keep their value; guarantees, when present, replace all).
type TeamJSON struct {
	Slug                  *string        `json:"slug"`
	Name                  *string        `json:"name"`
	CostCenter            *string        `json:"cost_center"`
	MonthlyBudgetGPUHours *int64         `json:"monthly_budget_gpu_hours"`
	Guarantees            map[string]int `json:"guarantees"`
	FairShareWeight       *int           `json:"fair_share_weight"`
	WebhookURL            *string        `json:"webhook_url"`
	// PosixAccount is the team's service account ("" = none).
	PosixAccount *string `json:"posix_account"`
	Note         string  `json:"note"`
}

func (p *TeamJSON) applyTo(t *allot.Team, hook *string) {
	if p.Name != nil {
		t.Name = strings.TrimSpace(*p.Name)
	}
	if p.CostCenter != nil {
		t.CostCenter = strings.TrimSpace(*p.CostCenter)
	}
	if p.MonthlyBudgetGPUHours != nil {
		t.MonthlyBudgetGPUHours = *p.MonthlyBudgetGPUHours
	}
	if p.Guarantees != nil {
		t.Guarantees = maps.Clone(p.Guarantees)
	}
	if p.FairShareWeight != nil {
		t.FairShareWeight = *p.FairShareWeight
	}
	if p.WebhookURL != nil {
		*hook = strings.TrimSpace(*p.WebhookURL)
	}
	if p.PosixAccount != nil {
		t.PosixAccount = strings.TrimSpace(*p.PosixAccount)
	}
}

func (p *TeamJSON) check(ctx context.Context) error {
	if p.WebhookURL != nil {
		if msg := webhookProblem(ctx, strings.TrimSpace(*p.WebhookURL)); msg != "" {
			return (allot.FieldErrors{"webhook_url": msg}).Err()
		}
	}
	return nil
}

func (s *Server) createTeam(c echo.Context, u *allot.User, p *TeamJSON) (store.AdminResult, error) {
	if err := p.check(c.Request().Context()); err != nil {
		return store.AdminResult{}, err
	}
	t := allot.Team{FairShareWeight: 1, Guarantees: map[string]int{}}
	if p.Slug != nil {
		t.Slug = strings.TrimSpace(*p.Slug)
	}
	hook := ""
	p.applyTo(&t, &hook)
	return s.st.CreateTeamPolicy(c.Request().Context(), policyChange(u, "team.create", "team:"+t.Slug, p.Note), t, hook)
}

func (s *Server) updateTeam(c echo.Context, u *allot.User, slug string, p *TeamJSON) (store.AdminResult, error) {
	if p.Slug != nil && *p.Slug != slug {
		return store.AdminResult{}, (allot.FieldErrors{"slug": "a team's slug cannot change"}).Err()
	}
	if err := p.check(c.Request().Context()); err != nil {
		return store.AdminResult{}, err
	}
	return s.st.UpdateTeamPolicy(c.Request().Context(), policyChange(u, "team.update", "team:"+slug, p.Note), slug, p.applyTo)
}

// teamFormPatch reads a team form (create when withIdentity).
func teamFormPatch(c echo.Context, types []string, withIdentity bool) (views.TeamFormValues, TeamJSON, error) {
	v := views.TeamFormValues{Slug: c.FormValue("slug"), Name: c.FormValue("name"), CostCenter: c.FormValue("cost_center"),
		Budget: c.FormValue("monthly_budget_gpu_hours"), Weight: c.FormValue("fair_share_weight"), Webhook: c.FormValue("webhook_url"),
		Note: c.FormValue("note"), PosixAccount: c.FormValue("posix_account")}
	p := TeamJSON{Guarantees: map[string]int{}, WebhookURL: &v.Webhook, Note: v.Note, PosixAccount: &v.PosixAccount}
	if withIdentity {
		p.Slug, p.Name, p.CostCenter = &v.Slug, &v.Name, &v.CostCenter
	}
	f := allot.FieldErrors{}
	budget, err := strconv.ParseInt(strings.TrimSpace(v.Budget), 10, 64)
	if err != nil {
		f.Add("monthly_budget_gpu_hours", "must be a whole number of GPU-hours")
	}
	p.MonthlyBudgetGPUHours = &budget
	weight, err := strconv.Atoi(strings.TrimSpace(v.Weight))
	if err != nil {
		f.Add("fair_share_weight", "must be a whole number")
	}
	p.FairShareWeight = &weight
	for _, typ := range types {
		raw := c.FormValue("guarantee_" + typ)
		v.Guarantees = append(v.Guarantees, views.Option{Value: typ, Label: raw})
		if strings.TrimSpace(raw) == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil {
			f.Add("guarantee_"+typ, "must be a whole number of GPUs")
		} else if n < 0 {
			f.Add("guarantee_"+typ, "must not be negative")
		}
		p.Guarantees[typ] = n
	}
	return v, p, f.Err()
}

func (s *Server) gpuTypeNames(c echo.Context) ([]string, error) {
	types, err := s.st.ListGPUTypes(c.Request().Context())
	if err != nil {
		return nil, err
	}
	out := make([]string, len(types))
	for i, t := range types {
		out[i] = t.Name
	}
	return out, nil
}

func (s *Server) teamsView(c echo.Context, edited *views.TeamForm) (views.AdminTeams, error) {
	ctx := c.Request().Context()
	teams, err := s.st.ListTeams(ctx)
	if err != nil {
		return views.AdminTeams{}, err
	}
	types, err := s.gpuTypeNames(c)
	if err != nil {
		return views.AdminTeams{}, err
	}
	a := views.AdminTeams{Page: s.page(c, "Teams · Admin")}
	for _, t := range teams {
		hook, err := s.st.TeamWebhook(ctx, t.Slug)
		if err != nil {
			return views.AdminTeams{}, err
		}
		f := views.TeamForm{Slug: t.Slug, Name: t.Name, Errors: map[string]string{}, Values: views.TeamFormValues{
			Budget: strconv.FormatInt(t.MonthlyBudgetGPUHours, 10), Weight: strconv.Itoa(t.FairShareWeight), Webhook: hook,
			PosixAccount: t.PosixAccount}}
		for _, typ := range types {
			f.Values.Guarantees = append(f.Values.Guarantees, views.Option{Value: typ, Label: strconv.Itoa(t.Guarantees[typ])})
		}
		if c.QueryParam("saved") == t.Slug {
			f.Saved = savedMessage(c, "team "+t.Slug)
		}
		if edited != nil && edited.Slug == t.Slug {
			edited.Name = t.Name
			f = *edited
		}
		a.Teams = append(a.Teams, f)
	}
	a.New = views.TeamForm{Errors: map[string]string{}, Values: views.TeamFormValues{Budget: "0", Weight: "1"}}
	for _, typ := range types {
		a.New.Values.Guarantees = append(a.New.Values.Guarantees, views.Option{Value: typ, Label: "0"})
	}
	if edited != nil && edited.Slug == "" {
		a.New = *edited
	}
	return a, nil
}

func (s *Server) adminTeamsPage(c echo.Context) error {
	a, err := s.teamsView(c, nil)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.AdminTeamsView(a))
}

func (s *Server) adminTeamForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	types, err := s.gpuTypeNames(c)
	if err != nil {
		return err
	}
	slug := c.Param("team")
	create := slug == ""
	v, p, err := teamFormPatch(c, types, create)
	var r store.AdminResult
	if err == nil {
		if create {
			r, err = s.createTeam(c, u, &p)
			slug = strings.TrimSpace(v.Slug)
		} else {
			r, err = s.updateTeam(c, u, slug, &p)
		}
	}
	return formDone(c, err, savedURL("/admin/teams", slug, r, "team-"+slug), func(errs map[string]string) (templ.Component, error) {
		edited := &views.TeamForm{Values: v, Errors: errs}
		if !create {
			edited.Slug = slug
		}
		a, err := s.teamsView(c, edited)
		return views.AdminTeamsView(a), err
	})
}

func (s *Server) teamValues(c echo.Context, slug string) (store.TeamValues, error) {
	t, err := s.st.GetTeam(c.Request().Context(), slug)
	if err != nil {
		return store.TeamValues{}, err
	}
	hook, err := s.st.TeamWebhook(c.Request().Context(), slug)
	if err != nil {
		return store.TeamValues{}, err
	}
	return store.TeamValuesOf(t, hook), nil
}

func (s *Server) apiCreateTeam(c echo.Context) error {
	u, p, err := userAndBody[TeamJSON](c)
	if err != nil {
		return err
	}
	r, err := s.createTeam(c, u, &p)
	if err != nil {
		return err
	}
	v, err := s.teamValues(c, *p.Slug)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", "/api/v1/teams/"+v.Slug+"/budget")
	return writeJSON(c, http.StatusCreated, changeJSON(r, v))
}

func (s *Server) apiUpdateTeam(c echo.Context) error {
	u, p, err := userAndBody[TeamJSON](c)
	if err != nil {
		return err
	}
	slug := c.Param("team")
	r, err := s.updateTeam(c, u, slug, &p)
	if err != nil {
		return err
	}
	v, err := s.teamValues(c, slug)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, v))
}

// ---- Policy settings

type policyFieldSpec struct {
	name, label, help, kind string // kind: int, duration, money, choice, bool
	options                 []string
}

var policyGroups = []struct {
	legend string
	fields []policyFieldSpec
}{
	{"Priority", []policyFieldSpec{
		{"queue_order", "Queue order within a tier", "response: short jobs first, aged, × fair share; multifactor: the weights below and a 20-minute starvation guard, kept for compatibility (on the simulator's robustness sweeps it waited longer than EASY backfill on 5 of 21 settings)", "choice",
			[]string{allot.QueueOrderResponse, allot.QueueOrderMultifactor}},
		{"tier1_fifo", "Tier 1 oldest first", "incident jobs by submission time, whatever their priority; one waiting on its victims' grace keeps its turn. Off: by priority, like the other tiers", "bool", nil},
		{"weight_fair_share", "Fair-share weight (W_fs)", "", "int", nil},
		{"weight_size", "Job-size weight (W_size)", "", "int", nil},
		{"weight_age", "Age weight (W_age)", "", "int", nil},
		{"half_life_s", "Fair-share half-life", "usage decay", "duration", nil},
		{"max_age_s", "Age factor full after", "", "duration", nil},
	}},
	{"Preemption", []policyFieldSpec{
		{"grace_period_s", "Grace period", "SIGTERM → SIGKILL", "duration", nil},
		{"min_runtime_s", "Minimum runtime", "no preemption before", "duration", nil},
	}},
	{"Scheduling and nodes", []policyFieldSpec{
		{"cycle_s", "Scheduling cycle", "", "duration", nil},
		{"heartbeat_missed_after_s", "Node down after silence of", "", "duration", nil},
		{"auto_undrain_after_s", "Auto-undrain after healthy for", "0 = never", "duration", nil},
		{"max_loss_requeues", "Requeues after a lost node or process", "a checkpointable job's; the next such loss fails it (0 = no limit)", "int", nil},
	}},
	{"Budgets", []policyFieldSpec{
		{"budget_warn_pct", "Warn leads at (% of budget)", "", "int", nil},
		{"budget_demote_pct", "Demote tiers 3–4 at (% of budget)", "", "int", nil},
	}},
	{"Cloud burst", []policyFieldSpec{
		{"burst_pending_gpu_hours", "Burst when pending work exceeds (GPU-hours)", "", "int", nil},
		{"burst_mean_wait_s", "… and mean wait exceeds", "", "duration", nil},
		{"burst_release_gpu_hours", "Release idle burst nodes below (GPU-hours)", "", "int", nil},
		{"burst_max_nodes", "Most burst nodes at once", "0 = burst off", "int", nil},
		{"burst_monthly_budget", "Monthly burst budget", "0 = no cap", "money", nil},
	}},
}

// policyFormValues formats v for the form.
func policyFormValues(v store.PolicyValues) map[string]string {
	raw, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	out := map[string]string{}
	for _, g := range policyGroups {
		for _, f := range g.fields {
			switch x := m[f.name].(type) {
			case float64:
				if f.kind == "duration" {
					out[f.name] = allot.FormatDuration(time.Duration(x) * time.Second)
				} else {
					out[f.name] = strconv.FormatInt(int64(x), 10)
				}
			case string:
				out[f.name] = x
			case bool:
				out[f.name] = strconv.FormatBool(x)
			}
		}
	}
	return out
}

// policyFormPatch reads the policy form into a JSON patch of PolicyValues.
func policyFormPatch(c echo.Context) (map[string]string, json.RawMessage, error) {
	typed := map[string]string{}
	patch := map[string]any{}
	f := allot.FieldErrors{}
	form, err := c.FormParams()
	if err != nil {
		return typed, nil, &badRequest{"malformed form"}
	}
	for _, g := range policyGroups {
		for _, spec := range g.fields {
			raw := strings.TrimSpace(c.FormValue(spec.name))
			typed[spec.name] = raw
			switch spec.kind {
			case "bool":
				// The form posts a hidden "false" and, when ticked, the
				// checkbox's "true": on if any value is. Not posted at
				// all: kept as it is.
				vals := form[spec.name]
				if len(vals) == 0 {
					delete(typed, spec.name)
					continue
				}
				on, bad := false, false
				for _, v := range vals {
					switch strings.ToLower(strings.TrimSpace(v)) {
					case "true", "on", "1":
						on = true
					case "false", "off", "0", "":
					default:
						bad = true
					}
				}
				if bad {
					f.Add(spec.name, "must be true or false")
					continue
				}
				typed[spec.name] = strconv.FormatBool(on)
				patch[spec.name] = on
			case "int":
				n, err := strconv.Atoi(raw)
				if err != nil {
					f.Add(spec.name, "must be a whole number")
					continue
				}
				patch[spec.name] = n
			case "duration":
				d, err := allot.ParseDuration(raw)
				if err != nil {
					f.Add(spec.name, "%v", err)
					continue
				}
				if d%time.Second != 0 {
					f.Add(spec.name, "must be whole seconds")
					continue
				}
				patch[spec.name] = int64(d / time.Second)
			case "choice":
				if raw != "" { // not posted: kept as it is
					patch[spec.name] = raw // Policy.Validate names the choices
				}
			case "money":
				m, err := allot.ParseMoney(raw, "USD")
				if err != nil {
					f.Add(spec.name, "%v", err)
					continue
				}
				patch[spec.name] = m.Decimal()
			}
		}
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return typed, nil, err
	}
	return typed, b, f.Err()
}

// PolicyJSON is GET /api/v1/policy: the version in force and its settings.
type PolicyJSON struct {
	Version   int64     `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	Comment   string    `json:"comment"`
	store.PolicyValues
	// HealthRules as GET /api/v1/health/rules shows them (durations in the
	// "10m" form); they are edited there.
	HealthRules []HealthRuleJSON `json:"health_rules"`
}

func policyJSON(p allot.Policy) PolicyJSON {
	return PolicyJSON{Version: p.Version, CreatedAt: p.CreatedAt.UTC(), CreatedBy: p.CreatedBy, Comment: p.Comment,
		PolicyValues: store.PolicyValuesOf(p), HealthRules: rulesJSON(p.HealthRules)}
}

// updatePolicy merges patch (a JSON object of PolicyValues fields) into
// the policy in force.
func (s *Server) updatePolicy(c echo.Context, u *allot.User, patch json.RawMessage, note string) (store.AdminResult, error) {
	return s.savePolicy(c, policyChange(u, "policy.update", "policy", note), func(v *store.PolicyValues) error {
		return json.Unmarshal(patch, v)
	})
}

// savePolicy applies patch to the policy's values, refuses what this
// cluster cannot honour, and asks for a scheduling cycle when the policy
// changed, so the new values take effect at once.
func (s *Server) savePolicy(c echo.Context, change store.PolicyChange, patch func(v *store.PolicyValues) error) (store.AdminResult, error) {
	ctx := c.Request().Context()
	r, err := s.st.UpdatePolicy(ctx, change, func(v *store.PolicyValues) error {
		if err := patch(v); err != nil {
			return err
		}
		// Agents heartbeat every HeartbeatInterval: a shorter silence
		// limit than two of them would mark healthy nodes down (and fail
		// their jobs) between two heartbeats.
		hb := s.cfg.HeartbeatInterval
		if least := int64((2*hb + time.Second - 1) / time.Second); v.HeartbeatMissedAfterS < least {
			every := hb.String()
			if hb%time.Second == 0 {
				every = allot.FormatDuration(hb)
			}
			return allot.FieldErrors{"heartbeat_missed_after_s": fmt.Sprintf("must be at least %s: agents send a heartbeat every %s, and a node may miss one",
				allot.FormatDuration(time.Duration(least)*time.Second), every)}.Err()
		}
		return nil
	})
	if err == nil && r.Changed {
		s.jobEvent(ctx)
	}
	return r, err
}

func (s *Server) policyView(c echo.Context, typed map[string]string, errs map[string]string, note string) (views.AdminPolicy, error) {
	p, err := s.st.CurrentPolicy(c.Request().Context())
	if err != nil {
		return views.AdminPolicy{}, err
	}
	stored := policyFormValues(store.PolicyValuesOf(p))
	if typed == nil {
		typed = stored
	}
	for k, v := range stored { // a field the form did not post shows what is kept
		if _, ok := typed[k]; !ok {
			typed[k] = v
		}
	}
	if errs == nil {
		errs = map[string]string{}
	}
	cur, err := s.cardCurrency(c)
	if err != nil {
		return views.AdminPolicy{}, err
	}
	a := views.AdminPolicy{Page: s.page(c, "Policy · Admin"), Version: p.Version, Errors: errs, Note: note}
	if c.QueryParam("saved") == "policy" {
		a.Saved = savedMessage(c, "the policy")
	}
	for _, g := range policyGroups {
		pg := views.PolicyGroup{Legend: g.legend}
		for _, f := range g.fields {
			label := f.label
			if f.kind == "money" {
				label += " (" + cur + ")"
			}
			pg.Fields = append(pg.Fields, views.PolicyField{Name: f.name, Label: label, Help: f.help, Value: typed[f.name], Kind: f.kind, Options: f.options})
		}
		a.Groups = append(a.Groups, pg)
	}
	return a, nil
}

func (s *Server) adminPolicyPage(c echo.Context) error {
	a, err := s.policyView(c, nil, nil, "")
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.AdminPolicyView(a))
}

func (s *Server) adminPolicyForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	typed, patch, err := policyFormPatch(c)
	note := c.FormValue("note")
	var r store.AdminResult
	if err == nil {
		r, err = s.updatePolicy(c, u, patch, note)
	}
	return formDone(c, err, savedURL("/admin/policy", "policy", r, "policy"), func(errs map[string]string) (templ.Component, error) {
		a, err := s.policyView(c, typed, errs, note)
		return views.AdminPolicyView(a), err
	})
}

func (s *Server) apiGetPolicy(c echo.Context) error {
	p, err := s.st.CurrentPolicy(c.Request().Context())
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, policyJSON(p))
}

// policyPutJSON is the body of PUT /api/v1/policy: any PolicyValues
// fields (absent ones keep their value) and an optional note.
type policyPutJSON struct {
	*store.PolicyValues
	Note string `json:"note"`
}

func (s *Server) apiPutPolicy(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	body := new(strings.Builder)
	if _, err := io.Copy(body, c.Request().Body); err != nil {
		return &badRequest{"reading body: " + err.Error()}
	}
	// Check the body's shape first (unknown fields, types), on throwaway values.
	probe := policyPutJSON{PolicyValues: &store.PolicyValues{BurstMonthlyBudget: "0"}}
	if err := decodeStrict(strings.NewReader(body.String()), &probe); err != nil {
		// Name promoted fields as the client wrote them.
		if f := allot.Fields(err); f != nil {
			out := allot.FieldErrors{}
			for k, v := range f {
				out[strings.TrimPrefix(k, "PolicyValues.")] = v
			}
			if _, ok := out["health_rules"]; ok {
				out["health_rules"] = "health rules are edited with PUT /api/v1/health/rules (or at /admin/health), not here"
			}
			return out.Err()
		}
		return err
	}
	// The body is patched onto the current values; "note" lands in the
	// wrapper, not the policy.
	r, err := s.savePolicy(c, policyChange(u, "policy.update", "policy", probe.Note), func(v *store.PolicyValues) error {
		return json.Unmarshal([]byte(body.String()), &policyPutJSON{PolicyValues: v})
	})
	if err != nil {
		return err
	}
	p, err := s.st.CurrentPolicy(c.Request().Context())
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, policyJSON(p)))
}

// apiListTeams is GET /api/v1/teams: every team as admins edit it
// (budgets, guarantees, weights, webhooks).
func (s *Server) apiListTeams(c echo.Context) error {
	ctx := c.Request().Context()
	teams, err := s.st.ListTeams(ctx)
	if err != nil {
		return err
	}
	out := make([]store.TeamValues, 0, len(teams))
	for _, t := range teams {
		hook, err := s.st.TeamWebhook(ctx, t.Slug)
		if err != nil {
			return err
		}
		out = append(out, store.TeamValuesOf(t, hook))
	}
	return writeJSON(c, http.StatusOK, map[string]any{"teams": out})
}
