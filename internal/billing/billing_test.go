package billing

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/google/go-cmp/cmp"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

const usd = 1_000_000 // micros per dollar

var (
	h100Change  = at("2026-03-15T12:10:00Z") // H100 2.50 -> 3.00, mid-month, mid-hour
	tier4Change = at("2026-03-20T06:30:00Z") // tier 4 x1 -> x0.8
)

func testCard(t testing.TB) *RateCard {
	t.Helper()
	start := at("2026-01-01T00:00:00Z")
	c, err := NewRateCard([]Rate{
		{GPUType: "H100", Micros: 2_500_000, Currency: "USD", EffectiveFrom: start},
		{GPUType: "H100", Micros: 3_000_000, Currency: "USD", EffectiveFrom: h100Change},
		{GPUType: "A100", Micros: 1_234_567, Currency: "usd", EffectiveFrom: start},
	}, []Multiplier{
		{Tier: allot.Tier1, BP: 10000, EffectiveFrom: start},
		{Tier: allot.Tier2, BP: 10000, EffectiveFrom: start},
		{Tier: allot.Tier3, BP: 10000, EffectiveFrom: start},
		{Tier: allot.Tier4, BP: 10000, EffectiveFrom: start},
		{Tier: allot.Tier4, BP: 8000, EffectiveFrom: tier4Change},
		{Tier: allot.TierPreemptible, BP: 3000, EffectiveFrom: start},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func seg(start, end string) Segment {
	return Segment{JobID: 42, Segment: 1, Team: "ml", User: "ada@example.com", CostCenter: "cc-7",
		TierAsRun: allot.Tier3, GPUType: "H100", Node: "n1", GPUs: 1, Start: at(start), End: at(end)}
}

type span struct{ Start, End string }

func spans(ps []Piece, kind Kind) []span {
	var out []span
	for _, p := range ps {
		if p.Kind == kind {
			out = append(out, span{p.Start.Format(time.RFC3339), p.End.Format(time.RFC3339)})
		}
	}
	return out
}

func TestSplit(t *testing.T) {
	card := testCard(t)
	for _, tc := range []struct {
		name string
		seg  Segment
		want []span
	}{
		{"within an hour", seg("2026-03-02T10:05:00Z", "2026-03-02T10:55:00Z"),
			[]span{{"2026-03-02T10:05:00Z", "2026-03-02T10:55:00Z"}}},
		{"month edge, sub-second ends floored", seg("2026-03-31T23:30:00.7Z", "2026-04-01T01:15:00.5Z"),
			[]span{{"2026-03-31T23:30:00Z", "2026-04-01T00:00:00Z"}, {"2026-04-01T00:00:00Z", "2026-04-01T01:00:00Z"}, {"2026-04-01T01:00:00Z", "2026-04-01T01:15:00Z"}}},
		{"rate change mid-hour", seg("2026-03-15T11:50:00Z", "2026-03-15T12:30:00Z"),
			[]span{{"2026-03-15T11:50:00Z", "2026-03-15T12:00:00Z"}, {"2026-03-15T12:00:00Z", "2026-03-15T12:10:00Z"}, {"2026-03-15T12:10:00Z", "2026-03-15T12:30:00Z"}}},
		{"time zone offset is UTC", seg("2026-03-02T05:30:00-05:00", "2026-03-02T06:10:00-05:00"),
			[]span{{"2026-03-02T10:30:00Z", "2026-03-02T11:00:00Z"}, {"2026-03-02T11:00:00Z", "2026-03-02T11:10:00Z"}}},
		{"empty", seg("2026-03-02T10:05:00Z", "2026-03-02T10:05:00.9Z"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps, err := Split(card, []Segment{tc.seg})
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, spans(ps, KindCharge)); d != "" {
				t.Errorf("pieces (-want +got):\n%s", d)
			}
		})
	}
}

func TestSplitErrors(t *testing.T) {
	card := testCard(t)
	for _, tc := range []struct {
		name string
		mod  func(*Segment)
		want string
	}{
		{"before first rate", func(s *Segment) { s.Start = at("2025-12-31T23:00:00Z") }, "no rate for GPU type"},
		{"unknown gpu type", func(s *Segment) { s.GPUType = "T4" }, "no rate for GPU type"},
		{"end before start", func(s *Segment) { s.End = at("2026-03-01T00:00:00Z") }, "must not be before start"},
		{"no gpus", func(s *Segment) { s.GPUs = 0 }, "gpus"},
		{"bad tier", func(s *Segment) { s.TierAsRun = "gold" }, "unknown tier"},
		{"no team", func(s *Segment) { s.Team = "" }, "team"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := seg("2026-03-02T10:00:00Z", "2026-03-02T12:00:00Z")
			tc.mod(&s)
			_, err := Split(card, []Segment{s})
			if err == nil || !strings.Contains(err.Error(), tc.want) || allot.ErrorCode(err) != allot.EInvalid {
				t.Fatalf("err = %v, want invalid containing %q", err, tc.want)
			}
		})
	}
}

func TestNewRateCardErrors(t *testing.T) {
	t0 := at("2026-01-01T00:00:00Z")
	for _, tc := range []struct {
		name  string
		rates []Rate
		mults []Multiplier
		want  string
	}{
		{"mixed currency", []Rate{{"H100", 1, "USD", t0}, {"A100", 1, "EUR", t0}}, nil, "one currency"},
		{"duplicate version", []Rate{{"H100", 1, "USD", t0}, {"H100", 2, "USD", t0.Add(300 * time.Millisecond)}}, nil, "two rates"},
		{"negative rate", []Rate{{"H100", -1, "USD", t0}}, nil, "rate"},
		{"bad currency", []Rate{{"H100", 1, "US", t0}}, nil, "ISO 4217"},
		{"bad tier", nil, []Multiplier{{"gold", 10000, t0}}, "unknown tier"},
		{"multiplier too big", nil, []Multiplier{{allot.Tier1, 100001, t0}}, "between 0 and 10"},
		{"no effective date", nil, []Multiplier{{allot.Tier1, 10000, time.Time{}}}, "required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRateCard(tc.rates, tc.mults)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestLineAmount(t *testing.T) {
	for _, tc := range []struct {
		name     string
		gs, rate int64
		bp       int
		cur      string
		want     int64
	}{
		{"one GPU-hour", 3600, 2_500_000, 10000, "USD", 2_500_000},
		{"preemptible x0.3", 3600, 2_500_000, 3000, "USD", 750_000},
		{"one second rounds to 0", 1, 2_500_000, 10000, "USD", 0},
		{"half a cent rounds up", 18, usd, 10000, "USD", 10_000},
		{"just under half a cent", 17, usd, 10000, "USD", 0},
		{"credit: half a cent rounds away from zero", -18, usd, 10000, "USD", -10_000},
		{"odd rate", 7 * 3600, 1_234_567, 10000, "USD", 8_640_000}, // 8.641969 -> 8.64
		{"yen: zero decimals", 3600, 1_500_000, 10000, "JPY", 2_000_000},
		{"dinar: three decimals", 3600, 1_234_567, 10000, "KWD", 1_235_000},
		{"10000 GPUs x 31 days at 1000/h x10", 10000 * 31 * 86400, 1000 * usd, MaxMultiplierBP, "USD", 10000 * 31 * 24 * 1000 * usd * 10},
		{"10000 GPUs x 31 days, odd rate", 10000*31*86400 + 1, 1_234_567, 3000, "USD", 2_755_553_540_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LineAmount(tc.gs, tc.rate, tc.bp, tc.cur)
			if err != nil {
				t.Fatal(err)
			}
			if got.Micros != tc.want || got.Currency != tc.cur {
				t.Errorf("got %d %s, want %d", got.Micros, got.Currency, tc.want)
			}
		})
	}
	// Too large for int64 micro-units: an error, never a wrong amount.
	if _, err := LineAmount(10000*31*86400, MaxRateMicros, MaxMultiplierBP, "USD"); err == nil {
		t.Error("no overflow error")
	}
	if _, err := LineAmount(1<<62, MaxRateMicros, MaxMultiplierBP, "USD"); err == nil {
		t.Error("no overflow error")
	}
	if _, err := LineAmount(1, -1, 1, "USD"); err == nil {
		t.Error("negative rate accepted")
	}
}

func mustLines(t testing.TB, card *RateCard, segs ...Segment) []Line {
	t.Helper()
	ps, err := Split(card, segs)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := Lines(ps)
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

type short struct {
	Kind   Kind
	Hour   string
	GS     int64
	Amount int64
}

func shorten(ls []Line) []short {
	var out []short
	for _, l := range ls {
		out = append(out, short{l.Kind, l.Hour.Format("01-02T15"), l.GPUSeconds, l.Amount.Micros})
	}
	return out
}

func TestLines(t *testing.T) {
	card := testCard(t)
	demoted := seg("2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z")
	demoted.TierAsRun = allot.TierPreemptible // a tier-3 job demoted for budget
	eight := seg("2026-03-02T10:30:00Z", "2026-03-02T11:30:00Z")
	eight.GPUs = 8
	noCkpt := seg("2026-03-02T10:00:00Z", "2026-03-02T11:30:00Z")
	noCkpt.PreemptedAt = noCkpt.End
	ckpt := noCkpt
	ckpt.Checkpointable, ckpt.LastCheckpoint = true, at("2026-03-02T11:10:00Z")
	oldCkpt := ckpt
	oldCkpt.LastCheckpoint = at("2026-03-01T00:00:00Z") // from an earlier segment: nothing of this one kept
	neverCkpt := ckpt
	neverCkpt.LastCheckpoint = time.Time{}
	t4 := seg("2026-03-20T06:00:00Z", "2026-03-20T07:00:00Z")
	t4.TierAsRun = allot.Tier4
	for _, tc := range []struct {
		name string
		seg  Segment
		want []short
	}{
		{"one hour", seg("2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z"), []short{{KindCharge, "03-02T10", 3600, 2_500_000}}},
		{"demoted bills as preemptible", demoted, []short{{KindCharge, "03-02T10", 3600, 750_000}}},
		{"8 GPUs over two hours", eight, []short{{KindCharge, "03-02T10", 14400, 10_000_000}, {KindCharge, "03-02T11", 14400, 10_000_000}}},
		{"rate change", seg("2026-03-15T12:00:00Z", "2026-03-15T13:00:00Z"), []short{
			{KindCharge, "03-15T12", 600, 420_000}, // 0.416667 -> 0.42
			{KindCharge, "03-15T12", 3000, 2_500_000}}},
		{"multiplier change", t4, []short{{KindCharge, "03-20T06", 1800, 1_500_000}, {KindCharge, "03-20T06", 1800, 1_200_000}}},
		{"preempted, not checkpointable: all credited", noCkpt, []short{
			{KindCharge, "03-02T10", 3600, 2_500_000}, {KindPreemptionCredit, "03-02T10", -3600, -2_500_000},
			{KindCharge, "03-02T11", 1800, 1_250_000}, {KindPreemptionCredit, "03-02T11", -1800, -1_250_000}}},
		{"preempted, checkpointed: time since checkpoint credited", ckpt, []short{
			{KindCharge, "03-02T10", 3600, 2_500_000},
			{KindCharge, "03-02T11", 1800, 1_250_000}, {KindPreemptionCredit, "03-02T11", -1200, -830_000}}},
		{"checkpoint before the segment: all credited", oldCkpt, []short{
			{KindCharge, "03-02T10", 3600, 2_500_000}, {KindPreemptionCredit, "03-02T10", -3600, -2_500_000},
			{KindCharge, "03-02T11", 1800, 1_250_000}, {KindPreemptionCredit, "03-02T11", -1800, -1_250_000}}},
		{"checkpointable, never checkpointed: all credited", neverCkpt, []short{
			{KindCharge, "03-02T10", 3600, 2_500_000}, {KindPreemptionCredit, "03-02T10", -3600, -2_500_000},
			{KindCharge, "03-02T11", 1800, 1_250_000}, {KindPreemptionCredit, "03-02T11", -1800, -1_250_000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, shorten(mustLines(t, card, tc.seg))); d != "" {
				t.Errorf("lines (-want +got):\n%s", d)
			}
		})
	}
}

func TestLineKeyString(t *testing.T) {
	ls := mustLines(t, testCard(t), seg("2026-03-02T10:00:00Z", "2026-03-02T10:30:00Z"))
	want := `charge|2026-03|2026-03-02T10:00:00Z|42/1|"ml"|"cc-7"|"ada@example.com"|3|"H100"|2026-01-01T00:00:00Z|2026-01-01T00:00:00Z`
	if got := ls[0].Key().String(); got != want {
		t.Errorf("key = %s\nwant  %s", got, want)
	}
}

func TestTotals(t *testing.T) {
	card := testCard(t)
	a := seg("2026-03-02T10:00:00Z", "2026-03-02T12:00:00Z")
	b := seg("2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z")
	b.JobID, b.Team, b.User, b.GPUType, b.TierAsRun = 7, "cv", "bob@example.com", "A100", allot.TierPreemptible
	b.PreemptedAt = b.End
	s, err := Totals(mustLines(t, card, a, b))
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{
		Currency: "USD",
		Total:    Total{GPUSeconds: 7200, Charges: 5_370_000, Credits: -370_000, Amount: 5_000_000},
		ByTeam: map[string]Total{
			"ml": {GPUSeconds: 7200, Charges: 5_000_000, Amount: 5_000_000},
			"cv": {GPUSeconds: 0, Charges: 370_000, Credits: -370_000, Amount: 0},
		},
		ByTeamGPUTier: map[TeamGPUTier]Total{
			{"ml", "H100", allot.Tier3}:           {GPUSeconds: 7200, Charges: 5_000_000, Amount: 5_000_000},
			{"cv", "A100", allot.TierPreemptible}: {GPUSeconds: 0, Charges: 370_000, Credits: -370_000, Amount: 0},
		},
		ByUser: map[string]Total{
			"ada@example.com": {GPUSeconds: 7200, Charges: 5_000_000, Amount: 5_000_000},
			"bob@example.com": {GPUSeconds: 0, Charges: 370_000, Credits: -370_000, Amount: 0},
		},
		ByJob: map[int64]Total{
			42: {GPUSeconds: 7200, Charges: 5_000_000, Amount: 5_000_000},
			7:  {GPUSeconds: 0, Charges: 370_000, Credits: -370_000, Amount: 0},
		},
	}
	if d := cmp.Diff(want, s); d != "" {
		t.Errorf("totals (-want +got):\n%s", d)
	}
	mixed := []Line{{Amount: allot.Money{Currency: "USD"}}, {Amount: allot.Money{Currency: "EUR"}}}
	if _, err := Totals(mixed); err == nil {
		t.Error("mixed currencies accepted")
	}
}

func TestParseMonth(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"2026-03", "2026-03", ""},
		{"0001-01", "0001-01", ""},
		{"9999-12", "9999-12", ""},
		{"2026-13", "", "month must be 01 to 12"},
		{"2026-00", "", "month must be 01 to 12"},
		{"2026-1", "", "must be YYYY-MM"},
		{"abc", "", "must be YYYY-MM"},
		{"", "", "is required"},
		{"0000-05", "", "year must be"},
		{"2026/03", "", "must be YYYY-MM"},
		{" 2026-03", "", "must be YYYY-MM"},
		{"2026-03-01", "", "must be YYYY-MM"},
		{"+026-03", "", "must be YYYY-MM"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			m, err := ParseMonth(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || allot.ErrorCode(err) != allot.EInvalid {
					t.Fatalf("ParseMonth(%q) = %v, %v; want error %q", tc.in, m, err, tc.err)
				}
				return
			}
			if err != nil || m.String() != tc.want {
				t.Fatalf("ParseMonth(%q) = %v, %v", tc.in, m, err)
			}
		})
	}
}

