package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// Audit appends e to the audit log and sets its ID and time. Call it on the
// transaction that makes the change, so a change and its entry land
// together or not at all.
func (s *Store) Audit(ctx context.Context, e *allot.AuditEntry) error {
	if e.Actor == "" {
		e.Actor = allot.ActorSystem
	}
	var version *int64
	if e.PolicyVersion != 0 {
		version = &e.PolicyVersion
	}
	err := s.db.QueryRow(ctx, `
		INSERT INTO audit_log (actor, action, object, policy_version, before, after, note, at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id, at`,
		e.Actor, e.Action, e.Object, version, nullJSON(e.Before), nullJSON(e.After), e.Note, s.Now()).Scan(&e.ID, &e.At)
	return mapErr("writing audit log", err)
}

func nullJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return []byte(b)
}

// AuditFilter narrows AuditLog. Zero values match everything.
type AuditFilter struct {
	Object string // exact object, e.g. "node:gpu01"
	Action string // exact action, or a kind prefix ending in "." ("tier.")
	Actor  string
	Since  time.Time
	Until  time.Time
	Limit  int // 0 = 500
}

// AuditLog returns entries newest first.
func (s *Store) AuditLog(ctx context.Context, f AuditFilter) ([]allot.AuditEntry, error) {
	if f.Limit <= 0 {
		f.Limit = 500
	}
	out := []allot.AuditEntry{}
	err := s.eachAudit(ctx, f, &f.Limit, func(e *allot.AuditEntry) error {
		out = append(out, *e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// EachAudit streams the audit entries f selects (f.Limit is ignored: all
// of them), newest first, to fn without holding them in memory: a page of
// ExportPageRows per short statement, and no connection held while fn
// runs. The set is fixed when it starts: entries written after the first
// page (the log only grows) are left out, so a long export is the log as
// it was when it began.
func (s *Store) EachAudit(ctx context.Context, f AuditFilter, fn func(*allot.AuditEntry) error) error {
	return s.eachAudit(ctx, f, nil, fn)
}

// eachAudit streams the entries f selects, newest first, to fn: at most
// limit of them, or all when limit is nil. fn's entry is reused.
func (s *Store) eachAudit(ctx context.Context, f AuditFilter, limit *int, fn func(*allot.AuditEntry) error) error {
	var since, until *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	if !f.Until.IsZero() {
		until = &f.Until
	}
	var maxID int64
	if err := s.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM audit_log`).Scan(&maxID); err != nil {
		return mapErr("reading audit log", err)
	}
	left := -1 // all
	if limit != nil {
		left = *limit
	}
	capacity := ExportPageRows
	if left >= 0 && left < capacity {
		capacity = left
	}
	page := make([]allot.AuditEntry, 0, capacity)
	var afterAt time.Time
	var afterID int64
	for first := true; left != 0; first = false {
		n := ExportPageRows
		if left >= 0 && left < n {
			n = left
		}
		args := []any{f.Object, f.Action, f.Actor, since, until, maxID, n}
		keyset := ""
		if !first {
			keyset = ` AND (at, id) < ($8, $9)`
			args = append(args, afterAt, afterID)
		}
		rows, err := s.db.Query(ctx, `
			SELECT id, at, actor, action, object, coalesce(policy_version, 0), before, after, note
			FROM audit_log
			WHERE ($1 = '' OR object = $1)
			  AND ($2 = '' OR action = $2 OR (right($2, 1) = '.' AND starts_with(action, $2)))
			  AND ($3 = '' OR actor = $3)
			  AND ($4::timestamptz IS NULL OR at >= $4)
			  AND ($5::timestamptz IS NULL OR at < $5)
			  AND id <= $6`+keyset+`
			ORDER BY at DESC, id DESC
			LIMIT $7`, args...)
		if err != nil {
			return mapErr("reading audit log", err)
		}
		page = page[:0]
		for rows.Next() {
			var e allot.AuditEntry
			var before, after []byte
			if err := rows.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.Object, &e.PolicyVersion, &before, &after, &e.Note); err != nil {
				rows.Close()
				return mapErr("reading audit log", err)
			}
			e.Before, e.After = before, after
			page = append(page, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return mapErr("reading audit log", err)
		}
		for i := range page {
			if err := fn(&page[i]); err != nil {
				return err
			}
		}
		if len(page) < n {
			return nil
		}
		if left > 0 {
			left -= len(page)
		}
		last := page[len(page)-1]
		afterAt, afterID = last.At, last.ID
	}
	return nil
}

// PolicyChange describes one admin change for ChangePolicy.
type PolicyChange struct {
	Actor  string // the admin's email, or allot.ActorSystem
	Action string // e.g. "tier.update"
	Object string // e.g. "tier:3"
	Note   string // the admin's comment (optional)
}

// ChangePolicy makes one policy change atomically: under a lock that
// serialises policy changes it loads the current policy, runs fn on a
// transaction-bound Store (fn may edit p's scalar fields and/or the policy
// tables: tiers, rates, teams…) and returns the value before and after,
// then stores p as a new policy version and writes the audit entry that
// names it. fn's error aborts everything.
func (s *Store) ChangePolicy(ctx context.Context, c PolicyChange, fn func(tx *Store, p *allot.Policy) (before, after any, err error)) (allot.AuditEntry, error) {
	var e allot.AuditEntry
	err := s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('allot.policy'))`); err != nil {
			return mapErr("locking policy", err)
		}
		p, err := tx.CurrentPolicy(ctx)
		if err != nil {
			return err
		}
		before, after, err := fn(tx, &p)
		if err != nil {
			return err
		}
		p.CreatedBy, p.Comment = c.Actor, c.Note
		if p.Comment == "" {
			p.Comment = c.Action + " " + c.Object
		}
		if err := tx.InsertPolicy(ctx, &p); err != nil {
			return err
		}
		e = allot.AuditEntry{Actor: c.Actor, Action: c.Action, Object: c.Object, PolicyVersion: p.Version, Note: c.Note}
		if e.Before, err = marshalAudit(before); err != nil {
			return err
		}
		if e.After, err = marshalAudit(after); err != nil {
			return err
		}
		return tx.Audit(ctx, &e)
	})
	return e, err
}

func marshalAudit(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	if raw, ok := v.(json.RawMessage); ok {
		return raw, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding audit value: %w", err)
	}
	return b, nil
}
