package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// TokenPrefix starts every API token, so leaked tokens are easy to find.
const TokenPrefix = "allot_"

// APIToken describes a stored token (never the secret itself).
type APIToken struct {
	ID         int64
	UserID     int64
	Name       string
	Prefix     string // first characters, for telling tokens apart
	CreatedAt  time.Time
	LastUsedAt time.Time
	RevokedAt  time.Time
}

func randomSecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashSecret(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// CreateAPIToken makes a new personal API token for userID and returns its
// plaintext, which is shown once; only its SHA-256 hash is stored.
func (s *Store) CreateAPIToken(ctx context.Context, userID int64, name string) (string, APIToken, error) {
	if strings.TrimSpace(name) == "" {
		return "", APIToken{}, (allot.FieldErrors{"name": "is required"}).Err()
	}
	secret := TokenPrefix + randomSecret()
	t := APIToken{UserID: userID, Name: name, Prefix: secret[:len(TokenPrefix)+6]}
	err := s.db.QueryRow(ctx, `INSERT INTO api_tokens (user_id, name, prefix, token_hash) VALUES ($1, $2, $3, $4) RETURNING id, created_at`,
		userID, name, t.Prefix, hashSecret(secret)).Scan(&t.ID, &t.CreatedAt)
	if err != nil {
		return "", APIToken{}, mapErr("creating API token", err)
	}
	return secret, t, nil
}

// UserByAPIToken returns the owner of a valid, unrevoked token (one round
// trip) and records its use at most once a minute. Unknown or revoked tokens
// give EUnauthorized.
func (s *Store) UserByAPIToken(ctx context.Context, secret string) (allot.User, error) {
	h := hashSecret(secret)
	var lastUsed *time.Time
	var u allot.User
	var teams, roles []string
	err := s.db.QueryRow(ctx, `
		SELECT t.last_used_at, u.id, u.oidc_subject, u.email, u.name, u.is_admin, u.is_finance,
			coalesce(array_agg(m.team ORDER BY m.team) FILTER (WHERE m.team IS NOT NULL), '{}'),
			coalesce(array_agg(m.role ORDER BY m.team) FILTER (WHERE m.team IS NOT NULL), '{}')
		FROM api_tokens t JOIN users u ON u.id = t.user_id LEFT JOIN memberships m ON m.user_id = u.id
		WHERE t.token_hash = $1 AND t.revoked_at IS NULL
		GROUP BY t.id, u.id`, h).Scan(&lastUsed, &u.ID, &u.OIDCSubject, &u.Email, &u.Name, &u.Admin, &u.Finance, &teams, &roles)
	if err == pgx.ErrNoRows {
		return allot.User{}, allot.Errorf(allot.EUnauthorized, "invalid or revoked API token")
	}
	if err != nil {
		return allot.User{}, mapErr("checking API token", err)
	}
	for i := range teams {
		u.Memberships = append(u.Memberships, allot.Membership{Team: teams[i], Role: roles[i]})
	}
	if lastUsed == nil || s.Now().Sub(*lastUsed) > time.Minute {
		// A write per API call would cost more than the call.
		if _, err := s.db.Exec(ctx, `UPDATE api_tokens SET last_used_at = $2 WHERE token_hash = $1`, h, s.Now()); err != nil {
			return allot.User{}, mapErr("recording token use", err)
		}
	}
	return u, nil
}

// CreateSession starts a portal session for userID and returns its secret
// (the cookie value); only its hash is stored.
func (s *Store) CreateSession(ctx context.Context, userID int64, ttl time.Duration) (string, error) {
	secret := randomSecret()
	_, err := s.db.Exec(ctx, `INSERT INTO sessions (id_hash, user_id, expires_at) VALUES ($1, $2, $3)`,
		hashSecret(secret), userID, s.Now().Add(ttl))
	return secret, mapErr("creating session", err)
}

// UserBySession returns the user of an unexpired session.
func (s *Store) UserBySession(ctx context.Context, secret string) (allot.User, error) {
	var uid int64
	err := s.db.QueryRow(ctx, `SELECT user_id FROM sessions WHERE id_hash = $1 AND expires_at > $2`, hashSecret(secret), s.Now()).Scan(&uid)
	if err == pgx.ErrNoRows {
		return allot.User{}, allot.Errorf(allot.EUnauthorized, "session expired; log in again")
	}
	if err != nil {
		return allot.User{}, mapErr("checking session", err)
	}
	return s.GetUser(ctx, uid)
}

// DeleteSession ends a session.
func (s *Store) DeleteSession(ctx context.Context, secret string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM sessions WHERE id_hash = $1`, hashSecret(secret))
	return mapErr("deleting session", err)
}

// DeleteExpiredSessions removes sessions past their expiry and returns how
// many went.
func (s *Store) DeleteExpiredSessions(ctx context.Context) (int64, error) {
	tag, err := s.db.Exec(ctx, `DELETE FROM sessions WHERE expires_at <= $1`, s.Now())
	return tag.RowsAffected(), mapErr("deleting expired sessions", err)
}

// RevokeAPITokensNamed revokes userID's unrevoked tokens called name.
func (s *Store) RevokeAPITokensNamed(ctx context.Context, userID int64, name string) error {
	_, err := s.db.Exec(ctx, `UPDATE api_tokens SET revoked_at = now() WHERE user_id = $1 AND name = $2 AND revoked_at IS NULL`, userID, name)
	return mapErr("revoking API tokens", err)
}

// CountTeams returns the number of teams (0 means an empty organisation).
func (s *Store) CountTeams(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM teams`).Scan(&n)
	return n, mapErr("counting teams", err)
}
