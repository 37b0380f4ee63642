package web

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// The audit log (page, JSON, streamed CSV) and the policy version history.

// FieldChangeJSON is one changed field of an audit entry or policy version.
type FieldChangeJSON struct {
	Field  string `json:"field"`
	Before string `json:"before"`
	After  string `json:"after"`
}

// AuditEntryJSON is one audit-log entry.
type AuditEntryJSON struct {
	ID            int64             `json:"id"`
	At            time.Time         `json:"at"`
	Actor         string            `json:"actor"`
	Action        string            `json:"action"`
	Object        string            `json:"object"`
	PolicyVersion int64             `json:"policy_version,omitempty"`
	Before        json.RawMessage   `json:"before"`
	After         json.RawMessage   `json:"after"`
	Changes       []FieldChangeJSON `json:"changes"`
	Note          string            `json:"note"`
}

func auditJSON(e *allot.AuditEntry) AuditEntryJSON {
	out := AuditEntryJSON{ID: e.ID, At: e.At.UTC(), Actor: e.Actor, Action: e.Action, Object: e.Object, PolicyVersion: e.PolicyVersion,
		Before: nullRaw(e.Before), After: nullRaw(e.After), Note: e.Note, Changes: []FieldChangeJSON{}}
	for _, c := range diffJSON(e.Before, e.After) {
		out.Changes = append(out.Changes, FieldChangeJSON(c))
	}
	return out
}

func nullRaw(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

func auditRow(e allot.AuditEntry) views.AuditRow {
	return views.AuditRow{ID: e.ID, At: fmtTime(e.At), Actor: e.Actor, Action: e.Action, Object: e.Object, PolicyVersion: e.PolicyVersion,
		Changes: diffJSON(e.Before, e.After), Note: e.Note}
}

// diffJSON lists the fields that differ between two JSON documents,
// sorted by name: objects field by field, anything else as one "value".
// Fields in whole seconds (*_s) also show the duration.
func diffJSON(before, after json.RawMessage) []views.FieldChange {
	b, bObj := decodeObject(before)
	a, aObj := decodeObject(after)
	if !bObj || !aObj {
		if (len(before) == 0 || bObj) && (len(after) == 0 || aObj) {
			// one side is missing: list the other's fields
		} else {
			if bytes.Equal(compact(before), compact(after)) {
				return nil
			}
			return []views.FieldChange{{Field: "value", Before: fmtValue("", rawOrNil(before)), After: fmtValue("", rawOrNil(after))}}
		}
	}
	keys := map[string]bool{}
	for k := range b {
		keys[k] = true
	}
	for k := range a {
		keys[k] = true
	}
	var out []views.FieldChange
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		bv, bok := b[k]
		av, aok := a[k]
		if bok && aok && bytes.Equal(compact(bv), compact(av)) {
			continue
		}
		c := views.FieldChange{Field: k, Before: "—", After: "—"}
		if bok {
			c.Before = fmtValue(k, bv)
		}
		if aok {
			c.After = fmtValue(k, av)
		}
		out = append(out, c)
	}
	return out
}

func rawOrNil(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

func decodeObject(b json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if len(b) == 0 || json.Unmarshal(b, &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

func compact(b json.RawMessage) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return b
	}
	return buf.Bytes()
}

// fmtValue formats one JSON value for people: strings bare, numbers as
// written (with the duration for *_s fields), the rest as compact JSON.
func fmtValue(field string, v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) == nil {
		if s == "" {
			return `""`
		}
		return s
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	if dec.Decode(&n) == nil {
		if strings.HasSuffix(field, "_s") {
			if secs, err := n.Int64(); err == nil {
				return fmt.Sprintf("%s (%s)", n, allot.FormatDuration(time.Duration(secs)*time.Second))
			}
		}
		return n.String()
	}
	if string(compact(v)) == "null" {
		return "—"
	}
	return string(compact(v))
}

// auditFilter reads the audit filters: kind (tier, rate, team, policy,
// node…), actor, since and until (dates, until inclusive), object.
func auditFilter(c echo.Context) (views.AuditFilterValues, store.AuditFilter, error) {
	v := views.AuditFilterValues{Kind: c.QueryParam("kind"), Actor: c.QueryParam("actor"), Since: c.QueryParam("since"), Until: c.QueryParam("until")}
	f := store.AuditFilter{Actor: v.Actor, Object: c.QueryParam("object")}
	errs := allot.FieldErrors{}
	// Text PostgreSQL cannot hold is refused here, the same for the page,
	// the JSON and the CSV (which must refuse it before its first byte).
	for name, s := range map[string]string{"actor": f.Actor, "object": f.Object} {
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			errs.Add(name, "must be UTF-8 text without NUL characters")
		}
	}
	if v.Kind != "" {
		if strings.Trim(v.Kind, "abcdefghijklmnopqrstuvwxyz_") != "" {
			errs.Add("kind", "must be an object kind such as tier, rate, team, policy or node")
		}
		f.Action = v.Kind + "."
	}
	date := func(name, s string) time.Time {
		if s == "" {
			return time.Time{}
		}
		t, err := time.ParseInLocation("2006-01-02", s, time.UTC)
		if err != nil {
			errs.Add(name, "must be a date, e.g. 2026-11-30")
		}
		return t
	}
	f.Since = date("since", v.Since)
	if u := date("until", v.Until); !u.IsZero() {
		f.Until = u.AddDate(0, 0, 1)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		errs.Add("until", "must not be before the start date")
	}
	return v, f, errs.Err()
}

