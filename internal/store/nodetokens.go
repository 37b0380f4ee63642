package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// Node tokens authenticate node agents. Each is bound to one node; only
// its SHA-256 hash and its first characters (the prefix) are stored.
// Listing, creating, rotating and revoking them are admin actions, each
// audited under the node's object ("node:gpu01"); revoking one ends the
// agent's access at once (NodeByToken reads the table on every request
// and nothing caches it) and wakes the node's long poll, which then
// answers 401.

// NodeToken describes a stored node token (never the secret itself).
type NodeToken struct {
	ID         int64
	Node       string
	Prefix     string // first characters, for telling tokens apart
	CreatedBy  string
	CreatedAt  time.Time
	LastUsedAt time.Time // zero: never used
	RevokedAt  time.Time // zero: active
	RevokedBy  string
}

// Active says whether the token still works.
func (t *NodeToken) Active() bool { return t.RevokedAt.IsZero() }

// nodeTokenPrefixLen is how many characters of a node token are kept.
const nodeTokenPrefixLen = len(NodeTokenPrefix) + 6

// nodeTokenUseEvery is how often NodeByToken records a token's use at
// most: a write per heartbeat would cost more than the heartbeat.
const nodeTokenUseEvery = time.Minute

const nodeTokenSelect = `SELECT id, node, prefix, created_by, created_at, last_used_at, revoked_at, revoked_by FROM node_tokens`

func scanNodeToken(r pgx.Row) (NodeToken, error) {
	var t NodeToken
	var used, revoked *time.Time
	err := r.Scan(&t.ID, &t.Node, &t.Prefix, &t.CreatedBy, &t.CreatedAt, &used, &revoked, &t.RevokedBy)
	if used != nil {
		t.LastUsedAt = *used
	}
	if revoked != nil {
		t.RevokedAt = *revoked
	}
	return t, err
}

func collectNodeTokens(rows pgx.Rows, err error) ([]NodeToken, error) {
	const what = "reading node tokens"
	if err != nil {
		return nil, mapErr(what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeToken, error) { return scanNodeToken(r) })
	if out == nil {
		out = []NodeToken{}
	}
	return out, mapErr(what, err)
}

// checkNodeExists is a field error on "node" when node is not a node.
func (s *Store) checkNodeExists(ctx context.Context, node string) error {
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE name = $1)`, node).Scan(&exists); err != nil {
		return mapErr("checking node", err)
	}
	if !exists {
		if strings.TrimSpace(node) == "" {
			return (allot.FieldErrors{"node": "is required"}).Err()
		}
		return (allot.FieldErrors{"node": fmt.Sprintf("unknown node %q: add it first (allot node-token create %s --gpu-type …)", node, node)}).Err()
	}
	return nil
}

// CreateNodeToken makes a token for an agent on node and returns its
// plaintext (shown once). The node must exist. It is not audited: `allot
// dev` makes its own agents' tokens with it; people use IssueNodeToken.
func (s *Store) CreateNodeToken(ctx context.Context, node, createdBy string) (string, error) {
	if err := s.checkNodeExists(ctx, node); err != nil {
		return "", err
	}
	secret := NodeTokenPrefix + randomSecret()
	_, err := s.db.Exec(ctx, `INSERT INTO node_tokens (node, prefix, token_hash, created_by, created_at) VALUES ($1, $2, $3, $4, $5)`,
		node, secret[:nodeTokenPrefixLen], hashSecret(secret), createdBy, s.Now())
	return secret, mapErr("creating node token", err)
}

// NodeTokenIssued is a token IssueNodeToken made: its secret, shown once,
// and, for a rotation, the tokens it revoked.
type NodeTokenIssued struct {
	Token   NodeToken
	Secret  string
	Revoked []NodeToken
}

