package agent

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
)

// TestLargeOutputBurstReachesTheServerInPieces: a job that prints about
// 3 MiB at once (1,500 lines of 2 KiB, all inside one flush interval) used
// to lose its whole batch to the server's 1 MiB body limit (a 413 is
// "refused for good"). Now the batch goes out in pieces under the limit:
// no 413, and the server has the tail — every line the outbox keeps (the
// last maxQueuedLogLines), in order, with their end offsets.
func TestLargeOutputBurstReachesTheServerInPieces(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p, func(c *Config) { c.LogFlush = 2 * time.Second })
	const n, width = 1500, 2048
	// Written to a file first, then printed with one cat: the whole 3 MiB
	// arrives inside one flush interval.
	script := fmt.Sprintf(`f=$(mktemp) && awk 'BEGIN { pad = sprintf("%%%ds", ""); gsub(/ /, "x", pad); for (i = 1; i <= %d; i++) printf "%%05d %%s\n", i, pad }' > "$f" && cat "$f"; rm -f "$f"`, width-7, n)
	l := shLease(7, []int{0}, script)
	ta.run(t, l)
	r := ref(7)
	p.waitExit(r, 20*time.Second)
	last := fmt.Sprintf("%05d ", n)
	p.waitFor("the last line", 10*time.Second, func() bool {
		lines := p.logs[r]
		return len(lines) > 0 && strings.HasPrefix(lines[len(lines)-1], last)
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tooLarge != 0 {
		t.Errorf("%d log batches refused with 413", p.tooLarge)
	}
	for _, b := range p.logBodies {
		if b > peerBodyLimit {
			t.Errorf("a log request of %d bytes", b)
		}
	}
	lines := p.logs[r]
	tail := lines[len(lines)-maxQueuedLogLines:]
	for i, line := range tail {
		want := fmt.Sprintf("%05d ", n-maxQueuedLogLines+1+i)
		if !strings.HasPrefix(line, want) || len(line) != width-1 {
			t.Fatalf("tail line %d is %.12q… (%d bytes), want %q… (%d bytes)", i, line, len(line), want, width-1)
		}
	}
	ends := p.ends[r]
	if len(ends) != len(lines) {
		t.Fatalf("%d lines, %d ends", len(lines), len(ends))
	}
	// Line k ends at k·width bytes into the output file.
	if got := ends[len(ends)-1]; got != int64(n*width) {
		t.Errorf("the last line ends at %d, want %d", got, n*width)
	}
	t.Logf("%d lines at the server in %d requests, largest %d bytes", len(lines), len(p.logBodies), slicesMax(p.logBodies))
}

func slicesMax(v []int) int {
	m := 0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// TestLogReportDoneWaitsForItsLastPiece: a report split into pieces runs
// its done (which records the output offset the server has) only once the
// server has every line of it, so an agent restarted between two pieces
// resends the rest instead of skipping it.
func TestLogReportDoneWaitsForItsLastPiece(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	r := agentproto.LeaseRef{JobID: 8, Segment: 1}
	var lines []string
	var ends []int64
	for i := range maxQueuedLogLines {
		// Worst-case JSON: control bytes and invalid UTF-8 escape to six
		// bytes each, so 16 KiB lines are ~96 KiB on the wire.
		lines = append(lines, strings.Repeat("\x01\xff", maxLineBytes/2))
		ends = append(ends, int64(i+1)*maxLineBytes)
	}
	atDone := make(chan int, 1)
	ta.out.log(r, lines, ends, func() {
		p.mu.Lock()
		atDone <- len(p.logs[r])
		p.mu.Unlock()
	})
	select {
	case got := <-atDone:
		if got != len(lines) {
			t.Errorf("done ran when the server had %d of %d lines", got, len(lines))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the report was not delivered")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tooLarge != 0 || len(p.logBodies) < 2 {
		t.Errorf("%d refused with 413, %d requests", p.tooLarge, len(p.logBodies))
	}
	if got := p.ends[r]; len(got) != len(ends) || got[len(got)-1] != ends[len(ends)-1] {
		t.Errorf("%d ends at the server, want %d ending with %d", len(got), len(ends), ends[len(ends)-1])
	}
}

// TestLogPieceFitsTheLimit: logPiece's size estimate is exact or above
// what encoding/json writes, so a piece never exceeds the limit.
func TestLogPieceFitsTheLimit(t *testing.T) {
	for _, s := range []string{"", "plain", "quote\" back\\ nl\n tab\t", "<html>&amp;", "\x00\x1f\x7f", "héllo 世界", "\xff\xfe bad", "\u2028\u2029"} {
		b, _ := json.Marshal(s)
		if got := jsonStringLen(s); got != len(b) {
			t.Errorf("jsonStringLen(%q) = %d, encoding/json writes %d", s, got, len(b))
		}
	}
	lines := make([]string, 100)
	ends := make([]int64, 100)
	for i := range lines {
		lines[i] = strings.Repeat("a\"<", 100)
		ends[i] = 123456789
	}
	k := logPiece(lines, ends, 10_000)
	b, _ := json.Marshal(agentproto.JobLog{JobID: 1 << 40, Segment: 99, Lines: lines[:k], Ends: ends[:k]})
	if k == 0 || len(b) > 10_000 {
		t.Errorf("piece of %d lines is %d bytes", k, len(b))
	}
	b, _ = json.Marshal(agentproto.JobLog{JobID: 1 << 40, Segment: 99, Lines: lines[:k+1], Ends: ends[:k+1]})
	if len(b) <= 10_000-200 {
		t.Errorf("piece of %d lines is only %d bytes: one more would fit", k, len(b))
	}
}
