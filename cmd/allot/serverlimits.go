package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

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
	return func(c *Config) error {
		if l.AgentConns < 1 || l.ExportConns < 1 || l.HeartbeatConns < 1 {
			return fmt.Errorf("--agent-db-conns, --heartbeat-db-conns and --export-db-conns must be at least 1")
		}
		c.HTTP, c.RateLimits = l, rl
		return nil
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
