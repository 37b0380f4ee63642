package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
	ExpiresAt  time.Time // zero: never expires
	// ParentID is the token whose request made this one (0: made in the
	// portal, or by Allot itself). Revoking a token revokes every token
	// made with it, and the tokens made with those.
	ParentID int64
}

// MaxTokenNameLen is the longest API token name.
const MaxTokenNameLen = 100

// Active says whether the token still works at now.
func (t *APIToken) Active(now time.Time) bool {
	return t.RevokedAt.IsZero() && (t.ExpiresAt.IsZero() || t.ExpiresAt.After(now))
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

// CreateAPIToken makes a new personal API token for userID that never
// expires and returns its plaintext, which is shown once; only its SHA-256
// hash is stored.
func (s *Store) CreateAPIToken(ctx context.Context, userID int64, name string) (string, APIToken, error) {
	return s.CreateAPITokenExpiring(ctx, userID, name, time.Time{})
}

// CreateAPITokenExpiring is CreateAPIToken with an expiry (zero: never).
// A blank or over-long name, or an expiry not in the future, is a field
// error and stores nothing.
func (s *Store) CreateAPITokenExpiring(ctx context.Context, userID int64, name string, expires time.Time) (string, APIToken, error) {
	return s.CreateAPITokenWith(ctx, userID, NewAPIToken{Name: name, ExpiresAt: expires})
}

// NewAPIToken is what CreateAPITokenWith makes.
type NewAPIToken struct {
	Name      string
	ExpiresAt time.Time // zero: never
	// ParentID is the API token of the request that asks for this one (0:
	// none, e.g. a portal session). It must be userID's and still work;
	// revoking it revokes the new token too.
	ParentID int64
}

// CreateAPITokenWith is CreateAPITokenExpiring with a parent token. A
// parent that is not userID's, or that was revoked or expired meanwhile,
// is EUnauthorized and stores nothing.
func (s *Store) CreateAPITokenWith(ctx context.Context, userID int64, n NewAPIToken) (string, APIToken, error) {
	name, expires := strings.TrimSpace(n.Name), n.ExpiresAt
	f := allot.FieldErrors{}
	switch {
	case name == "":
		f.Add("name", "is required")
	case utf8.RuneCountInString(name) > MaxTokenNameLen:
		f.Add("name", "must be at most %d characters", MaxTokenNameLen)
	case !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0:
		f.Add("name", "must be printable text")
	}
	if !expires.IsZero() && !expires.After(s.Now()) {
		f.Add("expires_at", "must be in the future")
	}
	if err := f.Err(); err != nil {
		return "", APIToken{}, err
	}
	secret := TokenPrefix + randomSecret()
	t := APIToken{UserID: userID, Name: name, Prefix: secret[:len(TokenPrefix)+6], ExpiresAt: expires, ParentID: n.ParentID}
	var exp *time.Time
	if !expires.IsZero() {
		exp = &expires
	}
	var parent *int64
	if n.ParentID != 0 {
		parent = &n.ParentID
	}
	err := s.InTx(ctx, func(tx *Store) error {
		// FOR SHARE: DisableUser (FOR UPDATE) and this wait for each other.
		var enabled bool
		if err := tx.db.QueryRow(ctx, `SELECT disabled_at IS NULL FROM users WHERE id = $1 FOR SHARE`, userID).Scan(&enabled); err != nil {
			return mapErr("loading token owner", err)
		}
		if !enabled {
			return errUserDisabled()
		}
		if parent != nil {
			// FOR SHARE waits for a revocation of the parent in flight, and
			// makes one that starts now wait for this token, so that
			// revokeTokenTree sees it.
			var ok bool
			err := tx.db.QueryRow(ctx, `SELECT revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $3) FROM api_tokens
				WHERE id = $1 AND user_id = $2 FOR SHARE`, *parent, userID, tx.Now()).Scan(&ok)
			if err == pgx.ErrNoRows || err == nil && !ok {
				return allot.Errorf(allot.EUnauthorized, "the API token making this request was revoked or has expired")
			}
			if err != nil {
				return mapErr("checking parent token", err)
			}
		}
		return mapErr("creating API token", tx.db.QueryRow(ctx, `INSERT INTO api_tokens (user_id, name, prefix, token_hash, expires_at, created_at, parent_token_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id, created_at`,
			userID, name, t.Prefix, hashSecret(secret), exp, tx.Now(), parent).Scan(&t.ID, &t.CreatedAt))
	})
	if err != nil {
		return "", APIToken{}, err
	}
	return secret, t, nil
}

// revokeTokenTree revokes the unrevoked tokens among roots and every token
// made with them, down the generations, at now, and returns how many it
// revoked. Run it in a transaction that has locked the roots (FOR UPDATE)
// in an earlier statement: a child being made waits for that lock, and
// this statement's snapshot then includes it.
func (s *Store) revokeTokenTree(ctx context.Context, roots []int64, now time.Time) (int64, error) {
	tag, err := s.db.Exec(ctx, `
		WITH RECURSIVE tree AS (
			SELECT id FROM api_tokens WHERE id = ANY($1)
			UNION
			SELECT c.id FROM api_tokens c JOIN tree ON c.parent_token_id = tree.id
		)
		UPDATE api_tokens t SET revoked_at = $2 FROM tree WHERE t.id = tree.id AND t.revoked_at IS NULL`, roots, now)
	return tag.RowsAffected(), mapErr("revoking API tokens", err)
}

const tokenSelect = `SELECT id, user_id, name, prefix, created_at, last_used_at, revoked_at, expires_at, coalesce(parent_token_id, 0) FROM api_tokens`

func scanToken(r pgx.Row) (APIToken, error) {
	var t APIToken
	var used, revoked, expires *time.Time
	err := r.Scan(&t.ID, &t.UserID, &t.Name, &t.Prefix, &t.CreatedAt, &used, &revoked, &expires, &t.ParentID)
	for _, p := range []struct {
		dst *time.Time
		src *time.Time
	}{{&t.LastUsedAt, used}, {&t.RevokedAt, revoked}, {&t.ExpiresAt, expires}} {
		if p.src != nil {
			*p.dst = *p.src
		}
	}
	return t, err
}

// ListAPITokens returns userID's tokens, newest first, revoked and expired
// ones included.
func (s *Store) ListAPITokens(ctx context.Context, userID int64) ([]APIToken, error) {
	rows, err := s.db.Query(ctx, tokenSelect+` WHERE user_id = $1 ORDER BY created_at DESC, id DESC`, userID)
	if err != nil {
		return nil, mapErr("listing API tokens", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (APIToken, error) { return scanToken(r) })
	return out, mapErr("listing API tokens", err)
}

// RevokeAPIToken revokes token id for by, and every token made with it
// (ParentID), down the generations. Unless by is an admin, only by's own
// token may be revoked: someone else's token is ENotFound, as is a
// missing one. An admin revoking someone else's token is audited (in the
// same transaction). Revoking a revoked token again succeeds and revokes
// what it made that still works.
func (s *Store) RevokeAPIToken(ctx context.Context, id int64, by *allot.User) (APIToken, error) {
	var t APIToken
	err := s.InTx(ctx, func(tx *Store) error {
		var err error
		t, err = scanToken(tx.db.QueryRow(ctx, tokenSelect+` WHERE id = $1 AND (user_id = $2 OR $3) FOR UPDATE`, id, by.ID, by.Admin))
		if err == pgx.ErrNoRows {
			return allot.Errorf(allot.ENotFound, "no API token %d", id)
		}
		if err != nil {
			return mapErr("revoking API token", err)
		}
		n, err := tx.revokeTokenTree(ctx, []int64{id}, tx.Now())
		if err != nil {
			return err
		}
		if t.RevokedAt.IsZero() {
			t.RevokedAt, n = tx.Now(), n-1
		}
		if t.UserID == by.ID {
			return nil
		}
		var owner string
		if err := tx.db.QueryRow(ctx, `SELECT email FROM users WHERE id = $1`, t.UserID).Scan(&owner); err != nil {
			return mapErr("loading token owner", err)
		}
		note := fmt.Sprintf("API token %q (%s…) of %s", t.Name, t.Prefix, owner)
		if n > 0 {
			note += fmt.Sprintf(", and %d token(s) made with it", n)
		}
		return tx.Audit(ctx, &allot.AuditEntry{Actor: by.Email, Action: "token.revoke", Object: fmt.Sprintf("token:%d", t.ID), Note: note})
	})
	return t, err
}

// UserByAPIToken returns the owner of a valid, unrevoked token (one round
// trip) and records its use at most once a minute. Unknown or revoked tokens
// give EUnauthorized.
func (s *Store) UserByAPIToken(ctx context.Context, secret string) (allot.User, error) {
	u, _, err := s.userByAPIToken(ctx, secret)
	return u, err
}

// UserByAPITokenContext is UserByAPIToken that also returns ctx carrying
// what a submission in this request is judged on has been at (the
// allocations', nodes' and configuration epochs, read in the same round
// trip): a submission made with it reuses the context judged for an
// earlier one while none of them moved (submitContext), and so costs one
// round trip fewer.
func (s *Store) UserByAPITokenContext(ctx context.Context, secret string) (allot.User, context.Context, error) {
	u, ep, err := s.userByAPIToken(ctx, secret)
	if err != nil {
		return u, ctx, err
	}
	return u, context.WithValue(ctx, epochsKey{}, ep), nil
}

func (s *Store) userByAPIToken(ctx context.Context, secret string) (allot.User, submitEpochs, error) {
	h := hashSecret(secret)
	var lastUsed *time.Time
	var u allot.User
	var teams, roles []string
	var ep submitEpochs
	err := s.db.QueryRow(ctx, `
		SELECT t.last_used_at, u.id, u.oidc_subject, u.email, u.name, u.is_admin, u.is_finance,
			coalesce(array_agg(m.team ORDER BY m.team) FILTER (WHERE m.team IS NOT NULL), '{}'),
			coalesce(array_agg(m.role ORDER BY m.team) FILTER (WHERE m.team IS NOT NULL), '{}'),
			`+submitEpochsSQL+`
		FROM api_tokens t JOIN users u ON u.id = t.user_id LEFT JOIN memberships m ON m.user_id = u.id
		WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > $2) AND u.disabled_at IS NULL
		GROUP BY t.id, u.id`, h, s.Now()).Scan(&lastUsed, &u.ID, &u.OIDCSubject, &u.Email, &u.Name, &u.Admin, &u.Finance, &teams, &roles,
		&ep.allocations, &ep.nodes, &ep.config)
	if err == pgx.ErrNoRows {
		return allot.User{}, ep, allot.Errorf(allot.EUnauthorized, "invalid or revoked API token, or it has expired")
	}
	if err != nil {
		return allot.User{}, ep, mapErr("checking API token", err)
	}
	for i := range teams {
		u.Memberships = append(u.Memberships, allot.Membership{Team: teams[i], Role: roles[i]})
	}
	if lastUsed == nil || s.Now().Sub(*lastUsed) > time.Minute {
		// A write per API call would cost more than the call; and it is
		// bookkeeping, committed without waiting for the WAL flush (as the
		// node tokens' mark).
		if _, err := s.db.Exec(ctx, `WITH `+asyncCommitSQL+` UPDATE api_tokens SET last_used_at = $2 FROM ac WHERE token_hash = $1`, h, s.Now()); err != nil {
			return allot.User{}, ep, mapErr("recording token use", err)
		}
	}
	ep.ok = true
	return u, ep, nil
}

// APITokenBySecret returns the stored token whose secret this is, whatever
// its state; an unknown secret is EUnauthorized.
func (s *Store) APITokenBySecret(ctx context.Context, secret string) (APIToken, error) {
	t, err := scanToken(s.db.QueryRow(ctx, tokenSelect+` WHERE token_hash = $1`, hashSecret(secret)))
	if err == pgx.ErrNoRows {
		return APIToken{}, allot.Errorf(allot.EUnauthorized, "invalid API token")
	}
	return t, mapErr("loading API token", err)
}

// CreateSession starts a portal session for userID and returns its secret
// (the cookie value); only its hash is stored. A disabled user gets none
// (EForbidden, ErrUserDisabled's message).
func (s *Store) CreateSession(ctx context.Context, userID int64, ttl time.Duration) (string, error) {
	secret := randomSecret()
	tag, err := s.db.Exec(ctx, `INSERT INTO sessions (id_hash, user_id, expires_at) SELECT $1, id, $3 FROM users WHERE id = $2 AND disabled_at IS NULL`,
		hashSecret(secret), userID, s.Now().Add(ttl))
	if err == nil && tag.RowsAffected() == 0 {
		return "", errUserDisabled()
	}
	return secret, mapErr("creating session", err)
}

// UserBySession returns the user of an unexpired session of a user who is
// not disabled.
func (s *Store) UserBySession(ctx context.Context, secret string) (allot.User, error) {
	var uid int64
	err := s.db.QueryRow(ctx, `SELECT s.user_id FROM sessions s JOIN users u ON u.id = s.user_id
		WHERE s.id_hash = $1 AND s.expires_at > $2 AND u.disabled_at IS NULL`, hashSecret(secret), s.Now()).Scan(&uid)
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

// RevokeAPITokensNamed revokes userID's unrevoked tokens called name, and
// the tokens made with them.
func (s *Store) RevokeAPITokensNamed(ctx context.Context, userID int64, name string) error {
	return s.InTx(ctx, func(tx *Store) error {
		rows, err := tx.db.Query(ctx, `SELECT id FROM api_tokens WHERE user_id = $1 AND name = $2 AND revoked_at IS NULL FOR UPDATE`, userID, name)
		if err != nil {
			return mapErr("revoking API tokens", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(ids) == 0 {
			return mapErr("revoking API tokens", err)
		}
		_, err = tx.revokeTokenTree(ctx, ids, tx.Now())
		return err
	})
}

// CountTeams returns the number of teams (0 means an empty organisation).
func (s *Store) CountTeams(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM teams`).Scan(&n)
	return n, mapErr("counting teams", err)
}

// OIDCLogin is a sign-in in flight: what the callback needs to finish it.
type OIDCLogin struct {
	Nonce    string
	Verifier string // PKCE code verifier
	Next     string // local path to go to afterwards
}

// SaveOIDCLogin stores a sign-in in flight under its state for ttl and
// drops the ones that expired.
func (s *Store) SaveOIDCLogin(ctx context.Context, state string, l OIDCLogin, ttl time.Duration) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM oidc_logins WHERE expires_at <= $1`, s.Now()); err != nil {
		return mapErr("dropping expired sign-ins", err)
	}
	_, err := s.db.Exec(ctx, `INSERT INTO oidc_logins (state_hash, nonce, verifier, next, expires_at) VALUES ($1, $2, $3, $4, $5)`,
		hashSecret(state), l.Nonce, l.Verifier, l.Next, s.Now().Add(ttl))
	return mapErr("saving sign-in", err)
}

// TakeOIDCLogin returns the sign-in stored under state and deletes it, so a
// state works once. An unknown, used or expired state is EUnauthorized.
func (s *Store) TakeOIDCLogin(ctx context.Context, state string) (OIDCLogin, error) {
	var l OIDCLogin
	var expires time.Time
	err := s.db.QueryRow(ctx, `DELETE FROM oidc_logins WHERE state_hash = $1 RETURNING nonce, verifier, next, expires_at`,
		hashSecret(state)).Scan(&l.Nonce, &l.Verifier, &l.Next, &expires)
	if err == pgx.ErrNoRows || err == nil && !expires.After(s.Now()) {
		return OIDCLogin{}, allot.Errorf(allot.EUnauthorized, "this sign-in was already used or has expired; start again")
	}
	return l, mapErr("loading sign-in", err)
}

// PlaceholderSubjectPrefix starts the oidc_subject of a person Allot
// recorded before they ever signed in through single sign-on (the demo
// organisation's people are "demo|<email>"). Such a subject is the only
// one a sign-in may replace, linking the account by email; a subject any
// identity provider issued is never replaced.
const PlaceholderSubjectPrefix = "demo|"

// NeverSignedIn reports whether subject is a placeholder: its user has
// never signed in through single sign-on.
func NeverSignedIn(subject string) bool { return strings.HasPrefix(subject, PlaceholderSubjectPrefix) }

// RandomSecret returns 32 random bytes, base64url-encoded: for OIDC state
// and nonce values.
func RandomSecret() string { return randomSecret() }
