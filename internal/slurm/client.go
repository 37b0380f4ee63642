package slurm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// adapter is one REST API version: request bodies and response shapes. Paths
// are the same pattern in every version ("/slurm/<v>/jobs").
type adapter interface {
	version() string
	submitBody(s JobSubmit) any
	updateBody(u JobUpdate) any
	// nodeUpdateBody: the body of POST /slurm/<v>/node/{name}, or ok=false
	// when the version has no node update (v0.0.38: scontrol instead).
	nodeUpdateBody(drain bool, reason string) (body any, ok bool)
	decodeJobs(b []byte) ([]Job, error)
	decodeNodes(b []byte) ([]Node, error)
	decodeRuns(b []byte) ([]Run, error)
	decodePing(b []byte) (Info, error)
}

var adapters = map[string]func() adapter{
	"v0.0.38": func() adapter { return v0038{} },
	"v0.0.40": func() adapter { return v0040{} },
	"v0.0.41": func() adapter { return v0041{} },
}

// Versions lists the REST versions this package has adapters for, newest
// first (auto-detection prefers the newest the server offers).
func Versions() []string { return []string{"v0.0.41", "v0.0.40", "v0.0.38"} }

// Client talks to one slurmrestd. It is safe for concurrent use.
type Client struct {
	cfg    Config
	base   string
	http   *http.Client
	tokens *tokenSource

	mu  sync.Mutex
	ad  adapter // nil until detected
	now func() time.Time
}

// New checks cfg and returns a client. It does not contact slurmrestd (so
// Allot can start while Slurm is down); Ping does.
func New(cfg Config) (*Client, error) {
	if cfg.URL == "" {
		return nil, &configError{"URL is empty: set the slurmrestd address, e.g. http://slurm-head:6820"}
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, &configError{fmt.Sprintf("URL %q is not an http(s)://host:port address of slurmrestd", cfg.URL)}
	}
	if u.Path != "" && u.Path != "/" {
		return nil, &configError{fmt.Sprintf("URL %q has a path; give only scheme://host:port", cfg.URL)}
	}
	switch {
	case cfg.JWTKeyFile != "" && cfg.TokenFile != "":
		return nil, &configError{"set JWTKeyFile or TokenFile, not both"}
	case cfg.JWTKeyFile == "" && cfg.TokenFile == "":
		return nil, &configError{"no credentials: set JWTKeyFile (Slurm's jwt_key, to mint tokens) or TokenFile (a token from `scontrol token`)"}
	case cfg.JWTKeyFile != "":
		if _, err := readKey(cfg.JWTKeyFile); err != nil {
			return nil, err
		}
	default:
		if _, err := os.Stat(cfg.TokenFile); err != nil {
			return nil, &configError{"TokenFile: " + err.Error()}
		}
	}
	if cfg.TokenUser == "" {
		cfg.TokenUser = "root"
	}
	if cfg.TokenLifespan <= 0 {
		cfg.TokenLifespan = 5 * time.Minute
	}
	if cfg.TokenLifespan < 30*time.Second {
		return nil, &configError{"TokenLifespan " + cfg.TokenLifespan.String() + " is too short (at least 30s)"}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	c := &Client{
		cfg:  cfg,
		base: strings.TrimRight(cfg.URL, "/"),
		http: &http.Client{Timeout: cfg.Timeout},
		now:  time.Now,
	}
	switch cfg.Version {
	case "", "auto":
	default:
		mk, ok := adapters[cfg.Version]
		if !ok {
			return nil, &configError{fmt.Sprintf("Version %q is not supported; use one of %s or \"auto\"", cfg.Version, strings.Join(Versions(), ", "))}
		}
		c.ad = mk()
	}
	c.tokens = &tokenSource{user: cfg.TokenUser, keyFile: cfg.JWTKeyFile, tokFile: cfg.TokenFile,
		lifespan: cfg.TokenLifespan, now: func() time.Time { return c.now() }}
	return c, nil
}

// Version is the REST version in use ("" before detection).
func (c *Client) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ad == nil {
		return ""
	}
	return c.ad.version()
}

// envelope is what every response carries.
type envelope struct {
	Errors   []SlurmError `json:"errors"`
	Warnings []struct {
		Description string `json:"description"`
		Source      string `json:"source"`
	} `json:"warnings"`
}

