package sim

// Idle GPUs while jobs wait (Result.IdlePendingSpan, IdleHeldSpan): why a
// policy's utilization falls short of another's on the same replay. Idle
// GPUs while the smallest pending job would fit were held back by the
// policy (a reservation, class order); idle GPUs that no pending job fits
// are fragmentation, which the queue's make-up decides: a policy that
// starts small jobs first leaves a queue of jobs that need whole nodes.

// idleNodes is the free capacity of the on-premise nodes (the first
// Config.Nodes; burst nodes come after them), recomputed only after a
// start or a release (fresh false).
type idleNodes struct {
	fresh   bool
	free    int // free GPUs
	maxFree int // the most free GPUs on one node
	whole   int // wholly free nodes
}

// pendingAsks notes a pending job of g GPUs (state.pendMin).
func (s *state) pendingAsks(g int) {
	if s.pendMin == 0 || g < s.pendMin {
		s.pendMin = g
	}
}

// idleWhilePending adds ov seconds of the current idle GPUs to the idle
// GPU-seconds, and to the held ones when the smallest pending job fits;
// the caller calls it only while jobs are pending (pendMin > 0).
func (s *state) idleWhilePending(ov float64) {
	in := &s.idle
	if !in.fresh {
		in.free, in.maxFree, in.whole = 0, 0, 0
		for n := range s.cfg.Nodes {
			f := s.nodes[n].GPUs - s.nodeUsed[n]
			in.free += f
			in.maxFree = max(in.maxFree, f)
			if f == s.nodes[n].GPUs {
				in.whole++
			}
		}
		in.fresh = true
	}
	if in.free == 0 {
		return
	}
	idle := float64(in.free) * ov
	s.idlePend += idle
	per := s.cfg.GPUsPerNode
	if s.pendMin <= per && in.maxFree >= s.pendMin || s.pendMin > per && in.whole*per >= s.pendMin {
		s.idleHeld += idle
	}
}
