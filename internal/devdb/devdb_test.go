package devdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// closedAddr returns a 127.0.0.1 address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// reachableTempDir is t.TempDir, opened up so that the postgres user can
// reach it when the tests run as root (MkdirTemp makes 0700 directories).
func reachableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		for _, d := range []string{dir, filepath.Dir(dir)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func testLogger(t *testing.T) Options {
	return Options{Logger: slogToTest(t)}
}

func queryInt(t *testing.T, ctx context.Context, url, sql string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func exec1(t *testing.T, ctx context.Context, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestEnvURLWins(t *testing.T) {
	t.Parallel()
	const env = "postgres://someone:secret@db.invalid:6543/allot?sslmode=require&application_name=x"
	o := testLogger(t)
	o.EnvURL = env
	o.ProbeAddr = closedAddr(t)
	o.NoDefaultSearch = true
	db, err := Find(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if db.URL != env || db.Source != SourceEnv {
		t.Fatalf("got %q %q, want %q env", db.URL, db.Source, env)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestRunningServerFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want := "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	if err := ping(ctx, want, probeTimeout); err != nil {
		t.Skipf("no PostgreSQL answers at 127.0.0.1:5432 as user postgres without password (%v); start one to run this test", err)
	}
	o := testLogger(t)
	o.NoDefaultSearch = true // must not need binaries
	db, err := Find(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.Source != SourceRunning || db.URL != want {
		t.Fatalf("got %q %q, want %q running", db.URL, db.Source, want)
	}
	if n := queryInt(t, ctx, db.URL, "SELECT 1"); n != 1 {
		t.Fatalf("SELECT 1 = %d", n)
	}
}

func TestPrivateCluster(t *testing.T) {
	t.Parallel()
	if len(findBinDirs(Options{})) == 0 {
		t.Skip("no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin; install PostgreSQL to run this test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tmp := reachableTempDir(t)
	o := testLogger(t)
	o.ProbeAddr = closedAddr(t)
	o.DataDir = filepath.Join(tmp, "pgdata")

	db, err := Find(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if db.Source != SourcePrivate || db.DataDir != o.DataDir {
		t.Fatalf("got source %q dir %q", db.Source, db.DataDir)
	}
	if _, err := os.Stat(filepath.Join(o.DataDir, "PG_VERSION")); err != nil {
		t.Fatalf("no cluster created: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "postgres.log")); err != nil {
		t.Fatalf("no log next to data dir: %v", err)
	}
	if n := queryInt(t, ctx, db.URL, "SELECT 1"); n != 1 {
		t.Fatalf("SELECT 1 = %d", n)
	}
	exec1(t, ctx, db.URL, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")

	// A second Find on the same data dir while it runs adopts the server
	// and its Close leaves it running.
	db2, err := Find(ctx, o)
	if err != nil {
		t.Fatalf("Find while running: %v", err)
	}
	if db2.URL != db.URL || db2.Source != SourcePrivate {
		t.Fatalf("adopted %q %q, want %q", db2.URL, db2.Source, db.URL)
	}
	if err := db2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, db.URL, probeTimeout); err != nil {
		t.Fatalf("second Close stopped the first's server: %v", err)
	}

	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := ping(ctx, db.URL, probeTimeout); err == nil {
		t.Fatal("server still answers after Close")
	}
	if err := db.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// Leave a stale postmaster.pid naming a dead process, as after a crash.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%d\n%s\n%d\n%d\n\n127.0.0.1\n  1234  5678\nready   \n",
		dead.Process.Pid, o.DataDir, time.Now().Unix(), 5432) // PostgreSQL's own pid file stamps the real clock
	if err := os.WriteFile(filepath.Join(o.DataDir, "postmaster.pid"), []byte(stale), 0o600); err != nil {
		t.Fatal(err)
	}

	db3, err := Find(ctx, o)
	if err != nil {
		t.Fatalf("Find reusing data dir: %v", err)
	}
	t.Cleanup(func() { db3.Close() })
	if db3.Source != SourcePrivate || db3.DataDir != o.DataDir {
		t.Fatalf("got source %q dir %q", db3.Source, db3.DataDir)
	}
	if n := queryInt(t, ctx, db3.URL, "SELECT x FROM kept"); n != 42 {
		t.Fatalf("data not kept: %d", n)
	}
	if err := db3.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := ping(ctx, db3.URL, probeTimeout); err == nil {
		t.Fatal("server still answers after Close")
	}
}

// A data dir too deep for a Unix socket path still works: the server then
// listens on TCP only.
func TestPrivateClusterLongPath(t *testing.T) {
	t.Parallel()
	if len(findBinDirs(Options{})) == 0 {
		t.Skip("no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin; install PostgreSQL to run this test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := testLogger(t)
	o.ProbeAddr = closedAddr(t)
	o.DataDir = filepath.Join(reachableTempDir(t), strings.Repeat("d", 60), strings.Repeat("e", 60), "pgdata")
	db, err := Find(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if n := queryInt(t, ctx, db.URL, "SELECT 1"); n != 1 {
		t.Fatalf("SELECT 1 = %d", n)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestNoBinaries(t *testing.T) {
	t.Parallel()
	o := testLogger(t)
	o.ProbeAddr = closedAddr(t)
	o.DataDir = filepath.Join(t.TempDir(), "pgdata")
	o.SearchPaths = []string{t.TempDir()}
	o.NoDefaultSearch = true
	db, err := Find(context.Background(), o)
	if err == nil {
		db.Close()
		t.Fatalf("Find succeeded with %q %q", db.URL, db.Source)
	}
	if !errors.Is(err, ErrNoPostgres) || !strings.Contains(err.Error(), "apt-get install") ||
		!strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("unhelpful error: %v", err)
	}
	t.Log(err)
	if _, err := os.Stat(o.DataDir); err == nil {
		t.Fatal("data dir created although nothing could run")
	}
}

func TestRootUnreachableDataDir(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("only relevant when running as root")
	}
	if len(findBinDirs(Options{})) == 0 {
		t.Skip("no PostgreSQL binaries installed")
	}
	dir := t.TempDir() // 0700, root-owned: the postgres user cannot enter it
	o := testLogger(t)
	o.ProbeAddr = closedAddr(t)
	o.DataDir = filepath.Join(dir, "pgdata")
	db, err := Find(context.Background(), o)
	if err == nil {
		db.Close()
		t.Fatal("Find succeeded with an unreachable data dir")
	}
	if !strings.Contains(err.Error(), "cannot reach") {
		t.Fatalf("unclear error: %v", err)
	}
	t.Log(err)
}

func TestEnsureDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	if err := ping(ctx, admin, probeTimeout); err != nil {
		t.Skipf("no PostgreSQL answers at 127.0.0.1:5432 (%v); start one to run this test", err)
	}
	name := fmt.Sprintf(`devdb "Test" %d-%d`, os.Getpid(), time.Now().UnixNano()) // a unique name, not a time
	t.Cleanup(func() {
		exec1(t, context.Background(), admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	u1, err := EnsureDatabase(ctx, admin, name)
	if err != nil {
		t.Fatal(err)
	}
	u2, err := EnsureDatabase(ctx, admin, name)
	if err != nil {
		t.Fatalf("second EnsureDatabase: %v", err)
	}
	if u1 != u2 {
		t.Fatalf("URLs differ: %q %q", u1, u2)
	}
	conn, err := pgx.Connect(ctx, u1)
	if err != nil {
		t.Fatalf("connect %s: %v", u1, err)
	}
	defer conn.Close(ctx)
	var got string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != name {
		t.Fatalf("current_database() = %q, want %q", got, name)
	}
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"postgres://u@h:1/postgres?sslmode=disable", "postgres://u@h:1/allot?sslmode=disable"},
		{"postgresql://u@h/?dbname=x", "postgresql://u@h/allot"},
		{"host=h user=u dbname=postgres", "host=h user=u dbname=postgres dbname='allot'"},
	} {
		got, err := withDatabase(c.in, "allot")
		if err != nil || got != c.want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
		if _, err := pgx.ParseConfig(got); err != nil {
			t.Errorf("ParseConfig(%q): %v", got, err)
		}
	}
	cfg, _ := pgx.ParseConfig("host=h " + "dbname='a b\\'c'")
	if cfg.Database != "a b'c" {
		t.Errorf("keyword quoting: %q", cfg.Database)
	}
	got, _ := withDatabase("host=h dbname=postgres", "a b'c")
	if cfg, err := pgx.ParseConfig(got); err != nil || cfg.Database != "a b'c" {
		t.Errorf("withDatabase keyword form %q: %v", got, err)
	}
}

func TestSortNewestFirst(t *testing.T) {
	t.Parallel()
	in := []string{
		"/usr/lib/postgresql/9.6/bin",
		"/usr/lib/postgresql/16/bin",
		"/usr/lib/postgresql/10/bin",
		"/opt/homebrew/opt/postgresql/bin",
		"/usr/lib/postgresql/15/bin",
		"/opt/homebrew/opt/postgresql@17/bin",
	}
	sortNewestFirst(in)
	want := []string{
		"/opt/homebrew/opt/postgresql@17/bin",
		"/usr/lib/postgresql/16/bin",
		"/usr/lib/postgresql/15/bin",
		"/usr/lib/postgresql/10/bin",
		"/usr/lib/postgresql/9.6/bin",
		"/opt/homebrew/opt/postgresql/bin",
	}
	if !reflect.DeepEqual(in, want) {
		t.Fatalf("got %q", in)
	}
}

func TestSearchPathsFirst(t *testing.T) {
	t.Parallel()
	// Fake installation: two "bin" dirs with executable initdb and pg_ctl.
	root := t.TempDir()
	var dirs []string
	for _, v := range []string{"a", "b"} {
		d := filepath.Join(root, v, "bin")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"initdb", "pg_ctl"} {
			if err := os.WriteFile(filepath.Join(d, f), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		dirs = append(dirs, d)
	}
	half := filepath.Join(root, "half")
	os.MkdirAll(half, 0o755)
	os.WriteFile(filepath.Join(half, "initdb"), []byte("#!/bin/sh\n"), 0o755) // no pg_ctl

	got := findBinDirs(Options{SearchPaths: []string{dirs[1], half, dirs[0], dirs[1]}, NoDefaultSearch: true})
	var names []string
	for _, b := range got {
		names = append(names, b.dir)
	}
	if want := []string{dirs[1], dirs[0]}; !reflect.DeepEqual(names, want) {
		t.Fatalf("got %q, want %q", names, want)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func slogToTest(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
