package sim

import (
	"math"
	"slices"
	"strconv"
	"time"
)

// result turns a finished replay into its metrics.
func (s *state) result() *Result {
	r := &Result{
		Jobs:        len(s.jobs),
		TotalGPUs:   s.total,
		Preemptions: s.preemptions,
		ByTier:      map[string]Group{},
		ByTeam:      map[string]Group{},
		Cycles:      len(s.cycleNS),
		SpanStartS:  s.spanA.Seconds(),
		SpanEndS:    s.spanB.Seconds(),
		Timeline:    s.timeline,
	}
	r.GPUSLostToPreemption = s.lost
	if len(s.jobs) == 0 {
		return r
	}
	first := s.spanA
	end := s.spanB
	var offered, offeredSpan, useful float64
	var jct, bsd float64
	waits := make([]float64, 0, len(s.jobs))
	teamWaits := make([][]float64, len(s.teams))
	tierWaits := make([][]float64, 5)
	for i := range s.jobs {
		j := &s.jobs[i]
		g := float64(j.tj.GPUs)
		offered += g * j.tj.Duration.Seconds()
		offeredSpan += g * overlap(j.tj.Submit, j.tj.Submit+j.tj.Duration, s.spanA, s.spanB)
		switch j.phase {
		case phaseDropped:
			r.Dropped++
			if j.stuck {
				r.DroppedNeverStartable++
			}
			continue
		case phaseDone:
		default:
			// Cannot happen once the loop has drained every event.
			r.Dropped++
			continue
		}
		if j.finish > end {
			end = j.finish
		}
		ran := j.tj.Duration
		if j.killed {
			ran = j.timeLimit
			r.TimeLimitKills++
		}
		useful += g * ran.Seconds()
		w := (j.firstStart - j.tj.Submit).Seconds()
		c := (j.finish - j.tj.Submit).Seconds()
		waits = append(waits, w)
		if s.cfg.JobWaits {
			r.JobWaits = append(r.JobWaits, JobWait{
				ID: j.id, Name: j.tj.Name, Team: j.tj.Team, Tier: j.tier, GPUs: j.tj.GPUs,
				SubmitS: j.tj.Submit.Seconds(), FirstStartS: j.firstStart.Seconds(), WaitS: w,
				Preemptions: j.preempted,
			})
		}
		teamWaits[j.team] = append(teamWaits[j.team], w)
		tierWaits[j.tier-1] = append(tierWaits[j.tier-1], w)
		jct += c
		bsd += max(1, c/max(ran.Seconds(), 10))
	}
	n := float64(len(waits))
	makespan := (end - first).Seconds()
	r.MakespanS = makespan
	if makespan > 0 {
		r.Utilization = useful / (float64(s.total) * makespan)
		r.OfferedLoad = offered / (float64(s.total) * makespan)
	}
	if span := (s.spanB - s.spanA).Seconds(); span > 0 {
		r.UtilizationSpan = s.usefulSpan / (float64(s.total) * span)
		r.OfferedLoadSpan = offeredSpan / (float64(s.total) * span)
		r.IdlePendingSpan = s.idlePend / (float64(s.total) * span)
		r.IdleHeldSpan = s.idleHeld / (float64(s.total) * span)
	}
	slices.Sort(waits)
	r.Waits = waits
	if n > 0 {
		r.WaitMeanS = mean(waits)
		r.WaitP50S = Percentile(waits, 50)
		r.WaitP95S = Percentile(waits, 95)
		r.WaitP99S = Percentile(waits, 99)
		r.JCTMeanS = jct / n
		r.BoundedSlowdownMean = bsd / n
	}

	var ratios []float64
	for i, t := range s.teams {
		ws := teamWaits[i]
		if len(ws) == 0 && s.teamF[i] == 0 && s.teamR[i] == 0 {
			continue // no job of this team ran
		}
		g := group(ws, s.teamR[i], s.teamF[i])
		r.ByTeam[t.Name] = g
		if s.teamF[i] > 0 {
			ratios = append(ratios, g.ShareRatio)
		}
	}
	r.JainFairness = Jain(ratios)
	for i := range tierWaits {
		if len(tierWaits[i]) == 0 && s.tierF[i] == 0 {
			continue
		}
		r.ByTier[strconv.Itoa(i+1)] = group(tierWaits[i], s.tierR[i], s.tierF[i])
	}

	if len(s.cycleNS) > 0 {
		us := make([]float64, len(s.cycleNS))
		for i, ns := range s.cycleNS {
			us[i] = float64(ns) / float64(time.Microsecond)
		}
		r.CycleMeanUS = mean(us)
		slices.Sort(us)
		r.CycleP99US = Percentile(us, 99)
	}
	return r
}

func group(waits []float64, received, fair float64) Group {
	g := Group{Jobs: len(waits), GPUS: received}
	if len(waits) > 0 {
		sorted := slices.Clone(waits)
		slices.Sort(sorted)
		g.WaitMeanS = mean(sorted)
		g.WaitP95S = Percentile(sorted, 95)
		g.WaitP99S = Percentile(sorted, 99)
	}
	if fair > 0 {
		g.ShareRatio = received / fair
	}
	return g
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// Percentile is the q-th percentile (0..100) of sorted by linear
// interpolation between closest ranks (NumPy's default, "type 7").
func Percentile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	pos := q / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	if lo >= n-1 {
		return sorted[n-1]
	}
	frac := pos - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// Jain is Jain's fairness index (Σx)² / (n·Σx²); 1 for an empty input.
func Jain(xs []float64) float64 {
	if len(xs) == 0 {
		return 1
	}
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 1
	}
	return s * s / (float64(len(xs)) * s2)
}
