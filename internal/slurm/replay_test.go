package slurm

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// replay is a stand-in slurmrestd that answers from testdata fixtures. It
// exists because no slurmrestd newer than 22.05 runs here: the v0.0.40 and
// v0.0.41 flows (and the v0.0.38 error answers, recorded for real) are
// exercised end to end through the client against it. It checks the token's
// HS256 signature like slurmctld would.
type replay struct {
	t      *testing.T
	key    []byte
	routes map[string]string // "METHOD /path" → fixture ("" = 200 with empty errors)
	status map[string]int

	mu   sync.Mutex
	seen []string          // "METHOD /path?query user"
	body map[string]string // last request body per route
}

func (rp *replay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route := r.Method + " " + r.URL.Path
	b, _ := io.ReadAll(r.Body)
	rp.mu.Lock()
	rp.seen = append(rp.seen, route+"?"+r.URL.RawQuery+" "+r.Header.Get("X-SLURM-USER-NAME"))
	rp.body[route] = string(b)
	rp.mu.Unlock()
	tok := r.Header.Get("X-SLURM-USER-TOKEN")
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		w.WriteHeader(401)
		io.WriteString(w, "Authentication failure")
		return
	}
	mac := hmac.New(sha256.New, rp.key)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	if base64.RawURLEncoding.EncodeToString(mac.Sum(nil)) != parts[2] {
		w.WriteHeader(500)
		io.WriteString(w, `{"errors":[{"error_number":1007,"error":"Protocol authentication error","source":"slurmdb_jobs_get"}]}`)
		return
	}
	f, ok := rp.routes[route]
	if !ok {
		w.WriteHeader(404)
		io.WriteString(w, "Unable to find requested URL. Please view /openapi/v3 for API reference.")
		return
	}
	if st := rp.status[route]; st != 0 {
		w.WriteHeader(st)
	}
	if f == "" {
		io.WriteString(w, `{"meta":{},"errors":[],"warnings":[]}`)
		return
	}
	w.Write(fixture(rp.t, f))
}

func newReplay(t *testing.T, routes map[string]string) (*replay, string, string) {
	dir := t.TempDir()
	key := []byte("replay-key-0123456789abcdef01234")
	kf := filepath.Join(dir, "jwt.key")
	if err := os.WriteFile(kf, key, 0o600); err != nil {
		t.Fatal(err)
	}
	rp := &replay{t: t, key: key, routes: routes, status: map[string]int{}, body: map[string]string{}}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return rp, srv.URL, kf
}

func TestReplayV0040(t *testing.T) {
	rp, url, kf := newReplay(t, map[string]string{
		"GET /openapi/v3":                "v0040_openapi_paths.json",
		"GET /slurm/v0.0.40/ping":        "v0040_ping.json",
		"GET /slurm/v0.0.40/jobs":        "v0040_jobs.json",
		"GET /slurm/v0.0.40/nodes":       "v0040_nodes.json",
		"GET /slurmdb/v0.0.40/jobs":      "dbv0040_jobs.json",
		"POST /slurm/v0.0.40/job/submit": "v0040_submit_ok.json",
		"DELETE /slurm/v0.0.40/job/201":  "",
		"POST /slurm/v0.0.40/job/202":    "",
		"POST /slurm/v0.0.40/node/sn02":  "",
		"GET /slurmdb/v0.0.40/tres":      "",
	})
	ctx := context.Background()
	c, err := New(Config{URL: url, JWTKeyFile: kf})
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Ping(ctx)
	if err != nil || info.Version != "v0.0.40" || info.Release != "23.11.0" {
		t.Fatalf("Ping = %+v, %v", info, err)
	}
	id, msg, err := c.Submit(ctx, "alice", JobSubmit{Account: "nlp", Script: "#!/bin/sh\n", GPUs: 2, TimeLimit: time.Hour})
	if err != nil || id != 301 || msg != "account nlp is over its GPU-hour budget; job runs as preemptible" {
		t.Errorf("Submit = %d %q %v", id, msg, err)
	}
	var body map[string]any
	json.Unmarshal([]byte(rp.body["POST /slurm/v0.0.40/job/submit"]), &body)
	if job := body["job"].(map[string]any); job["tres_per_job"] != "gres/gpu:2" || body["script"] != "#!/bin/sh\n" {
		t.Errorf("submit body %v", body)
	}
	jobs, err := c.Jobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkNewerJobs(t, jobs)
	if _, err := c.Nodes(ctx); err != nil {
		t.Fatal(err)
	}
	runs, err := c.Accounting(ctx, ts(1796140000), ts(1796160000))
	if err != nil {
		t.Fatal(err)
	}
	checkNewerRuns(t, runs)
	if err := c.Cancel(ctx, "alice", 201); err != nil {
		t.Error(err)
	}
	q := "allot-preemptible"
	if err := c.UpdateJob(ctx, 202, JobUpdate{QOS: &q}); err != nil {
		t.Error(err)
	}
	if rp.body["POST /slurm/v0.0.40/job/202"] != `{"qos":"allot-preemptible"}` {
		t.Errorf("update body %s", rp.body["POST /slurm/v0.0.40/job/202"])
	}
	if err := c.Drain(ctx, "sn02", "allot: XID 79"); err != nil {
		t.Error(err)
	}
	if rp.body["POST /slurm/v0.0.40/node/sn02"] != `{"reason":"allot: XID 79","state":["DRAIN"]}` {
		t.Errorf("drain body %s", rp.body["POST /slurm/v0.0.40/node/sn02"])
	}
	want := []string{
		"GET /openapi/v3? root", "GET /slurm/v0.0.40/ping? root", "POST /slurm/v0.0.40/job/submit? alice",
		"GET /slurm/v0.0.40/jobs? root", "GET /slurm/v0.0.40/nodes? root",
		"GET /slurmdb/v0.0.40/jobs?end_time=uts1796160000&start_time=uts1796140000 root",
		"DELETE /slurm/v0.0.40/job/201? alice", "POST /slurm/v0.0.40/job/202? root", "POST /slurm/v0.0.40/node/sn02? root",
	}
	if strings.Join(rp.seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant\n%s", strings.Join(rp.seen, "\n"), strings.Join(want, "\n"))
	}
}

