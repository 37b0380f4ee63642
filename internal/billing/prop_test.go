package billing

import (
	"fmt"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

var (
	propBase = at("2026-02-25T00:00:00Z") // window spans the Feb/Mar and Mar/Apr edges,
	propDays = int64(40)                  // the H100 rate change and the tier-4 multiplier change
	march    = YearMonth{2026, time.March}
)

func genInstant(t *rapid.T, label string, lo, hi int64) time.Time {
	sec := rapid.Int64Range(lo, hi).Draw(t, label)
	if rapid.IntRange(0, 3).Draw(t, label+"_aligned") == 0 {
		sec -= floorMod(sec, 3600) // on an hour boundary
	}
	ns := int64(0)
	if rapid.Bool().Draw(t, label+"_frac") {
		ns = rapid.Int64Range(0, 999_999_999).Draw(t, label+"_ns")
	}
	return time.Unix(sec, ns).UTC()
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

var (
	teams = []string{"ml", "cv", "nlp"}
	users = []string{"ada", "bob", "cy"}
)

func genSegment(t *rapid.T) Segment {
	lo := propBase.Unix()
	start := genInstant(t, "start", lo, lo+propDays*86400)
	var dur int64
	switch rapid.IntRange(0, 2).Draw(t, "durkind") {
	case 0:
		dur = rapid.Int64Range(0, 7200).Draw(t, "dur")
	case 1:
		dur = rapid.Int64Range(0, 3*86400).Draw(t, "dur")
	default:
		dur = 3600 * rapid.Int64Range(0, 48).Draw(t, "hours")
	}
	end := start.Add(time.Duration(dur)*time.Second + time.Duration(rapid.Int64Range(0, 999_999_999).Draw(t, "endns")))
	ti := rapid.IntRange(0, 2).Draw(t, "team")
	s := Segment{
		JobID: rapid.Int64Range(1, 20).Draw(t, "job"), Segment: rapid.IntRange(1, 3).Draw(t, "seg"),
		Team: teams[ti], CostCenter: "cc-" + teams[ti], User: rapid.SampledFrom(users).Draw(t, "user"),
		TierAsRun: rapid.SampledFrom(allot.Tiers).Draw(t, "tier"),
		GPUType:   rapid.SampledFrom([]string{"H100", "A100"}).Draw(t, "gpu"),
		Node:      "n1", GPUs: rapid.SampledFrom([]int{1, 2, 4, 8, 10000}).Draw(t, "gpus"),
		Start: start, End: end,
		Checkpointable: rapid.Bool().Draw(t, "ckptable"),
	}
	if rapid.Bool().Draw(t, "preempted") {
		s.PreemptedAt = s.End
		switch rapid.IntRange(0, 3).Draw(t, "ckpt") {
		case 0: // none
		case 1:
			s.LastCheckpoint = s.Start.Add(-time.Hour)
		case 2:
			s.LastCheckpoint = genInstant(t, "lc", s.Start.Unix(), s.End.Unix())
		default:
			s.LastCheckpoint = s.End.Add(time.Minute)
		}
	}
	return s
}

var genSegments = rapid.SliceOfN(rapid.Custom(genSegment), 0, 25)

// tb is what *testing.T and *rapid.T share.
type tb interface {
	Helper()
	Fatalf(string, ...any)
}

func split(t tb, card *RateCard, segs []Segment) []Piece {
	t.Helper()
	ps, err := Split(card, segs)
	if err != nil {
		t.Fatalf("Split: %v", err)
	}
	return ps
}

func lines(t tb, card *RateCard, segs []Segment) []Line {
	t.Helper()
	ls, err := Lines(split(t, card, segs))
	if err != nil {
		t.Fatalf("Lines: %v", err)
	}
	return ls
}

// Splitting preserves GPU-seconds exactly, and every piece lies within one
// hour under one rate and one multiplier version.
func TestPropSplitPreservesSeconds(t *testing.T) {
	card := testCard(t)
	rapid.Check(t, func(t *rapid.T) {
		segs := genSegments.Draw(t, "segs")
		ps := split(t, card, segs)
		charged := map[*Segment]int64{}
		credited := map[*Segment]int64{}
		last := map[[2]any]int64{}
		for i := range ps {
			p := &ps[i]
			a, b := p.Start.Unix(), p.End.Unix()
			if b <= a || floorDiv(a, 3600) != floorDiv(b-1, 3600) || Month(p.Start) != Month(p.End.Add(-time.Second)) {
				t.Fatalf("piece %v..%v is empty or crosses an hour", p.Start, p.End)
			}
			for _, at := range []time.Time{p.Start, p.End.Add(-time.Second)} {
				r, _ := card.RateAt(p.Seg.GPUType, at)
				m, _ := card.MultiplierAt(p.Seg.TierAsRun, at)
				if r != *p.Rate || m != *p.Multiplier {
					t.Fatalf("piece %v..%v: rate/multiplier at %v differ", p.Start, p.End, at)
				}
			}
			k := [2]any{p.Seg, p.Kind}
			if e, ok := last[k]; ok && e != a {
				t.Fatalf("pieces not contiguous: gap at %d..%d", e, a)
			}
			last[k] = b
			if p.Kind == KindCharge {
				charged[p.Seg] += p.GPUSeconds()
			} else {
				credited[p.Seg] += p.GPUSeconds()
			}
		}
		for i := range segs {
			s := &segs[i]
			if got, want := charged[s], s.Seconds()*int64(s.GPUs); got != want {
				t.Fatalf("segment %d: pieces have %d GPU-seconds, segment %d", i, got, want)
			}
			a, b := s.LostWindow()
			if got, want := credited[s], (b-a)*int64(s.GPUs); got != want {
				t.Fatalf("segment %d: credit pieces have %d GPU-seconds, lost window %d", i, got, want)
			}
		}
	})
}

// presplit cuts each segment at random instants (with sub-second parts) into
// consecutive segments with the same fields.
func presplit(t *rapid.T, segs []Segment) []Segment {
	var out []Segment
	for i, s := range segs {
		n := rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("cuts%d", i))
		if s.End.Sub(s.Start) < 2 || n == 0 {
			out = append(out, s)
			continue
		}
		cuts := make([]time.Time, n)
		for j := range cuts {
			d := rapid.Int64Range(1, int64(s.End.Sub(s.Start))-1).Draw(t, fmt.Sprintf("cut%d_%d", i, j))
			cuts[j] = s.Start.Add(time.Duration(d))
		}
		slices.SortFunc(cuts, time.Time.Compare)
		from := s.Start
		for _, c := range append(cuts, s.End) {
			p := s
			p.Start, p.End = from, c
			out = append(out, p)
			from = c
		}
	}
	return out
}

// Lines do not depend on input order, on the order of pieces, or on
// pre-splitting segments at arbitrary instants; rolling twice is identical.
func TestPropLinesInvariant(t *testing.T) {
	card := testCard(t)
	rapid.Check(t, func(t *rapid.T) {
		segs := genSegments.Draw(t, "segs")
		want := lines(t, card, segs)
		if again := lines(t, card, segs); !cmp.Equal(want, again) {
			t.Fatalf("second roll differs:\n%s", cmp.Diff(want, again))
		}
		other := rapid.Permutation(presplit(t, segs)).Draw(t, "presplit")
		if got := lines(t, card, other); !cmp.Equal(want, got) {
			t.Fatalf("pre-split/permuted input changes lines (-want +got):\n%s", cmp.Diff(want, got))
		}
		ps := rapid.Permutation(split(t, card, segs)).Draw(t, "pieces")
		got, err := Lines(ps)
		if err != nil {
			t.Fatal(err)
		}
		if !cmp.Equal(want, got) {
			t.Fatalf("permuted pieces change lines:\n%s", cmp.Diff(want, got))
		}
		for i := 1; i < len(want); i++ {
			if CompareKeys(want[i-1].LineKey, want[i].LineKey) >= 0 {
				t.Fatalf("lines not strictly sorted by key at %d", i)
			}
		}
	})
}

type net struct{ GPUSeconds, Amount int64 }

func netOf(t Total) net { return net{t.GPUSeconds, t.Amount} }

// The sum of line amounts equals every total exactly; amounts are whole
// cents, never negative except credits; no charge nets below zero.
func TestPropTotals(t *testing.T) {
	card := testCard(t)
	rapid.Check(t, func(t *rapid.T) {
		ls := lines(t, card, genSegments.Draw(t, "segs"))
		s, err := Totals(ls)
		if err != nil {
			t.Fatal(err)
		}
		var grand Total
		team := map[string]Total{}
		tgt := map[TeamGPUTier]Total{}
		user := map[string]Total{}
		job := map[int64]Total{}
		perKey := map[LineKey]int64{}
		perSeg := map[[2]int64]int64{}
		for _, l := range ls {
			m := l.Amount.Micros
			if m%10_000 != 0 {
				t.Fatalf("amount %d is not whole cents", m)
			}
			switch l.Kind {
			case KindCharge:
				if m < 0 || l.GPUSeconds <= 0 {
					t.Fatalf("charge line %+v negative", l)
				}
			case KindPreemptionCredit:
				if m > 0 || l.GPUSeconds >= 0 {
					t.Fatalf("credit line %+v positive", l)
				}
			default:
				t.Fatalf("kind %q", l.Kind)
			}
			if want, _ := LineAmount(l.GPUSeconds, l.RateMicros, l.MultiplierBP, "USD"); want != l.Amount {
				t.Fatalf("line %+v: amount is not its seconds priced once (%v)", l, want)
			}
			add := func(x Total) Total {
				x.GPUSeconds += l.GPUSeconds
				x.Amount += m
				if l.Kind == KindCharge {
					x.Charges += m
				} else {
					x.Credits += m
				}
				return x
			}
			grand = add(grand)
			team[l.Team] = add(team[l.Team])
			k := TeamGPUTier{l.Team, l.GPUType, l.Tier}
			tgt[k] = add(tgt[k])
			user[l.User] = add(user[l.User])
			job[l.JobID] = add(job[l.JobID])
			uk := l.LineKey
			uk.Kind = ""
			perKey[uk] += m
			perSeg[[2]int64{l.JobID, int64(l.Segment)}] += m
		}
		if len(ls) > 0 {
			for name, got := range map[string]any{"total": s.Total, "team": s.ByTeam, "team×gpu×tier": s.ByTeamGPUTier, "user": s.ByUser, "job": s.ByJob} {
				want := map[string]any{"total": grand, "team": team, "team×gpu×tier": tgt, "user": user, "job": job}[name]
				if d := cmp.Diff(want, got); d != "" {
					t.Fatalf("%s totals (-lines +Totals):\n%s", name, d)
				}
			}
		}
		sum := func(m any) (n net) {
			switch m := m.(type) {
			case map[string]Total:
				for _, v := range m {
					n.GPUSeconds, n.Amount = n.GPUSeconds+v.GPUSeconds, n.Amount+v.Amount
				}
			case map[TeamGPUTier]Total:
				for _, v := range m {
					n.GPUSeconds, n.Amount = n.GPUSeconds+v.GPUSeconds, n.Amount+v.Amount
				}
			case map[int64]Total:
				for _, v := range m {
					n.GPUSeconds, n.Amount = n.GPUSeconds+v.GPUSeconds, n.Amount+v.Amount
				}
			}
			return n
		}
		for _, m := range []any{s.ByTeam, s.ByTeamGPUTier, s.ByUser, s.ByJob} {
			if got := sum(m); got != netOf(s.Total) {
				t.Fatalf("breakdown sums to %+v, total %+v", got, s.Total)
			}
		}
		if s.Total.Amount != s.Total.Charges+s.Total.Credits+s.Total.Adjustments {
			t.Fatalf("total %+v inconsistent", s.Total)
		}
		for k, v := range perKey {
			if v < 0 {
				t.Fatalf("key %s nets %d < 0", k, v)
			}
		}
		for k, v := range perSeg {
			if v < 0 {
				t.Fatalf("job segment %v nets %d < 0", k, v)
			}
		}
	})
}

// LineAmount agrees with math/big: half up to the minor unit, or an error
// when the result does not fit.
func TestPropLineAmountExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var gs int64
		if rapid.Bool().Draw(t, "huge") {
			gs = rapid.Int64().Draw(t, "gs")
		} else {
			gs = rapid.Int64Range(-1e9, 1e9).Draw(t, "gs")
		}
		rate := rapid.Int64Range(0, MaxRateMicros).Draw(t, "rate")
		bp := rapid.IntRange(0, MaxMultiplierBP).Draw(t, "bp")
		cur := rapid.SampledFrom([]string{"USD", "JPY", "KWD"}).Draw(t, "cur")
		if rapid.IntRange(0, 3).Draw(t, "tie") == 0 {
			// Exact ties: gs/36 cents with gs ≡ 18 (mod 36) is k + 1/2 cents.
			gs = (36*rapid.Int64Range(-1e6, 1e6).Draw(t, "k") + 18)
			rate, bp, cur = 1_000_000, 10000, "USD"
		}
		got, err := LineAmount(gs, rate, bp, cur)

		unit := big.NewInt(RoundingUnit(cur))
		num := new(big.Int).Abs(big.NewInt(gs))
		num.Mul(num, big.NewInt(rate)).Mul(num, big.NewInt(int64(bp)))
		den := new(big.Int).Mul(big.NewInt(3600*10000), unit)
		q := new(big.Int).Add(new(big.Int).Mul(num, big.NewInt(2)), den)
		q.Quo(q, new(big.Int).Mul(den, big.NewInt(2))) // floor(x + 1/2)
		q.Mul(q, unit)
		if gs < 0 {
			q.Neg(q)
		}
		if !q.IsInt64() {
			if err == nil {
				t.Fatalf("LineAmount(%d,%d,%d) = %v, want overflow", gs, rate, bp, got)
			}
			return
		}
		if err != nil || got.Micros != q.Int64() {
			t.Fatalf("LineAmount(%d,%d,%d,%s) = %v, %v; want %s", gs, rate, bp, cur, got, err, q)
		}
	})
}