// IssueNodeToken makes a new token for node as actor, audited. With
// rotate it also revokes every other token of the node, in the same
// transaction: the node's agent must switch to the new one. An unknown
// node is a field error and changes nothing.
func (s *Store) IssueNodeToken(ctx context.Context, node, actor string, rotate bool) (NodeTokenIssued, error) {
	var out NodeTokenIssued
	err := s.InTx(ctx, func(tx *Store) error {
		out = NodeTokenIssued{}
		if err := tx.checkNodeExists(ctx, node); err != nil {
			return err
		}
		now := tx.Now()
		var err error
		if rotate {
			out.Revoked, err = collectNodeTokens(tx.db.Query(ctx, `UPDATE node_tokens SET revoked_at = $2, revoked_by = $3
				WHERE node = $1 AND revoked_at IS NULL
				RETURNING id, node, prefix, created_by, created_at, last_used_at, revoked_at, revoked_by`, node, now, actor))
			if err != nil {
				return err
			}
		}
		secret := NodeTokenPrefix + randomSecret()
		out.Token, err = scanNodeToken(tx.db.QueryRow(ctx, `
			INSERT INTO node_tokens (node, prefix, token_hash, created_by, created_at) VALUES ($1, $2, $3, $4, $5)
			RETURNING id, node, prefix, created_by, created_at, last_used_at, revoked_at, revoked_by`,
			node, secret[:nodeTokenPrefixLen], hashSecret(secret), actor, now))
		if err != nil {
			return mapErr("creating node token", err)
		}
		out.Secret = secret
		action, note := "node_token.create", fmt.Sprintf("node token %d (%s…) made", out.Token.ID, out.Token.Prefix)
		if rotate {
			action = "node_token.rotate"
			note += "; revoked " + describeNodeTokens(out.Revoked)
			if len(out.Revoked) > 0 {
				if err := notify(ctx, tx.db, node); err != nil {
					return err
				}
			}
		}
		return tx.Audit(ctx, &allot.AuditEntry{Actor: actor, Action: action, Object: "node:" + node, Note: note})
	})
	return out, err
}

func describeNodeTokens(list []NodeToken) string {
	if len(list) == 0 {
		return "none"
	}
	var parts []string
	for _, t := range list {
		parts = append(parts, fmt.Sprintf("%d (%s…)", t.ID, t.Prefix))
	}
	return "node token(s) " + strings.Join(parts, ", ")
}

// ListNodeTokens returns the node tokens, newest first, revoked ones
// included: all of them, or node's ("" for all). A node that is neither
// a node nor has tokens is ENotFound.
func (s *Store) ListNodeTokens(ctx context.Context, node string) ([]NodeToken, error) {
	if node == "" {
		return collectNodeTokens(s.db.Query(ctx, nodeTokenSelect+` ORDER BY created_at DESC, id DESC`))
	}
	out, err := collectNodeTokens(s.db.Query(ctx, nodeTokenSelect+` WHERE node = $1 ORDER BY created_at DESC, id DESC`, node))
	if err != nil || len(out) > 0 {
		return out, err
	}
	if err := s.checkNodeExists(ctx, node); err != nil {
		return nil, allot.Errorf(allot.ENotFound, "unknown node %q", node)
	}
	return out, nil
}

// revokeNodeToken revokes the token with id as actor and audits it; an
// already revoked token is returned as it is, changed false.
func (s *Store) revokeNodeToken(ctx context.Context, id int64, actor string) (NodeToken, bool, error) {
	var t NodeToken
	changed := false
	err := s.InTx(ctx, func(tx *Store) error {
		var err error
		t, err = scanNodeToken(tx.db.QueryRow(ctx, nodeTokenSelect+` WHERE id = $1 FOR UPDATE`, id))
		if err == pgx.ErrNoRows {
			return allot.Errorf(allot.ENotFound, "no node token %d", id)
		}
		if err != nil {
			return mapErr("loading node token", err)
		}
		if !t.Active() {
			return nil
		}
		t, err = scanNodeToken(tx.db.QueryRow(ctx, `UPDATE node_tokens SET revoked_at = $2, revoked_by = $3 WHERE id = $1
			RETURNING id, node, prefix, created_by, created_at, last_used_at, revoked_at, revoked_by`, id, tx.Now(), actor))
		if err != nil {
			return mapErr("revoking node token", err)
		}
		changed = true
		if err := notify(ctx, tx.db, t.Node); err != nil {
			return err
		}
		return tx.Audit(ctx, &allot.AuditEntry{Actor: actor, Action: "node_token.revoke", Object: "node:" + t.Node,
			Note: "revoked " + describeNodeTokens([]NodeToken{t})})
	})
	return t, changed, err
}

// RevokeNodeToken revokes node token id as actor (audited). An unknown id
// is ENotFound; revoking a revoked token again changes nothing, succeeds
// and returns changed false.
func (s *Store) RevokeNodeToken(ctx context.Context, id int64, actor string) (t NodeToken, changed bool, err error) {
	return s.revokeNodeToken(ctx, id, actor)
}

