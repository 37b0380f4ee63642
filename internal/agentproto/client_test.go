package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestClientRoundTrips(t *testing.T) {
	t.Parallel()
	var gotAuth, gotWait string
	var took LeaseRef
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/agent/v1/register", func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		var inv Inventory
		if err := json.NewDecoder(r.Body).Decode(&inv); err != nil {
			t.Errorf("decode: %v", err)
		}
		_ = json.NewEncoder(w).Encode(Registration{Node: inv.Hostname, HeartbeatInterval: 5 * time.Second})
	})
	mux.HandleFunc("GET /api/agent/v1/orders", func(w http.ResponseWriter, r *http.Request) {
		gotWait = r.URL.Query().Get("wait")
		_ = json.NewEncoder(w).Encode(Orders{Start: []LeaseRef{{JobID: 7, Segment: 1}}})
	})
	mux.HandleFunc("POST /api/agent/v1/leases/take", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&took)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /api/agent/v1/jobs/exited", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"type":"about:blank","title":"Conflict","detail":"job 7 is not running on this node"}`))
	})
	mux.HandleFunc("POST /api/agent/v1/jobs/log", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusBadGateway)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	c := NewClient(srv.URL+"/", "allot_node_x")
	ctx := context.Background()
	reg, err := c.Register(ctx, Inventory{Hostname: "gpu1"})
	if err != nil || reg.Node != "gpu1" || reg.HeartbeatInterval != 5*time.Second {
		t.Fatalf("Register = %+v, %v", reg, err)
	}
	if gotAuth != "Bearer allot_node_x" {
		t.Errorf("Authorization = %q", gotAuth)
	}
	o, err := c.Orders(ctx, 25*time.Second)
	if err != nil || len(o.Start) != 1 || o.Start[0].JobID != 7 {
		t.Fatalf("Orders = %+v, %v", o, err)
	}
	if gotWait != "25s" {
		t.Errorf("wait = %q, want 25s", gotWait)
	}
	if err := c.TakeLease(ctx, LeaseRef{JobID: 7, Segment: 2}); err != nil || took.Segment != 2 {
		t.Fatalf("TakeLease: %v (%+v)", err, took)
	}

	err = c.Exited(ctx, JobExited{JobID: 7})
	var p *Problem
	if !errors.As(err, &p) || p.Status != http.StatusConflict || p.Detail != "job 7 is not running on this node" {
		t.Fatalf("Exited error = %#v", err)
	}
	if ErrorStatus(err) != http.StatusConflict {
		t.Errorf("ErrorStatus = %d", ErrorStatus(err))
	}
	err = c.Log(ctx, JobLog{JobID: 7})
	if ErrorStatus(err) != http.StatusBadGateway || errors.As(err, &p) {
		t.Fatalf("Log error = %#v", err)
	}
}

func TestClientNetworkErrorHasNoStatus(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := NewClient(url, "t").Heartbeat(context.Background(), Heartbeat{})
	if err == nil || ErrorStatus(err) != 0 {
		t.Fatalf("err = %v, status %d", err, ErrorStatus(err))
	}
}

// TestClientBatches: batched takes and starts carry one result per lease
// (a refusal as an error with its status) and the starts now due; a reply
// with a missing result is an error; a server without the batched
// requests (404) answers ErrNoBatch, and its other errors stay as they are.
func TestClientBatches(t *testing.T) {
	t.Parallel()
	var old bool
	var short bool
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/agent/v1/leases/take-batch", func(w http.ResponseWriter, r *http.Request) {
		if old {
			http.NotFound(w, r)
			return
		}
		var b TakeBatch
		_ = json.NewDecoder(r.Body).Decode(&b)
		rep := TakeBatchReply{Start: []LeaseRef{b.Leases[0]}}
		for i, l := range b.Leases {
			res := LeaseResult{JobID: l.JobID, Segment: l.Segment}
			if i == 1 {
				res.Status, res.Detail = http.StatusConflict, "has ended"
			}
			rep.Results = append(rep.Results, res)
		}
		if short {
			rep.Results = rep.Results[:1]
		}
		_ = json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("POST /api/agent/v1/jobs/started-batch", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := NewClient(srv.URL, "allot_node_x")
	ctx := context.Background()
	refs := []LeaseRef{{JobID: 1, Segment: 1}, {JobID: 2, Segment: 1}}
	rep, err := c.TakeLeases(ctx, refs)
	if err != nil || len(rep.Results) != 2 || rep.Results[0].Err() != nil || ErrorStatus(rep.Results[1].Err()) != http.StatusConflict ||
		len(rep.Start) != 1 || rep.Start[0] != refs[0] {
		t.Fatalf("TakeLeases = %+v, %v", rep, err)
	}
	short = true
	if _, err := c.TakeLeases(ctx, refs); err == nil || errors.Is(err, ErrNoBatch) {
		t.Errorf("a reply short of results: %v, want an error", err)
	}
	old = true
	if _, err := c.TakeLeases(ctx, refs); !errors.Is(err, ErrNoBatch) {
		t.Errorf("an older server: %v, want ErrNoBatch", err)
	}
	if _, err := c.StartedBatch(ctx, []JobStarted{{JobID: 1, Segment: 1}}); errors.Is(err, ErrNoBatch) || ErrorStatus(err) != http.StatusServiceUnavailable {
		t.Errorf("a busy server: %v, want its 503", err)
	}
}
