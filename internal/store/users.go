package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// Disabling a person (issue 12): an admin can disable a user. Disabling
// revokes all their API tokens and ends all their portal sessions in one
// audited transaction; until an admin enables them again they cannot sign
// in (CreateSession and SignInOIDC refuse), and no token or session of
// theirs works (UserByAPIToken and UserBySession check). Enabling does not
// bring revoked tokens back.

// errUserDisabled is what a disabled person gets when they try to sign in
// or to use Allot.
func errUserDisabled() error {
	return allot.Errorf(allot.EForbidden, "this Allot account is disabled: ask an admin to enable it before you sign in again")
}

// UserAccount is a user with their account's state, for admins.
type UserAccount struct {
	ID           int64
	Email        string
	Name         string
	Admin        bool
	Finance      bool
	Teams        []string
	CreatedAt    time.Time
	DisabledAt   time.Time // zero: enabled
	DisabledBy   string
	ActiveTokens int
}

// Disabled says whether the account is disabled.
func (u *UserAccount) Disabled() bool { return !u.DisabledAt.IsZero() }

const accountSelect = `
	SELECT u.id, u.email, u.name, u.is_admin, u.is_finance,
		coalesce((SELECT array_agg(m.team ORDER BY m.team) FROM memberships m WHERE m.user_id = u.id), '{}'),
		u.created_at, u.disabled_at, u.disabled_by,
		(SELECT count(*) FROM api_tokens t WHERE t.user_id = u.id AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > $1))
	FROM users u`

func scanAccount(r pgx.Row) (UserAccount, error) {
	var a UserAccount
	var disabled *time.Time
	err := r.Scan(&a.ID, &a.Email, &a.Name, &a.Admin, &a.Finance, &a.Teams, &a.CreatedAt, &disabled, &a.DisabledBy, &a.ActiveTokens)
	if disabled != nil {
		a.DisabledAt = *disabled
	}
	return a, err
}

// ListUserAccounts returns every user by email with their account state.
func (s *Store) ListUserAccounts(ctx context.Context) ([]UserAccount, error) {
	rows, err := s.db.Query(ctx, accountSelect+` ORDER BY u.email`, s.Now())
	if err != nil {
		return nil, mapErr("listing users", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UserAccount, error) { return scanAccount(r) })
	return out, mapErr("listing users", err)
}

// userRef reads a reference to a user: a numeric ID or an email address.
func userRef(ref string) (where string, arg any, err error) {
	ref = strings.TrimSpace(ref)
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil && id > 0 {
		return `u.id = $2`, id, nil
	}
	if strings.Contains(ref, "@") {
		return `lower(u.email) = lower($2)`, ref, nil
	}
	return "", nil, (allot.FieldErrors{"user": "must be a user's ID or email address"}).Err()
}

// UserAccountByRef returns the user ref names: their ID or email address
// (any case). An unknown user is ENotFound.
func (s *Store) UserAccountByRef(ctx context.Context, ref string) (UserAccount, error) {
	return s.accountByRef(ctx, ref, "")
}

func (s *Store) accountByRef(ctx context.Context, ref, lock string) (UserAccount, error) {
	where, arg, err := userRef(ref)
	if err != nil {
		return UserAccount{}, err
	}
	a, err := scanAccount(s.db.QueryRow(ctx, accountSelect+` WHERE `+where+lock, s.Now(), arg))
	if err == pgx.ErrNoRows {
		return UserAccount{}, allot.Errorf(allot.ENotFound, "no user %q", strings.TrimSpace(ref))
	}
	return a, mapErr("loading user", err)
}

// UserAccessChange is what DisableUser or EnableUser did.
type UserAccessChange struct {
	User    UserAccount
	Changed bool // false: the user already was in that state
	// TokensRevoked and SessionsEnded count what disabling ended.
	TokensRevoked int64
	SessionsEnded int64
	AuditID       int64
}

// DisableUser disables the user ref names (ID or email) as admin by: all
// their API tokens are revoked and all their sessions end, in one
// audited transaction. Disabling oneself is EInvalid (an admin cannot
// lock themselves out); an unknown user is ENotFound; a user already
// disabled is left as is (Changed false, no audit entry).
func (s *Store) DisableUser(ctx context.Context, ref string, by *allot.User, note string) (UserAccessChange, error) {
	var out UserAccessChange
	err := s.InTx(ctx, func(tx *Store) error {
		out = UserAccessChange{}
		a, err := tx.accountByRef(ctx, ref, ` FOR UPDATE OF u`)
		if err != nil {
			return err
		}
		out.User = a
		if a.ID == by.ID {
			return allot.Errorf(allot.EInvalid, "you cannot disable your own account; ask another admin")
		}
		if a.Disabled() {
			return nil
		}
		now := tx.Now()
		if _, err := tx.db.Exec(ctx, `UPDATE users SET disabled_at = $2, disabled_by = $3 WHERE id = $1`, a.ID, now, by.Email); err != nil {
			return mapErr("disabling user", err)
		}
		tag, err := tx.db.Exec(ctx, `UPDATE api_tokens SET revoked_at = $2 WHERE user_id = $1 AND revoked_at IS NULL`, a.ID, now)
		if err != nil {
			return mapErr("revoking the user's API tokens", err)
		}
		out.TokensRevoked = tag.RowsAffected()
		if tag, err = tx.db.Exec(ctx, `DELETE FROM sessions WHERE user_id = $1`, a.ID); err != nil {
			return mapErr("ending the user's sessions", err)
		}
		out.SessionsEnded = tag.RowsAffected()
		out.Changed = true
		out.User.DisabledAt, out.User.DisabledBy, out.User.ActiveTokens = now, by.Email, 0
		e := allot.AuditEntry{Actor: by.Email, Action: "user.disable", Object: "user:" + a.Email,
			Note: withNote(fmt.Sprintf("disabled %s: %d API token(s) revoked, %d session(s) ended", a.Email, out.TokensRevoked, out.SessionsEnded), note)}
		if err := tx.Audit(ctx, &e); err != nil {
			return err
		}
		out.AuditID = e.ID
		return nil
	})
	return out, err
}

// EnableUser enables the user ref names again as admin by, audited: they
// may sign in again. Their revoked tokens stay revoked. A user who is not
// disabled is left as is (Changed false, no audit entry).
func (s *Store) EnableUser(ctx context.Context, ref string, by *allot.User, note string) (UserAccessChange, error) {
	var out UserAccessChange
	err := s.InTx(ctx, func(tx *Store) error {
		out = UserAccessChange{}
		a, err := tx.accountByRef(ctx, ref, ` FOR UPDATE OF u`)
		if err != nil {
			return err
		}
		out.User = a
		if !a.Disabled() {
			return nil
		}
		if _, err := tx.db.Exec(ctx, `UPDATE users SET disabled_at = NULL, disabled_by = '' WHERE id = $1`, a.ID); err != nil {
			return mapErr("enabling user", err)
		}
		out.Changed = true
		out.User.DisabledAt, out.User.DisabledBy = time.Time{}, ""
		e := allot.AuditEntry{Actor: by.Email, Action: "user.enable", Object: "user:" + a.Email,
			Note: withNote(fmt.Sprintf("enabled %s (disabled since %s by %s)", a.Email, a.DisabledAt.UTC().Format(time.RFC3339), a.DisabledBy), note)}
		if err := tx.Audit(ctx, &e); err != nil {
			return err
		}
		out.AuditID = e.ID
		return nil
	})
	return out, err
}

func withNote(s, note string) string {
	if note = strings.TrimSpace(note); note != "" {
		return s + ": " + note
	}
	return s
}