func monthLines(ls []Line, m YearMonth) []Line {
	var out []Line
	for _, l := range ls {
		if l.Month == m {
			out = append(out, l)
		}
	}
	return out
}

// lateData changes a set of segments as late reports would: drops some,
// moves some ends, adds new ones.
func lateData(t *rapid.T, segs []Segment, label string) []Segment {
	var out []Segment
	for i, s := range segs {
		switch rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("%s%d", label, i)) {
		case 0: // dropped (e.g. a duplicate report retracted)
			continue
		case 1:
			s.End = s.End.Add(time.Duration(rapid.Int64Range(0, 3*3600).Draw(t, fmt.Sprintf("%sext%d", label, i))) * time.Second)
		}
		out = append(out, s)
	}
	return append(out, genSegments.Draw(t, label+"new")...)
}

func nets(s Summary) map[string]any {
	m := map[string]any{"total": netOf(s.Total)}
	team, tgt, user, job := map[string]net{}, map[TeamGPUTier]net{}, map[string]net{}, map[int64]net{}
	for k, v := range s.ByTeam {
		team[k] = netOf(v)
	}
	for k, v := range s.ByTeamGPUTier {
		tgt[k] = netOf(v)
	}
	for k, v := range s.ByUser {
		user[k] = netOf(v)
	}
	for k, v := range s.ByJob {
		job[k] = netOf(v)
	}
	m["team"], m["tgt"], m["user"], m["job"] = team, tgt, user, job
	// Zero nets are the same as absent ones.
	for _, x := range []any{team, tgt, user, job} {
		switch x := x.(type) {
		case map[string]net:
			for k, v := range x {
				if v == (net{}) {
					delete(x, k)
				}
			}
		case map[TeamGPUTier]net:
			for k, v := range x {
				if v == (net{}) {
					delete(x, k)
				}
			}
		case map[int64]net:
			for k, v := range x {
				if v == (net{}) {
					delete(x, k)
				}
			}
		}
	}
	return m
}