// call does one request as asUser ("" = TokenUser) and returns the body of a
// successful answer. Slurm's errors[] turn into an *APIError; errors listed
// in ignore (e.g. "nothing found") do not.
func (c *Client) call(ctx context.Context, op, method, path string, query url.Values, asUser string, body any, ignore ...int) ([]byte, error) {
	b, err := c.do(ctx, op, method, path, query, asUser, body, ignore...)
	var ae *APIError
	if err != nil && errors.As(err, &ae) && ae.kind == ErrRejected && ae.Status >= 500 && generic(ae.Errors) {
		// slurmctld calls answered only "Unspecified error" (22.05 does this
		// for a token slurmctld rejects, and when slurmctld is down).
		// slurmdbd names a bad token: ask it.
		if v, ok := strings.CutPrefix(path, "/slurm/"); ok {
			v, _, _ = strings.Cut(v, "/")
			_, perr := c.do(ctx, "check token", "GET", "/slurmdb/"+v+"/tres", nil, "", nil)
			var pe *APIError
			switch {
			case perr != nil && errors.As(perr, &pe) && pe.kind == ErrUnauthorized:
				ae.kind = ErrUnauthorized
				ae.badToken = true
				ae.Errors = append(ae.Errors, pe.Errors...)
			case perr == nil || errors.Is(perr, ErrRejected):
				ae.kind = ErrUnreachable
			}
		}
	}
	return b, err
}

// generic: no error carries a specific Slurm number.
func generic(errs []SlurmError) bool {
	for _, se := range errs {
		if se.Num() > 0 {
			return false
		}
	}
	return true
}

func (c *Client) do(ctx context.Context, op, method, path string, query url.Values, asUser string, body any, ignore ...int) ([]byte, error) {
	tok, err := c.tokens.get()
	if err != nil {
		return nil, err
	}
	if asUser == "" {
		asUser = c.cfg.TokenUser
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-SLURM-USER-NAME", asUser)
	req.Header.Set("X-SLURM-USER-TOKEN", tok)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("slurm: %s: %w", op, ctx.Err())
		}
		return nil, &unreachableError{url: c.base, err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, &unreachableError{url: c.base, err: err}
	}
	var env envelope
	jsonErr := json.Unmarshal(b, &env)
	var errs []SlurmError
	for _, se := range env.Errors {
		if !containsInt(ignore, se.Num()) {
			errs = append(errs, se)
		}
	}
	if resp.StatusCode/100 == 2 && len(errs) == 0 && jsonErr == nil {
		return b, nil
	}
	ae := &APIError{Op: op, URL: c.base, Status: resp.StatusCode, Errors: errs, TokenUser: c.cfg.TokenUser, AsUser: asUser}
	if jsonErr != nil || len(errs) == 0 {
		ae.Body = trimBody(b)
	}
	if resp.StatusCode/100 == 2 && len(errs) == 0 {
		return nil, fmt.Errorf("slurm: %s: answer from %s is not JSON: %s", op, c.base, ae.Body)
	}
	ae.kind = classify(resp.StatusCode, errs)
	ae.badToken = ae.kind == ErrUnauthorized && (resp.StatusCode == 401 || resp.StatusCode == 403 || hasNum(errs, errProtocolAuth, errAuthCredInvalid))
	return nil, ae
}

