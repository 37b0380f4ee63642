package billing

import (
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// Segment is the usage of one job run segment: GPUs identical GPUs of
// GPUType on Node, held from Start to End.
type Segment struct {
	JobID      int64
	Segment    int // run segment number, 1 for the first run
	Team       string
	User       string
	CostCenter string
	// TierAsRun is the tier the segment ran as; a demoted job runs, and is
	// billed, as allot.TierPreemptible.
	TierAsRun allot.TierID
	GPUType   string
	Node      string
	GPUs      int
	// Start is when the GPUs were allocated; End when they were released,
	// or the instant usage is billed up to for a running segment (the last
	// heartbeat on node loss).
	Start, End     time.Time
	Checkpointable bool
	// PreemptedAt is set when the segment was ended by preemption.
	PreemptedAt time.Time
	// LastCheckpoint is the job's last completed checkpoint (zero: none).
	LastCheckpoint time.Time
}

// Seconds is the segment's length in whole seconds on the UTC second grid:
// floor(End) - floor(Start).
func (s *Segment) Seconds() int64 { return s.End.Unix() - s.Start.Unix() }

// LostWindow returns the seconds [from, to) lost to preemption (empty when
// the segment was not preempted): from the last checkpoint when the job is
// checkpointable and checkpointed during the segment, else from Start; to
// End. The window is clamped to the segment.
func (s *Segment) LostWindow() (from, to int64) {
	a, b := s.Start.Unix(), s.End.Unix()
	if s.PreemptedAt.IsZero() || b <= a {
		return b, b
	}
	from = a
	if s.Checkpointable && !s.LastCheckpoint.IsZero() {
		from = min(max(s.LastCheckpoint.Unix(), a), b)
	}
	return from, b
}

// Validate checks the segment's fields.
func (s *Segment) Validate() error {
	if s.JobID > 0 && s.Segment >= 1 && s.Team != "" && validTier(s.TierAsRun) && s.GPUType != "" &&
		s.GPUs >= 1 && s.GPUs <= maxGPUs && !s.Start.IsZero() && !s.End.IsZero() && !s.End.Before(s.Start) {
		return nil // fast path: no allocation
	}
	f := allot.FieldErrors{}
	if s.JobID <= 0 {
		f.Add("job_id", "must be positive")
	}
	if s.Segment < 1 {
		f.Add("segment", "must be at least 1")
	}
	if s.Team == "" {
		f.Add("team", "is required")
	}
	if !validTier(s.TierAsRun) {
		f.Add("tier", "unknown tier %q", s.TierAsRun)
	}
	if s.GPUType == "" {
		f.Add("gpu_type", "is required")
	}
	if s.GPUs < 1 || s.GPUs > maxGPUs {
		f.Add("gpus", "must be between 1 and %d", maxGPUs)
	}
	if s.Start.IsZero() || s.End.IsZero() {
		f.Add("start", "start and end are required")
	} else if s.End.Before(s.Start) {
		f.Add("end", "must not be before start")
	}
	return f.Err()
}

// maxGPUs bounds Segment.GPUs so that GPU-seconds cannot overflow.
const maxGPUs = 1 << 20

// Kind is a charge line's kind.
type Kind string

const (
	KindCharge           Kind = "charge"
	KindPreemptionCredit Kind = "preemption_credit"
	KindAdjustment       Kind = "adjustment"
)

// Piece is part of a segment within one UTC hour, one rate version and one
// multiplier version. Seg, Rate and Multiplier point at the input segment
// and into the rate card; they must not be modified.
type Piece struct {
	Kind       Kind // KindCharge, or KindPreemptionCredit for lost time
	Seg        *Segment
	Start, End time.Time // whole UTC seconds, End > Start
	Rate       *Rate
	Multiplier *Multiplier
}

// Seconds is the piece's length in whole seconds.
func (p *Piece) Seconds() int64 { return p.End.Unix() - p.Start.Unix() }

// GPUSeconds is Seconds × the segment's GPUs (never negative; credit lines
// carry the sign).
func (p *Piece) GPUSeconds() int64 { return p.Seconds() * int64(p.Seg.GPUs) }

// Hour is the UTC hour that contains the piece.
func (p *Piece) Hour() time.Time { return time.Unix(floorDiv(p.Start.Unix(), 3600)*3600, 0).UTC() }

// Split validates segs and cuts each at UTC hour boundaries and at rate and
// multiplier changes into charge pieces, followed by its preemption credit
// pieces, if any (see the package doc). A segment with End == Start has no
// pieces. The pieces point into segs.
func Split(card *RateCard, segs []Segment) ([]Piece, error) {
	n := 0
	for i := range segs {
		n += int(max(segs[i].Seconds(), 0)/3600) + 2
	}
	out := make([]Piece, 0, n)
	for i := range segs {
		s := &segs[i]
		if err := s.Validate(); err != nil {
			return nil, segErr(s, err)
		}
		var err error
		if out, err = card.split(out, s, KindCharge, s.Start.Unix(), s.End.Unix()); err != nil {
			return nil, err
		}
		if a, b := s.LostWindow(); a < b {
			if out, err = card.split(out, s, KindPreemptionCredit, a, b); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

func segErr(s *Segment, err error) error {
	return allot.Errorf(allot.EInvalid, "job %d segment %d: %s", s.JobID, s.Segment, err.Error())
}

func (c *RateCard) split(out []Piece, s *Segment, kind Kind, a, b int64) ([]Piece, error) {
	if a >= b {
		return out, nil
	}
	rs, ms := c.rates[s.GPUType], c.mults[s.TierAsRun]
	ri := versionAt(rs, a, rateFrom)
	if ri < 0 {
		return out, allot.Errorf(allot.EInvalid, "job %d segment %d: no rate for GPU type %q at %s",
			s.JobID, s.Segment, s.GPUType, time.Unix(a, 0).UTC().Format(time.RFC3339))
	}
	mi := versionAt(ms, a, multFrom)
	if mi < 0 {
		return out, allot.Errorf(allot.EInvalid, "job %d segment %d: no multiplier for tier %q at %s",
			s.JobID, s.Segment, s.TierAsRun, time.Unix(a, 0).UTC().Format(time.RFC3339))
	}
	for t := a; t < b; {
		end := min(floorDiv(t, 3600)*3600+3600, b)
		if ri+1 < len(rs) {
			end = min(end, rateFrom(rs[ri+1]))
		}
		if mi+1 < len(ms) {
			end = min(end, multFrom(ms[mi+1]))
		}
		out = append(out, Piece{
			Kind: kind, Seg: s,
			Start: time.Unix(t, 0).UTC(), End: time.Unix(end, 0).UTC(),
			Rate: &rs[ri], Multiplier: &ms[mi],
		})
		t = end
		if ri+1 < len(rs) && rateFrom(rs[ri+1]) <= t {
			ri++
		}
		if mi+1 < len(ms) && multFrom(ms[mi+1]) <= t {
			mi++
		}
	}
	return out, nil
}

func rateFrom(r Rate) int64       { return r.EffectiveFrom.Unix() }
func multFrom(m Multiplier) int64 { return m.EffectiveFrom.Unix() }

// floorDiv is a / b rounded toward minus infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}