// RevokeNodeTokenPrefix revokes the node token whose prefix starts with
// prefix (as `allot node-token list` shows it, a trailing "…" allowed), or
// whose whole secret prefix is. Several active tokens matching is
// EConflict (give more characters, or the ID); none is ENotFound.
func (s *Store) RevokeNodeTokenPrefix(ctx context.Context, prefix, actor string) (NodeToken, bool, error) {
	p := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(prefix), "…"), "...")
	if !strings.HasPrefix(p, NodeTokenPrefix) || len(p) == len(NodeTokenPrefix) {
		return NodeToken{}, false, (allot.FieldErrors{"prefix": fmt.Sprintf("must be a node token's prefix, e.g. %sAbC123", NodeTokenPrefix)}).Err()
	}
	var matches []NodeToken
	var err error
	if len(p) > nodeTokenPrefixLen { // the whole token: exactly that one
		matches, err = collectNodeTokens(s.db.Query(ctx, nodeTokenSelect+` WHERE token_hash = $1`, hashSecret(p)))
	} else {
		matches, err = collectNodeTokens(s.db.Query(ctx, nodeTokenSelect+` WHERE starts_with(prefix, $1) ORDER BY created_at DESC, id DESC`, p))
	}
	if err != nil {
		return NodeToken{}, false, err
	}
	if len(matches) == 0 {
		return NodeToken{}, false, allot.Errorf(allot.ENotFound, "no node token starts with %q", p)
	}
	var active []NodeToken
	for _, t := range matches {
		if t.Active() {
			active = append(active, t)
		}
	}
	switch len(active) {
	case 0:
		return matches[0], false, nil
	case 1:
		return s.revokeNodeToken(ctx, active[0].ID, actor)
	}
	var ids []string
	for _, t := range active {
		ids = append(ids, fmt.Sprint(t.ID))
	}
	return NodeToken{}, false, allot.Errorf(allot.EConflict, "%q matches %d active node tokens (IDs %s): give more characters or the ID",
		p, len(active), strings.Join(ids, ", "))
}

// RevokeNodeTokensOf revokes every active token of node as actor, in one
// audited transaction, and returns them. A node that is neither a node
// nor has tokens is a field error.
func (s *Store) RevokeNodeTokensOf(ctx context.Context, node, actor string) ([]NodeToken, error) {
	var out []NodeToken
	err := s.InTx(ctx, func(tx *Store) error {
		var has bool
		if err := tx.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM node_tokens WHERE node = $1)`, node).Scan(&has); err != nil {
			return mapErr("checking node tokens", err)
		}
		if !has {
			if err := tx.checkNodeExists(ctx, node); err != nil {
				return err
			}
		}
		var err error
		out, err = collectNodeTokens(tx.db.Query(ctx, `UPDATE node_tokens SET revoked_at = $2, revoked_by = $3
			WHERE node = $1 AND revoked_at IS NULL
			RETURNING id, node, prefix, created_by, created_at, last_used_at, revoked_at, revoked_by`, node, tx.Now(), actor))
		if err != nil || len(out) == 0 {
			return err
		}
		if err := notify(ctx, tx.db, node); err != nil {
			return err
		}
		return tx.Audit(ctx, &allot.AuditEntry{Actor: actor, Action: "node_token.revoke", Object: "node:" + node,
			Note: "revoked " + describeNodeTokens(out)})
	})
	return out, err
}

// RevokeNodeTokens revokes node's tokens made by createdBy (`allot dev`
// replacing its own agents' tokens; not audited).
func (s *Store) RevokeNodeTokens(ctx context.Context, node, createdBy string) error {
	_, err := s.db.Exec(ctx, `UPDATE node_tokens SET revoked_at = $3, revoked_by = $2 WHERE node = $1 AND created_by = $2 AND revoked_at IS NULL`, node, createdBy, s.Now())
	return mapErr("revoking node tokens", err)
}

// NodeByToken returns the node a valid node token belongs to, reading the
// table every time (a revoked token fails on its next request), and
// records the token's use at most once a minute.
func (s *Store) NodeByToken(ctx context.Context, secret string) (string, error) {
	_, node, err := s.NodeTokenByToken(ctx, secret)
	return node, err
}

// NodeTokenByToken is NodeByToken with the token's id.
func (s *Store) NodeTokenByToken(ctx context.Context, secret string) (int64, string, error) {
	var id int64
	var node string
	var used *time.Time
	err := s.db.QueryRow(ctx, `SELECT id, node, last_used_at FROM node_tokens WHERE token_hash = $1 AND revoked_at IS NULL`,
		hashSecret(secret)).Scan(&id, &node, &used)
	if err == pgx.ErrNoRows {
		return 0, "", allot.Errorf(allot.EUnauthorized, "invalid or revoked node token")
	}
	if err != nil {
		return 0, "", mapErr("checking node token", err)
	}
	if now := s.Now(); used == nil || now.Sub(*used) >= nodeTokenUseEvery || now.Before(*used) {
		// Bookkeeping, committed without waiting for the WAL flush: under
		// load a synchronous commit here queued every sixth heartbeat
		// behind the submissions' flushes (the heartbeats' p99); a crash of
		// PostgreSQL can lose at most this minute's mark.
		if _, err := s.db.Exec(ctx, `WITH `+asyncCommitSQL+` UPDATE node_tokens SET last_used_at = $2 FROM ac WHERE id = $1`, id, now); err != nil {
			return 0, "", mapErr("recording node token use", err)
		}
	}
	return id, node, nil
}
