package store

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// CLITokenNamePrefix starts the name of every API token `allot login`
// makes ("allot login: <host>").
const CLITokenNamePrefix = "allot login: "

// LinkRequiredError is a sign-in Allot will not link to an existing
// account by itself: an admin must link the identity (LinkOIDCIdentity).
type LinkRequiredError struct {
	Email  string
	Reason string
}

func (e *LinkRequiredError) Error() string {
	return fmt.Sprintf("an Allot account exists for %s, but this sign-in is not linked to it: %s", e.Email, e.Reason)
}

// SignInOIDC records a person who signed in through OIDC, keyed by
// (issuer, subject):
//
//   - found by (issuer, subject): updated;
//   - recorded before issuers were kept (issuer ”), same subject and
//     email: adopted by this issuer;
//   - else an account with the same email that never signed in (a
//     placeholder subject: the bootstrap admin, the demo's people) is
//     linked only when emailVerified and linkByEmail (the issuer is on the
//     operator's allow-list), with an audit entry (user.oidc_link);
//   - an account with the same email and another identity, or one the
//     rules above do not allow linking, is *LinkRequiredError: no second
//     identity-provider account takes over an account by claiming its email;
//   - no account with the email: created.
//
// Name, email, admin and finance flags and memberships are replaced by
// what the identity provider says; memberships in teams Allot does not
// know are skipped and returned.
func (s *Store) SignInOIDC(ctx context.Context, u *allot.User, issuer string, emailVerified, linkByEmail bool) (unknownTeams []string, err error) {
	if err := u.Validate(); err != nil {
		return nil, err
	}
	if NeverSignedIn(u.OIDCSubject) {
		return nil, allot.Errorf(allot.EInvalid, "the identity provider sent a reserved subject %q", u.OIDCSubject)
	}
	if issuer == "" {
		return nil, allot.Errorf(allot.EInvalid, "the ID token has no issuer")
	}
	err = s.InTx(ctx, func(tx *Store) error {
		unknownTeams = nil
		var disabled, found bool
		var email string
		err := tx.db.QueryRow(ctx, `SELECT id, disabled_at IS NOT NULL FROM users WHERE oidc_issuer = $1 AND oidc_subject = $2 FOR UPDATE`,
			issuer, u.OIDCSubject).Scan(&u.ID, &disabled)
		switch {
		case err == nil:
			found = true
		case err != pgx.ErrNoRows:
			return mapErr("finding user", err)
		}
		if !found {
			err = tx.db.QueryRow(ctx, `SELECT id, email, disabled_at IS NOT NULL FROM users WHERE oidc_issuer = '' AND oidc_subject = $1 FOR UPDATE`,
				u.OIDCSubject).Scan(&u.ID, &email, &disabled)
			switch {
			case err == nil && strings.EqualFold(email, u.Email):
				found = true
			case err == nil:
				return &LinkRequiredError{Email: u.Email, Reason: "an account recorded before Allot kept issuers has this subject but another email address"}
			case err != pgx.ErrNoRows:
				return mapErr("finding user", err)
			}
		}
		linked := false
		if !found {
			var subject, oldIssuer string
			err = tx.db.QueryRow(ctx, `SELECT id, oidc_issuer, oidc_subject, disabled_at IS NOT NULL FROM users WHERE lower(email) = lower($1) FOR UPDATE`,
				u.Email).Scan(&u.ID, &oldIssuer, &subject, &disabled)
			switch {
			case err == pgx.ErrNoRows:
			case err != nil:
				return mapErr("finding user", err)
			case disabled:
				return errUserDisabled()
			case !NeverSignedIn(subject):
				return &LinkRequiredError{Email: u.Email, Reason: "that account signs in with another identity-provider account"}
			case !emailVerified:
				return &LinkRequiredError{Email: u.Email, Reason: "the identity provider does not say this email address is verified (email_verified)"}
			case !linkByEmail:
				return &LinkRequiredError{Email: u.Email, Reason: "this server does not link accounts by email for the issuer " + issuer + " (--oidc-link-email-issuers)"}
			default:
				found, linked = true, true
			}
		}
		if found && disabled {
			return errUserDisabled()
		}
		if !found {
			err = tx.db.QueryRow(ctx, `INSERT INTO users (oidc_issuer, oidc_subject, email, name, is_admin, is_finance, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
				issuer, u.OIDCSubject, u.Email, u.Name, u.Admin, u.Finance, tx.Now()).Scan(&u.ID)
			if err != nil {
				return mapErr("creating user", err)
			}
		} else {
			if _, err := tx.db.Exec(ctx, `UPDATE users SET oidc_issuer = $2, oidc_subject = $3, email = $4, name = $5, is_admin = $6, is_finance = $7 WHERE id = $1`,
				u.ID, issuer, u.OIDCSubject, u.Email, u.Name, u.Admin, u.Finance); err != nil {
				return mapErr("updating user", err)
			}
			if _, err := tx.db.Exec(ctx, `DELETE FROM memberships WHERE user_id = $1`, u.ID); err != nil {
				return mapErr("replacing memberships", err)
			}
		}
		if linked {
			after, _ := json.Marshal(identityDoc{Email: u.Email, Issuer: issuer, Subject: u.OIDCSubject})
			e := allot.AuditEntry{Action: "user.oidc_link", Object: "user:" + u.Email, After: after,
				Note: "linked at first sign-in by verified email (the issuer is on --oidc-link-email-issuers)"}
			if err := tx.Audit(ctx, &e); err != nil {
				return err
			}
		}
		var kept []allot.Membership
		for _, m := range u.Memberships {
			tag, err := tx.db.Exec(ctx, `INSERT INTO memberships (user_id, team, role) SELECT $1, slug, $3 FROM teams WHERE slug = $2`, u.ID, m.Team, m.Role)
			if err != nil {
				return mapErr("adding membership", err)
			}
			if tag.RowsAffected() == 0 {
				unknownTeams = append(unknownTeams, m.Team)
				continue
			}
			kept = append(kept, m)
		}
		u.Memberships = kept
		return nil
	})
	return unknownTeams, err
}

type identityDoc struct {
	Email   string `json:"email"`
	Issuer  string `json:"issuer"`
	Subject string `json:"subject"`
}

// OIDCIdentity is a user's single sign-on identity.
type OIDCIdentity struct {
	UserID  int64  `json:"user_id"`
	Email   string `json:"email"`
	Issuer  string `json:"issuer"`
	Subject string `json:"subject"`
}

// LinkOIDCIdentity binds (issuer, subject) to the user named by ref (an id
// or an email address), as actor: the explicit admin choice that links a
// sign-in Allot refused to link by itself. It is audited (user.oidc_link,
// before and after) and ends the user's sessions and revokes the API
// tokens allot login made (CLITokenNamePrefix): the identity that signs
// in as them changed. Linking the identity the user already has changes
// nothing.
func (s *Store) LinkOIDCIdentity(ctx context.Context, actor, ref, issuer, subject, note string) (OIDCIdentity, AdminResult, error) {
	issuer, subject = strings.TrimSpace(issuer), strings.TrimSpace(subject)
	f := allot.FieldErrors{}
	if p, err := url.Parse(issuer); issuer == "" || err != nil || p.Host == "" || (p.Scheme != "https" && p.Scheme != "http") {
		f.Add("issuer", "must be the identity provider's issuer URL, as in the ID token's iss claim")
	}
	switch {
	case subject == "":
		f.Add("subject", "is required: the ID token's sub claim")
	case len(subject) > 255:
		f.Add("subject", "is too long (at most 255 characters)")
	case NeverSignedIn(subject):
		f.Add("subject", "%q is reserved for accounts that never signed in", subject)
	}
	if len(f) > 0 {
		return OIDCIdentity{}, AdminResult{}, f.Err()
	}
	var out OIDCIdentity
	var res AdminResult
	err := s.InTx(ctx, func(tx *Store) error {
		a, err := tx.PosixMappingOf(ctx, ref)
		if err != nil {
			return err
		}
		var before identityDoc
		if err := tx.db.QueryRow(ctx, `SELECT email, oidc_issuer, oidc_subject FROM users WHERE id = $1 FOR UPDATE`, a.ID).
			Scan(&before.Email, &before.Issuer, &before.Subject); err != nil {
			return mapErr("locking user", err)
		}
		out = OIDCIdentity{UserID: a.ID, Email: a.Email, Issuer: issuer, Subject: subject}
		if before.Issuer == issuer && before.Subject == subject {
			return nil
		}
		var other string
		err = tx.db.QueryRow(ctx, `SELECT email FROM users WHERE oidc_issuer = $1 AND oidc_subject = $2 AND id <> $3`, issuer, subject, a.ID).Scan(&other)
		if err == nil {
			return (allot.FieldErrors{"subject": fmt.Sprintf("this identity signs in as %s already", other)}).Err()
		}
		if err != pgx.ErrNoRows {
			return mapErr("checking the identity", err)
		}
		if _, err := tx.db.Exec(ctx, `UPDATE users SET oidc_issuer = $2, oidc_subject = $3 WHERE id = $1`, a.ID, issuer, subject); err != nil {
			return mapErr("linking the identity", err)
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM sessions WHERE user_id = $1`, a.ID); err != nil {
			return mapErr("ending the user's sessions", err)
		}
		// The API tokens allot login made are sign-ins too, of an identity
		// that may no longer sign in as this user.
		rows, err := tx.db.Query(ctx, `SELECT id FROM api_tokens WHERE user_id = $1 AND revoked_at IS NULL AND starts_with(name, $2) FOR UPDATE`,
			a.ID, CLITokenNamePrefix)
		if err != nil {
			return mapErr("revoking allot login tokens", err)
		}
		cli, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return mapErr("revoking allot login tokens", err)
		}
		if len(cli) > 0 {
			if _, err := tx.revokeTokenTree(ctx, cli, tx.Now()); err != nil {
				return err
			}
		}
		// The sign-ins that waited for this link are settled.
		if _, err := tx.db.Exec(ctx, `UPDATE oidc_sign_ins SET outcome = 'linked', detail = 'linked by an admin to ' || $3
			WHERE issuer = $1 AND subject = $2 AND outcome = 'link_required'`, issuer, subject, a.Email); err != nil {
			return mapErr("settling waiting sign-ins", err)
		}
		b, _ := json.Marshal(before)
		after, _ := json.Marshal(identityDoc{Email: a.Email, Issuer: issuer, Subject: subject})
		e := allot.AuditEntry{Actor: actor, Action: "user.oidc_link", Object: "user:" + a.Email, Before: b, After: after, Note: strings.TrimSpace(note)}
		if err := tx.Audit(ctx, &e); err != nil {
			return err
		}
		res = AdminResult{Changed: true, Entry: e}
		return nil
	})
	return out, res, err
}

