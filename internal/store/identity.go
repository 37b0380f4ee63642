package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// resolveAccount returns the POSIX account a job of team submitted by
// userID runs as, and where it came from (allot.ResolveAccount): the
// admin's mapping of the user, the identity provider's claim, the team's
// service account. A claim naming an account Allot gives to someone else
// (any team's service account, another person's mapping or claim) is
// ignored: the provider's claim (preferred_username, say) need not be
// unique, and people can often edit it.
// accountSourcesSQL selects the three sources of a job's POSIX account for
// the user and team placeholders given (allot.ResolveAccount picks): the
// admin's mapping, the identity provider's claim (unless it names a team's
// service account or another person's account), the team's service
// account. The submission reads them with its other context.
func accountSourcesSQL(user, team string) string {
	return `coalesce((SELECT posix_user FROM users WHERE id = ` + user + `), ''),
		coalesce((SELECT u.oidc_posix_user FROM users u WHERE u.id = ` + user + `
			AND NOT EXISTS (SELECT 1 FROM teams t WHERE t.posix_account = u.oidc_posix_user)
			AND NOT EXISTS (SELECT 1 FROM users o WHERE o.id <> u.id AND u.oidc_posix_user IN (o.posix_user, o.oidc_posix_user))), ''),
		coalesce((SELECT posix_account FROM teams WHERE slug = ` + team + `), '')`
}

func (s *Store) resolveAccount(ctx context.Context, userID int64, team string) (string, string, error) {
	var mapped, claimed, teamAccount string
	err := s.db.QueryRow(ctx, `SELECT `+accountSourcesSQL("$1", "$2"), userID, team).Scan(&mapped, &claimed, &teamAccount)
	if err != nil {
		return "", "", mapErr("resolving the job's POSIX account", err)
	}
	a, src := allot.ResolveAccount(mapped, claimed, teamAccount)
	return a, src, nil
}

// ResolveAccount is what a job of team submitted by u would run as now.
func (s *Store) ResolveAccount(ctx context.Context, u *allot.User, team string) (account, source string, err error) {
	return s.resolveAccount(ctx, u.ID, team)
}

// PosixMapping is a user and their POSIX accounts, as admins map them.
type PosixMapping struct {
	ID            int64    `json:"id"`
	Email         string   `json:"email"`
	Name          string   `json:"name"`
	Admin         bool     `json:"admin"`
	Finance       bool     `json:"finance"`
	Teams         []string `json:"teams"`
	PosixUser     string   `json:"posix_user"`      // the admin's mapping ("" = none)
	OIDCPosixUser string   `json:"oidc_posix_user"` // the identity provider's claim at the last sign-in
}

const posixMappingSelect = `
	SELECT u.id, u.email, u.name, u.is_admin, u.is_finance,
		coalesce(array_agg(m.team ORDER BY m.team) FILTER (WHERE m.team IS NOT NULL), '{}'),
		u.posix_user, u.oidc_posix_user
	FROM users u LEFT JOIN memberships m ON m.user_id = u.id`

func scanPosixMapping(r pgx.Row) (PosixMapping, error) {
	var a PosixMapping
	err := r.Scan(&a.ID, &a.Email, &a.Name, &a.Admin, &a.Finance, &a.Teams, &a.PosixUser, &a.OIDCPosixUser)
	return a, err
}

// ListPosixMappings returns every user with their POSIX accounts, by email.
func (s *Store) ListPosixMappings(ctx context.Context) ([]PosixMapping, error) {
	rows, err := s.db.Query(ctx, posixMappingSelect+` GROUP BY u.id ORDER BY u.email`)
	if err != nil {
		return nil, mapErr("listing users", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PosixMapping, error) { return scanPosixMapping(r) })
	return out, mapErr("listing users", err)
}

// PosixMappingOf returns the user named by ref: a numeric id or an email
// address (case-insensitive).
func (s *Store) PosixMappingOf(ctx context.Context, ref string) (PosixMapping, error) {
	ref = strings.TrimSpace(ref)
	q, arg := posixMappingSelect+` WHERE lower(u.email) = lower($1) GROUP BY u.id`, any(ref)
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		q, arg = posixMappingSelect+` WHERE u.id = $1 GROUP BY u.id`, id
	}
	a, err := scanPosixMapping(s.db.QueryRow(ctx, q, arg))
	if err == pgx.ErrNoRows {
		return a, allot.Errorf(allot.ENotFound, "no user %q", ref)
	}
	return a, mapErr(fmt.Sprintf("loading user %q", ref), err)
}

// SetPosixUser maps the user named by ref (id or email) to a POSIX
// account ("" removes the mapping), as actor, with an audit entry
// (user.posix_user, before and after) in the same transaction. Setting
// the account a user already has changes nothing and writes no entry.
func (s *Store) SetPosixUser(ctx context.Context, actor, ref, account, note string) (PosixMapping, AdminResult, error) {
	account = strings.TrimSpace(account)
	if account != "" {
		if msg := allot.POSIXAccountProblem(account); msg != "" {
			return PosixMapping{}, AdminResult{}, (allot.FieldErrors{"posix_user": msg}).Err()
		}
	}
	var out PosixMapping
	var res AdminResult
	err := s.InTx(ctx, func(tx *Store) error {
		a, err := tx.PosixMappingOf(ctx, ref)
		if err != nil {
			return err
		}
		if _, err := tx.db.Exec(ctx, `SELECT 1 FROM users WHERE id = $1 FOR UPDATE`, a.ID); err != nil {
			return mapErr("locking user", err)
		}
		if a.PosixUser == account {
			out = a
			return nil
		}
		type doc struct {
			Email     string `json:"email"`
			PosixUser string `json:"posix_user"`
		}
		before, _ := json.Marshal(doc{a.Email, a.PosixUser})
		after, _ := json.Marshal(doc{a.Email, account})
		if _, err := tx.db.Exec(ctx, `UPDATE users SET posix_user = $2 WHERE id = $1`, a.ID, account); err != nil {
			return mapErr("setting the user's POSIX account", err)
		}
		e := allot.AuditEntry{Actor: actor, Action: "user.posix_user", Object: fmt.Sprintf("user:%s", a.Email),
			Before: before, After: after, Note: strings.TrimSpace(note)}
		if err := tx.Audit(ctx, &e); err != nil {
			return err
		}
		a.PosixUser = account
		out, res = a, AdminResult{Changed: true, Entry: e}
		return nil
	})
	return out, res, err
}

// SetOIDCPosixUser records the POSIX account the identity provider's
// account claim gave userID at sign-in ("" = none: the claim is off, absent
// or not a valid account). The admin's mapping (posix_user) is kept.
func (s *Store) SetOIDCPosixUser(ctx context.Context, userID int64, account string) error {
	if account != "" {
		if msg := allot.POSIXAccountProblem(account); msg != "" {
			return (allot.FieldErrors{"oidc_posix_user": msg}).Err()
		}
	}
	_, err := s.db.Exec(ctx, `UPDATE users SET oidc_posix_user = $2 WHERE id = $1 AND oidc_posix_user <> $2`, userID, account)
	return mapErr("recording the account claim", err)
}
