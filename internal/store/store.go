// Package store is the one package that speaks SQL: a *Store over pgx (a
// pool or a transaction) that maps rows to domain types and PostgreSQL
// errors to domain errors.
package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/migrations"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// DBTX is what a Store runs statements on: a pool or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// Store reads and writes Allot's state.
type Store struct {
	db DBTX
	// Now is the clock used for timestamps the store computes (month
	// boundaries, usage up to now): the process clock (clock.Now) unless a
	// test replaces it.
	Now func() time.Time
	// RequirePOSIXAccount refuses a job submission when no POSIX account
	// resolves for it (see allot.ResolveAccount); off, such a job runs as
	// the agent's default job user. Read by SubmitJob and QuotaPreview on
	// the Store they are called on.
	RequirePOSIXAccount bool
	// Secrets, when set, encrypts jobs' secret environment values as they
	// are stored and decrypts them for the agents and Slurm (secrets.go);
	// nil stores them as given and still reads values stored without it.
	Secrets *SecretKeys
	// ConfigSettle is how long this process must have seen a configuration
	// epoch (migration 0034) before a submission context read at it is
	// kept for the next submissions (0: a second; negative: at once,
	// tests). The epoch moves as a change commits, a moment before the
	// change is visible: a context read in that moment would hold the old
	// values under the new epoch.
	ConfigSettle time.Duration
}

// New returns a Store over db (usually a *pgxpool.Pool).
func New(db DBTX) *Store { return &Store{db: db, Now: clock.Now} }

// Open connects a pool to url and checks the connection.
func Open(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", err)
	}
	// pgxpool's default (max(4, CPUs)) starves a server under load: a
	// LISTEN connection is held for good, and every request needs one.
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = 32
	}
	SetClock(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to database: %w", err)
	}
	return pool, nil
}

// SetClock makes the database's allot_now() (node state history,
// migration 0025) on connections of cfg this process's clock: the same
// offset from the real time. Every pool a server opens sets it.
func SetClock(cfg *pgx.ConnConfig) {
	cfg.RuntimeParams["allot.clock_offset_us"] = strconv.FormatInt(clock.Offset().Microseconds(), 10)
}

// InTx runs fn in a transaction on a Store bound to it; it commits when fn
// returns nil and rolls back otherwise.
func (s *Store) InTx(ctx context.Context, fn func(*Store) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if err := fn(&Store{db: tx, Now: s.Now, Secrets: s.Secrets}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return mapErr("committing", err)
	}
	return nil
}

// Pool returns the pool the store runs on (nil inside a transaction).
func (s *Store) Pool() *pgxpool.Pool {
	p, _ := s.db.(*pgxpool.Pool)
	return p
}

// InPgxTx is InTx that also hands fn the pgx transaction, for River's
// InsertTx (a job enqueued in the same transaction as the data).
func (s *Store) InPgxTx(ctx context.Context, fn func(pgx.Tx, *Store) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if err := fn(tx, &Store{db: tx, Now: s.Now, Secrets: s.Secrets}); err != nil {
		return err
	}
	return mapErr("committing", tx.Commit(ctx))
}

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	return s.db.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// mapErr turns PostgreSQL errors into domain errors.
func mapErr(action string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", action, allot.ErrNotFound)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "23505", "23P01": // unique_violation, exclusion_violation
			return fmt.Errorf("%s: %w", action, &allot.Error{Code: allot.EConflict, Message: conflictMessage(pe)})
		case "23503", "23514", "23502", "22P02", "22003", "22021": // FK, check, not null, bad text repr, out of range, bad encoding (NUL)
			return fmt.Errorf("%s: %w", action, &allot.Error{Code: allot.EInvalid, Message: "the database refused the value: " + pe.ConstraintName + " " + pe.Message})
		case "40001", "40P01":
			return fmt.Errorf("%s: %w", action, &allot.Error{Code: allot.EUnavailable, Message: "concurrent update: retry"})
		}
	}
	return fmt.Errorf("%s: %w", action, err)
}

func conflictMessage(pe *pgconn.PgError) string {
	switch pe.ConstraintName {
	case "allocations_one_active_per_gpu":
		return "GPU is already allocated to another active job"
	}
	return "already exists (" + pe.ConstraintName + ")"
}

// Migrate applies Allot's numbered migrations (one transaction each, under
// an advisory lock so concurrent migrators wait) and River's own tables.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()
	const lockKey = 7_401_223_001
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return fmt.Errorf("migrate: taking lock: %w", err)
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS allot_migrations (
		version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	files, err := Migrations()
	if err != nil {
		return err
	}
	for _, m := range files {
		var done bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM allot_migrations WHERE version = $1)", m.Version).Scan(&done); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if done {
			continue
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			tx.Rollback(ctx) //nolint:errcheck
			return fmt.Errorf("migrate: applying %s: %w", m.Name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO allot_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			tx.Rollback(ctx) //nolint:errcheck
			return fmt.Errorf("migrate: recording %s: %w", m.Name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("migrate: committing %s: %w", m.Name, err)
		}
		log.Info("applied migration", "name", m.Name)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("migrate: river: %w", err)
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("migrate: river: %w", err)
	}
	for _, v := range res.Versions {
		log.Info("applied river migration", "version", v.Version)
	}
	return nil
}

// Migration is one embedded SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations lists the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	names, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, n := range names {
		v, err := strconv.Atoi(strings.SplitN(n, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number", n)
		}
		b, err := fs.ReadFile(migrations.FS, n)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: n, SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s share a version", out[i-1].Name, out[i].Name)
		}
	}
	return out, nil
}

// SetMeta records a fact about the database (allot_meta).
func (s *Store) SetMeta(ctx context.Context, key, value string) error {
	_, err := s.db.Exec(ctx, `INSERT INTO allot_meta (key, value, at) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, at = EXCLUDED.at`, key, value, s.Now())
	return mapErr("recording "+key, err)
}

// Meta returns the fact recorded under key ("" and false when none).
func (s *Store) Meta(ctx context.Context, key string) (string, bool, error) {
	var v string
	err := s.db.QueryRow(ctx, `SELECT value FROM allot_meta WHERE key = $1`, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return v, err == nil, mapErr("reading "+key, err)
}
