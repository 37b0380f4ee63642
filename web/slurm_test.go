package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/slurmtest"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/allotlabs/allot/web"
)

// slurmRig is the portal over the demo organisation, with or without a
// Slurm cluster.
type slurmRig struct {
	t      *testing.T
	st     *store.Store
	url    string
	tokens map[string]string // persona email → API token
}

func newSlurmRig(t *testing.T, env []string) *slurmRig {
	t.Helper()
	pool := storetest.Pool(t)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC) // the store's business clock
	st.Now = func() time.Time { return now }
	ctx := context.Background()
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	r := &slurmRig{t: t, st: st, tokens: map[string]string{}}
	for _, email := range []string{"ada@example.com", "noah@example.com"} {
		u, err := st.UserByEmail(ctx, email)
		if err != nil {
			t.Fatal(err)
		}
		tok, _, err := st.CreateAPIToken(ctx, u.ID, "test")
		if err != nil {
			t.Fatal(err)
		}
		r.tokens[email] = tok
	}
	srv := web.New(web.Config{Store: st, Logger: slog.New(slog.DiscardHandler), DevMode: true, SlurmEnv: env,
		SlurmOverBudgetFile: "/etc/slurm/allot-over-budget"})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	r.url = hs.URL
	return r
}

// browser is a logged-in persona with its cookies and CSRF token.
type browser struct {
	r    *slurmRig
	c    *http.Client
	csrf string
}

