// Package storetest gives each test its own migrated PostgreSQL database,
// cloned from a template so tests run in parallel and leave nothing behind.
package storetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is the server tried when DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// AdminURL returns the URL of the server tests run on: DATABASE_URL, else
// a PostgreSQL at 127.0.0.1:5432. `make test` sets DATABASE_URL to the
// database `allot dev` would find, starting a private one when needed.
func AdminURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// replaceDB rewrites the database path of a postgres:// URL, or the dbname
// of a keyword/value string.
func replaceDB(url, name string) string {
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		rest := url[strings.Index(url, "://")+3:]
		q := ""
		if i := strings.IndexByte(rest, '?'); i >= 0 {
			rest, q = rest[:i], rest[i:]
		}
		host := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			host = rest[:i]
		}
		return url[:strings.Index(url, "://")+3] + host + "/" + name + q
	}
	return url + " dbname=" + name
}

func migrationsHash() string {
	h := sha256.New()
	ms, err := store.Migrations()
	if err != nil {
		panic(err)
	}
	for _, m := range ms {
		h.Write([]byte(m.Name))
		h.Write([]byte(m.SQL))
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// templatePrefix starts the name of every template database; each
// checkout's templates continue with its own checkoutID.
const templatePrefix = "allot_tmpl_"

// checkoutID names this checkout of the code among all that may share one
// PostgreSQL server (other clones, other machines): a hash of the host name
// and the module's directory, found from the working directory (go test
// runs in the package's directory) or else from this file's path.
func checkoutID() string {
	dir := ""
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				dir = d
				break
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Dir(file)
	}
	host, _ := os.Hostname()
	h := sha256.Sum256([]byte(host + "\x00" + dir))
	return hex.EncodeToString(h[:])[:10]
}

// templateNameFor is the template of a checkout for a migration set.
func templateNameFor(checkout, migrations string) string {
	return templatePrefix + checkout + "_" + migrations
}

// staleTemplates picks, among the databases names, the templates to drop
// once own is built: those of the same checkout for other migration sets.
// Other checkouts' templates, older-style names and builds in progress are
// never touched: another test run may be cloning from them.
func staleTemplates(names []string, own string) []string {
	mine := strings.TrimPrefix(own, templatePrefix)
	checkout, _, ok := strings.Cut(mine, "_")
	if !ok || !strings.HasPrefix(own, templatePrefix) {
		return nil
	}
	var stale []string
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, templatePrefix+checkout+"_")
		if !ok || n == own || rest == "" || strings.Contains(rest, "_") {
			continue
		}
		stale = append(stale, n)
	}
	return stale
}

// dropStaleTemplates drops this checkout's templates of other migration
// sets, without FORCE: one that a test run of the same checkout is still
// cloning from stays, for the next run to drop.
func dropStaleTemplates(ctx context.Context, admin *pgx.Conn, own string) {
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'allot\_tmpl\_%'`)
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range staleTemplates(names, own) {
		admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()) //nolint:errcheck // in use: kept
	}
}

func ensureTemplate(ctx context.Context) (string, error) {
	templateOnce.Do(func() {
		templateName = templateNameFor(checkoutID(), migrationsHash())
		admin, err := pgx.Connect(ctx, AdminURL())
		if err != nil {
			templateErr = fmt.Errorf("no PostgreSQL for tests at %s (run `make test`, which finds or starts one): %w", AdminURL(), err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(7401223002)"); err != nil {
			templateErr = err
			return
		}
		defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock(7401223002)") //nolint:errcheck
		var exists bool
		if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", templateName).Scan(&exists); err != nil {
			templateErr = err
			return
		}
		if exists {
			return
		}
		building := templateName + "_build"
		admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{building}.Sanitize()+" WITH (FORCE)") //nolint:errcheck
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
			templateErr = fmt.Errorf("creating template database: %w", err)
			return
		}
		pool, err := pgxpool.New(ctx, replaceDB(AdminURL(), building))
		if err != nil {
			templateErr = err
			return
		}
		err = store.Migrate(ctx, pool, nil)
		pool.Close()
		if err != nil {
			templateErr = fmt.Errorf("migrating template database: %w", err)
			return
		}
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{building}.Sanitize()+" RENAME TO "+pgx.Identifier{templateName}.Sanitize()); err != nil {
			templateErr = fmt.Errorf("renaming template database: %w", err)
			return
		}
		dropStaleTemplates(ctx, admin, templateName)
	})
	return templateName, templateErr
}

// URL creates a fresh, fully migrated database for t, drops it when t ends,
// and returns its URL.
func URL(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tmpl, err := ensureTemplate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return createDB(ctx, t, tmpl)
}

// EmptyURL creates a fresh database without any migration (to test
// migrations over older data), drops it when t ends, and returns its URL.
func EmptyURL(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return createDB(ctx, t, "template0")
}

func createDB(ctx context.Context, t testing.TB, tmpl string) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b) //nolint:errcheck
	name := "allot_test_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("connecting to test PostgreSQL: %v", err)
	}
	defer admin.Close(ctx)
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{tmpl}.Sanitize())
		if err == nil || attempt == 20 || !strings.Contains(err.Error(), "being accessed by other users") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("creating test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, AdminURL())
		if err != nil {
			t.Errorf("dropping test database: %v", err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping test database: %v", err)
		}
	})
	return replaceDB(AdminURL(), name)
}

// Pool returns a pool on a fresh database for t, closed when t ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := store.Open(context.Background(), URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// New returns a Store on a fresh database for t.
func New(t testing.TB) *store.Store {
	t.Helper()
	return store.New(Pool(t))
}