func auditQuery(v views.AuditFilterValues) string {
	q := url.Values{}
	for k, s := range map[string]string{"kind": v.Kind, "actor": v.Actor, "since": v.Since, "until": v.Until} {
		if s != "" {
			q.Set(k, s)
		}
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

const auditPageLimit = 200

func (s *Server) auditPage(c echo.Context) error {
	ctx := c.Request().Context()
	v, f, ferr := auditFilter(c)
	a := views.AuditPage{Page: s.page(c, "Audit log · Admin"), Filter: v,
		JSONURL: "/api/v1/audit" + auditQuery(v), CSVURL: "/api/v1/audit.csv" + auditQuery(v)}
	kinds, err := s.st.AuditKinds(ctx)
	if err != nil {
		return err
	}
	for _, k := range kinds {
		a.Kinds = append(a.Kinds, views.Option{Value: k, Label: k})
	}
	actors, err := s.st.AuditActors(ctx)
	if err != nil {
		return err
	}
	for _, k := range actors {
		a.Actors = append(a.Actors, views.Option{Value: k, Label: k})
	}
	status := http.StatusOK
	if ferr != nil {
		a.Error = allot.Fields(ferr).String()
		status = http.StatusUnprocessableEntity
	} else {
		f.Limit = auditPageLimit + 1
		entries, err := s.st.AuditLog(ctx, f)
		if err != nil {
			return err
		}
		if len(entries) > auditPageLimit {
			entries, a.Truncated = entries[:auditPageLimit], true
		}
		for _, e := range entries {
			a.Entries = append(a.Entries, auditRow(e))
		}
	}
	return render(c, status, views.AuditView(a))
}

// apiAudit is GET /api/v1/audit: entries newest first (limit ≤ 5000,
// default 500), with the page's filters.
func (s *Server) apiAudit(c echo.Context) error {
	_, f, err := auditFilter(c)
	if err != nil {
		return err
	}
	f.Limit = 500
	if l := c.QueryParam("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 5000 {
			return (allot.FieldErrors{"limit": "must be a whole number from 1 to 5000"}).Err()
		}
		f.Limit = n
	}
	entries, err := s.st.AuditLog(c.Request().Context(), f)
	if err != nil {
		return err
	}
	out := make([]AuditEntryJSON, 0, len(entries))
	for i := range entries {
		out = append(out, auditJSON(&entries[i]))
	}
	return writeJSON(c, http.StatusOK, map[string]any{"entries": out})
}

// csvText neutralises a text cell a spreadsheet would run as a formula
// (OWASP "CSV injection") by putting an apostrophe, which spreadsheets show
// as text and do not evaluate, before the character that would start it:
// =, +, -, @, a tab or a carriage return at the start of the cell, and the
// same after a ';', a tab or a line break anywhere in it (skipping spaces
// and quotes). A spreadsheet whose list separator is ';' (most European
// locales) splits our comma-separated lines on ';' and ignores the quotes
// around our cells, so "fan;=1+1" would start a cell "=1+1" there; a line
// break inside a quoted cell can start a row for it. A ',' inside a cell
// needs nothing: the CSV writer quotes such a cell, and whatever splits on
// ',' honours those quotes. Numeric columns do not go through it, so their
// numbers stay numbers.
func csvText(s string) string {
	if !strings.ContainsAny(s, csvFormulaStart+csvCellBreaks) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2)
	start := true // where some spreadsheet may start a cell
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if start && i > 0 && (ch == ' ' || ch == '"') {
			b.WriteByte(ch)
			continue
		}
		if start && strings.IndexByte(csvFormulaStart, ch) >= 0 {
			b.WriteByte('\'')
		}
		b.WriteByte(ch)
		start = strings.IndexByte(csvCellBreaks, ch) >= 0
	}
	return b.String()
}

const (
	csvFormulaStart = "=+-@\t\r"
	csvCellBreaks   = ";\t\r\n"
)

// AuditCSVColumns is the header of the audit CSV export.
var AuditCSVColumns = []string{"id", "at", "actor", "action", "object", "policy_version", "changes", "before", "after", "note"}

