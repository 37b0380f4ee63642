package agent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDCGMJobMapping: with a job on GPUs 1 and 3, the mapping directory
// has files "1" and "3" naming the Allot job (dcgm-exporter's
// --hpc-job-mapping-dir format); a stale file of a GPU no job holds goes,
// files that are not GPU indices stay.
func TestDCGMJobMapping(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "0"), []byte("999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("not a GPU\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ta.run(t, shLease(77, []int{1, 3}, "echo ready; exec sleep 30"))
	// The agent reports a start just before it counts the job as running;
	// its first output line comes after.
	p.waitLogLine(ref(77), "ready", 10*time.Second)
	if err := ta.writeDCGMJobMapping(dir); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "1 3 README" {
		p.mu.Lock()
		t.Errorf("files = %v; the job's exits %+v, logs %v", names, p.exited, p.logs)
		p.mu.Unlock()
	}
	for _, n := range []string{"1", "3"} {
		if b, _ := os.ReadFile(filepath.Join(dir, n)); string(b) != "77\n" {
			t.Errorf("file %s = %q", n, b)
		}
	}
	// The background sync keeps it so, and survives an unwritable dir.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ta.SyncDCGMJobMapping(ctx, filepath.Join(dir, "README", "x"), 10*time.Millisecond, slog.New(slog.DiscardHandler))
	time.Sleep(50 * time.Millisecond)
}

// TestMetricsPortTaken: a taken metrics port (dcgm-exporter's, say) is
// logged, not fatal, and served once it is free.
func TestMetricsPortTaken(t *testing.T) {
	t.Parallel()
	if DefaultMetricsAddr == ":9400" {
		t.Fatal("the default metrics port is dcgm-exporter's")
	}
	p := newPeer(t)
	ta := startAgent(t, p)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		ta.ServeMetrics(ctx, addr, 20*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
		close(done)
	}()
	time.Sleep(100 * time.Millisecond)
	if !strings.Contains(logs.String(), "cannot serve metrics") || strings.Count(logs.String(), "cannot serve metrics") != 1 {
		t.Errorf("log = %q", logs.String())
	}
	ln.Close()
	var body []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) { // deadline (real time)
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			break
		}
	}
	if !bytes.Contains(body, []byte("DCGM_FI_DEV_GPU_UTIL{")) {
		t.Errorf("metrics after the port came free: %q", body)
	}
	cancel()
	<-done
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
