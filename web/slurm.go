package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/slurmpolicy"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// Allot on Slurm: the configuration rendered from the live policy
// (internal/slurmpolicy), its diff against what a configured cluster runs,
// and the sync that applies the diff with sacctmgr (audited as
// slurm.sync). Config.SlurmEnv names the cluster (nil: none).

// slurmReadTimeout bounds one read or sync of the cluster's accounting.
const slurmReadTimeout = 30 * time.Second

// slurmRender renders the live policy. users false leaves the accounts'
// users out (for /docs).
func (s *Server) slurmRender(ctx context.Context, users bool) (slurmpolicy.Input, slurmpolicy.Rendered, error) {
	in, err := s.st.SlurmPolicyInput(ctx)
	if err != nil {
		return in, slurmpolicy.Rendered{}, err
	}
	in.OverBudgetFile = s.cfg.SlurmOverBudgetFile
	if s.slurmConfigured() {
		in.ClusterName = slurmpolicy.ClusterName(s.cfg.SlurmEnv)
	}
	if !users {
		in.Members = nil
		for i := range in.Teams {
			in.Teams[i].PosixAccount = ""
		}
	}
	return in, slurmpolicy.Render(in), nil
}

func slurmFiles(in slurmpolicy.Input, r slurmpolicy.Rendered) views.SlurmFiles {
	f := views.SlurmFiles{PolicyVersion: in.Policy.Version, SlurmConf: r.SlurmConf, Sacctmgr: r.Sacctmgr, JobSubmitLua: r.JobSubmitLua,
		OverBudgetList: r.OverBudgetList, OverBudgetFile: in.OverBudgetFile, OverBudget: in.OverBudget}
	if f.OverBudgetFile == "" {
		f.OverBudgetFile = slurmpolicy.DefaultOverBudgetFile
	}
	return f
}

// slurmDocs is the /docs section: the files without the accounts' users.
func (s *Server) slurmDocs(ctx context.Context) (views.SlurmFiles, error) {
	in, r, err := s.slurmRender(ctx, false)
	if err != nil {
		return views.SlurmFiles{}, err
	}
	f := slurmFiles(in, r)
	f.NoUsers = true
	return f, nil
}

func (s *Server) slurmConfigured() bool { return len(s.cfg.SlurmEnv) > 0 }

// slurmDiff reads the cluster and diffs it against r.
func (s *Server) slurmDiff(ctx context.Context, r slurmpolicy.Rendered) ([]slurmpolicy.Change, error) {
	ctx, cancel := context.WithTimeout(ctx, slurmReadTimeout)
	defer cancel()
	actual, err := slurmpolicy.ReadClusterState(ctx, s.cfg.SlurmEnv)
	if err != nil {
		return nil, err
	}
	return slurmpolicy.Diff(r.Desired, actual), nil
}

func viewChanges(cs []slurmpolicy.Change) []views.SlurmChange {
	out := make([]views.SlurmChange, len(cs))
	for i, c := range cs {
		out[i] = views.SlurmChange{Text: c.Text, Command: c.Command()}
	}
	return out
}

// ---- Portal: /admin/slurm

func (s *Server) adminSlurmPage(c echo.Context) error {
	a := views.AdminSlurm{}
	if n := c.QueryParam("synced"); n != "" {
		a.Saved = "Synced: applied " + n + " " + map[bool]string{true: "change", false: "changes"}[n == "1"] + " to the cluster."
	}
	return s.renderSlurm(c, http.StatusOK, a)
}

