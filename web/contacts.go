package web

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/store"
)

// contactTokenTTL is how long a node token that authenticated here is
// recognised in an agent request refused before authentication (counted
// from a time learn keeps up to contactRelearn old: 9 to 10 minutes after
// its last authentication). Past it
// (or once the token fails to authenticate) a refused request with it is
// no sign of life: a revoked token keeps no node alive for longer.
const contactTokenTTL = 10 * time.Minute

// contacts remembers, per API server, which node each recently
// authenticated node token belongs to, and which nodes knocked with one
// while admission control refused their requests (issue 16: under a
// 1,000-agent fill, nodes whose heartbeats were refused for 60 s were
// marked down and their jobs failed, though every agent was alive).
// Only digests of tokens are kept (CallerKey).
type contacts struct {
	mu    sync.Mutex
	known map[string]knownToken    // CallerKey → the node it authenticated as
	heard map[string]store.Contact // node → its latest refused request, not yet recorded
}

type knownToken struct {
	node string
	id   int64     // node_tokens.id: RecordContacts checks it is not revoked
	at   time.Time // when it last authenticated
}

func newContacts() *contacts {
	return &contacts{known: map[string]knownToken{}, heard: map[string]store.Contact{}}
}

// learn records that r's bearer token, node token id, authenticated as
// node at now.
func (c *contacts) learn(r *http.Request, node string, id int64, now time.Time) {
	key, ok := CallerKey(r)
	if !ok {
		return
	}
	c.mu.Lock()
	// Rewritten only when it changed or is a minute old: an agent's every
	// request learns its token again.
	if t, ok := c.known[key]; !ok || t.node != node || t.id != id || now.Sub(t.at) >= contactRelearn || now.Before(t.at) {
		c.known[key] = knownToken{node: node, id: id, at: now}
	}
	c.mu.Unlock()
}

// contactRelearn is how old a known token's time may grow before learn
// writes it again (far inside contactTokenTTL).
const contactRelearn = time.Minute

// forgetToken drops r's bearer token (it failed to authenticate).
func (c *contacts) forgetToken(r *http.Request) {
	key, ok := CallerKey(r)
	if !ok {
		return
	}
	c.mu.Lock()
	delete(c.known, key)
	c.mu.Unlock()
}

// forgetNode drops every token of node and its unrecorded knocks (its
// tokens were revoked, or it was retired).
func (c *contacts) forgetNode(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range c.known {
		if t.node == node {
			delete(c.known, k)
		}
	}
	delete(c.heard, node)
}

// heardFrom counts r, refused before authentication at now, as a knock of
// the node its token authenticated as within contactTokenTTL. It reports
// whether it did.
func (c *contacts) heardFrom(r *http.Request, now time.Time) bool {
	key, ok := CallerKey(r)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.known[key]
	if !ok || now.Sub(t.at) > contactTokenTTL {
		return false
	}
	if h, ok := c.heard[t.node]; !ok || now.After(h.At) {
		c.heard[t.node] = store.Contact{Node: t.node, At: now, Token: t.id}
	}
	return true
}

// take returns the knocks heard since the last take, by node name, and
// forgets tokens not seen within contactTokenTTL of now.
func (c *contacts) take(now time.Time) []store.Contact {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]store.Contact, 0, len(c.heard))
	for _, h := range c.heard {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	clear(c.heard)
	for k, t := range c.known {
		if now.Sub(t.at) > contactTokenTTL {
			delete(c.known, k)
		}
	}
	return out
}

// putBack returns knocks a failed write did not record, unless newer ones
// were heard meanwhile.
func (c *contacts) putBack(cs []store.Contact) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range cs {
		if cur, ok := c.heard[h.Node]; !ok || h.At.After(cur.At) {
			c.heard[h.Node] = h
		}
	}
}

// RefusedAgentRequest is admission control's hook (apf.Controller
// .RefusedAgent): an agent request (a heartbeat, a lease report, a log
// batch) it refused before authentication, with a node token that
// authenticated here within the last 10 minutes, is a sign of its node's
// life, recorded by the next RecordContacts.
func (s *Server) RefusedAgentRequest(r *http.Request) {
	if s.contacts.heardFrom(r, s.st.Now()) {
		s.http.KnownRefusedAgent.Inc()
	}
}

// RecordContacts writes the refused agent requests heard since the last call
// (store.RecordContacts), on the heartbeats' pool. `allot server` calls it
// every heartbeat interval; a node is marked down only once it has been
// silent both ways for the lost window.
func (s *Server) RecordContacts(ctx context.Context) error {
	cs := s.contacts.take(s.st.Now())
	if len(cs) == 0 {
		return nil
	}
	if err := s.hbSt.RecordContacts(ctx, cs); err != nil {
		s.contacts.putBack(cs)
		return err
	}
	s.log.Warn("server overloaded: refused agent requests counted as their nodes' signs of life", "nodes", len(cs))
	return nil
}
