package web

import (
	"crypto/sha256"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"
)

// Rate limits (issue 16: nothing kept one client from taking the whole
// server). Three token buckets, each keyed separately, so no class of
// caller can use up another's:
//
//   - per client IP, before authentication, on /api/v1 and the portal's
//     POSTs (login included): it bounds what one address costs, bad or
//     unknown tokens too, before any database lookup;
//   - per API token (or portal session), after authentication, on
//     /api/v1: one script cannot crowd out its owner's colleagues;
//   - per node token on /api/agent/v1, with its own generous budget: a
//     heartbeat or a lease report is never refused because users are busy.
//     A node's job output (POST /jobs/log) has a bucket of its own, so a
//     chatty job slows only its log batches (the agent retries them and
//     folds the lines that wait into one batch), never the node's
//     heartbeats, polls and lease reports. The node token is the key
//     before it is checked, so an address whose agent requests keep being
//     refused (401: a token sprayed at random, each a lookup on the agent
//     API's pool) is turned away, before the lookup, once it has had a
//     tenth of its IP budget of refusals.
//
// A refusal is 429 with Retry-After (whole seconds) and, on the API, the
// usual problem JSON. The client IP is the connection's peer: headers such
// as X-Forwarded-For are the client's to invent, so behind a reverse proxy
// every client shares the proxy's address (raise --ip-rate there).

// Rate is one token bucket: PerSecond requests a second on average, Burst
// at once. A zero PerSecond turns the limit off.
type Rate struct {
	PerSecond float64
	Burst     int
}

// RateLimits configures the server's limits; the zero value limits
// nothing (tests; `allot server` sets defaults no person or agent reaches).
type RateLimits struct {
	IP    Rate // per client IP: /api/v1 and portal POSTs
	Token Rate // per API token or session: /api/v1
	Agent Rate // per node token: /api/agent/v1 (its job logs apart)
}

// DefaultRateLimits are `allot server`'s defaults: far above what a person,
// a CLI loop or an agent (a heartbeat every 10 s, a long poll, a log batch
// a second) sends, well below what stalls the server.
var DefaultRateLimits = RateLimits{
	IP:    Rate{PerSecond: 200, Burst: 400},
	Token: Rate{PerSecond: 50, Burst: 100},
	Agent: Rate{PerSecond: 20, Burst: 100},
}

// maxLimiterKeys bounds each limiter's memory: past it, new keys share
// one bucket until idle ones are swept.
const maxLimiterKeys = 100_000

type limiter struct {
	rate  Rate
	mu    sync.Mutex
	keys  map[string]*rate.Limiter
	swept time.Time
}

func newLimiter(r Rate) *limiter {
	if r.PerSecond <= 0 {
		return nil
	}
	if r.Burst < 1 {
		r.Burst = max(1, int(math.Ceil(r.PerSecond)))
	}
	return &limiter{rate: r, keys: map[string]*rate.Limiter{}}
}

// allow takes a request from key's bucket, or says how long until one is
// there. A nil limiter allows everything.
func (l *limiter) allow(key string, now time.Time) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > time.Minute {
		// A full bucket is the same as none: dropping it forgets nothing.
		for k, b := range l.keys {
			if b.TokensAt(now) >= float64(l.rate.Burst) {
				delete(l.keys, k)
			}
		}
		l.swept = now
	}
	b, ok := l.keys[key]
	if !ok {
		if len(l.keys) >= maxLimiterKeys {
			key = "\x00overflow"
			b = l.keys[key]
		}
		if b == nil {
			b = rate.NewLimiter(rate.Limit(l.rate.PerSecond), l.rate.Burst)
			l.keys[key] = b
		}
	}
	r := b.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// spent reports whether key's bucket is empty now, without taking from
// it (a nil limiter never is).
func (l *limiter) spent(key string, now time.Time) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.keys[key]
	return ok && b.TokensAt(now) < 1
}

// limiters is the server's set, built from Config.RateLimits.
type limiters struct {
	ip, token, agent *limiter
	agentRefused     *limiter // per IP: agent requests refused as unauthorized
}

func newLimiters(r RateLimits) limiters {
	refused := r.IP
	refused.PerSecond, refused.Burst = refused.PerSecond/10, max(1, refused.Burst/10)
	return limiters{ip: newLimiter(r.IP), token: newLimiter(r.Token), agent: newLimiter(r.Agent), agentRefused: newLimiter(refused)}
}

// ClientIP is r's connection's peer address (no forwarded headers: behind
// a reverse proxy every caller is the proxy).
func ClientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// CallerKey is the key of r's credential, its bearer token or else its
// portal session, digested (no secret is kept); false without either. The
// per-token rate limit and the server's admission control (internal/apf)
// both count callers by it.
func CallerKey(r *http.Request) (string, bool) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && strings.TrimSpace(tok) != "" {
		return secretKey("api:", strings.TrimSpace(tok)), true
	}
	if ck, err := r.Cookie(sessionCookie); err == nil && ck.Value != "" {
		return secretKey("session:", ck.Value), true
	}
	return "", false
}

// secretKey is a bucket key for a credential: its digest, so the limiter
// keeps no secret in memory.
func secretKey(kind, secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return kind + string(sum[:16])
}

func tooMany(c echo.Context, wait time.Duration, what string) error {
	secs := max(1, int(math.Ceil(wait.Seconds())))
	c.Response().Header().Set("Retry-After", fmt.Sprint(secs))
	return echo.NewHTTPError(http.StatusTooManyRequests, fmt.Sprintf("too many requests %s: retry in %d s", what, secs))
}

// limitByClient runs before authentication: node tokens on the agent API,
// client IPs on the user API and the portal's POSTs.
func (s *Server) limitByClient(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		now := time.Now()
		switch {
		case isAgentAPI(c):
			ip := ClientIP(r)
			if s.limits.agentRefused.spent(ip, now) {
				return tooMany(c, time.Second, "from this address (too many refused node tokens)")
			}
			key := "ip:" + ip
			if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
				key = secretKey("node:", strings.TrimSpace(tok))
			}
			if strings.HasSuffix(r.URL.Path, "/jobs/log") {
				key = "log:" + key
			}
			if ok, wait := s.limits.agent.allow(key, now); !ok {
				return tooMany(c, wait, "for this node token")
			}
			err := next(c)
			if allot.ErrorCode(err) == allot.EUnauthorized {
				s.limits.agentRefused.allow(ip, now)
			}
			return err
		case isAPI(c) || r.Method == http.MethodPost:
			if ok, wait := s.limits.ip.allow(ClientIP(r), now); !ok {
				return tooMany(c, wait, "from this address")
			}
		}
		return next(c)
	}
}

// limitByToken runs after authentication: one bucket per API token (or
// portal session) on /api/v1.
func (s *Server) limitByToken(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.limits.token == nil || !isAPI(c) || isAgentAPI(c) || c.Get(ctxUser) == nil {
			return next(c)
		}
		key, ok := CallerKey(c.Request())
		if !ok {
			return next(c)
		}
		if ok, wait := s.limits.token.allow(key, time.Now()); !ok {
			return tooMany(c, wait, "for this token")
		}
		return next(c)
	}
}
