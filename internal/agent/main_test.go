package agent

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestMainRejectsBadFlags(t *testing.T) {
	t.Setenv("ALLOT_URL", "")
	t.Setenv("ALLOT_NODE_TOKEN", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--token", "allot_node_x"}, "--server is required"},
		{[]string{"--server", "http://allot:8080"}, "--token is required"},
		{[]string{"--server", "allot:8080", "--token", "t"}, "must be an http:// or https:// URL"},
		{[]string{"--server", "http://a", "--token", "t", "--gpu", "amd"}, `--gpu "amd": use nvml or fake`},
		{[]string{"--server", "http://a", "--token", "t", "--gpu", "fake", "--fake-gpus", "0"}, "--fake-gpus must be between 1 and 64"},
		{[]string{"--server", "http://a", "--token", "t", "--heartbeat", "-1s"}, "--heartbeat must be positive"},
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
	} {
		var out, errb bytes.Buffer
		if code := Main(tc.args, &out, &errb); code != 2 {
			t.Errorf("Main(%q) = %d, want 2", tc.args, code)
		}
		if !strings.Contains(errb.String(), tc.want) {
			t.Errorf("Main(%q) stderr = %q, want %q", tc.args, errb.String(), tc.want)
		}
	}
}

func TestMainWithoutDriverSuggestsFake(t *testing.T) {
	if b, err := NewNVML(); err == nil {
		b.Close()
		t.Skip("an NVIDIA driver is present")
	}
	var out, errb bytes.Buffer
	code := Main([]string{"--server", "http://127.0.0.1:1", "--token", "allot_node_x", "--gpu", "nvml"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "run with --gpu fake") {
		t.Errorf("Main = %d, stderr %q", code, errb.String())
	}
}

func TestRunFailsWhenTheTokenIsRefused(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	a := New(Config{Server: p.URL(), Token: "allot_node_wrong", Backend: NewFake(FakeOptions{GPUs: 1}), Logger: discardLogger()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := a.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "refused to register") || !strings.Contains(err.Error(), "unknown node token") {
		t.Errorf("Run = %v", err)
	}
}

func TestRunRetriesUntilTheServerIsUp(t *testing.T) {
	t.Parallel()
	// Reserve an address, then start the server on it only later.
	p0 := newPeer(t)
	addr := p0.Addr()
	p0.close()
	a := New(Config{Server: "http://" + addr, Token: testToken, Hostname: "late", Backend: NewFake(FakeOptions{GPUs: 2}),
		Logger: discardLogger(), RetryMax: 100 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	time.Sleep(300 * time.Millisecond)
	p := newPeerAt(t, addr)
	p.waitFor("registration", 5*time.Second, func() bool { return len(p.regs) > 0 })
	p.waitFor("heartbeat", 5*time.Second, func() bool { return len(p.hbs) > 0 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}
