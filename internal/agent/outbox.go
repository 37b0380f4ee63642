package agent

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/allotlabs/allot/internal/agentproto"
)

// outbox delivers reports (started, log, exited) in order, retrying each
// until the server acknowledges it, so a server restart loses nothing. The
// server must accept a repeated report (the same job and segment) without
// effect: a report may arrive twice when an answer is lost.
type outbox struct {
	a *Agent

	mu     sync.Mutex
	items  []*report
	notify chan struct{}
	empty  chan struct{} // closed and replaced when the queue drains
}

type report struct {
	started *agentproto.JobStarted
	exited  *agentproto.JobExited
	log     *agentproto.JobLog
	sending bool
	tries   int
	// piece is how many of log's lines the request in flight carries: a
	// long report goes out in pieces that each fit the server's body limit.
	piece int
	// done runs once the report left the queue: delivered, or refused for
	// good (an exit report then lets the agent forget the lease on disk).
	done func()
}

// maxQueuedLogLines caps a job's unsent log lines; older ones are dropped
// (the server keeps only the tail anyway).
const maxQueuedLogLines = 1000

// maxLogBody bounds the JSON body of one log request. The server refuses
// bodies over 1 MiB (web/server.go's BodyLimit) with a 413, which the
// outbox takes as refused for good: a batch over it was lost whole, tail
// and all. A report's lines go out in pieces of at most this much; half the
// limit leaves room for the envelope and any future limit change.
const maxLogBody = 512 << 10

// logPiece is how many of lines (from the first) fit one request of at
// most limit bytes: at least one (a single line is at most maxLineBytes,
// 16 KiB, so its JSON — at worst six bytes per byte, as \u00XX — always
// fits).
func logPiece(lines []string, ends []int64, limit int) int {
	size := 128 // {"job_id":…,"segment":…,"lines":[],"ends":[]}, with room
	for i, l := range lines {
		n := jsonStringLen(l) + 1
		if i < len(ends) {
			n += len(strconv.FormatInt(ends[i], 10)) + 1
		}
		if i > 0 && size+n > limit {
			return i
		}
		size += n
	}
	return len(lines)
}

// jsonStringLen is the length of s as encoding/json writes it (quotes,
// escapes, U+FFFD for invalid UTF-8, HTML-safe escapes of <, > and &).
func jsonStringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && w == 1:
			n += 6 // \ufffd
		case r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += w
		}
		i += w
	}
	return n
}

func newOutbox(a *Agent) *outbox {
	return &outbox{a: a, notify: make(chan struct{}, 1), empty: make(chan struct{})}
}

func (o *outbox) push(r *report) {
	o.mu.Lock()
	o.items = append(o.items, r)
	o.mu.Unlock()
	o.wake()
}

func (o *outbox) wake() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

func (o *outbox) started(s agentproto.JobStarted) { o.push(&report{started: &s}) }
func (o *outbox) exited(e agentproto.JobExited)   { o.push(&report{exited: &e}) }

// exitedThen queues an exit report and runs done once it left the queue.
func (o *outbox) exitedThen(e agentproto.JobExited, done func()) {
	o.push(&report{exited: &e, done: done})
}

// log queues lines, merged into the job's last unsent log report; done
// (may be nil) runs once they are delivered, and replaces the done of the
// report they merge into (it covers those lines too).
func (o *outbox) log(ref agentproto.LeaseRef, lines []string, ends []int64, done func()) {
	o.mu.Lock()
	for i := len(o.items) - 1; i >= 0; i-- {
		r := o.items[i]
		if r.exited != nil && r.exited.JobID == ref.JobID && r.exited.Segment == ref.Segment {
			break
		}
		if r.log != nil && !r.sending && r.log.JobID == ref.JobID && r.log.Segment == ref.Segment {
			r.log.Lines = append(r.log.Lines, lines...)
			r.log.Ends = append(r.log.Ends, ends...)
			if done != nil {
				r.done = done
			}
			if n := len(r.log.Lines); n > maxQueuedLogLines {
				r.log.Lines = append([]string(nil), r.log.Lines[n-maxQueuedLogLines:]...)
				r.log.Ends = append([]int64(nil), r.log.Ends[n-maxQueuedLogLines:]...)
			}
			o.mu.Unlock()
			o.wake()
			return
		}
	}
	o.items = append(o.items, &report{log: &agentproto.JobLog{JobID: ref.JobID, Segment: ref.Segment,
		Lines: append([]string(nil), lines...), Ends: append([]int64(nil), ends...)}, done: done})
	o.mu.Unlock()
	o.wake()
}

func (o *outbox) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.items)
}

