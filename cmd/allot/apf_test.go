package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/apf"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

const apfJob = `{"team":"nlp","tier":3,"gpus":1,"gpu_type":"T4","time_limit":"1h","command":["true"]}`

type apfAnswer struct {
	code int
	hdr  http.Header
	body string
}

// apfSend sends a request as persona in the background; body nil is a
// body the test holds open (the request runs, admitted, until the test
// writes it through the pipe returned and closes it).
func apfSend(e *env, method, path, persona string, body []byte) (<-chan apfAnswer, *io.PipeWriter) {
	var rd io.Reader = bytes.NewReader(body)
	var pw *io.PipeWriter
	if body == nil {
		rd, pw = io.Pipe()
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.tokens[persona])
	out := make(chan apfAnswer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- apfAnswer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- apfAnswer{code: resp.StatusCode, hdr: resp.Header, body: string(b)}
	}()
	return out, pw
}

// admission reads one of the server's allot_admission_* series.
func admission(t *testing.T, e *env, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := e.m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i, lp := range m.GetLabel() {
				if i < len(labels) && lp.GetValue() != labels[i] {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// waitAdmission waits until the write level has inFlight requests
// executing and queued waiting.
func waitAdmission(t *testing.T, e *env, inFlight, queued float64) {
	t.Helper()
	waitLevel(t, e, apf.Write, inFlight, queued)
}

func waitLevel(t *testing.T, e *env, level string, inFlight, queued float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a deadline for the server's goroutines, not product time
	for admission(t, e, "allot_admission_in_flight", level) != inFlight || admission(t, e, "allot_admission_queued", level) != queued {
		if time.Now().After(deadline) { // the same deadline
			t.Fatalf("%s level: %v in flight, %v queued; want %v and %v", level, admission(t, e, "allot_admission_in_flight", level),
				admission(t, e, "allot_admission_queued", level), inFlight, queued)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAdmissionControl16: with the user write level's slots all taken
// (two submissions held in flight, their bodies still coming) and its
// queue full, and the other agent requests' slots taken too (two job-log
// batches held), agents' heartbeats and users' reads are answered; one more
// submission gets 429 with Retry-After and a problem, and writes nothing;
// another token's write takes the place of the heavy token's newest
// waiting one; once the held submissions finish, every admitted request
// is served.
func TestAdmissionControl16(t *testing.T) {
	e := bootMain(t, &Main{Config: Config{Worker: true, DevMode: true, HTTP: HTTPLimits{BodyTimeout: 5 * time.Minute}, Admission: apf.Config{
		Write: apf.Limits{MaxInFlight: 2, QueueLength: 2, QueueWait: 5 * time.Minute},
		Read:  apf.Limits{MaxInFlight: 2, QueueLength: 2, QueueWait: 5 * time.Minute},
		Agent: apf.Limits{MaxInFlight: 2, QueueLength: 16, QueueWait: 5 * time.Minute}, Heartbeat: apf.Limits{MaxInFlight: 2, QueueLength: 16, QueueWait: 5 * time.Minute}}}})
	agent := fakeAgent(t, e, "apf01")
	e.withTokens()
	nodeTok, err := e.m.Store.CreateNodeToken(context.Background(), "apf01", "apf test: held agent requests")
	if err != nil {
		t.Fatal(err)
	}
	e.tokens["node"] = nodeTok
	ctx := context.Background()
	before := e.jobCount()

	var held []<-chan apfAnswer
	var pipes []*io.PipeWriter
	for range 2 {
		ch, pw := apfSend(e, "POST", "/api/v1/jobs", demo.Engineer, nil)
		held, pipes = append(held, ch), append(pipes, pw)
	}
	waitAdmission(t, e, 2, 0)
	var queued []<-chan apfAnswer
	for i := range 2 {
		ch, _ := apfSend(e, "POST", "/api/v1/jobs", demo.Engineer, []byte(apfJob))
		queued = append(queued, ch)
		waitAdmission(t, e, 2, float64(i+1))
	}

	// The other agent requests' slots taken too (two job-log batches,
	// their bodies still coming).
	var heldAgent []<-chan apfAnswer
	var agentPipes []*io.PipeWriter
	for range 2 {
		ch, pw := apfSend(e, "POST", "/api/agent/v1/jobs/log", "node", nil)
		heldAgent, agentPipes = append(heldAgent, ch), append(agentPipes, pw)
	}
	waitLevel(t, e, apf.Agent, 2, 0)

	// The heartbeats' level and the reads' are neither the writes' nor the
	// other agent requests'.
	for range 3 {
		if _, err := agent.Heartbeat(ctx, beatOf("apf01")); err != nil {
			t.Fatalf("a heartbeat while the user writes are saturated: %v", err)
		}
	}
	if code, _, b := e.api("GET", "/api/v1/me", demo.Engineer, ""); code != http.StatusOK {
		t.Errorf("a read while the user writes are saturated: %d %s", code, b)
	}

	// One more of the same token's: refused at once, nothing written.
	refused, _ := apfSend(e, "POST", "/api/v1/jobs", demo.Engineer, []byte(apfJob))
	checkAdmission429(t, <-refused, "2 in flight and the queue is full")
	if n := e.jobCount(); n != before {
		t.Errorf("jobs %d → %d after a refused submission (none finished yet)", before, n)
	}
	// Another token's write takes the heavy token's newest place.
	lead, _ := apfSend(e, "POST", "/api/v1/tokens", demo.Lead, []byte(`{"name":"apf"}`))
	checkAdmission429(t, <-queued[1], "its place in the queue went to a caller with fewer requests waiting")
	waitAdmission(t, e, 2, 2)

	for _, pw := range pipes {
		if _, err := pw.Write([]byte(apfJob)); err != nil {
			t.Fatal(err)
		}
		pw.Close()
	}
	for _, pw := range agentPipes {
		pw.Close() // an empty batch: refused by the handler, not by admission
	}
	for i, ch := range heldAgent {
		if a := <-ch; a.code == http.StatusTooManyRequests || a.code >= 500 || a.code == 0 {
			t.Errorf("held agent request %d: %d %s", i, a.code, a.body)
		}
	}
	for i, ch := range append(held, queued[0], lead) {
		if a := <-ch; a.code != http.StatusCreated {
			t.Errorf("admitted request %d: %d %s", i, a.code, a.body)
		}
	}
	if n := e.jobCount(); n != before+3 {
		t.Errorf("jobs %d → %d; want 3 more (the held two and the one admitted from the queue)", before, n)
	}
	waitAdmission(t, e, 0, 0)
	if q, ev := admission(t, e, "allot_admission_rejected_total", apf.Write, "queue_full"), admission(t, e, "allot_admission_rejected_total", apf.Write, "evicted"); q != 1 || ev != 1 {
		t.Errorf("rejected: %v for a full queue, %v evicted; want 1 and 1", q, ev)
	}
	if n := admission(t, e, "allot_admission_dispatched_total", apf.Heartbeat); n < 3 {
		t.Errorf("heartbeats dispatched: %v, want the 3 at least", n)
	}
	if l := admission(t, e, "allot_admission_limit", apf.Write); l != 2 {
		t.Errorf("write limit metric %v", l)
	}
}

func checkAdmission429(t *testing.T, a apfAnswer, why string) {
	t.Helper()
	var p web.Problem
	json.Unmarshal([]byte(a.body), &p) //nolint:errcheck
	if a.code != http.StatusTooManyRequests || a.hdr.Get("Retry-After") != "1" || a.hdr.Get("Content-Type") != "application/problem+json" ||
		p.Status != 429 || !strings.HasSuffix(p.Type, "/too_many_requests") || !strings.Contains(p.Detail, why) || !strings.Contains(p.Detail, "retry in 1 s") {
		t.Errorf("want 429 with Retry-After 1 and a problem saying %q; got %d %v %s", why, a.code, a.hdr, a.body)
	}
}

// TestAdmissionFlags16: the admission flags reach the Config (defaults:
// apf.Default); negative values are refused with a message naming the
// flag, by `allot server` and by `allot loadtest`, before anything
// connects.
func TestAdmissionFlags16(t *testing.T) {
	parse := parseServerLimits
	c, err := parse()
	if err != nil || c.Admission != apf.Default {
		t.Errorf("defaults: %+v %v", c.Admission, err)
	}
	c, err = parse("--api-max-inflight", "3", "--api-read-max-inflight", "0", "--agent-max-inflight", "7", "--api-queue", "9", "--agent-queue", "11", "--api-queue-wait", "2s")
	want := apf.Config{Write: apf.Limits{MaxInFlight: 3, QueueLength: 9, QueueWait: 2 * time.Second}, Read: apf.Limits{QueueLength: 9, QueueWait: 2 * time.Second},
		Agent: apf.Limits{MaxInFlight: 7, QueueLength: 11, QueueWait: 2 * time.Second}, Heartbeat: apf.Limits{MaxInFlight: 7, QueueLength: 11, QueueWait: 2 * time.Second}}
	if err != nil || c.Admission != want {
		t.Errorf("set: %+v %v, want %+v", c.Admission, err, want)
	}
	for _, bad := range []struct{ flag, value, msg string }{
		{"--api-max-inflight", "-1", "--api-max-inflight must be 0 (no limit) or more, not -1"},
		{"--api-read-max-inflight", "-2", "--api-read-max-inflight must be 0 (no limit) or more, not -2"},
		{"--agent-max-inflight", "-3", "--agent-max-inflight must be 0 (no limit) or more, not -3"},
		{"--api-queue", "-4", "--api-queue must be 0 (no queue) or more, not -4"},
		{"--agent-queue", "-5", "--agent-queue must be 0 (no queue) or more, not -5"},
		{"--api-queue-wait", "-1s", "--api-queue-wait must be 0 or more, not -1s"},
	} {
		for _, cmd := range []string{"server", "loadtest"} {
			var stderr bytes.Buffer
			code := run([]string{cmd, "--database-url", "postgres://nobody@127.0.0.1:1/none", bad.flag, bad.value}, io.Discard, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), bad.msg) {
				t.Errorf("allot %s %s %s: exit %d, %q; want 2 and %q", cmd, bad.flag, bad.value, code, stderr.String(), bad.msg)
			}
		}
	}
}