// billed + adjustments = recomputed, exactly, over two rounds of late data;
// adjustments are dated in the first open month; reruns are idempotent.
func TestPropAdjust(t *testing.T) {
	card := testCard(t)
	apr, may := march.Next(), march.Next().Next()
	rapid.Check(t, func(t *rapid.T) {
		segs := genSegments.Draw(t, "segs")
		billed := monthLines(lines(t, card, segs), march)
		segs1 := lateData(t, segs, "late1")
		rec1 := monthLines(lines(t, card, segs1), march)
		adj1, err := Adjust(march, billed, rec1, apr)
		if err != nil {
			t.Fatal(err)
		}
		check := func(billed, adj, rec []Line, open YearMonth) {
			for _, a := range adj {
				if a.Kind != KindAdjustment || a.Month != open || Month(a.Hour) != march || a.Amount.Micros%10_000 != 0 {
					t.Fatalf("bad adjustment %+v", a)
				}
			}
			b, err := Totals(append(slices.Clone(billed), adj...))
			if err != nil {
				t.Fatal(err)
			}
			r, err := Totals(rec)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(nets(r), nets(b)); d != "" {
				t.Fatalf("billed+adjustments != recomputed (-rec +billed):\n%s", d)
			}
			// Per usage key and corrected kind, too.
			per := map[LineKey]net{}
			for i, ls := range [][]Line{billed, adj, rec} {
				sign := int64(1)
				if i == 2 {
					sign = -1
				}
				for _, l := range ls {
					k := l.Key()
					if k.Kind == KindAdjustment {
						if l.Month.Compare(open) > 0 || (i == 0 && l.Month == open) {
							continue
						}
						k.Kind = k.Adjusts
					}
					k.Adjusts, k.Month = "", YearMonth{}
					n := per[k]
					n.GPUSeconds += sign * l.GPUSeconds
					n.Amount += sign * l.Amount.Micros
					per[k] = n
				}
			}
			for k, n := range per {
				if n != (net{}) {
					t.Fatalf("key %s: billed+adjustments-recomputed = %+v", k, n)
				}
			}
		}
		check(billed, adj1, rec1, apr)
		// Rerun while April is open: replaces, does not add.
		again, err := Adjust(march, append(slices.Clone(billed), adj1...), rec1, apr)
		if err != nil || !cmp.Equal(adj1, again) {
			t.Fatalf("rerun: %v\n%s", err, cmp.Diff(adj1, again))
		}
		// April closes; more late data for March goes to May.
		frozen := append(slices.Clone(billed), adj1...)
		segs2 := lateData(t, segs1, "late2")
		rec2 := monthLines(lines(t, card, segs2), march)
		adj2, err := Adjust(march, frozen, rec2, may)
		if err != nil {
			t.Fatal(err)
		}
		check(frozen, adj2, rec2, may)
	})
}