// waitEmpty waits until everything is delivered, at most d.
func (o *outbox) waitEmpty(d time.Duration) bool {
	o.mu.Lock()
	if len(o.items) == 0 {
		o.mu.Unlock()
		return true
	}
	ch := o.empty
	o.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

func (o *outbox) run(ctx context.Context) {
	bo := newBackoff(100*time.Millisecond, o.a.cfg.RetryMax)
	for {
		group := o.next()
		if len(group) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-o.notify:
				continue
			}
		}
		r := group[0]
		var err error
		var refused []error // per report of a batch: refused for good
		if len(group) > 1 {
			refused, err = o.sendStarted(ctx, group)
			if errors.Is(err, agentproto.ErrNoBatch) {
				// An older server: one by one from now on, at once.
				o.a.log.Info("the server takes no batched reports; reporting starts one by one", "err", err)
				o.a.noBatch.Store(true)
				o.mu.Lock()
				for _, g := range group {
					g.sending = false
				}
				o.mu.Unlock()
				continue
			}
		} else {
			err = o.send(ctx, r)
		}
		if ctx.Err() != nil {
			return
		}
		done := err == nil
		if err != nil {
			r.tries++
			st := agentproto.ErrorStatus(err)
			lost := o.a.connectionLost("report", err)
			switch {
			case !lost && st >= 400 && st < 500 && st != http.StatusTooManyRequests && st != http.StatusRequestTimeout:
				done = true // refused for good
			}
			if done {
				for _, g := range group {
					o.a.log.Warn("server refused a report; dropping it", "report", g.kind(), "job", g.jobID(), "err", err)
				}
			} else {
				d := bo.next()
				o.a.log.Debug("report not delivered; retrying", "report", r.kind(), "job", r.jobID(), "reports", len(group), "in", d, "err", err)
				if lost {
					// Wait for the new registration first (or the backoff,
					// whichever is later).
					_ = o.a.sess.wait(ctx)
				}
				if !sleepCtx(ctx, d) {
					return
				}
			}
		}
		for i, rerr := range refused {
			if rerr != nil {
				o.a.log.Warn("server refused a report; dropping it", "report", group[i].kind(), "job", group[i].jobID(), "err", rerr)
			}
		}
		if done && err == nil && r.log != nil {
			// One piece delivered: drop its lines; the rest (and lines
			// merged in meanwhile) go next, and done waits for the last.
			o.mu.Lock()
			r.log.Lines = r.log.Lines[r.piece:]
			if len(r.log.Ends) >= r.piece {
				r.log.Ends = r.log.Ends[r.piece:]
			}
			more := len(r.log.Lines) > 0
			if more {
				r.sending = false
			}
			o.mu.Unlock()
			if more {
				bo.reset()
				continue
			}
		}
		if done {
			bo.reset()
			for _, g := range group {
				if g.done != nil {
					g.done()
				}
			}
			o.mu.Lock()
			o.items = o.items[len(group):]
			if len(o.items) == 0 {
				close(o.empty)
				o.empty = make(chan struct{})
			}
			o.mu.Unlock()
		} else {
			o.mu.Lock()
			for _, g := range group {
				g.sending = false
			}
			o.mu.Unlock()
		}
	}
}

// next marks the reports to send next as sending and returns them: the
// first in the queue, and with a start report the start reports right
// behind it (up to agentproto.MaxBatch), which go in one request. Only
// run takes reports off the queue's front, so they stay its first ones.
func (o *outbox) next() []*report {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.items) == 0 {
		return nil
	}
	group := o.items[:1:1]
	if o.items[0].started != nil && !o.a.noBatch.Load() {
		for _, r := range o.items[1:] {
			if r.started == nil || len(group) == agentproto.MaxBatch {
				break
			}
			group = append(group, r)
		}
	}
	for _, r := range group {
		r.sending = true
	}
	return group
}

// sendStarted sends a group of start reports in one request and returns
// each one's refusal (nil when recorded).
func (o *outbox) sendStarted(ctx context.Context, group []*report) ([]error, error) {
	started := make([]agentproto.JobStarted, len(group))
	for i, r := range group {
		started[i] = *r.started
	}
	results, err := o.a.client.StartedBatch(ctx, started)
	if err != nil {
		return nil, err
	}
	refused := make([]error, len(results))
	for i, res := range results {
		refused[i] = res.Err()
	}
	return refused, nil
}

func (o *outbox) send(ctx context.Context, r *report) error {
	c := o.a.client
	switch {
	case r.started != nil:
		return c.Started(ctx, *r.started)
	case r.exited != nil:
		return c.Exited(ctx, *r.exited)
	default:
		o.mu.Lock()
		k := logPiece(r.log.Lines, r.log.Ends, maxLogBody)
		l := agentproto.JobLog{JobID: r.log.JobID, Segment: r.log.Segment, Lines: r.log.Lines[:k]}
		if len(r.log.Ends) >= k { // Ends is parallel to Lines (or empty)
			l.Ends = r.log.Ends[:k]
		}
		r.piece = k
		o.mu.Unlock()
		return c.Log(ctx, l)
	}
}

func (r *report) kind() string {
	switch {
	case r.started != nil:
		return "started"
	case r.exited != nil:
		return "exited"
	}
	return "log"
}

func (r *report) jobID() int64 {
	switch {
	case r.started != nil:
		return r.started.JobID
	case r.exited != nil:
		return r.exited.JobID
	}
	return r.log.JobID
}
