package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/static"
	"github.com/allotlabs/allot/web"
)

// The personas of the matrix; "" is a caller who is not logged in.
const anonymous = ""

var matrixPersonas = []string{anonymous, demo.Engineer, demo.Lead, demo.Finance, demo.Admin}

// allow is one row of the expected table: for each persona, whether the
// rule lets them through, for the team in the path being their own team
// (nlp: noah is an engineer in it, nadia its lead) or another one (fraud).
type allow struct{ own, other map[string]bool }

func everyone(v bool, except ...string) map[string]bool {
	m := map[string]bool{}
	for _, p := range matrixPersonas {
		m[p] = v != slices.Contains(except, p)
	}
	return m
}

func only(ps ...string) map[string]bool { return everyone(false, ps...) }

// expected is written by hand from issue 6's roles, per rule: engineer —
// their own team's jobs (submit, cancel their own); lead — the team's
// budget, jobs, reports, alerts; finance — all chargeback and reports,
// read only; admin — everything. Team routes differ by whose team it is.
var expected = map[string]allow{
	// Health, login, static files: anyone.
	"public": {own: everyone(true)},
	// The agents' API takes node tokens only: no person's token or session.
	"node": {own: everyone(false)},
	// /metrics takes a bearer token only (an admin's or the scrape token;
	// metrics16_test.go), no session, and refuses with 401, not the login page.
	"metrics": {own: everyone(false)},
	// Logged-in pages and read APIs.
	"user": {own: only(demo.Engineer, demo.Lead, demo.Finance, demo.Admin)},
	// Submitting and cancelling: team members and admins; finance is read only.
	"submitter": {own: only(demo.Engineer, demo.Lead, demo.Admin)},
	// A team's dashboard and budget: its members, finance, admins.
	"team-member": {own: only(demo.Engineer, demo.Lead, demo.Finance, demo.Admin), other: only(demo.Finance, demo.Admin)},
	// Changing a team's settings (webhook): its lead and admins.
	"team-lead": {own: only(demo.Lead, demo.Admin), other: only(demo.Admin)},
	// Usage reports: team members, finance, admins.
	"reports": {own: only(demo.Engineer, demo.Lead, demo.Finance, demo.Admin)},
	// Chargeback: leads, finance, admins (not engineers).
	"lead-or-finance": {own: only(demo.Lead, demo.Finance, demo.Admin)},
	// Closing a month: finance and admins.
	"finance": {own: only(demo.Finance, demo.Admin)},
	// Policy, nodes, audit: admins.
	"admin": {own: only(demo.Admin)},
}

// matrixClient is one persona's way in: a cookie session (pages) and an
// API token (API), redirects not followed.
type matrixClient struct {
	c     *http.Client
	csrf  string
	token string
}

