package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

const idpMappingSelect = `SELECT id, claim, match, pattern, grant_role, team, updated_at, updated_by FROM idp_mappings`

func scanIdPMapping(r pgx.Row) (IdPMapping, error) {
	var m IdPMapping
	err := r.Scan(&m.ID, &m.Claim, &m.Match, &m.Pattern, &m.Grant, &m.Team, &m.UpdatedAt, &m.UpdatedBy)
	return m, err
}

// ListIdPMappings returns the rules by claim, then id.
func (s *Store) ListIdPMappings(ctx context.Context) ([]IdPMapping, error) {
	rows, err := s.db.Query(ctx, idpMappingSelect+` ORDER BY claim, id`)
	if err != nil {
		return nil, mapErr("listing identity-provider mappings", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (IdPMapping, error) { return scanIdPMapping(r) })
	if out == nil {
		out = []IdPMapping{}
	}
	return out, mapErr("listing identity-provider mappings", err)
}

// IdPRules returns the rules compiled, for sign-in. A stored rule that no
// longer compiles (it cannot: they are checked when saved) is skipped.
func (s *Store) IdPRules(ctx context.Context) ([]*Rule, error) {
	ms, err := s.ListIdPMappings(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Rule
	for _, m := range ms {
		if r, err := m.Compile(); err == nil {
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *Store) idpMapping(ctx context.Context, id int64, lock bool) (IdPMapping, error) {
	q := idpMappingSelect + ` WHERE id = $1`
	if lock {
		q += ` FOR UPDATE`
	}
	m, err := scanIdPMapping(s.db.QueryRow(ctx, q, id))
	if err == pgx.ErrNoRows {
		return m, allot.Errorf(allot.ENotFound, "no identity-provider mapping %d", id)
	}
	return m, mapErr("loading identity-provider mapping", err)
}

// checkIdPMapping compiles m and checks that its fixed team exists and that
// no other rule (but except) is the same.
func (s *Store) checkIdPMapping(ctx context.Context, m IdPMapping, except int64) (IdPMapping, error) {
	r, err := m.Compile()
	if err != nil {
		return m, err
	}
	m = r.IdPMapping
	if m.Team != "" {
		var n int
		if err := s.db.QueryRow(ctx, `SELECT count(*) FROM teams WHERE slug = $1`, m.Team).Scan(&n); err != nil {
			return m, mapErr("checking the team", err)
		}
		if n == 0 {
			return m, (allot.FieldErrors{"team": fmt.Sprintf("no team %q: create it first (Teams)", m.Team)}).Err()
		}
	}
	var dup int64
	err = s.db.QueryRow(ctx, `SELECT id FROM idp_mappings WHERE claim = $1 AND match = $2 AND pattern = $3 AND grant_role = $4 AND team = $5 AND id <> $6`,
		m.Claim, m.Match, m.Pattern, m.Grant, m.Team, except).Scan(&dup)
	if err == nil {
		return m, (allot.FieldErrors{"pattern": fmt.Sprintf("the same rule exists already (#%d)", dup)}).Err()
	}
	if err != pgx.ErrNoRows {
		return m, mapErr("checking for the same rule", err)
	}
	return m, nil
}

func idpAudit(ctx context.Context, tx *Store, actor, action string, id int64, before, after *IdPMapping, note string) (allot.AuditEntry, error) {
	doc := func(m *IdPMapping) json.RawMessage {
		if m == nil {
			return nil
		}
		b, _ := json.Marshal(struct {
			Claim   string `json:"claim"`
			Match   string `json:"match"`
			Pattern string `json:"pattern"`
			Grant   string `json:"grant"`
			Team    string `json:"team"`
		}{m.Claim, m.Match, m.Pattern, m.Grant, m.Team})
		return b
	}
	e := allot.AuditEntry{Actor: actor, Action: action, Object: fmt.Sprintf("idp_mapping:%d", id),
		Before: doc(before), After: doc(after), Note: strings.TrimSpace(note)}
	return e, tx.Audit(ctx, &e)
}

// CreateIdPMapping adds a rule as actor, audited (idp_mapping.create) in
// the same transaction. Bad input is field errors and changes nothing.
func (s *Store) CreateIdPMapping(ctx context.Context, actor string, m IdPMapping, note string) (IdPMapping, AdminResult, error) {
	var res AdminResult
	err := s.InTx(ctx, func(tx *Store) error {
		// One writer at a time, so the duplicate check holds.
		if _, err := tx.db.Exec(ctx, `LOCK TABLE idp_mappings IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return mapErr("locking identity-provider mappings", err)
		}
		var err error
		if m, err = tx.checkIdPMapping(ctx, m, 0); err != nil {
			return err
		}
		m.UpdatedAt, m.UpdatedBy = tx.Now(), actor
		err = tx.db.QueryRow(ctx, `INSERT INTO idp_mappings (claim, match, pattern, grant_role, team, updated_at, updated_by)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`, m.Claim, m.Match, m.Pattern, m.Grant, m.Team, m.UpdatedAt, m.UpdatedBy).Scan(&m.ID)
		if err != nil {
			return mapErr("adding the identity-provider mapping", err)
		}
		e, err := idpAudit(ctx, tx, actor, "idp_mapping.create", m.ID, nil, &m, note)
		res = AdminResult{Changed: true, Entry: e}
		return err
	})
	return m, res, err
}

// UpdateIdPMapping replaces rule id as actor, audited (idp_mapping.update);
// the same values change nothing and write no entry.
func (s *Store) UpdateIdPMapping(ctx context.Context, actor string, id int64, m IdPMapping, note string) (IdPMapping, AdminResult, error) {
	var res AdminResult
	var out IdPMapping
	err := s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `LOCK TABLE idp_mappings IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return mapErr("locking identity-provider mappings", err)
		}
		before, err := tx.idpMapping(ctx, id, true)
		if err != nil {
			return err
		}
		if m, err = tx.checkIdPMapping(ctx, m, id); err != nil {
			return err
		}
		if m.Claim == before.Claim && m.Match == before.Match && m.Pattern == before.Pattern && m.Grant == before.Grant && m.Team == before.Team {
			out = before
			return nil
		}
		m.ID, m.UpdatedAt, m.UpdatedBy = id, tx.Now(), actor
		if _, err := tx.db.Exec(ctx, `UPDATE idp_mappings SET claim = $2, match = $3, pattern = $4, grant_role = $5, team = $6, updated_at = $7, updated_by = $8 WHERE id = $1`,
			id, m.Claim, m.Match, m.Pattern, m.Grant, m.Team, m.UpdatedAt, m.UpdatedBy); err != nil {
			return mapErr("updating the identity-provider mapping", err)
		}
		e, err := idpAudit(ctx, tx, actor, "idp_mapping.update", id, &before, &m, note)
		out, res = m, AdminResult{Changed: true, Entry: e}
		return err
	})
	return out, res, err
}

// DeleteIdPMapping removes rule id as actor, audited (idp_mapping.delete).
func (s *Store) DeleteIdPMapping(ctx context.Context, actor string, id int64, note string) (IdPMapping, AdminResult, error) {
	var res AdminResult
	var before IdPMapping
	err := s.InTx(ctx, func(tx *Store) error {
		var err error
		if before, err = tx.idpMapping(ctx, id, true); err != nil {
			return err
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM idp_mappings WHERE id = $1`, id); err != nil {
			return mapErr("deleting the identity-provider mapping", err)
		}
		e, err := idpAudit(ctx, tx, actor, "idp_mapping.delete", id, &before, nil, note)
		res = AdminResult{Changed: true, Entry: e}
		return err
	})
	return before, res, err
}
