package store

import (
	"context"
	"fmt"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// CreateNodeToken makes a token for an agent on node and returns its
// plaintext (shown once). The node must exist.
func (s *Store) CreateNodeToken(ctx context.Context, node, createdBy string) (string, error) {
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE name = $1)`, node).Scan(&exists); err != nil {
		return "", mapErr("checking node", err)
	}
	if !exists {
		return "", (allot.FieldErrors{"node": fmt.Sprintf("unknown node %q: add it first (allot node add)", node)}).Err()
	}
	secret := NodeTokenPrefix + randomSecret()
	_, err := s.db.Exec(ctx, `INSERT INTO node_tokens (node, prefix, token_hash, created_by, created_at) VALUES ($1, $2, $3, $4, $5)`,
		node, secret[:len(NodeTokenPrefix)+6], hashSecret(secret), createdBy, s.Now())
	return secret, mapErr("creating node token", err)
}

// RevokeNodeTokens revokes node's tokens made by createdBy.
func (s *Store) RevokeNodeTokens(ctx context.Context, node, createdBy string) error {
	_, err := s.db.Exec(ctx, `UPDATE node_tokens SET revoked_at = $3 WHERE node = $1 AND created_by = $2 AND revoked_at IS NULL`, node, createdBy, s.Now())
	return mapErr("revoking node tokens", err)
}

// NodeByToken returns the node a valid node token belongs to.
func (s *Store) NodeByToken(ctx context.Context, secret string) (string, error) {
	var node string
	err := s.db.QueryRow(ctx, `SELECT node FROM node_tokens WHERE token_hash = $1 AND revoked_at IS NULL`, hashSecret(secret)).Scan(&node)
	if err == pgx.ErrNoRows {
		return "", allot.Errorf(allot.EUnauthorized, "invalid or revoked node token")
	}
	return node, mapErr("checking node token", err)
}
