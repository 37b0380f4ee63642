package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/allotlabs/allot/internal/apf"
	"github.com/allotlabs/allot/web"
)

// limitFlags adds `allot server`'s timeout and rate-limit flags to fs; the
// function it returns puts what they say into a Config after parsing.
func limitFlags(fs *flag.FlagSet) func(*Config) error {
	d := DefaultHTTPLimits
	l := d
	fs.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", d.ReadHeaderTimeout, "longest a client may take to send a request's headers (negative: no limit)")
	fs.DurationVar(&l.BodyTimeout, "body-timeout", d.BodyTimeout, "longest a client may take to send a request's body (negative: no limit)")
	fs.DurationVar(&l.WriteTimeout, "write-timeout", d.WriteTimeout,
		"longest from a request's headers to the end of its answer; agents' long polls and CSV exports set their own (negative: no limit)")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", d.IdleTimeout, "close a kept-alive connection idle this long (negative: never)")
	fs.DurationVar(&l.ExportStallTimeout, "export-stall-timeout", d.ExportStallTimeout,
		"drop a CSV export whose client has read nothing for this long (negative: never)")
	fs.IntVar(&l.AgentConns, "agent-db-conns", d.AgentConns, "database connections of the agent API's own pool (heartbeats, polls, lease reports)")
	fs.IntVar(&l.HeartbeatConns, "heartbeat-db-conns", d.HeartbeatConns, "database connections of the agents' heartbeats' own pool")
	fs.IntVar(&l.ExportConns, "export-db-conns", d.ExportConns, "database connections of the exports' own pool (chargeback and audit CSV, monthly statements)")
	rl := web.DefaultRateLimits
	fs.Var((*rateFlag)(&rl.Token), "api-rate", "requests per second per API token (or portal session) on /api/v1, as RATE or RATE:BURST (0: no limit)")
	fs.Var((*rateFlag)(&rl.IP), "ip-rate", "requests per second per client IP on /api/v1 and the portal's POSTs, as RATE or RATE:BURST (0: no limit)")
	fs.Var((*rateFlag)(&rl.Agent), "agent-rate", "requests per second per node token on /api/agent/v1 (job logs apart), as RATE or RATE:BURST (0: no limit)")
	admission := admissionFlags(fs, apf.Default)
	return func(c *Config) error {
		if l.AgentConns < 1 || l.ExportConns < 1 || l.HeartbeatConns < 1 {
			return fmt.Errorf("--agent-db-conns, --heartbeat-db-conns and --export-db-conns must be at least 1")
		}
		a, err := admission()
		if err != nil {
			return err
		}
		c.HTTP, c.RateLimits, c.Admission = l, rl, a
		return nil
	}
}

// admissionFlags adds the admission control's flags (internal/apf: a
// priority level each for heartbeats, other agent requests, user writes
// and user reads) to fs, with
// d's values as defaults; the function it returns checks them. `allot
// server` and `allot loadtest`'s booted server share them.
// admissionArgs are the flags of admissionFlags that give a server a (a
// child process `allot loadtest --processes` starts).
func admissionArgs(a apf.Config) []string {
	return []string{"--api-max-inflight", strconv.Itoa(a.Write.MaxInFlight), "--api-read-max-inflight", strconv.Itoa(a.Read.MaxInFlight),
		"--agent-max-inflight", strconv.Itoa(a.Agent.MaxInFlight), "--api-queue", strconv.Itoa(a.Write.QueueLength),
		"--agent-queue", strconv.Itoa(a.Agent.QueueLength), "--api-queue-wait", a.Write.QueueWait.String()}
}

func admissionFlags(fs *flag.FlagSet, d apf.Config) func() (apf.Config, error) {
	a := d
	fs.IntVar(&a.Write.MaxInFlight, "api-max-inflight", d.Write.MaxInFlight,
		"user writes (API and portal: submissions, cancels, edits) executing at once; more wait in a queue (0: no limit)")
	fs.IntVar(&a.Read.MaxInFlight, "api-read-max-inflight", d.Read.MaxInFlight,
		"user reads (API and portal pages; CSV exports apart) executing at once; more wait in a queue (0: no limit)")
	fs.IntVar(&a.Agent.MaxInFlight, "agent-max-inflight", d.Agent.MaxInFlight,
		"node agents' heartbeats executing at once, and as many of their other requests (lease reports, registration, logs; the orders long poll apart): two levels of their own user traffic cannot take (0: no limit)")
	fs.IntVar(&a.Write.QueueLength, "api-queue", d.Write.QueueLength,
		"user requests that may wait for a slot, each of the write and read levels (fair across tokens; past it: 429)")
	fs.IntVar(&a.Agent.QueueLength, "agent-queue", d.Agent.QueueLength, "agent requests that may wait for a slot, each of the heartbeat and other agent levels (fair across node tokens; past it: 429)")
	fs.DurationVar(&a.Write.QueueWait, "api-queue-wait", d.Write.QueueWait,
		"longest a request waits for a slot before a 429 with Retry-After (all levels; 0: refuse at once past the in-flight limit)")
	return func() (apf.Config, error) {
		for _, f := range []struct {
			name, zero string
			v          int
		}{{"api-max-inflight", "no limit", a.Write.MaxInFlight}, {"api-read-max-inflight", "no limit", a.Read.MaxInFlight},
			{"agent-max-inflight", "no limit", a.Agent.MaxInFlight}, {"api-queue", "no queue", a.Write.QueueLength}, {"agent-queue", "no queue", a.Agent.QueueLength}} {
			if f.v < 0 {
				return apf.Config{}, fmt.Errorf("--%s must be 0 (%s) or more, not %d", f.name, f.zero, f.v)
			}
		}
		if a.Write.QueueWait < 0 {
			return apf.Config{}, fmt.Errorf("--api-queue-wait must be 0 or more, not %s", a.Write.QueueWait)
		}
		a.Read.QueueLength = a.Write.QueueLength
		a.Read.QueueWait, a.Agent.QueueWait = a.Write.QueueWait, a.Write.QueueWait
		a.Heartbeat = a.Agent
		return a, a.Validate()
	}
}

// rateFlag is a web.Rate on the command line: "RATE" or "RATE:BURST"
// (burst: twice the rate, at least 1, when left out); "0" is no limit.
type rateFlag web.Rate

func (r *rateFlag) String() string {
	if r == nil || r.PerSecond == 0 {
		return "0"
	}
	return strconv.FormatFloat(r.PerSecond, 'f', -1, 64) + ":" + strconv.Itoa(r.Burst)
}

func (r *rateFlag) Set(v string) error {
	rs, bs, hasBurst := strings.Cut(v, ":")
	perSecond, err := strconv.ParseFloat(rs, 64)
	if err != nil || perSecond < 0 || perSecond > 1e6 {
		return fmt.Errorf("%q: want requests per second (0 to 1000000), optionally :BURST", v)
	}
	burst := max(1, int(2*perSecond))
	if hasBurst {
		if burst, err = strconv.Atoi(bs); err != nil || burst < 1 || burst > 1e7 {
			return fmt.Errorf("%q: the burst must be a whole number from 1 to 10000000", v)
		}
	}
	*r = rateFlag{PerSecond: perSecond, Burst: burst}
	if perSecond == 0 {
		*r = rateFlag{}
	}
	return nil
}