func TestReplayV0041Detect(t *testing.T) {
	rp, url, kf := newReplay(t, map[string]string{
		"GET /openapi/v3":                "v0041_openapi_paths.json",
		"GET /slurm/v0.0.41/ping":        "v0041_ping.json",
		"POST /slurm/v0.0.41/job/submit": "v0040_submit_ok.json",
	})
	c, _ := New(Config{URL: url, JWTKeyFile: kf})
	info, err := c.Ping(context.Background())
	if err != nil || info.Version != "v0.0.41" || info.Release != "24.05.0" {
		t.Fatalf("Ping = %+v, %v", info, err)
	}
	if _, _, err := c.Submit(context.Background(), "bob", JobSubmit{Script: "s", GPUsPerNode: 4, Nodes: 2, GRESType: "h100"}); err != nil {
		t.Fatal(err)
	}
	var body map[string]map[string]any
	json.Unmarshal([]byte(rp.body["POST /slurm/v0.0.41/job/submit"]), &body)
	if body["job"]["script"] != "s" || body["job"]["tres_per_node"] != "gres/gpu:h100:4" {
		t.Errorf("v0.0.41 body %v", rp.body["POST /slurm/v0.0.41/job/submit"])
	}
}

func TestReplayErrors(t *testing.T) {
	rp, url, kf := newReplay(t, map[string]string{
		"GET /openapi/v3":                "v0038_openapi_paths.json",
		"GET /slurm/v0.0.38/ping":        "v0038_ping_badtoken.json", // recorded: 22.05's ping with a bad token
		"GET /slurmdb/v0.0.38/tres":      "dbv0038_jobs_badtoken.json",
		"POST /slurm/v0.0.38/job/submit": "v0038_submit_bad_account.json",
		"GET /slurmdb/v0.0.38/jobs":      "dbv0038_jobs_nothing.json",
	})
	rp.status["GET /slurm/v0.0.38/ping"] = 500
	rp.status["GET /slurmdb/v0.0.38/tres"] = 500
	rp.status["POST /slurm/v0.0.38/job/submit"] = 500
	ctx := context.Background()
	c, _ := New(Config{URL: url, JWTKeyFile: kf})
	_, err := c.Ping(ctx)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "rejected the token") || !strings.Contains(err.Error(), "Protocol authentication error (1007)") {
		t.Errorf("Ping with a token slurmdbd rejects = %v", err)
	}
	if c.Version() != "v0.0.38" {
		t.Errorf("detected %q", c.Version())
	}
	_, _, err = c.Submit(ctx, "alice", JobSubmit{Account: "nope", Script: "x"})
	var ae *APIError
	if !errors.Is(err, ErrRejected) || !errors.As(err, &ae) || !ae.Has(2045) ||
		err.Error() != "slurm: submit job as alice: Invalid account or account/partition combination specified (2045) (HTTP 500)" {
		t.Errorf("Submit bad account = %v", err)
	}
	runs, err := c.Accounting(ctx, ts(1796000000), ts(1796000100))
	if err != nil || len(runs) != 0 {
		t.Errorf("empty accounting = %v, %v", runs, err)
	}

	// Only v0.0.39 offered.
	_, url2, kf2 := newReplay(t, map[string]string{"GET /openapi/v3": "v0039_openapi_paths.json"})
	c2, _ := New(Config{URL: url2, JWTKeyFile: kf2})
	_, err = c2.Ping(ctx)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "offers REST v0.0.39; this Allot has adapters for v0.0.41, v0.0.40, v0.0.38") {
		t.Errorf("v0.0.39-only = %v", err)
	}

	// A token file the server does not accept (not even a JWT): HTTP 401.
	tf := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(tf, []byte("garbage"), 0o600)
	c3, _ := New(Config{URL: url, TokenFile: tf, Version: "v0.0.38"})
	_, err = c3.Jobs(ctx)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "rejected the token") || !strings.Contains(err.Error(), "HTTP 401") {
		t.Errorf("garbage token = %v", err)
	}

	// Nothing listens.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + l.Addr().String()
	l.Close()
	c4, _ := New(Config{URL: dead, JWTKeyFile: kf})
	_, err = c4.Ping(ctx)
	if !errors.Is(err, ErrUnreachable) || !strings.HasPrefix(err.Error(), "slurmrestd at "+dead+" is not reachable: ") {
		t.Errorf("dead URL = %v", err)
	}
}
