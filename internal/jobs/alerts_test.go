package jobs_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
)

// TestBudgetAlertsFireOnceAndWebhooksRetry: 80 % and 100 % alerts fire once
// per team and month; a webhook answering 500 is retried until it takes
// the alert, and every attempt is in the delivery log.
func TestBudgetAlertsFireOnceAndWebhooksRetry(t *testing.T) {
	st, _, _ := billingSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		json.NewDecoder(r.Body).Decode(&body) //nolint:errcheck
		mu.Lock()
		seen[body["text"]]++
		first := seen[body["text"]] == 1
		mu.Unlock()
		if first {
			http.Error(w, "try later", http.StatusInternalServerError)
		}
	}))
	defer hook.Close()
	if err := st.SetTeamWebhook(ctx, "nlp", hook.URL); err != nil {
		t.Fatal(err)
	}
	pool := storePool(t, st)
	client, err := jobs.NewClient(jobs.Config{Pool: pool, Store: st, WebhookBackoff: 50 * time.Millisecond, BudgetCheckInterval: time.Hour, AllowPrivateWebhooks: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer client.Stop(context.Background()) //nolint:errcheck
	for {
		ds, err := st.Deliveries(ctx, "nlp", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) >= 4 {
			codes := []int{}
			for _, d := range ds {
				codes = append(codes, *d.Status)
			}
			sort.Ints(codes)
			if codes[0] != 200 || codes[1] != 200 || codes[2] != 500 || codes[3] != 500 || len(ds) != 4 {
				t.Errorf("delivery log codes %v", codes)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("webhooks not delivered: %d attempts logged", len(ds))
		case <-time.After(50 * time.Millisecond):
		}
	}
	// A second check fires nothing new.
	again, err := jobs.BudgetCheck(ctx, st, nil)
	if err != nil || len(again) != 0 {
		t.Errorf("second check fired %v, %v", again, err)
	}
	alerts, err := st.BudgetAlerts(ctx, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range alerts {
		if !a.Month.Equal(store.MonthStart(st.Now())) {
			continue // last month's, seeded with the demo
		}
		got = append(got, a.Team+":"+itoa(a.ThresholdPct))
		if a.Team == "nlp" && a.ThresholdPct == 100 && !strings.Contains(a.Message, "run as preemptible") {
			t.Errorf("100 %% alert says %q", a.Message)
		}
	}
	sort.Strings(got)
	if strings.Join(got, ",") != "nlp:100,nlp:80,recs:80" {
		t.Errorf("alerts %v", got)
	}
}