// apiAuditCSV streams every matching entry as RFC 4180 CSV. Bad filters
// and a database that refuses the first page answer as the JSON does
// (a problem, nothing written); once the first row is out, a failure can
// only break the download off.
func (s *Server) apiAuditCSV(c echo.Context) error {
	_, f, err := auditFilter(c)
	if err != nil {
		return err
	}
	w := csv.NewWriter(c.Response())
	w.UseCRLF = true // RFC 4180
	out := s.exportWriter(c, w)
	start := func() error {
		h := c.Response().Header()
		h.Set(echo.HeaderContentType, "text/csv; charset=utf-8")
		h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="allot-audit-%s.csv"`, s.st.Now().UTC().Format("2006-01-02")))
		c.Response().WriteHeader(http.StatusOK)
		return out.write(AuditCSVColumns)
	}
	started := false
	err = s.exportSt.EachAudit(c.Request().Context(), f, func(e *allot.AuditEntry) error {
		if !started {
			started = true
			if err := start(); err != nil {
				return err
			}
		}
		var changes []string
		for _, ch := range diffJSON(e.Before, e.After) {
			changes = append(changes, ch.Field+": "+ch.Before+" → "+ch.After)
		}
		version := ""
		if e.PolicyVersion > 0 {
			version = strconv.FormatInt(e.PolicyVersion, 10)
		}
		return out.write([]string{strconv.FormatInt(e.ID, 10), e.At.UTC().Format(time.RFC3339Nano), csvText(e.Actor), csvText(e.Action),
			csvText(e.Object), version, csvText(strings.Join(changes, "; ")), csvText(string(compact(e.Before))), csvText(string(compact(e.After))),
			csvText(e.Note)})
	})
	if err != nil && !started {
		return err
	}
	if err != nil {
		s.log.Error("audit CSV export broke off", "err", err)
		panic(http.ErrAbortHandler) // the client sees a cut download, not a short file
	}
	if !started {
		if err := start(); err != nil {
			return err
		}
	}
	return out.flush()
}

// PolicyVersionJSON is one policy version and what changed in it.
type PolicyVersionJSON struct {
	PolicyJSON
	Changes  []FieldChangeJSON `json:"changes"`   // settings changed from the version before
	AuditIDs []int64           `json:"audit_ids"` // the audit entries naming this version
}

// policyVersions returns the versions newest first with their changes and
// audit entries.
func (s *Server) policyVersions(c echo.Context) ([]allot.Policy, map[int64][]allot.AuditEntry, error) {
	ctx := c.Request().Context()
	hist, err := s.st.PolicyHistory(ctx)
	if err != nil {
		return nil, nil, err
	}
	entries, err := s.st.AuditLog(ctx, store.AuditFilter{Limit: 5000})
	if err != nil {
		return nil, nil, err
	}
	byVersion := map[int64][]allot.AuditEntry{}
	for _, e := range entries {
		if e.PolicyVersion > 0 {
			byVersion[e.PolicyVersion] = append(byVersion[e.PolicyVersion], e)
		}
	}
	return hist, byVersion, nil
}

// versionChanges diffs version i of hist (newest first) against the one
// before it.
func versionChanges(hist []allot.Policy, i int) []views.FieldChange {
	if i+1 >= len(hist) {
		return nil
	}
	b, _ := json.Marshal(policyDoc(hist[i+1]))
	a, _ := json.Marshal(policyDoc(hist[i]))
	return diffJSON(b, a)
}

// policyDoc is a version's settings with its health rules, for diffs.
func policyDoc(p allot.Policy) any {
	return struct {
		store.PolicyValues
		HealthRules []HealthRuleJSON `json:"health_rules"`
	}{store.PolicyValuesOf(p), rulesJSON(p.HealthRules)}
}

func (s *Server) versionsPage(c echo.Context) error {
	hist, byVersion, err := s.policyVersions(c)
	if err != nil {
		return err
	}
	v := views.PolicyVersions{Page: s.page(c, "Policy versions · Admin")}
	for i, p := range hist {
		if i == 200 {
			break
		}
		r := views.VersionRow{Version: p.Version, At: fmtTime(p.CreatedAt), By: p.CreatedBy, Comment: p.Comment, Changes: versionChanges(hist, i)}
		for _, e := range byVersion[p.Version] {
			r.Entries = append(r.Entries, auditRow(e))
		}
		v.Versions = append(v.Versions, r)
	}
	return render(c, http.StatusOK, views.PolicyVersionsView(v))
}

func (s *Server) apiPolicyVersions(c echo.Context) error {
	hist, byVersion, err := s.policyVersions(c)
	if err != nil {
		return err
	}
	out := make([]PolicyVersionJSON, 0, len(hist))
	for i, p := range hist {
		v := PolicyVersionJSON{PolicyJSON: policyJSON(p), Changes: []FieldChangeJSON{}, AuditIDs: []int64{}}
		for _, ch := range versionChanges(hist, i) {
			v.Changes = append(v.Changes, FieldChangeJSON(ch))
		}
		for _, e := range byVersion[p.Version] {
			v.AuditIDs = append(v.AuditIDs, e.ID)
		}
		out = append(out, v)
	}
	return writeJSON(c, http.StatusOK, map[string]any{"versions": out})
}