// OIDCSignIn is what one sign-in sent: the names of the claims and how
// many values each claim the mapping reads had (never the values), and
// what came of it.
type OIDCSignIn struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Issuer  string    `json:"issuer"`
	Subject string    `json:"subject"`
	Email   string    `json:"email"`
	// Outcome: signed_in, link_required (waiting for an admin to link
	// it), linked (an admin has since linked it), refused.
	Outcome string `json:"outcome"`
	Detail  string `json:"detail,omitempty"`
	// ClaimNames are all the claims the provider sent (ID token and
	// userinfo); ClaimCounts the number of values of each claim the
	// mapping reads that was present.
	ClaimNames  []string       `json:"claim_names"`
	ClaimCounts map[string]int `json:"claim_counts"`
	// Matched counts the values that matched a rule (or the built-in
	// mapping); Overage: the token said the groups are too many to send
	// (Entra ID's _claim_names.groups) instead of listing them.
	Matched int  `json:"matched"`
	Overage bool `json:"overage"`
	// Roles is what the sign-in gave, e.g. "admin, lead of nlp".
	Roles string `json:"roles"`
}

// keptSignIns is how many sign-ins are kept.
const keptSignIns = 200

// RecordOIDCSignIn stores what a sign-in sent, keeping the latest 200.
func (s *Store) RecordOIDCSignIn(ctx context.Context, r OIDCSignIn) error {
	counts, _ := json.Marshal(r.ClaimCounts)
	if r.ClaimNames == nil {
		r.ClaimNames = []string{}
	}
	return s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `INSERT INTO oidc_sign_ins (at, issuer, subject, email, outcome, detail, claim_names, claim_counts, matched, overage, roles)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`, tx.Now(), r.Issuer, r.Subject, r.Email, r.Outcome, r.Detail,
			r.ClaimNames, counts, r.Matched, r.Overage, r.Roles); err != nil {
			return mapErr("recording the sign-in", err)
		}
		_, err := tx.db.Exec(ctx, `DELETE FROM oidc_sign_ins WHERE id NOT IN (SELECT id FROM oidc_sign_ins ORDER BY at DESC, id DESC LIMIT $1)`, keptSignIns)
		return mapErr("pruning sign-ins", err)
	})
}

// RecentOIDCSignIns returns the latest sign-ins, newest first.
func (s *Store) RecentOIDCSignIns(ctx context.Context, limit int) ([]OIDCSignIn, error) {
	if limit <= 0 || limit > keptSignIns {
		limit = keptSignIns
	}
	rows, err := s.db.Query(ctx, `SELECT id, at, issuer, subject, email, outcome, detail, claim_names, claim_counts, matched, overage, roles
		FROM oidc_sign_ins ORDER BY at DESC, id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, mapErr("listing sign-ins", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OIDCSignIn, error) {
		var x OIDCSignIn
		var counts []byte
		err := r.Scan(&x.ID, &x.At, &x.Issuer, &x.Subject, &x.Email, &x.Outcome, &x.Detail, &x.ClaimNames, &counts, &x.Matched, &x.Overage, &x.Roles)
		if err == nil {
			err = json.Unmarshal(counts, &x.ClaimCounts)
		}
		return x, err
	})
	if out == nil {
		out = []OIDCSignIn{}
	}
	return out, mapErr("listing sign-ins", err)
}
