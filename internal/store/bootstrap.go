package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// BootstrapTokenName names the API token `allot bootstrap-admin` makes.
const BootstrapTokenName = "bootstrap"

// BootstrapAdmin is what BootstrapAdmin did.
type BootstrapAdmin struct {
	User     allot.User
	Secret   string // the API token, shown once
	Token    APIToken
	Created  bool     // the user was new (else an existing user was made admin, or was one)
	Admins   []string // the admins there were before (only with force)
	AuditID  int64
	Promoted bool // an existing user was not an admin before
}

// BootstrapAdminValues is the audit log's document for a bootstrap.
type BootstrapAdminValues struct {
	Email       string    `json:"email"`
	Admin       bool      `json:"admin"`
	Created     bool      `json:"created"`
	Forced      bool      `json:"forced"`
	TokenPrefix string    `json:"token_prefix"`
	ExpiresAt   time.Time `json:"expires_at,omitzero"`
}

// BootstrapAdminUser makes the first admin of an empty organisation: the
// user with email (created, recorded before their first sign-in so that
// single sign-on with the same, verified, email links to it; or an existing
// user, made admin) and a new API token for them, expiring after ttl (0:
// never), whose secret is returned once. It is audited as
// user.bootstrap_admin by actor. When an enabled admin exists already it
// refuses (EConflict) unless force. Bad input is a field error and changes
// nothing.
func (s *Store) BootstrapAdminUser(ctx context.Context, email, name, actor string, force bool, ttl time.Duration) (BootstrapAdmin, error) {
	email = strings.TrimSpace(email)
	name = strings.TrimSpace(name)
	f := allot.FieldErrors{}
	if at := strings.Index(email, "@"); at < 1 || at == len(email)-1 || strings.ContainsAny(email, " \t\r\n") {
		f.Add("email", "must be an email address, e.g. ops@corp.example")
	}
	if ttl < 0 {
		f.Add("ttl", "must not be negative (0: the token never expires)")
	}
	if err := f.Err(); err != nil {
		return BootstrapAdmin{}, err
	}
	if name == "" {
		name = email[:strings.Index(email, "@")]
	}
	if actor == "" {
		actor = "cli"
	}
	var out BootstrapAdmin
	err := s.InTx(ctx, func(tx *Store) error {
		out = BootstrapAdmin{}
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('allot.bootstrap_admin'))`); err != nil {
			return mapErr("locking", err)
		}
		rows, err := tx.db.Query(ctx, `SELECT email FROM users WHERE is_admin AND disabled_at IS NULL ORDER BY id`)
		if err != nil {
			return mapErr("listing admins", err)
		}
		admins, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return mapErr("listing admins", err)
		}
		if len(admins) > 0 && !force {
			return allot.Errorf(allot.EConflict, "this organisation has an admin already (%s): nothing was changed; "+
				"an admin makes further admins and tokens, or run again with --force to make %s an admin with a new token anyway",
				strings.Join(admins, ", "), email)
		}
		if force {
			out.Admins = admins
		}
		var u allot.User
		var disabled, wasAdmin bool
		err = tx.db.QueryRow(ctx, `SELECT id, disabled_at IS NOT NULL, is_admin FROM users WHERE lower(email) = lower($1) FOR UPDATE`, email).
			Scan(&u.ID, &disabled, &wasAdmin)
		switch {
		case err == pgx.ErrNoRows:
			u = allot.User{OIDCSubject: PlaceholderSubjectPrefix + email, Email: email, Name: name, Admin: true}
			if err := tx.CreateUser(ctx, &u); err != nil {
				return err
			}
			out.Created = true
		case err != nil:
			return mapErr("finding user", err)
		case disabled:
			return allot.Errorf(allot.EConflict, "%s is disabled: enable them first (allot user enable %s), or bootstrap another email", email, email)
		default:
			if _, err := tx.db.Exec(ctx, `UPDATE users SET is_admin = true WHERE id = $1`, u.ID); err != nil {
				return mapErr("making admin", err)
			}
			out.Promoted = !wasAdmin
		}
		if out.User, err = tx.GetUser(ctx, u.ID); err != nil {
			return err
		}
		var exp time.Time
		if ttl > 0 {
			exp = tx.Now().Add(ttl)
		}
		if out.Secret, out.Token, err = tx.CreateAPITokenExpiring(ctx, u.ID, BootstrapTokenName, exp); err != nil {
			return err
		}
		after, err := json.Marshal(BootstrapAdminValues{Email: out.User.Email, Admin: true, Created: out.Created, Forced: force && len(admins) > 0,
			TokenPrefix: out.Token.Prefix, ExpiresAt: exp.UTC()})
		if err != nil {
			return err
		}
		var before json.RawMessage
		if !out.Created {
			before = json.RawMessage(fmt.Sprintf(`{"email":%q,"admin":%t}`, out.User.Email, wasAdmin))
		}
		e := allot.AuditEntry{Actor: actor, Action: "user.bootstrap_admin", Object: "user:" + out.User.Email, Before: before, After: after,
			Note: "allot bootstrap-admin"}
		if err := tx.Audit(ctx, &e); err != nil {
			return err
		}
		out.AuditID = e.ID
		return nil
	})
	return out, err
}
