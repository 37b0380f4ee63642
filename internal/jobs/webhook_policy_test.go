package jobs_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// TestWebhookDeliveryRefusesInsideAddressesAtConnect: a webhook whose name
// resolves to this machine, CGNAT or a NAT64 address of a private network
// at delivery time (DNS rebinding after the set-time check) is not posted:
// the attempt is logged with the reason and the job is cancelled rather
// than retried. With AllowPrivate (allot dev, tests) the local server gets
// the post.
func TestWebhookDeliveryRefusesInsideAddressesAtConnect(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	ctx := context.Background()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	lookup := func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "hooks.rebind.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		case "cgnat.rebind.test":
			return []netip.Addr{netip.MustParseAddr("100.64.3.4")}, nil
		case "nat64.rebind.test":
			return []netip.Addr{netip.MustParseAddr("64:ff9b::c0a8:0101")}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	w := &jobs.WebhookWorker{Store: st, Lookup: lookup}
	for i, tc := range []struct{ host, why string }{
		{"hooks.rebind.test:" + u.Port(), "loopback"},
		{"cgnat.rebind.test", "carrier-grade NAT"},
		{"nat64.rebind.test", "NAT64 address of a private"},
		{"2130706433:" + u.Port(), "loopback"},
	} {
		hook := "http://" + tc.host + "/hook"
		err := w.Work(ctx, &river.Job[jobs.WebhookArgs]{JobRow: &rivertype.JobRow{Attempt: 1}, Args: jobs.WebhookArgs{URL: hook, Text: "x"}})
		var cancel *river.JobCancelError
		if err == nil || !errors.As(err, &cancel) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s: %v, want a cancelled delivery saying %q", hook, err, tc.why)
		}
		ds, err := st.AdminDeliveries(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != i+1 || ds[0].URL != hook || !strings.Contains(ds[0].Error, "not public") {
			t.Errorf("%s: delivery log %+v", hook, ds)
		}
	}
	if hits.Load() != 0 {
		t.Fatalf("the local server was reached %d times", hits.Load())
	}
	dev := &jobs.WebhookWorker{Store: st, Lookup: lookup, AllowPrivate: true}
	if err := dev.Work(ctx, &river.Job[jobs.WebhookArgs]{JobRow: &rivertype.JobRow{Attempt: 1}, Args: jobs.WebhookArgs{URL: srv.URL + "/hook", Text: "x"}}); err != nil || hits.Load() != 1 {
		t.Errorf("dev mode: %v, %d hits", err, hits.Load())
	}
}
