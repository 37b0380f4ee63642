package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/jackc/pgx/v5/pgxpool"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

const hour = int64(3600)

// capacityFixture builds, in a fresh database, the history the capacity
// tests read: nodes and their states over time written as the triggers
// would, and allocations on them.
type capacityFixture struct {
	t    *testing.T
	pool *pgxpool.Pool
	st   *store.Store
	job  int64
}

func newCapacityFixture(t *testing.T, now time.Time) *capacityFixture {
	t.Helper()
	t.Parallel()
	pool := storetest.Pool(t)
	st := store.New(pool)
	st.Now = func() time.Time { return now }
	f := &capacityFixture{t: t, pool: pool, st: st}
	f.exec(`INSERT INTO gpu_types (name, memory_gb) VALUES ('H100', 80), ('A100', 40), ('L4', 24)`)
	f.exec(`INSERT INTO gpu_rates (gpu_type, rate_micros, currency, effective_from) VALUES ('H100', 4000000, 'EUR', '1970-01-01'),
		('A100', 2000000, 'EUR', '1970-01-01'), ('L4', 500000, 'EUR', '1970-01-01')`)
	f.exec(`INSERT INTO teams (slug, name, cost_center) VALUES ('nlp', 'NLP', 'CC-1')`)
	f.exec(`INSERT INTO users (oidc_subject, email, name) VALUES ('u1', 'u1@example.com', 'U One')`)
	if err := pool.QueryRow(context.Background(), `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, submitted_at)
		SELECT 'j', 'nlp', id, '3', 1, 3600, '{true}', '2000-01-01' FROM users RETURNING id`).Scan(&f.job); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *capacityFixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// node creates a node whose history is exactly states: [at, state] pairs
// (registered from the first on; "gone" ends its registration).
func (f *capacityFixture) node(name, gpuType, site string, gpus int, states ...string) {
	f.t.Helper()
	f.exec(`INSERT INTO nodes (name, gpu_type, gpu_count, site, state, registered_at) VALUES ($1, $2, $3, $4, 'up', '2000-01-01')`, name, gpuType, gpus, site)
	f.exec(`DELETE FROM node_state_history WHERE node = $1`, name)
	for i := 0; i+1 < len(states); i += 2 {
		state, registered := states[i+1], true
		if state == "gone" {
			state, registered = "down", false
		}
		f.exec(`INSERT INTO node_state_history (node, at, state, gpu_type, gpus, site, registered) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			name, at(states[i]), state, gpuType, gpus, site, registered)
	}
}

// alloc records GPU gpu of node held from from to to ("" to: still held).
func (f *capacityFixture) alloc(node string, gpu int, from, to string) {
	f.t.Helper()
	var rel *time.Time
	if to != "" {
		r := at(to)
		rel = &r
	}
	f.exec(`INSERT INTO allocations (job_id, node, gpu_index, started_at, released_at) VALUES ($1, $2, $3, $4, $5)`, f.job, node, gpu, at(from), rel)
}

func (f *capacityFixture) capacity(month string) store.Capacity {
	f.t.Helper()
	m, err := billing.ParseMonth(month)
	if err != nil {
		f.t.Fatal(err)
	}
	c, err := f.st.CapacityOf(context.Background(), m)
	if err != nil {
		f.t.Fatal(err)
	}
	// The identity holds for every row and the total, whatever the data.
	for _, r := range append(c.Rows, c.Total) {
		if r.RegisteredGPUSeconds != r.AllocatedGPUSeconds+r.IdleGPUSeconds+r.DrainedDownGPUSeconds {
			f.t.Errorf("%s %s/%s: registered %d ≠ allocated %d + idle %d + drained/down %d", month, r.GPUType, r.Site,
				r.RegisteredGPUSeconds, r.AllocatedGPUSeconds, r.IdleGPUSeconds, r.DrainedDownGPUSeconds)
		}
		if r.IdleGPUSeconds < 0 || r.DrainedDownGPUSeconds < 0 || r.AllocatedGPUSeconds < 0 {
			f.t.Errorf("%s %s/%s: negative figure %+v", month, r.GPUType, r.Site, r)
		}
	}
	return c
}

func row(t *testing.T, c store.Capacity, gpuType string) store.CapacityRow {
	t.Helper()
	for _, r := range c.Rows {
		if r.GPUType == gpuType {
			return r
		}
	}
	t.Fatalf("%s: no row for %s in %+v", c.Month, gpuType, c.Rows)
	return store.CapacityRow{}
}

type secs struct{ registered, allocated, idle, down int64 }

func checkRow(t *testing.T, c store.Capacity, gpuType string, want secs) store.CapacityRow {
	t.Helper()
	r := row(t, c, gpuType)
	got := secs{r.RegisteredGPUSeconds, r.AllocatedGPUSeconds, r.IdleGPUSeconds, r.DrainedDownGPUSeconds}
	if got != want {
		t.Errorf("%s %s: got registered/allocated/idle/down %v s, want %v s", c.Month, gpuType, got, want)
	}
	return r
}

// TestCapacityExact: a node registered for part of a leap February,
// draining then drained for hours with a job still on it, one registered
// across January's end and lost (down) later, one across the year's end;
// every figure exact to the GPU-second, and the unrecovered cost to the
// cent.
func TestCapacityExact(t *testing.T) {
	f := newCapacityFixture(t, at("2029-01-01T00:10:00Z"))
	f.exec(`UPDATE gpu_types SET capacity_cost_micros = 2500000 WHERE name = 'H100'`)
	// h1: 8 H100, registered Feb 10; draining 06:00–07:00 and drained to
	// 16:00 on Feb 12; up to the end.
	f.node("h1", "H100", "onprem", 8,
		"2028-02-10T00:00:00Z", "up", "2028-02-12T06:00:00Z", "draining", "2028-02-12T07:00:00Z", "drained", "2028-02-12T16:00:00Z", "up")
	f.alloc("h1", 0, "2028-02-11T00:00:00Z", "2028-02-11T05:00:01Z") // 5 h 1 s, up
	f.alloc("h1", 2, "2028-02-12T05:00:00Z", "2028-02-12T07:00:00Z") // 1 h up, 1 h draining
	f.alloc("h1", 3, "2028-02-28T23:00:00Z", "2028-03-01T02:00:00Z") // 25 h in February (leap day)
	f.alloc("h1", 9, "2028-02-20T00:00:00Z", "2028-02-20T01:00:00Z") // a GPU it does not have: outside
	f.alloc("h1", 1, "2028-02-09T00:00:00Z", "2028-02-10T00:30:00Z") // before it registered: 24 h outside, 30 min in
	// a2: 2 A100, registered Jan 31 20:00, lost on Feb 20 and down since.
	f.node("a2", "A100", "onprem", 2, "2028-01-31T20:00:00Z", "up", "2028-02-20T00:00:00Z", "down")
	f.alloc("a2", 0, "2028-01-31T22:00:00Z", "2028-02-01T03:00:00Z")
	// l1: 1 L4 in the cloud, Dec 31 23:00 to Jan 1 00:05 (released).
	f.node("l1", "L4", "cloud", 1, "2028-12-31T23:00:00Z", "up", "2029-01-01T00:05:00Z", "gone")
	f.alloc("l1", 0, "2028-12-31T23:30:00Z", "") // still held at now

	feb := f.capacity("2028-02")
	if !feb.From.Equal(at("2028-02-01T00:00:00Z")) || !feb.To.Equal(at("2028-03-01T00:00:00Z")) || feb.Currency != "EUR" {
		t.Errorf("February: period %s–%s %s", feb.From, feb.To, feb.Currency)
	}
	// h1: 20 days × 24 h × 8 GPUs = 3840 GPU-h; 10 h not up × 8 = 80.
	// Allocated: 5 h 1 s + 2 h + 25 h + 30 min = 32 h 30 min 1 s, of
	// which 1 h while draining.
	alloc := 32*hour + 1800 + 1
	h := checkRow(t, feb, "H100", secs{3840 * hour, alloc, 3840*hour - 80*hour - (alloc - hour), 80*hour - hour})
	if h.Site != "onprem" || h.CostPerGPUHour == nil || h.CostPerGPUHour.Decimal() != "2.50" {
		t.Errorf("H100 cost per GPU-hour: %+v", h.CostPerGPUHour)
	}
	// 3840 h × 2.50 = 9600.00; (3840 h − 32 h 30 min 1 s) × 2.50 = 9518.749305… → 9518.75.
	if h.CapacityCost.Decimal() != "9600.00" || h.UnrecoveredCost.Decimal() != "9518.75" || h.UnrecoveredCost.Currency != "EUR" {
		t.Errorf("H100 costs: capacity %s, unrecovered %s", h.CapacityCost, h.UnrecoveredCost)
	}
	// a2: all 29 days × 24 h × 2 = 1392 GPU-h, down from the 20th: 10 days
	// (480), leap day included.
	a := checkRow(t, feb, "A100", secs{1392 * hour, 3 * hour, 912*hour - 3*hour, 480 * hour})
	if a.CostPerGPUHour != nil || a.UnrecoveredCost.Micros != 0 {
		t.Errorf("A100 has no cost set: %+v", a)
	}
	if feb.AllocatedOutsideGPUSeconds != 25*hour {
		t.Errorf("February: allocated outside capacity %d s, want 25 h (GPU 9 of h1, GPU 1 before registration)", feb.AllocatedOutsideGPUSeconds)
	}
	if feb.Total.RegisteredGPUSeconds != (3840+1392)*hour || feb.Total.UnrecoveredCost.Decimal() != "9518.75" {
		t.Errorf("February total: %+v", feb.Total)
	}

	jan := f.capacity("2028-01")
	checkRow(t, jan, "A100", secs{8 * hour, 2 * hour, 6 * hour, 0})
	if len(jan.Rows) != 1 {
		t.Errorf("January 2028: rows %+v", jan.Rows)
	}
	mar := f.capacity("2028-03")
	// h1 all of March (31 days × 8), GPU 3 held to 02:00; a2 down all month.
	checkRow(t, mar, "H100", secs{31 * 24 * 8 * hour, 2 * hour, 31*24*8*hour - 2*hour, 0})
	checkRow(t, mar, "A100", secs{31 * 24 * 2 * hour, 0, 0, 31 * 24 * 2 * hour})

	dec := f.capacity("2028-12")
	checkRow(t, dec, "L4", secs{hour, hour / 2, hour / 2, 0})
	if l := row(t, dec, "L4"); l.Site != "cloud" || l.CostPerGPUHour != nil {
		t.Errorf("L4 is cloud capacity without an owned cost: %+v", l)
	}
	// This month, up to now (00:10): l1 registered 5 min, held all 5; its
	// allocation still open after its release is outside capacity.
	cur := f.capacity("2029-01")
	if !cur.To.Equal(at("2029-01-01T00:10:00Z")) {
		t.Errorf("January 2029 ends at now, got %s", cur.To)
	}
	checkRow(t, cur, "L4", secs{300, 300, 0, 0})
	checkRow(t, cur, "H100", secs{600 * 8, 0, 600 * 8, 0})
	if cur.AllocatedOutsideGPUSeconds != 300 {
		t.Errorf("January 2029: outside %d s, want 300", cur.AllocatedOutsideGPUSeconds)
	}
	future := f.capacity("2029-02")
	if len(future.Rows) != 0 || future.Total.RegisteredGPUSeconds != 0 {
		t.Errorf("a future month has no capacity: %+v", future)
	}
}

// TestCapacityHistoryRecorded: the triggers record what the store does to
// a node (created, registered, drained, undrained, lost) on Allot's clock,
// which the API server's connections (store.Open) share with the
// database.
func TestCapacityHistoryRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := store.Open(ctx, storetest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := store.New(pool)
	if _, err := pool.Exec(ctx, `INSERT INTO gpu_types (name, memory_gb) VALUES ('H100', 80)`); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateNode(ctx, &allot.Node{Name: "n1", GPUType: "H100", GPUCount: 2, Site: allot.SiteOnPrem, State: allot.NodeDown}); err != nil {
		t.Fatal(err)
	}
	inv := store.NodeInventory{Hostname: "n1", GPUs: []store.NodeGPU{{Index: 0, UUID: "GPU-a", Model: "H100"}, {Index: 1, UUID: "GPU-b", Model: "H100"}}}
	if _, err := st.RegisterNode(ctx, "n1", inv); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RegisterNode(ctx, "n1", inv); err != nil { // again: no change, no row
		t.Fatal(err)
	}
	if _, err := st.DrainNode(ctx, "admin@example.com", "n1", "maintenance", false); err != nil {
		t.Fatal(err)
	}
	if err := st.UndrainNode(ctx, "admin@example.com", "n1", "done"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.MarkLostNodes(ctx, clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT state, registered, gpus, at FROM node_state_history WHERE node = 'n1' ORDER BY at, id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var state string
		var registered bool
		var gpus int
		var when time.Time
		if err := rows.Scan(&state, &registered, &gpus, &when); err != nil {
			t.Fatal(err)
		}
		r := state
		if registered {
			r += "+registered"
		}
		got = append(got, r)
		if d := clock.Now().Sub(when); d < -2*time.Second || d > time.Minute || when.Nanosecond() != 0 {
			t.Errorf("%s recorded at %s, Allot's clock says %s", r, when, clock.Now())
		}
	}
	want := []string{"down", "up+registered", "drained+registered", "up+registered", "down+registered"}
	if len(got) != len(want) {
		t.Fatalf("history %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("history %v, want %v", got, want)
		}
	}
}

// TestCapacityBurstRelease: a burst node leaves registered capacity when
// its release starts, and a provider that reuses its name brings a new
// machine that counts once it registers.
func TestCapacityBurstRelease(t *testing.T) {
	f := newCapacityFixture(t, at("2029-01-01T00:10:00Z"))
	ctx := context.Background()
	event := func(kind string) int64 {
		var id int64
		if err := f.pool.QueryRow(ctx, `INSERT INTO burst_events (at, kind, status, provider, reason, pending_gpu_seconds, mean_wait_s, pending_jobs,
			nodes_wanted, gpu_type, gpus_per_node) VALUES (now(), $1, 'done', 'local', 'test', 0, 0, 0, 1, 'L4', 1) RETURNING id`, kind).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	req := event("request")
	f.exec(`INSERT INTO nodes (name, gpu_type, gpu_count, site, state) VALUES ('burst-0', 'L4', 1, 'cloud', 'down')`)
	f.exec(`INSERT INTO burst_nodes (event_id, node, provider, gpus, rate_micros, currency, provisioned_at) VALUES ($1, 'burst-0', 'local', 1, 1000000, 'EUR', now())`, req)
	f.exec(`UPDATE nodes SET state = 'up', registered_at = now() WHERE name = 'burst-0'`)
	rel := event("release")
	f.exec(`UPDATE nodes SET state = 'down' WHERE name = 'burst-0'`)
	f.exec(`UPDATE burst_nodes SET release_event_id = $1 WHERE node = 'burst-0'`, rel)
	f.exec(`UPDATE burst_nodes SET released_at = now() WHERE node = 'burst-0'`)
	// Reused: not registered, a new request, then registered.
	f.exec(`UPDATE nodes SET state = 'down', registered_at = NULL WHERE name = 'burst-0'`)
	req2 := event("request")
	f.exec(`INSERT INTO burst_nodes (event_id, node, provider, gpus, rate_micros, currency, provisioned_at) VALUES ($1, 'burst-0', 'local', 1, 1000000, 'EUR', now() + interval '1 second')`, req2)
	f.exec(`UPDATE nodes SET state = 'up', registered_at = now() WHERE name = 'burst-0'`)
	rows, err := f.pool.Query(ctx, `SELECT state, registered FROM node_state_history WHERE node = 'burst-0' ORDER BY at, id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var state string
		var registered bool
		if err := rows.Scan(&state, &registered); err != nil {
			t.Fatal(err)
		}
		if registered {
			state += "+registered"
		}
		got = append(got, state)
	}
	// down (created), up (registered), down (release starts: still
	// registered a moment), released, down (new machine), up (registered).
	want := "down up+registered down+registered down down up+registered"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("burst node history %q, want %q", g, want)
	}
}