func hasNum(errs []SlurmError, nums ...int) bool {
	for _, se := range errs {
		if containsInt(nums, se.Num()) {
			return true
		}
	}
	return false
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func trimBody(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// adapter returns the version adapter, detecting it on first use.
func (c *Client) adapter(ctx context.Context) (adapter, error) {
	c.mu.Lock()
	ad := c.ad
	c.mu.Unlock()
	if ad != nil {
		return ad, nil
	}
	v, err := c.detect(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.ad = adapters[v]()
	ad = c.ad
	c.mu.Unlock()
	return ad, nil
}

// detect reads the path list of GET /openapi/v3 and picks the newest
// version with an adapter; if the spec cannot be read it probes ping.
func (c *Client) detect(ctx context.Context) (string, error) {
	b, err := c.call(ctx, "GET /openapi/v3", "GET", "/openapi/v3", nil, "", nil)
	if err == nil {
		var spec struct {
			Paths map[string]json.RawMessage `json:"paths"`
		}
		if json.Unmarshal(b, &spec) == nil && len(spec.Paths) > 0 {
			offered := map[string]bool{}
			for p := range spec.Paths {
				if rest, ok := strings.CutPrefix(p, "/slurm/"); ok {
					if v, _, ok := strings.Cut(rest, "/"); ok {
						offered[v] = true
					}
				}
			}
			for _, v := range Versions() {
				if offered[v] {
					return v, nil
				}
			}
			var list []string
			for v := range offered {
				list = append(list, v)
			}
			sort.Strings(list)
			return "", &unsupportedError{fmt.Sprintf("slurm: slurmrestd at %s offers REST %s; this Allot has adapters for %s (start slurmrestd with -s openapi/<one of them>, or upgrade Allot)",
				c.base, strings.Join(list, ", "), strings.Join(Versions(), ", "))}
		}
	} else if errors.Is(err, ErrUnreachable) || errors.Is(err, ErrUnauthorized) {
		return "", err
	}
	// No usable spec: probe.
	var last error = err
	for _, v := range Versions() {
		_, perr := c.call(ctx, "GET /slurm/"+v+"/ping", "GET", "/slurm/"+v+"/ping", nil, "", nil)
		if perr == nil {
			return v, nil
		}
		if errors.Is(perr, ErrUnreachable) || errors.Is(perr, ErrUnauthorized) {
			return "", perr
		}
		last = perr
	}
	return "", &unsupportedError{fmt.Sprintf("slurm: slurmrestd at %s answers none of %s (last: %v)", c.base, strings.Join(Versions(), ", "), last)}
}

// Ping checks slurmrestd, the token and slurmctld, and says which version and
// release it talks to. Errors are typed: ErrUnreachable (URL wrong, refused,
// slurmctld down), ErrUnauthorized (token rejected), ErrUnsupported.
func (c *Client) Ping(ctx context.Context) (Info, error) {
	ad, err := c.adapter(ctx)
	if err != nil {
		return Info{}, err
	}
	v := ad.version()
	// 22.05 answers a bad token on ping with a generic "slurmctld config
	// is unable to load"; call asks slurmdbd, which names it.
	b, err := c.call(ctx, "ping", "GET", "/slurm/"+v+"/ping", nil, "", nil)
	if err != nil {
		return Info{}, err
	}
	info, err := ad.decodePing(b)
	if err != nil {
		return Info{}, err
	}
	info.Version = v
	for _, st := range info.Controllers {
		if st == "UP" {
			return info, nil
		}
	}
	return info, &APIError{Op: "ping", URL: c.base, Status: 200, kind: ErrUnreachable,
		Body: fmt.Sprintf("no slurmctld is UP: %v", info.Controllers)}
}

// Submit submits a batch job as asUser (the engineer's POSIX account; the
// token user acts as authenticating proxy). userMsg is what job_submit.lua
// told the user (slurm.log_user), e.g. a demotion notice.
func (c *Client) Submit(ctx context.Context, asUser string, s JobSubmit) (jobID int64, userMsg string, err error) {
	if asUser == "" {
		return 0, "", errors.New("slurm: submit: no user to submit as")
	}
	if s.Script == "" {
		return 0, "", errors.New("slurm: submit: empty script")
	}
	ad, err := c.adapter(ctx)
	if err != nil {
		return 0, "", err
	}
	b, err := c.call(ctx, "submit job as "+asUser, "POST", "/slurm/"+ad.version()+"/job/submit", nil, asUser, ad.submitBody(s), errJobHeld)
	if err != nil {
		return 0, "", err
	}
	var r struct {
		JobID  int64  `json:"job_id"`
		Msg    string `json:"job_submit_user_msg"`
		Result struct {
			JobID int64  `json:"job_id"`
			Msg   string `json:"job_submit_user_msg"`
		} `json:"result"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, "", fmt.Errorf("slurm: submit: %w", err)
	}
	if r.JobID == 0 {
		r.JobID, r.Msg = r.Result.JobID, r.Result.Msg
	}
	if r.JobID == 0 {
		return 0, "", fmt.Errorf("slurm: submit job as %s: slurmrestd returned no job id: %s", asUser, trimBody(b))
	}
	return r.JobID, strings.TrimSpace(r.Msg), nil
}

// Cancel cancels job id as asUser ("" = the token user). A job that has
// already ended is not an error.
func (c *Client) Cancel(ctx context.Context, asUser string, id int64) error {
	ad, err := c.adapter(ctx)
	if err != nil {
		return err
	}
	who := asUser
	if who == "" {
		who = c.cfg.TokenUser
	}
	_, err = c.call(ctx, "cancel job "+itoa(id)+" as "+who, "DELETE", "/slurm/"+ad.version()+"/job/"+itoa(id), nil, asUser, nil, errAlreadyDone)
	return err
}

// UpdateJob changes QOS, partition or comment of a job (as the token user).
func (c *Client) UpdateJob(ctx context.Context, id int64, u JobUpdate) error {
	ad, err := c.adapter(ctx)
	if err != nil {
		return err
	}
	_, err = c.call(ctx, "update job "+itoa(id), "POST", "/slurm/"+ad.version()+"/job/"+itoa(id), nil, "", ad.updateBody(u))
	return err
}

// Jobs lists the jobs slurmctld knows (queued, running, recently ended
// within MinJobAge).
func (c *Client) Jobs(ctx context.Context) ([]Job, error) {
	ad, err := c.adapter(ctx)
	if err != nil {
		return nil, err
	}
	b, err := c.call(ctx, "list jobs", "GET", "/slurm/"+ad.version()+"/jobs", nil, "", nil)
	if err != nil {
		return nil, err
	}
	return ad.decodeJobs(b)
}

// Nodes lists the nodes with their GPUs and drain state.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	ad, err := c.adapter(ctx)
	if err != nil {
		return nil, err
	}
	b, err := c.call(ctx, "list nodes", "GET", "/slurm/"+ad.version()+"/nodes", nil, "", nil)
	if err != nil {
		return nil, err
	}
	return ad.decodeNodes(b)
}

// Drain drains node with reason (REST on v0.0.40+, `scontrol update` with
// SLURM_CONF=Config.SlurmConf on v0.0.38).
func (c *Client) Drain(ctx context.Context, node, reason string) error {
	if strings.TrimSpace(reason) == "" {
		return errors.New("slurm: drain " + node + ": Slurm requires a reason")
	}
	return c.updateNode(ctx, node, true, reason)
}

// Resume returns a drained node to service.
func (c *Client) Resume(ctx context.Context, node string) error {
	return c.updateNode(ctx, node, false, "")
}

func (c *Client) updateNode(ctx context.Context, node string, drain bool, reason string) error {
	if node == "" || strings.ContainsAny(node, " \t\n=") {
		return fmt.Errorf("slurm: bad node name %q", node)
	}
	ad, err := c.adapter(ctx)
	if err != nil {
		return err
	}
	body, ok := ad.nodeUpdateBody(drain, reason)
	if !ok {
		return c.scontrolNode(ctx, node, drain, reason)
	}
	op := "resume node " + node
	if drain {
		op = "drain node " + node
	}
	_, err = c.call(ctx, op, "POST", "/slurm/"+ad.version()+"/node/"+url.PathEscape(node), nil, "", body)
	return err
}

// Accounting returns every run segment slurmdbd recorded that overlaps
// [from, to): finished, running, and the PREEMPTED/REQUEUED records of
// requeued jobs, each as its own Run. Records that never started (Start zero)
// are included; callers that bill skip them.
func (c *Client) Accounting(ctx context.Context, from, to time.Time) ([]Run, error) {
	ad, err := c.adapter(ctx)
	if err != nil {
		return nil, err
	}
	// "uts<epoch>" is parse_time's time-zone-free form (22.05 and later).
	// Any query parameter also switches on JOBCOND_FLAG_DUP: without one,
	// slurmrestd returns only the last record of a requeued job.
	q := url.Values{}
	q.Set("start_time", "uts"+itoa(from.Unix()))
	q.Set("end_time", "uts"+itoa(to.Unix()))
	b, err := c.call(ctx, "read accounting", "GET", "/slurmdb/"+ad.version()+"/jobs", q, "", nil, errNothingFound)
	if err != nil {
		return nil, err
	}
	runs, err := ad.decodeRuns(b)
	if err != nil {
		return nil, err
	}
	sortRuns(runs)
	return runs, nil
}

func sortRuns(runs []Run) {
	sort.SliceStable(runs, func(i, j int) bool {
		a, b := runs[i], runs[j]
		if a.JobID != b.JobID {
			return a.JobID < b.JobID
		}
		if !a.Submit.Equal(b.Submit) {
			return a.Submit.Before(b.Submit)
		}
		return a.Start.Before(b.Start)
	})
}
