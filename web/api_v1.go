package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/labstack/echo/v4"
)

// JobJSON is a job as the API shows it (snake_case, RFC 3339 times).
type JobJSON struct {
	ID                int64                   `json:"id"`
	Name              string                  `json:"name"`
	Team              string                  `json:"team"`
	User              string                  `json:"user"`
	Tier              string                  `json:"tier"`
	GPUs              int                     `json:"gpus"`
	GPUType           *string                 `json:"gpu_type"`
	GPUsPerNode       *int                    `json:"gpus_per_node"`
	TimeLimitS        int64                   `json:"time_limit_s"`
	Command           []string                `json:"command"`
	Env               map[string]string       `json:"env"`
	WorkDir           string                  `json:"workdir"`
	Checkpointable    bool                    `json:"checkpointable"`
	Preemptible       bool                    `json:"preemptible"`
	Demoted           bool                    `json:"demoted"`
	State             string                  `json:"state"`
	SubmittedAt       time.Time               `json:"submitted_at"`
	StartedAt         *time.Time              `json:"started_at"`
	EndedAt           *time.Time              `json:"ended_at"`
	ExitCode          *int                    `json:"exit_code"`
	PendingReason     string                  `json:"pending_reason"`
	Priority          float64                 `json:"priority"`
	PriorityBreakdown allot.PriorityBreakdown `json:"priority_breakdown"`
	QuotaWarning      string                  `json:"quota_warning"`
	RunAs             string                  `json:"run_as"`
	Segment           int                     `json:"segment"`
	Preemptions       int                     `json:"preemptions"`
	EndReason         string                  `json:"end_reason"`
	// RunAsUser is the POSIX account the job runs as on its nodes ("" for
	// jobs from before accounts: the agent's default job user).
	RunAsUser string `json:"run_as_user"`
	// Backend is the engine that runs it: native (Allot's agents) or
	// slurm (its GPU type's; the job page has Slurm's side).
	Backend string `json:"backend"`
	// EnvRedacted says env's values are hidden from the caller ("***"):
	// only the submitter, the team's leads and admins see them.
	EnvRedacted bool `json:"env_redacted"`
	// SecretEnv names the secret variables; their values are never shown
	// ("***").
	SecretEnv   map[string]string `json:"secret_env"`
	Image       string            `json:"image"`
	MemoryBytes int64             `json:"memory_bytes"` // 0 = the node's default
	CPUs        float64           `json:"cpus"`         // 0 = the node's default
	MilliCPUs   int64             `json:"milli_cpus"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func toJSON(j *allot.Job) JobJSON {
	out := JobJSON{ID: j.ID, Name: j.Name, Team: j.Team, User: j.User, Tier: string(j.Tier), GPUs: j.GPUs,
		TimeLimitS: int64(j.TimeLimit / time.Second), Command: j.Command, Env: j.Env, WorkDir: j.WorkDir,
		Checkpointable: j.Checkpointable, Preemptible: j.Preemptible, Demoted: j.Demoted, State: string(j.State),
		SubmittedAt: j.SubmittedAt.UTC(), StartedAt: timePtr(j.StartedAt), EndedAt: timePtr(j.EndedAt), ExitCode: j.ExitCode,
		PendingReason: j.PendingReason, Priority: j.Priority, PriorityBreakdown: j.Breakdown, QuotaWarning: quotaWarning(j),
		RunAs: string(j.RunAs), Segment: j.Segment, Preemptions: j.Preemptions, EndReason: j.EndReason,
		RunAsUser: j.RunAsUser, Backend: j.Backend, EnvRedacted: j.EnvRedacted, SecretEnv: map[string]string{}, Image: j.Image, MemoryBytes: j.MemoryBytes,
		CPUs: float64(j.MilliCPUs) / 1000, MilliCPUs: j.MilliCPUs}
	for _, k := range j.SecretEnvKeys {
		out.SecretEnv[k] = allot.Redacted
	}
	if j.GPUType != "" {
		out.GPUType = &j.GPUType
	}
	if j.GPUsPerNode > 0 {
		out.GPUsPerNode = &j.GPUsPerNode
	}
	if out.Env == nil {
		out.Env = map[string]string{}
	}
	return out
}

// JobRequest is the body of POST /api/v1/jobs. tier may be a number or a
// string; the time limit is time_limit_s (seconds) or time_limit ("4h").
type JobRequest struct {
	Name           string            `json:"name"`
	Team           string            `json:"team"`
	Tier           json.RawMessage   `json:"tier"`
	GPUs           *int              `json:"gpus"`
	GPUType        string            `json:"gpu_type"`
	GPUsPerNode    int               `json:"gpus_per_node"`
	TimeLimitS     *int64            `json:"time_limit_s"`
	TimeLimit      string            `json:"time_limit"`
	Command        []string          `json:"command"`
	Env            map[string]string `json:"env"`
	WorkDir        string            `json:"workdir"`
	Checkpointable bool              `json:"checkpointable"`
	Preemptible    bool              `json:"preemptible"`
	// SecretEnv is passed to the job like env but never shown after
	// submission (to anyone: its values read "***").
	SecretEnv map[string]string `json:"secret_env"`
	// Image is an OCI image reference to run the command in.
	Image string `json:"image"`
	// Memory per node: memory_bytes, or memory as a size ("64GiB").
	MemoryBytes *int64 `json:"memory_bytes"`
	Memory      string `json:"memory"`
	// CPUs per node, a number (4, 0.5) or a string ("0.5").
	CPUs json.RawMessage `json:"cpus"`
}

// readObject reads a body that must be one JSON object into v (a
// pointer to a struct). A field of the wrong type or an unknown field is a
// field error under its own (JSON) name, and every other field is still
// read into v, so one bad field does not make the others look missing. A
// body that is not an object is a field error under "body". Malformed JSON
// and an empty body are bad requests (the error).
func readObject(body io.Reader, v any) (allot.FieldErrors, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, &badRequest{"reading the request body: " + err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return nil, &badRequest{"request body is empty: send a JSON object"}
	case err != nil && !errors.As(err, &te) && !strings.HasPrefix(err.Error(), "json: unknown field "):
		return nil, &badRequest{"malformed JSON: " + err.Error()}
	}
	if _, terr := dec.Token(); terr != io.EOF {
		return nil, &badRequest{"malformed JSON: more than one value in the body"}
	}
	f := allot.FieldErrors{}
	if t := bytes.TrimSpace(b); t[0] != '{' {
		f.Add("body", "must be a JSON object ({\"field\": value, …}), not %s", jsonValueKind(t[0]))
		return f, nil
	}
	if err == nil {
		return f, nil
	}
	// Something is wrong: look at each field alone, then read what fits.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, &badRequest{"malformed JSON: " + err.Error()}
	}
	typ := reflect.TypeOf(v).Elem()
	var wrong [][]int
	for k, raw := range fields {
		one, _ := json.Marshal(map[string]json.RawMessage{k: raw})
		d := json.NewDecoder(bytes.NewReader(one))
		d.DisallowUnknownFields()
		name, sf, known := jsonField(typ, k)
		err := d.Decode(reflect.New(typ).Interface())
		switch {
		case err == nil:
			continue
		case !known:
			f.Add(k, "unknown field")
			continue
		case errors.As(err, &te) && te.Field != "" && strings.HasPrefix(strings.ToLower(te.Field), strings.ToLower(name)+"."):
			f.Add(te.Field, "must be %s", jsonTypeName(te.Type, true))
		default:
			f.Add(name, "must be %s", jsonTypeName(sf.Type, true))
		}
		wrong = append(wrong, sf.Index)
	}
	// Read what fits; a wrongly typed field stays unset.
	_ = json.Unmarshal(b, v)
	for _, idx := range wrong {
		if fv, err := reflect.ValueOf(v).Elem().FieldByIndexErr(idx); err == nil {
			fv.SetZero()
		}
	}
	return f, nil
}

// jsonField finds the field of struct type t that JSON key k fills (as
// encoding/json does: the exact name first, else case-insensitively;
// embedded structs included) and returns its JSON name and the field, its
// Index the path from t.
func jsonField(t reflect.Type, k string) (string, reflect.StructField, bool) {
	var foldName string
	var fold reflect.StructField
	var walk func(t reflect.Type, path []int) (string, reflect.StructField, bool)
	walk = func(t reflect.Type, path []int) (string, reflect.StructField, bool) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		for i := 0; i < t.NumField(); i++ {
			sf := t.Field(i)
			sf.Index = append(slices.Clone(path), i)
			tag, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			if tag == "-" || !sf.IsExported() && !sf.Anonymous {
				continue
			}
			if et := sf.Type; sf.Anonymous && tag == "" && (et.Kind() == reflect.Struct || et.Kind() == reflect.Pointer && et.Elem().Kind() == reflect.Struct) {
				if n, f, ok := walk(et, sf.Index); ok {
					return n, f, true
				}
				continue
			}
			if tag == "" {
				tag = sf.Name
			}
			if tag == k {
				return tag, sf, true
			}
			if foldName == "" && strings.EqualFold(tag, k) {
				foldName, fold = tag, sf
			}
		}
		return "", reflect.StructField{}, false
	}
	if n, f, ok := walk(t, nil); ok {
		return n, f, true
	}
	if foldName != "" {
		return foldName, fold, true
	}
	return k, reflect.StructField{}, false
}

// jsonTypeName says in words what JSON a Go type takes: with an article
// ("a whole number", "a list of strings") or in the plural.
func jsonTypeName(t reflect.Type, article bool) string {
	name, plural := "a JSON value", "JSON values"
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == nil || t == reflect.TypeFor[json.RawMessage]():
	case t == reflect.TypeFor[time.Time]():
		name, plural = "an RFC 3339 time string", "RFC 3339 time strings"
	default:
		switch t.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			name, plural = "a whole number", "whole numbers"
		case reflect.Float32, reflect.Float64:
			name, plural = "a number", "numbers"
		case reflect.String:
			name, plural = "a string", "strings"
		case reflect.Bool:
			name, plural = "true or false", "true or false"
		case reflect.Slice, reflect.Array:
			name, plural = "a list of "+jsonTypeName(t.Elem(), false), "lists"
		case reflect.Map:
			name, plural = "an object of "+jsonTypeName(t.Elem(), false), "objects"
		case reflect.Struct:
			name, plural = "an object", "objects"
		}
	}
	if article {
		return name
	}
	return plural
}

// jsonValueKind names the kind of JSON value that starts with c.
func jsonValueKind(c byte) string {
	switch c {
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	return "a number"
}

// decodeJobRequest turns a request body into a spec; problems with single
// fields come back as field errors (the other fields are still read, so
// the domain's checks do not call them missing), malformed JSON as a bad
// request.
func decodeJobRequest(body io.Reader) (allot.JobSpec, error) {
	var r JobRequest
	f, err := readObject(body, &r)
	if err != nil {
		return allot.JobSpec{}, err
	}
	if _, bad := f["body"]; bad {
		return allot.JobSpec{}, f.Err()
	}
	spec := allot.JobSpec{Name: r.Name, Team: r.Team, GPUType: r.GPUType, GPUsPerNode: r.GPUsPerNode, Command: r.Command,
		Env: r.Env, WorkDir: r.WorkDir, Checkpointable: r.Checkpointable, Preemptible: r.Preemptible,
		SecretEnv: r.SecretEnv, Image: r.Image}
	switch {
	case r.MemoryBytes != nil && r.Memory != "":
		f.Add("memory", "give memory_bytes or memory, not both")
	case r.MemoryBytes != nil:
		spec.MemoryBytes = *r.MemoryBytes
	case r.Memory != "":
		b, err := allot.ParseMemory(r.Memory)
		if err != nil {
			f.Add("memory", "%v", err)
		}
		spec.MemoryBytes = b
	}
	if len(r.CPUs) > 0 && !bytes.Equal(r.CPUs, []byte("null")) {
		var str string
		if json.Unmarshal(r.CPUs, &str) != nil {
			var n json.Number
			if err := json.Unmarshal(r.CPUs, &n); err != nil {
				f.Add("cpus", "must be a number of CPUs, e.g. 4 or 0.5")
			}
			str = n.String()
		}
		if _, bad := f["cpus"]; !bad {
			m, err := allot.ParseCPUs(str)
			if err != nil {
				f.Add("cpus", "%v", err)
			}
			spec.MilliCPUs = m
		}
	}
	if r.GPUs != nil {
		spec.GPUs = *r.GPUs
	}
	if len(r.Tier) > 0 && !bytes.Equal(r.Tier, []byte("null")) {
		var s string
		if err := json.Unmarshal(r.Tier, &s); err != nil {
			var n json.Number
			if err := json.Unmarshal(r.Tier, &n); err != nil {
				f.Add("tier", "must be 1, 2, 3, 4 or \"preemptible\"")
			}
			s = n.String()
		}
		if t, ok := allot.ParseTier(s); ok {
			spec.Tier = t
		} else if _, bad := f["tier"]; !bad {
			spec.Tier = allot.TierID(s)
		}
	}
	switch {
	case r.TimeLimitS != nil && r.TimeLimit != "":
		f.Add("time_limit_s", "give time_limit_s or time_limit, not both")
	case r.TimeLimitS != nil:
		if *r.TimeLimitS < 1 {
			f.Add("time_limit_s", "must be positive")
		} else if *r.TimeLimitS > int64(365*24*time.Hour/time.Second) {
			f.Add("time_limit_s", "is too long")
		} else {
			spec.TimeLimit = time.Duration(*r.TimeLimitS) * time.Second
		}
	case r.TimeLimit != "":
		d, err := allot.ParseDuration(r.TimeLimit)
		if err != nil {
			f.Add("time_limit_s", "%v", err)
		}
		spec.TimeLimit = d
	}
	return spec, f.Err()
}

// submit is the one submission path behind the form and the API: parse
// errors are merged with the domain's so the user sees everything at once.
func (s *Server) submit(c echo.Context, u *allot.User, spec allot.JobSpec, parseErr error) (allot.Job, error) {
	if parseErr != nil {
		pf := allot.Fields(parseErr)
		if pf == nil {
			return allot.Job{}, parseErr
		}
		if _, err := s.st.QuotaPreview(c.Request().Context(), u, &spec); err != nil {
			for k, v := range allot.Fields(err) {
				pf.Add(k, "%s", v)
			}
		}
		return allot.Job{}, pf.Err()
	}
	j, err := s.st.SubmitJob(c.Request().Context(), u, spec)
	if err == nil {
		s.jobEvent(c.Request().Context())
	}
	j.RedactFor(u)
	return j, err
}

func (s *Server) apiSubmitJob(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	if ct := c.Request().Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return &badRequest{"Content-Type must be application/json"}
	}
	spec, perr := decodeJobRequest(c.Request().Body)
	if f := allot.Fields(perr); perr != nil && (f == nil || f["body"] != "") {
		return perr // not a job spec at all: nothing to check it against
	}
	j, err := s.submit(c, u, spec, perr)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", fmt.Sprintf("/api/v1/jobs/%d", j.ID))
	return writeJSON(c, http.StatusCreated, toJSON(&j))
}

// JobList is the body of GET /api/v1/jobs.
type JobList struct {
	Jobs       []JobJSON `json:"jobs"`
	NextBefore *int64    `json:"next_before"` // pass as ?before= for the next page
}

// parseJobFilter reads team, state, limit and before from the query.
func parseJobFilter(c echo.Context, u *allot.User) (store.JobFilter, error) {
	f := store.JobFilter{Teams: visibleTeams(u), Team: c.QueryParam("team")}
	errs := allot.FieldErrors{}
	// state: one state, or several (state=pending,running or state
	// repeated): jobs in any of them.
	var states []allot.JobState
	for _, v := range c.QueryParams()["state"] {
		for _, st := range strings.Split(v, ",") {
			if st = strings.TrimSpace(st); st == "" {
				continue
			}
			state, ok := allot.ParseJobState(st)
			switch {
			case st == "preempted" || st == "lost":
				errs.Add("state", "no job is ever %s: a preempted job, or one whose node stopped answering, goes back to pending (or fails, with end reason node_lost); its page shows each preemption and lost node", st)
			case !ok:
				errs.Add("state", "unknown state %q: use pending, running, completed, failed or cancelled", st)
			}
			if !slices.Contains(states, state) {
				states = append(states, state)
			}
		}
	}
	if len(states) == 1 {
		f.State = states[0]
	} else {
		f.States = states
	}
	if t := c.QueryParam("tier"); t != "" {
		tier, ok := allot.ParseTier(t)
		if !ok {
			errs.Add("tier", "must be 1, 2, 3, 4 or preemptible, not %q", t)
		}
		f.Tier = tier
	}
	f.NameContains = strings.TrimSpace(c.QueryParam("q"))
	if len(f.NameContains) > 128 {
		errs.Add("q", "must be at most 128 characters")
	}
	if mine := c.QueryParam("mine"); mine == "1" || mine == "true" {
		f.UserID = u.ID
	}
	// user: the submitter's email (several: user=a,b or user repeated);
	// "me" is the caller.
	if users := c.QueryParams()["user"]; len(users) == 1 && strings.TrimSpace(users[0]) == "me" {
		f.UserID = u.ID
	} else {
		for _, v := range users {
			for _, e := range strings.Split(v, ",") {
				switch e = strings.TrimSpace(e); {
				case e == "":
				case e == "me":
					f.UserEmails = append(f.UserEmails, u.Email)
				case len(e) > 254 || !strings.Contains(e, "@"):
					errs.Add("user", "must be a person's email (or me), not %q", e)
				default:
					f.UserEmails = append(f.UserEmails, e)
				}
			}
		}
	}
	for name, dst := range map[string]*int64{"before": &f.BeforeID} {
		if v := c.QueryParam(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				errs.Add(name, "must be a positive job id")
			}
			*dst = n
		}
	}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			errs.Add("limit", "must be between 1 and 1000")
		}
		f.Limit = n
	}
	return f, errs.Err()
}

// listJobs lists the jobs the caller may see that match the query.
func (s *Server) listJobs(c echo.Context) (*allot.User, store.JobFilter, []allot.Job, error) {
	u, err := currentUser(c)
	if err != nil {
		return nil, store.JobFilter{}, nil, err
	}
	f, err := parseJobFilter(c, u)
	if err != nil {
		return nil, f, nil, err
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	jobs, err := s.st.ListJobs(c.Request().Context(), f)
	for i := range jobs {
		jobs[i].RedactFor(u)
	}
	return u, f, jobs, err
}

func (s *Server) apiListJobs(c echo.Context) error {
	_, f, jobs, err := s.listJobs(c)
	if err != nil {
		return err
	}
	out := JobList{Jobs: make([]JobJSON, len(jobs))}
	for i := range jobs {
		out.Jobs[i] = toJSON(&jobs[i])
	}
	if len(jobs) == f.Limit {
		out.NextBefore = &jobs[len(jobs)-1].ID
	}
	return writeJSON(c, http.StatusOK, out)
}

// visibleJob returns the caller and the job named by :id if they may see it.
func (s *Server) visibleJob(c echo.Context) (*allot.User, allot.Job, error) {
	u, err := currentUser(c)
	if err != nil {
		return nil, allot.Job{}, err
	}
	j, err := s.loadJob(c, u)
	return u, j, err
}

// cancel cancels the job named by :id for the caller.
func (s *Server) cancel(c echo.Context) (allot.Job, error) {
	u, j, err := s.visibleJob(c)
	if err != nil {
		return j, err
	}
	j, err = s.st.CancelJob(c.Request().Context(), u, j.ID)
	if err == nil {
		s.jobEvent(c.Request().Context())
	}
	j.RedactFor(u)
	return j, err
}

// loadJob returns the job named by :id if u may see it.
func (s *Server) loadJob(c echo.Context, u *allot.User) (allot.Job, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id < 1 {
		return allot.Job{}, allot.Errorf(allot.ENotFound, "no job %q", c.Param("id"))
	}
	j, err := s.st.GetJob(c.Request().Context(), id)
	if err != nil {
		if allot.ErrorCode(err) == allot.ENotFound {
			return j, allot.Errorf(allot.ENotFound, "no job %d", id)
		}
		return j, err
	}
	if !canSee(u, &j) {
		return allot.Job{}, allot.Errorf(allot.ENotFound, "no job %d", id)
	}
	j.RedactFor(u)
	return j, nil
}

func (s *Server) apiGetJob(c echo.Context) error {
	u, j, err := s.visibleJob(c)
	if err != nil {
		return err
	}
	x, err := s.jobExplain(c, u, &j)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, jobDetailJSON(&j, x))
}

// JobLogJSON is the body of GET /api/v1/jobs/{id}/log.
type JobLogJSON struct {
	JobID int64    `json:"job_id"`
	Lines []string `json:"lines"`
}

func (s *Server) apiJobLog(c echo.Context) error {
	_, j, err := s.visibleJob(c)
	if err != nil {
		return err
	}
	lines, err := s.st.JobLog(c.Request().Context(), j.ID)
	if err != nil {
		return err
	}
	if lines == nil {
		lines = []string{}
	}
	return writeJSON(c, http.StatusOK, JobLogJSON{JobID: j.ID, Lines: lines})
}

func (s *Server) apiCancelJob(c echo.Context) error {
	j, err := s.cancel(c)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toJSON(&j))
}

// MeJSON is the body of GET /api/v1/me.
type MeJSON struct {
	ID      int64             `json:"id"`
	Email   string            `json:"email"`
	Name    string            `json:"name"`
	Admin   bool              `json:"admin"`
	Finance bool              `json:"finance"`
	Teams   map[string]string `json:"teams"` // team → role
}

func (s *Server) apiMe(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	me := MeJSON{ID: u.ID, Email: u.Email, Name: u.Name, Admin: u.Admin, Finance: u.Finance, Teams: map[string]string{}}
	for _, m := range u.Memberships {
		me.Teams[m.Team] = m.Role
	}
	return writeJSON(c, http.StatusOK, me)
}

func (s *Server) apiNotFound(c echo.Context) error {
	return allot.Errorf(allot.ENotFound, "no API endpoint %s %s", c.Request().Method, c.Request().URL.Path)
}