func TestMonth(t *testing.T) {
	now := at("2026-03-31T23:59:59.999-05:00") // April in UTC
	if got := Month(now).String(); got != "2026-04" {
		t.Errorf("Month = %s", got)
	}
	m, _ := ParseMonth("2026-12")
	if m.Next().String() != "2027-01" || !m.End().Equal(at("2027-01-01T00:00:00Z")) || !m.Start().Equal(at("2026-12-01T00:00:00Z")) {
		t.Errorf("Next/Start/End wrong: %v %v %v", m.Next(), m.Start(), m.End())
	}
	if _, err := CheckMonth("2026-04", now); err != nil {
		t.Errorf("current month rejected: %v", err)
	}
	if _, err := CheckMonth("2026-03", now); err != nil {
		t.Errorf("past month rejected: %v", err)
	}
	if _, err := CheckMonth("2026-05", now); err == nil || !strings.Contains(err.Error(), "future") {
		t.Errorf("future month: err = %v", err)
	}
	if _, err := CheckMonth("2026-13", now); err == nil {
		t.Error("2026-13 accepted")
	}
}

func TestCheckEffective(t *testing.T) {
	open, _ := ParseMonth("2026-04")
	if err := CheckEffective(at("2026-03-31T23:59:59Z"), open); allot.ErrorCode(err) != allot.EConflict {
		t.Errorf("backdated change: err = %v", err)
	}
	if err := CheckEffective(at("2026-04-01T00:00:00Z"), open); err != nil {
		t.Errorf("change in open month: %v", err)
	}
}