func (r *slurmRig) login(persona string) *browser {
	r.t.Helper()
	jar, _ := cookiejar.New(nil)
	b := &browser{r: r, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	b.get("/login")
	for _, ck := range jar.Cookies(mustParse(r.t, r.url)) {
		if ck.Name == "_csrf" {
			b.csrf = ck.Value
		}
	}
	if st, _ := b.post("/login/dev", url.Values{"persona": {persona}}); st != http.StatusSeeOther {
		r.t.Fatalf("dev login as %s: %d", persona, st)
	}
	return b
}

func mustParse(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func (b *browser) get(path string) (int, string) {
	b.r.t.Helper()
	resp, err := b.c.Get(b.r.url + path)
	if err != nil {
		b.r.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (b *browser) post(path string, v url.Values) (int, string) {
	b.r.t.Helper()
	v.Set("_csrf", b.csrf)
	resp, err := b.c.PostForm(b.r.url+path, v)
	if err != nil {
		b.r.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if loc := resp.Header.Get("Location"); loc != "" {
		return resp.StatusCode, loc
	}
	return resp.StatusCode, string(body)
}

// api calls the API with a bearer token.
func (r *slurmRig) api(path, token string) (int, string, string) {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

// TestSlurmAdminPageWithoutCluster: without a cluster the page shows the
// rendered files and says there is no cluster; sync is refused with that
// reason; only admins reach page and API; the over-budget list serves node
// tokens and admins; /docs shows the files without the accounts' users.
func TestSlurmAdminPageWithoutCluster(t *testing.T) {
	t.Parallel()
	r := newSlurmRig(t, nil)
	admin := r.login("admin")
	st, page := admin.get("/admin/slurm")
	if st != http.StatusOK {
		t.Fatalf("GET /admin/slurm as admin: %d\n%s", st, page)
	}
	for _, want := range []string{`data-testid="slurm-no-cluster"`, "PriorityWeightQOS=", "PreemptType=preempt/qos", "JobSubmitPlugins=lua",
		"modify qos where name=allot-t1 set Priority=5", "add user noah Account=nlp", "local OVER_BUDGET_FILE = &#34;/etc/slurm/allot-over-budget&#34;",
		`data-testid="tab-slurm"`, "Sync accounts and QOS"} {
		if want == "Sync accounts and QOS" {
			if strings.Contains(page, want) {
				t.Errorf("the page offers a sync without a cluster")
			}
			continue
		}
		if !strings.Contains(page, want) {
			t.Errorf("/admin/slurm lacks %q", want)
		}
	}
	if st, body := admin.post("/admin/slurm/sync", url.Values{}); st != http.StatusConflict || !strings.Contains(body, "No Slurm cluster configured: nothing to sync.") {
		t.Errorf("sync without a cluster: %d\n%s", st, body)
	}
	// A form without the CSRF token is refused.
	resp, err := admin.c.PostForm(r.url+"/admin/slurm/sync", url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("sync without the CSRF token: %d, want 403", resp.StatusCode)
	}
	engineer := r.login("engineer")
	if st, _ := engineer.get("/admin/slurm"); st != http.StatusForbidden {
		t.Errorf("GET /admin/slurm as an engineer: %d, want 403", st)
	}

	// API.
	st, ct, body := r.api("/api/v1/slurm/config", r.tokens["ada@example.com"])
	var cfg web.SlurmConfigJSON
	if st != http.StatusOK || !strings.HasPrefix(ct, "application/json") || json.Unmarshal([]byte(body), &cfg) != nil {
		t.Fatalf("GET /api/v1/slurm/config: %d %s\n%s", st, ct, body)
	}
	if cfg.Cluster || len(cfg.Changes) != 0 || !strings.Contains(cfg.SlurmConf, "PriorityType=priority/multifactor") ||
		!strings.Contains(cfg.JobSubmitLua, "slurm_job_submit") || !strings.Contains(cfg.Sacctmgr, "add qos allot-preemptible") ||
		cfg.OverBudgetFile != "/etc/slurm/allot-over-budget" {
		t.Errorf("config: %+v", cfg)
	}
	if st, _, _ := r.api("/api/v1/slurm/config", r.tokens["noah@example.com"]); st != http.StatusForbidden {
		t.Errorf("GET /api/v1/slurm/config as an engineer: %d, want 403", st)
	}
	st, ct, list := r.api("/api/v1/slurm/over-budget", r.tokens["ada@example.com"])
	if st != http.StatusOK || !strings.HasPrefix(ct, "text/plain") || !strings.HasPrefix(list, "# ") {
		t.Errorf("GET /api/v1/slurm/over-budget: %d %s\n%s", st, ct, list)
	}
	over, err := r.st.OverBudgetTeams(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, l := range strings.Split(list, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			listed = append(listed, l)
		}
	}
	if strings.Join(listed, ",") != strings.Join(over, ",") {
		t.Errorf("list %q, over-budget teams %q", listed, over)
	}
	nodeTok, err := r.st.CreateNodeToken(context.Background(), "gpu01", "ada@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if st, _, body := r.api("/api/agent/v1/slurm/over-budget", nodeTok); st != http.StatusOK || body != list {
		t.Errorf("GET /api/agent/v1/slurm/over-budget with a node token: %d\n%s", st, body)
	}
	if st, _, _ := r.api("/api/agent/v1/slurm/over-budget", r.tokens["ada@example.com"]); st != http.StatusUnauthorized {
		t.Errorf("the agent route with an admin's token: %d, want 401", st)
	}
	if st, _, _ := r.api("/api/v1/slurm/over-budget", nodeTok); st != http.StatusUnauthorized {
		t.Errorf("the admin route with a node token: %d, want 401", st)
	}

	// /docs, for everyone, without who is in which account.
	st, docs := engineer.get("/docs")
	if st != http.StatusOK || !strings.Contains(docs, "Allot on Slurm: the generated configuration") || !strings.Contains(docs, "PriorityWeightQOS=") ||
		!strings.Contains(docs, "modify account where name=nlp set Fairshare=2") {
		t.Fatalf("/docs lacks the Slurm section: %d", st)
	}
	if strings.Contains(docs, "add user noah") || strings.Contains(docs, "svc-nlp") {
		t.Errorf("/docs shows the accounts' users")
	}
}

// TestSlurmAdminPageSync: with a real cluster the page shows the diff,
// the sync button applies it (audited), the page then says the cluster
// matches; a changed team weight shows as one difference.
func TestSlurmAdminPageSync(t *testing.T) {
	t.Parallel()
	if ok, why := slurmtest.Available(); !ok {
		t.Skip(why)
	}
	c := slurmtest.Start(t, slurmtest.Options{Nodes: 1, GPUsPerNode: 1, NoRest: true})
	r := newSlurmRig(t, c.Env())
	admin := r.login("admin")
	st, page := admin.get("/admin/slurm")
	if st != http.StatusOK || !strings.Contains(page, `data-testid="slurm-diff"`) || !strings.Contains(page, "qos allot-t1: missing, add it") ||
		!strings.Contains(page, "account nlp: add user noah") || !strings.Contains(page, `data-testid="slurm-sync"`) {
		t.Fatalf("GET /admin/slurm with a fresh cluster: %d\n%s", st, page)
	}
	if !strings.Contains(page, "for cluster "+c.Name) {
		t.Errorf("the rendered files do not name the cluster %s", c.Name)
	}
	st, loc := admin.post("/admin/slurm/sync", url.Values{})
	if st != http.StatusSeeOther || !strings.HasPrefix(loc, "/admin/slurm?synced=") {
		t.Fatalf("sync: %d %s", st, loc)
	}
	_, page = admin.get(loc)
	if !strings.Contains(page, `data-testid="slurm-in-sync"`) || !strings.Contains(page, "Synced: applied") {
		t.Errorf("after the sync the page does not say the cluster matches:\n%s", page)
	}
	entries, err := r.st.AuditLog(context.Background(), store.AuditFilter{Action: "slurm.sync"})
	if err != nil || len(entries) != 1 || entries[0].Actor != "ada@example.com" || !strings.Contains(string(entries[0].After), "account nlp: add user noah") {
		t.Errorf("audit of the sync: %+v %v", entries, err)
	}
	// A weight changes in Allot: one difference, with its command.
	if _, err := r.st.UpdateTeamPolicy(context.Background(), store.PolicyChange{Actor: "ada@example.com", Action: "team.update", Object: "team:nlp"}, "nlp",
		func(tm *allot.Team, _ *string) { tm.FairShareWeight = 5 }); err != nil {
		t.Fatal(err)
	}
	st, ct, body := r.api("/api/v1/slurm/config", r.tokens["ada@example.com"])
	var cfg web.SlurmConfigJSON
	if st != http.StatusOK || json.Unmarshal([]byte(body), &cfg) != nil {
		t.Fatalf("GET /api/v1/slurm/config: %d %s\n%s", st, ct, body)
	}
	if !cfg.Cluster || len(cfg.Changes) != 1 || cfg.Changes[0].Text != "account nlp: fairshare 2 → 5" ||
		cfg.Changes[0].Command != "sacctmgr -i modify account where name=nlp set Fairshare=5" {
		t.Errorf("after nlp's weight 2 → 5, changes %+v (read error %q)", cfg.Changes, cfg.ReadError)
	}
	if st, loc := admin.post("/admin/slurm/sync", url.Values{}); st != http.StatusSeeOther || loc != "/admin/slurm?synced=1" {
		t.Errorf("second sync: %d %s", st, loc)
	}
	if _, page := admin.get("/admin/slurm"); !strings.Contains(page, `data-testid="slurm-in-sync"`) {
		t.Errorf("after the second sync the cluster does not match")
	}
	// slurmdbd down: the page says so, soon.
	c.StopDBD(t)
	start := time.Now() // stopwatch
	st, page = admin.get("/admin/slurm")
	took := time.Since(start)
	t.Logf("with slurmdbd down the page answered in %v", took.Round(time.Millisecond))
	if st != http.StatusOK || !strings.Contains(page, `data-testid="slurm-read-error"`) || took > 20*time.Second {
		t.Errorf("GET /admin/slurm with slurmdbd down: %d after %v\n%s", st, took, page)
	}
	c.StartDBD(t)
}

// TestSlurmAdminPageBrokenCluster: a cluster that cannot be read is said
// so on the page at once (the files still shown), and a sync fails with
// the reason and writes no audit entry.
func TestSlurmAdminPageBrokenCluster(t *testing.T) {
	t.Parallel()
	// The process environment the server hands sacctmgr holds secrets:
	// the page shows only Slurm's variables.
	r := newSlurmRig(t, []string{"DATABASE_URL=postgres://allot:hunter2@db/allot", "SLURM_CONF=/nonexistent/slurm.conf"})
	// The worker's last sync failed: the page says since when and why.
	if err := r.st.RecordEngineSync(context.Background(), "http://slurmctl:6820", "v0.0.38", errors.New("slurmrestd at http://slurmctl:6820 is not reachable: connection refused"), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	admin := r.login("admin")
	start := time.Now() // stopwatch: sacctmgr itself would retry for a minute
	st, page := admin.get("/admin/slurm")
	if st != http.StatusOK || !strings.Contains(page, `data-testid="slurm-read-error"`) || !strings.Contains(page, "SLURM_CONF=/nonexistent/slurm.conf") ||
		!strings.Contains(page, "PriorityWeightQOS=") {
		t.Errorf("GET /admin/slurm with a broken cluster: %d\n%s", st, page)
	}
	if strings.Contains(page, "hunter2") {
		t.Errorf("the admin page shows the server's environment")
	}
	if !strings.Contains(page, `data-testid="slurm-down"`) || !strings.Contains(page, "is not reachable: connection refused") {
		t.Errorf("the page does not say the worker cannot reach Slurm:\n%s", page)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the page took %v", d)
	}
	if st, body := admin.post("/admin/slurm/sync", url.Values{}); st != http.StatusBadGateway || !strings.Contains(body, "The sync failed: reading the cluster: SLURM_CONF=/nonexistent/slurm.conf") {
		t.Errorf("sync with a broken cluster: %d\n%s", st, body)
	}
	if entries, err := r.st.AuditLog(context.Background(), store.AuditFilter{Action: "slurm.sync"}); err != nil || len(entries) != 0 {
		t.Errorf("a failed read was audited: %+v %v", entries, err)
	}
	st, _, body := r.api("/api/v1/slurm/config", r.tokens["ada@example.com"])
	var cfg web.SlurmConfigJSON
	if st != http.StatusOK || json.Unmarshal([]byte(body), &cfg) != nil || !cfg.Cluster || !strings.Contains(cfg.ReadError, "no such file") {
		t.Errorf("GET /api/v1/slurm/config with a broken cluster: %d %+v", st, cfg)
	}
}