// renderSlurm shows the page: the files and, with a cluster, its diff.
func (s *Server) renderSlurm(c echo.Context, status int, a views.AdminSlurm) error {
	ctx := c.Request().Context()
	in, r, err := s.slurmRender(ctx, true)
	if err != nil {
		return err
	}
	a.Page = s.page(c, "Slurm · Admin")
	a.Files = slurmFiles(in, r)
	a.Configured = s.slurmConfigured()
	if a.Configured {
		// Only Slurm's own variables: the process environment holds secrets.
		var env []string
		for _, kv := range s.cfg.SlurmEnv {
			if strings.HasPrefix(kv, "SLURM_") {
				env = append(env, kv)
			}
		}
		a.Env = strings.Join(env, " ")
		changes, err := s.slurmDiff(ctx, r)
		if err != nil {
			a.ReadError = err.Error()
		}
		a.Changes = viewChanges(changes)
	}
	sync, err := s.st.EngineSync(ctx)
	if err != nil {
		return err
	}
	a.Sync = engineSyncView(sync)
	return render(c, status, views.AdminSlurmView(a))
}

// engineSyncView is the worker's last word from Slurm ("" fields: never).
func engineSyncView(st store.EngineSyncState) views.SlurmSyncState {
	v := views.SlurmSyncState{Cluster: st.Cluster, Version: st.Version, LastOK: fmtTime(st.LastOK), LastError: st.LastError,
		Cursor: fmtTime(st.Cursor), Runs: strconv.FormatInt(st.RunsImported, 10), Jobs: strconv.FormatInt(st.JobsImported, 10)}
	if !st.DownSince.IsZero() {
		v.DownSince = fmtTime(st.DownSince)
	}
	for what, n := range st.Unmapped {
		v.Unmapped = append(v.Unmapped, fmt.Sprintf("%d × %s", n, what))
	}
	sort.Strings(v.Unmapped)
	return v
}

// slurmSyncAudit is what a sync's audit entry records.
type slurmSyncAudit struct {
	Changes []string `json:"changes"`
	Applied int      `json:"applied"`
	Error   string   `json:"error,omitempty"`
}

// slurmSync reads the cluster, applies the diff and audits it (when there
// was anything to apply). It returns the changes it found and the error
// of the first that failed.
func (s *Server) slurmSync(ctx context.Context, actor string) ([]slurmpolicy.Change, error) {
	if !s.slurmConfigured() {
		return nil, allot.Errorf(allot.EConflict, "no Slurm cluster configured: nothing to sync")
	}
	in, r, err := s.slurmRender(ctx, true)
	if err != nil {
		return nil, err
	}
	changes, err := s.slurmDiff(ctx, r)
	if err != nil {
		return nil, slurmError{fmt.Errorf("reading the cluster: %w", err)}
	}
	if len(changes) == 0 {
		return nil, nil
	}
	actx, cancel := context.WithTimeout(ctx, slurmReadTimeout+time.Duration(len(changes))*5*time.Second)
	defer cancel()
	applyErr := slurmpolicy.Apply(actx, s.cfg.SlurmEnv, changes)
	// What was applied, from a fresh read (Apply stops at the first failure).
	rec := slurmSyncAudit{Applied: len(changes)}
	for _, c := range changes {
		rec.Changes = append(rec.Changes, c.Text)
	}
	if applyErr != nil {
		rec.Error = applyErr.Error()
		if left, err := s.slurmDiff(ctx, r); err == nil {
			rec.Applied = max(0, len(changes)-len(left))
		} else {
			rec.Applied = 0
		}
	}
	after, _ := json.Marshal(rec)
	note := fmt.Sprintf("policy version %d: %d of %d changes applied", in.Policy.Version, rec.Applied, len(changes))
	if err := s.st.Audit(ctx, &allot.AuditEntry{Actor: actor, Action: "slurm.sync", Object: "slurm:accounts", After: after, Note: note}); err != nil {
		return changes, err
	}
	if applyErr != nil {
		return changes, slurmError{applyErr}
	}
	return changes, nil
}

// slurmError is the cluster's failure (sacctmgr), not Allot's.
type slurmError struct{ error }

func (e slurmError) Unwrap() error { return e.error }