func TestAdjustLateSegment(t *testing.T) {
	card := testCard(t)
	mar, _ := ParseMonth("2026-03")
	apr := mar.Next()
	a := seg("2026-03-02T10:00:00Z", "2026-03-02T11:00:00Z")
	billed := mustLines(t, card, a)
	late := seg("2026-03-31T23:00:00Z", "2026-04-01T00:30:00Z") // reported after March closed
	late.JobID = 43
	var recomputed []Line
	for _, l := range mustLines(t, card, a, late) {
		if l.Month == mar {
			recomputed = append(recomputed, l)
		}
	}
	adj, err := Adjust(mar, billed, recomputed, apr)
	if err != nil {
		t.Fatal(err)
	}
	if len(adj) != 1 {
		t.Fatalf("adjustments = %+v", adj)
	}
	got := adj[0]
	if got.Kind != KindAdjustment || got.Adjusts != KindCharge || got.Month != apr || got.JobID != 43 ||
		!got.Hour.Equal(at("2026-03-31T23:00:00Z")) || got.GPUSeconds != 3600 || got.Amount.Micros != 3_000_000 {
		t.Errorf("adjustment = %+v", got)
	}
	// Idempotent: the open month's adjustments are replaced, not added to.
	again, err := Adjust(mar, append(billed, adj...), recomputed, apr)
	if err != nil || !cmp.Equal(adj, again) {
		t.Errorf("rerun: %v\n%s", err, cmp.Diff(adj, again))
	}
	if _, err := Adjust(mar, billed, recomputed, mar); err == nil {
		t.Error("adjustment dated in the closed month accepted")
	}
	if _, err := Adjust(apr, billed, recomputed, apr.Next()); err == nil {
		t.Error("lines of another month accepted")
	}
}

func TestErrorsAreDomainErrors(t *testing.T) {
	_, err := ParseMonth("x")
	var e *allot.Error
	if !errors.As(err, &e) {
		t.Fatalf("%T is not *allot.Error", err)
	}
}