func newMatrixClient(t *testing.T, e *env, persona string) *matrixClient {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	mc := &matrixClient{c: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	if persona != anonymous {
		u, err := e.m.Store.UserByEmail(context.Background(), demo.PersonaEmail[persona])
		if err != nil {
			t.Fatal(err)
		}
		secret, err := e.m.Store.CreateSession(context.Background(), u.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		jar.SetCookies(mustURL(t, e.url), []*http.Cookie{{Name: "allot_session", Value: secret, Path: "/"}})
		mc.token = e.tokens[persona]
	}
	resp, err := mc.c.Get(e.url + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range jar.Cookies(mustURL(t, e.url)) {
		if c.Name == "_csrf" {
			mc.csrf = c.Value
		}
	}
	if mc.csrf == "" {
		t.Fatal("no CSRF cookie from /login")
	}
	return mc
}

// send makes the request as a browser (pages: session cookie, CSRF token
// in the form) or an API client (bearer token, empty body).
func (mc *matrixClient) send(t *testing.T, base, method, path string) (int, string, string) {
	t.Helper()
	var body io.Reader
	api := strings.HasPrefix(path, "/api/")
	if !api && method != http.MethodGet {
		body = strings.NewReader(url.Values{"_csrf": {mc.csrf}}.Encode())
	}
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if api && mc.token != "" {
		req.Header.Set("Authorization", "Bearer "+mc.token)
	}
	resp, err := mc.c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

var paramRE = regexp.MustCompile(`:[a-z_]+|\*$`)

// TestAuthorizationMatrix walks every route the server registered as
// every persona and checks allow/deny against the table above; no route
// may bypass the access rules.
func TestAuthorizationMatrix(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	srv := e.m.Server
	if u := srv.Unguarded(); len(u) != 0 {
		t.Errorf("routes registered without an access rule (use s.route in routes.go): %v", u)
	}
	routes := srv.Access()
	if len(routes) < 40 {
		t.Fatalf("only %d routes", len(routes))
	}

	// Objects the paths name: a job of noah's in nlp, a month with usage,
	// a node, a tier, a GPU type, and a token nobody needs.
	noah, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Engineer])
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := e.m.Store.ListJobs(ctx, store.JobFilter{State: allot.JobPending})
	if err != nil {
		t.Fatal(err)
	}
	var jobID int64
	for _, j := range jobs {
		if j.Team == "nlp" && j.UserID == noah.ID {
			jobID = j.ID
		}
	}
	if jobID == 0 {
		t.Fatal("the demo has no pending job of noah's in nlp")
	}
	ada, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	_, spare, err := e.m.Store.CreateAPIToken(ctx, ada.ID, "spare")
	if err != nil {
		t.Fatal(err)
	}
	month := store.MonthStart(e.m.Store.Now()).Format("2006-01")
	fill := func(path, team string) string {
		return paramRE.ReplaceAllStringFunc(path, func(p string) string {
			switch p {
			case ":team":
				return team
			case ":id":
				if strings.Contains(path, "/tokens/") {
					return fmt.Sprint(spare.ID)
				}
				return fmt.Sprint(jobID)
			case ":month":
				return month
			case ":tier":
				return "3"
			case ":gpu_type":
				return "T4"
			case ":name", ":node":
				return "gpu01"
			case ":user": // nobody: an admin's disable/enable is a 404, no persona is locked out
				return "nobody@example.com"
			case "*":
				if strings.HasPrefix(path, static.Prefix) {
					return "pico.min.css"
				}
				return "no-such-thing"
			}
			t.Fatalf("route %s: the matrix does not know what to put for %s: add it", path, p)
			return ""
		})
	}

	// Reading first, then changes, deletions after those, and logout
	// last, so no request undoes what a later one needs.
	order := func(r web.RouteAccess) int {
		switch {
		case r.Path == "/logout":
			return 4
		case r.Method == http.MethodDelete:
			return 3
		case r.Method == http.MethodGet || r.Method == "*":
			return 1
		}
		return 2
	}
	slices.SortStableFunc(routes, func(a, b web.RouteAccess) int { return order(a) - order(b) })

	clients := map[string]*matrixClient{}
	for _, p := range matrixPersonas {
		clients[p] = newMatrixClient(t, e, p)
	}
	name := func(p string) string {
		if p == anonymous {
			return "anonymous"
		}
		return p
	}
	checked := 0
	for _, r := range routes {
		want, ok := expected[r.Rule.Name]
		if !ok {
			t.Errorf("%s %s: rule %q has no row in the expected table: add one", r.Method, r.Path, r.Rule.Name)
			continue
		}
		method := r.Method
		if method == "*" {
			method = http.MethodGet
		}
		teams := map[string]map[string]bool{"": want.own}
		if strings.Contains(r.Path, ":team") {
			other := want.other
			if other == nil {
				other = want.own
			}
			teams = map[string]map[string]bool{"nlp": want.own, "fraud": other}
		}
		for _, p := range matrixPersonas {
			for team, allowed := range teams {
				path := fill(r.Path, team)
				status, loc, body := clients[p].send(t, e.url, method, path)
				checked++
				denied := status == http.StatusUnauthorized || status == http.StatusForbidden ||
					(status == http.StatusSeeOther && strings.HasPrefix(loc, "/login?next="))
				switch {
				case status >= 500:
					t.Errorf("%s %s as %s (rule %s): %d %s", method, path, name(p), r.Rule.Name, status, body)
				case allowed[p] && denied:
					t.Errorf("%s %s as %s (rule %s): denied with %d, want allowed\n%s", method, path, name(p), r.Rule.Name, status, body)
				case !allowed[p] && !denied:
					t.Errorf("%s %s as %s (rule %s): allowed with %d, want denied", method, path, name(p), r.Rule.Name, status)
				case !allowed[p] && p == anonymous && method == http.MethodGet && !strings.HasPrefix(path, "/api/") && r.Rule.Name != "node" && r.Rule.Name != "metrics" &&
					(status != http.StatusSeeOther || loc != "/login?next="+url.QueryEscape(path)):
					t.Errorf("GET %s anonymously: %d → %q, want a redirect to the login page", path, status, loc)
				}
			}
		}
	}
	t.Logf("%d routes, %d requests", len(routes), checked)
}

// TestFormsNeedCSRF: a logged-in form POST without the CSRF token (or with
// another one) is refused with 403 and changes nothing.
func TestFormsNeedCSRF(t *testing.T) {
	e := boot(t)
	br := e.login(demo.Engineer)
	jobs, tokens := e.jobCount(), e.tokenCount()
	form := url.Values{"team": {"nlp"}, "tier": {"3"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"python train.py"}}
	for _, csrf := range []string{"", "forged-token-value"} {
		for path, v := range map[string]url.Values{"/jobs": form, "/tokens": {"name": {"csrf"}}} {
			v := url.Values(v)
			if csrf != "" {
				v.Set("_csrf", csrf)
			} else {
				v.Del("_csrf")
			}
			resp, err := br.c.PostForm(e.url+path, v)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "reload the page") {
				t.Errorf("POST %s with CSRF %q: %d, want 403", path, csrf, resp.StatusCode)
			}
		}
	}
	if e.jobCount() != jobs || e.tokenCount() != tokens {
		t.Errorf("a POST without a valid CSRF token changed something: jobs %d → %d, tokens %d → %d", jobs, e.jobCount(), tokens, e.tokenCount())
	}
	// With the token the same form works.
	_, page := br.get("/tokens")
	if status, _ := br.post("/tokens", page, url.Values{"name": {"csrf"}}); status != http.StatusCreated || e.tokenCount() != tokens+1 {
		t.Errorf("POST /tokens with the CSRF token: %d", status)
	}
}