// adminSlurmSyncForm applies the diff from the page.
func (s *Server) adminSlurmSyncForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	changes, err := s.slurmSync(c.Request().Context(), u.Email)
	var se slurmError
	switch {
	case err == nil:
		return redirect(c, "/admin/slurm?synced="+strconv.Itoa(len(changes)))
	case allot.ErrorCode(err) == allot.EConflict:
		return s.renderSlurm(c, http.StatusConflict, views.AdminSlurm{SyncError: "No Slurm cluster configured: nothing to sync."})
	case errors.As(err, &se):
		return s.renderSlurm(c, http.StatusBadGateway, views.AdminSlurm{SyncError: "The sync failed: " + err.Error()})
	}
	return err
}

// ---- API

// SlurmConfigJSON is the body of GET /api/v1/slurm/config.
type SlurmConfigJSON struct {
	PolicyVersion  int64    `json:"policy_version"`
	SlurmConf      string   `json:"slurm_conf"`
	Sacctmgr       string   `json:"sacctmgr"`
	JobSubmitLua   string   `json:"job_submit_lua"`
	OverBudgetList string   `json:"over_budget_list"`
	OverBudgetFile string   `json:"over_budget_file"`
	OverBudget     []string `json:"over_budget"`
	// Cluster is whether a Slurm cluster is configured; Changes (with
	// one) the diff against what it runs, ReadError why it could not be
	// read.
	Cluster   bool              `json:"cluster"`
	Changes   []SlurmChangeJSON `json:"changes"`
	ReadError string            `json:"read_error,omitempty"`
}

// SlurmChangeJSON is one difference and the command that fixes it.
type SlurmChangeJSON struct {
	Object  string   `json:"object"`
	Text    string   `json:"text"`
	Command string   `json:"command"`
	Args    []string `json:"args"`
}

func (s *Server) apiSlurmConfig(c echo.Context) error {
	ctx := c.Request().Context()
	in, r, err := s.slurmRender(ctx, true)
	if err != nil {
		return err
	}
	f := slurmFiles(in, r)
	out := SlurmConfigJSON{PolicyVersion: f.PolicyVersion, SlurmConf: f.SlurmConf, Sacctmgr: f.Sacctmgr, JobSubmitLua: f.JobSubmitLua,
		OverBudgetList: f.OverBudgetList, OverBudgetFile: f.OverBudgetFile, OverBudget: f.OverBudget,
		Cluster: s.slurmConfigured(), Changes: []SlurmChangeJSON{}}
	if out.Cluster {
		changes, err := s.slurmDiff(ctx, r)
		if err != nil {
			out.ReadError = err.Error()
		}
		for _, ch := range changes {
			out.Changes = append(out.Changes, SlurmChangeJSON{Object: ch.Object, Text: ch.Text, Command: ch.Command(), Args: ch.Args})
		}
	}
	return writeJSON(c, http.StatusOK, out)
}

// overBudgetList is the over-budget file's content, as text/plain.
func overBudgetList(c echo.Context, st *store.Store) error {
	ctx := c.Request().Context()
	p, err := st.CurrentPolicy(ctx)
	if err != nil {
		return err
	}
	over, err := st.OverBudgetTeams(ctx)
	if err != nil {
		return err
	}
	r := slurmpolicy.Render(slurmpolicy.Input{Policy: p, OverBudget: over})
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return c.Blob(http.StatusOK, echo.MIMETextPlainCharsetUTF8, []byte(r.OverBudgetList))
}

// apiSlurmOverBudget is GET /api/v1/slurm/over-budget (admin token).
func (s *Server) apiSlurmOverBudget(c echo.Context) error { return overBudgetList(c, s.st) }

// agentSlurmOverBudget is GET /api/agent/v1/slurm/over-budget (a node
// token): what a Slurm controller host fetches to keep the file current.
func (s *Server) agentSlurmOverBudget(c echo.Context) error {
	if _, err := s.agentNode(c); err != nil {
		return err
	}
	return overBudgetList(c, s.agentSt)
}
