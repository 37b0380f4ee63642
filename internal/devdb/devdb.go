// Package devdb finds or starts the PostgreSQL that `allot dev` and the tests use.
//
// Find picks, in order:
//
//  1. the URL in DATABASE_URL (Options.EnvURL), verbatim;
//  2. a PostgreSQL that accepts connections at 127.0.0.1:5432 (Options.ProbeAddr)
//     as user postgres without a password;
//  3. a private PostgreSQL started from the machine's installed binaries
//     (initdb and pg_ctl) in a data directory (Options.DataDir, default
//     .allot/pgdata) on a free TCP port on 127.0.0.1. DB.Close stops it.
//
// If none of these is possible, Find returns an error that says what to install.
package devdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Defaults used when the corresponding Options field is empty.
const (
	DefaultProbeAddr = "127.0.0.1:5432"
	DefaultDataDir   = ".allot/pgdata"
)

// Sources reported in DB.Source.
const (
	SourceEnv     = "env"     // DATABASE_URL
	SourceRunning = "running" // a server already answering at ProbeAddr
	SourcePrivate = "private" // a server in DataDir, started (or found running) by Find
)

// InstallHint is the advice included in the error returned when no
// PostgreSQL can be found or started.
const InstallHint = "set DATABASE_URL, start a server on 127.0.0.1:5432, or install PostgreSQL " +
	"(Debian/Ubuntu: apt-get install -y postgresql; Fedora/RHEL: dnf install -y postgresql-server; " +
	"macOS: brew install postgresql@16)"

// ErrNoPostgres is wrapped by the error Find returns when there is no
// DATABASE_URL, nothing answers at ProbeAddr and no initdb/pg_ctl binaries
// are installed.
var ErrNoPostgres = errors.New("no PostgreSQL found")

const (
	probeTimeout = 2 * time.Second
	startTimeout = 60 * time.Second
	stopTimeout  = 60 * time.Second
)

// defaultGlobs are searched after SearchPaths and PATH, each sorted newest
// version first.
var defaultGlobs = []string{
	"/usr/lib/postgresql/*/bin",         // Debian, Ubuntu
	"/usr/pgsql-*/bin",                  // PGDG RPMs
	"/opt/homebrew/opt/postgresql*/bin", // Homebrew, Apple silicon (keg-only formulae)
	"/usr/local/opt/postgresql*/bin",    // Homebrew, Intel
	"/Applications/Postgres.app/Contents/Versions/*/bin",
}

// Options configures Find. The zero value is usable.
type Options struct {
	// EnvURL is the value of DATABASE_URL; "" means unset.
	EnvURL string
	// ProbeAddr is where an already running server is looked for.
	// Default "127.0.0.1:5432".
	ProbeAddr string
	// DataDir is the private cluster's data directory, relative to the
	// working directory unless absolute. Default ".allot/pgdata".
	DataDir string
	// LogFile receives the private server's log. Default: postgres.log
	// next to DataDir.
	LogFile string
	// SearchPaths are directories searched for initdb and pg_ctl before
	// PATH and the well-known install locations.
	SearchPaths []string
	// NoDefaultSearch restricts the binary search to SearchPaths (no PATH,
	// no /usr/lib/postgresql/*/bin, ...). For tests.
	NoDefaultSearch bool
	// Logger receives progress messages. Default: discard.
	Logger *slog.Logger
}

// DB is a PostgreSQL that Find found or started.
type DB struct {
	// URL connects as a superuser (for "running" and "private") to the
	// database "postgres"; for "env" it is DATABASE_URL verbatim.
	URL string
	// Source is "env", "running" or "private".
	Source string
	// DataDir and LogFile are set for Source "private".
	DataDir string
	LogFile string

	once    sync.Once
	stop    func() error
	stopErr error
}

// Close stops the private server if Find started it; otherwise it does
// nothing. It is safe to call more than once and on a nil *DB.
func (d *DB) Close() error {
	if d == nil {
		return nil
	}
	d.once.Do(func() {
		if d.stop != nil {
			d.stopErr = d.stop()
		}
	})
	return d.stopErr
}

// Find returns the database `allot dev` should use; see the package comment
// for the order. The caller must Close the result.
func Find(ctx context.Context, o Options) (*DB, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.EnvURL != "" {
		log.Info("using DATABASE_URL")
		return &DB{URL: o.EnvURL, Source: SourceEnv}, nil
	}

	addr := o.ProbeAddr
	if addr == "" {
		addr = DefaultProbeAddr
	}
	probeURL := superuserURL(addr)
	err := ping(ctx, probeURL, probeTimeout)
	if err == nil {
		log.Info("using running PostgreSQL", "addr", addr)
		return &DB{URL: probeURL, Source: SourceRunning}, nil
	}
	log.Debug("no usable PostgreSQL at probe address", "addr", addr, "err", err)

	return startPrivate(ctx, o, log)
}

// superuserURL is the URL of database postgres as user postgres at addr.
func superuserURL(addr string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     addr,
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// ping connects to connURL and runs a trivial query within timeout.
func ping(ctx context.Context, connURL string, timeout time.Duration) error {
	cfg, err := pgx.ParseConfig(connURL)
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = timeout
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// EnsureDatabase creates database name on the server adminURL points at,
// unless it exists, and returns adminURL changed to point at it.
// adminURL may be a URL (postgres://...) or a keyword/value string.
func EnsureDatabase(ctx context.Context, adminURL, name string) (string, error) {
	if name == "" {
		return "", errors.New("devdb: empty database name")
	}
	dbURL, err := withDatabase(adminURL, name)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", fmt.Errorf("devdb: connect to create database %q: %w", name, err)
	}
	defer conn.Close(context.Background())

	var exists bool
	if err := conn.QueryRow(ctx,
		"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("devdb: look up database %q: %w", name, err)
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: lost a race
			err = nil
		}
		if err != nil {
			return "", fmt.Errorf("devdb: create database %q: %w", name, err)
		}
	}
	return dbURL, nil
}

// withDatabase returns connection string s changed to use database name.
func withDatabase(s, name string) (string, error) {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		if err != nil {
			return "", fmt.Errorf("devdb: parse database URL: %w", err)
		}
		u.Path = "/" + name
		u.RawPath = ""
		q := u.Query()
		if q.Has("dbname") { // would override the path
			q.Del("dbname")
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	// keyword/value form: a later keyword overrides an earlier one.
	v := strings.ReplaceAll(name, `\`, `\\`)
	v = strings.ReplaceAll(v, `'`, `\'`)
	return strings.TrimSpace(s) + " dbname='" + v + "'", nil
}

// binDir is a directory holding initdb and pg_ctl.
type binDir struct {
	dir   string
	major int // 0 until known
}

func (b *binDir) initdb() string { return filepath.Join(b.dir, "initdb") }
func (b *binDir) pgCtl() string  { return filepath.Join(b.dir, "pg_ctl") }

// findBinDirs lists the directories holding both initdb and pg_ctl, in
// search order: SearchPaths, PATH, then defaultGlobs newest version first.
func findBinDirs(o Options) []*binDir {
	var dirs []string
	dirs = append(dirs, o.SearchPaths...)
	if !o.NoDefaultSearch {
		dirs = append(dirs, filepath.SplitList(os.Getenv("PATH"))...)
		for _, g := range defaultGlobs {
			m, _ := filepath.Glob(g)
			sortNewestFirst(m)
			dirs = append(dirs, m...)
		}
	}
	var out []*binDir
	seen := map[string]bool{}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		initdb, err1 := filepath.EvalSymlinks(filepath.Join(d, "initdb"))
		pgctl, err2 := filepath.EvalSymlinks(filepath.Join(d, "pg_ctl"))
		if err1 != nil || err2 != nil || !isExecutable(initdb) || !isExecutable(pgctl) {
			continue
		}
		// Use the real directory, where postgres itself lives too.
		dir := filepath.Dir(pgctl)
		if filepath.Dir(initdb) != dir {
			dir = d
		}
		if abs, err := filepath.Abs(dir); err == nil {
			dir = abs
		}
		if seen[dir] {
			continue
		}
		seen[dir] = true
		out = append(out, &binDir{dir: dir})
	}
	return out
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// sortNewestFirst sorts paths by the first version number found in each,
// descending (…/16/bin before …/9.6/bin before …/postgresql/bin).
func sortNewestFirst(paths []string) {
	sort.SliceStable(paths, func(i, j int) bool {
		vi, vj := pathVersion(paths[i]), pathVersion(paths[j])
		for k := 0; k < len(vi) || k < len(vj); k++ {
			a, b := -1, -1
			if k < len(vi) {
				a = vi[k]
			}
			if k < len(vj) {
				b = vj[k]
			}
			if a != b {
				return a > b
			}
		}
		return false
	})
}

// pathVersion extracts the version from the last path element that holds
// digits, e.g. "/usr/lib/postgresql/9.6/bin" → [9 6],
// "/opt/homebrew/opt/postgresql@16/bin" → [16].
func pathVersion(p string) []int {
	elems := strings.Split(filepath.ToSlash(p), "/")
	for i := len(elems) - 1; i >= 0; i-- {
		if v := parseVersion(elems[i]); v != nil {
			return v
		}
	}
	return nil
}

// parseVersion returns the first run of dot-separated numbers in s.
func parseVersion(s string) []int {
	start := strings.IndexAny(s, "0123456789")
	if start < 0 {
		return nil
	}
	s = s[start:]
	end := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end >= 0 {
		s = s[:end]
	}
	var v []int
	for _, part := range strings.Split(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			break
		}
		v = append(v, n)
	}
	return v
}

// majorVersion runs pg_ctl --version ("pg_ctl (PostgreSQL) 15.20 (Debian …)").
func (b *binDir) majorVersion(ctx context.Context) int {
	if b.major != 0 {
		return b.major
	}
	out, err := exec.CommandContext(ctx, b.pgCtl(), "--version").Output()
	if err != nil {
		return 0
	}
	s := string(out)
	if i := strings.Index(s, ")"); i >= 0 {
		s = s[i+1:]
	}
	if v := parseVersion(s); len(v) > 0 {
		b.major = v[0]
		if b.major < 10 && len(v) > 1 { // 9.6 style
			b.major = v[0]*100 + v[1]
		}
	}
	return b.major
}

// clusterMajor reads PG_VERSION ("15", "9.6") in the same encoding as
// majorVersion.
func clusterMajor(dataDir string) (int, string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "PG_VERSION"))
	if err != nil {
		return 0, "", err
	}
	s := strings.TrimSpace(string(b))
	v := parseVersion(s)
	if len(v) == 0 {
		return 0, s, fmt.Errorf("devdb: unreadable %s", filepath.Join(dataDir, "PG_VERSION"))
	}
	if v[0] < 10 && len(v) > 1 {
		return v[0]*100 + v[1], s, nil
	}
	return v[0], s, nil
}

// runAs describes the unprivileged user the PostgreSQL binaries run as when
// we are root; nil means run as ourselves.
type runAs struct {
	name string
	uid  uint32
	gid  uint32
	gids []uint32
}

func (r *runAs) String() string {
	if r == nil {
		return "current user"
	}
	return fmt.Sprintf("%s (uid %d)", r.name, r.uid)
}

// chooseUser decides whom to run initdb/postgres as. PostgreSQL refuses to
// run as root, so as root we use the owner of an existing non-root data
// directory, else the "postgres" user.
func chooseUser(dataDir string) (*runAs, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var u *user.User
	if fi, err := os.Stat(dataDir); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			u, _ = user.LookupId(strconv.FormatUint(uint64(st.Uid), 10))
		}
	}
	if u == nil {
		var err error
		u, err = user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("devdb: running as root, but PostgreSQL refuses to run as root and there is no "+
				"\"postgres\" user to run it as (%v); run as a regular user, create one (useradd --system postgres), "+
				"or set DATABASE_URL", err)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("devdb: user %s has non-numeric uid/gid %s/%s", u.Username, u.Uid, u.Gid)
	}
	if uid == 0 {
		return nil, fmt.Errorf("devdb: user %s has uid 0; PostgreSQL refuses to run as root", u.Username)
	}
	r := &runAs{name: u.Username, uid: uint32(uid), gid: uint32(gid)}
	if ids, err := u.GroupIds(); err == nil {
		for _, s := range ids {
			if g, err := strconv.ParseUint(s, 10, 32); err == nil {
				r.gids = append(r.gids, uint32(g))
			}
		}
	}
	return r, nil
}

// canTraverse reports whether r may search (x) directory fi.
func (r *runAs) canTraverse(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	perm := fi.Mode().Perm()
	switch {
	case st.Uid == r.uid:
		return perm&0o100 != 0
	case st.Gid == r.gid || containsUint32(r.gids, st.Gid):
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

func containsUint32(s []uint32, v uint32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// checkReachable returns an error unless r can reach every ancestor of dir.
func (r *runAs) checkReachable(dir string) error {
	if r == nil {
		return nil
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !r.canTraverse(fi) {
			return fmt.Errorf("devdb: running as root, so PostgreSQL runs as %s, but %s cannot reach %s "+
				"because %s has mode %s; use a data directory %s can reach, chmod o+x %s, or run as a regular user",
				r, r.name, dir, p, fi.Mode(), r.name, p)
		}
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}

// chownTree gives dir and everything below it to r.
func (r *runAs) chownTree(dir string) error {
	if r == nil {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(r.uid), int(r.gid))
	})
}

// command builds a command that runs as r with working directory dir.
func (r *runAs) command(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	// Keep the server out of our process group so that a terminal's ^C
	// reaches us, and Close stops the server in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if r != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: r.uid, Gid: r.gid, Groups: r.gids}
		env := os.Environ()
		env = append(env, "HOME="+dir, "USER="+r.name, "LOGNAME="+r.name)
		cmd.Env = env
	}
	return cmd
}

// run runs cmd and returns an error with its output if it fails.
func run(cmd *exec.Cmd) error {
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(buf.String()))
	}
	return nil
}

func startPrivate(ctx context.Context, o Options, log *slog.Logger) (*DB, error) {
	bins := findBinDirs(o)
	if len(bins) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoPostgres, InstallHint)
	}

	dataDir := o.DataDir
	if dataDir == "" {
		dataDir = DefaultDataDir
	}
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, err
	}
	logFile := o.LogFile
	if logFile == "" {
		logFile = filepath.Join(filepath.Dir(dataDir), "postgres.log")
	}
	if logFile, err = filepath.Abs(logFile); err != nil {
		return nil, err
	}

	who, err := chooseUser(dataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dataDir), 0o755); err != nil {
		return nil, fmt.Errorf("devdb: %w", err)
	}
	if err := who.checkReachable(dataDir); err != nil {
		return nil, err
	}

	// Pick binaries: for an existing cluster, the same major version.
	var bin *binDir
	major, verText, verErr := clusterMajor(dataDir)
	exists := verErr == nil
	switch {
	case exists:
		var have []string
		for _, b := range bins {
			if b.majorVersion(ctx) == major {
				bin = b
				break
			}
			have = append(have, fmt.Sprintf("%s (%d)", b.dir, b.majorVersion(ctx)))
		}
		if bin == nil {
			return nil, fmt.Errorf("devdb: data directory %s was created by PostgreSQL %s, but only other versions are installed: %s; "+
				"install PostgreSQL %s, or remove %s to start afresh", dataDir, verText, strings.Join(have, ", "), verText, dataDir)
		}
	case errors.Is(verErr, fs.ErrNotExist):
		bin = bins[0]
	default:
		return nil, verErr
	}

	if exists {
		if who != nil {
			// A cluster owned by root (never runnable) or by the user we picked.
			if err := who.chownTree(dataDir); err != nil {
				return nil, fmt.Errorf("devdb: %w", err)
			}
		}
		if db, err := adoptRunning(ctx, bin, who, dataDir, logFile, log); db != nil || err != nil {
			return db, err
		}
		log.Info("reusing PostgreSQL data directory", "dir", dataDir)
	} else {
		if err := initCluster(ctx, bin, who, dataDir, log); err != nil {
			return nil, err
		}
	}

	// Pre-create the log so that an unprivileged server can append to it.
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("devdb: %w", err)
	}
	f.Close()
	if who != nil {
		if err := os.Chown(logFile, int(who.uid), int(who.gid)); err != nil {
			return nil, fmt.Errorf("devdb: %w", err)
		}
	}

	// Start on a free port; retry if someone else takes it in between.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("devdb: find a free port: %w", err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		log.Info("starting private PostgreSQL", "bin", bin.dir, "dir", dataDir, "addr", addr, "user", who.String())
		lastErr = startServer(ctx, bin, who, dataDir, logFile, port)
		if lastErr == nil {
			db := &DB{URL: superuserURL(addr), Source: SourcePrivate, DataDir: dataDir, LogFile: logFile}
			if err := waitReady(ctx, db.URL); err != nil {
				_ = stopServer(bin, who, dataDir)
				return nil, fmt.Errorf("devdb: PostgreSQL in %s started but does not accept connections at %s: %w (see %s)",
					dataDir, addr, err, logFile)
			}
			db.stop = func() error {
				log.Info("stopping private PostgreSQL", "dir", dataDir)
				return stopServer(bin, who, dataDir)
			}
			return db, nil
		}
		if ctx.Err() != nil {
			break
		}
		if !strings.Contains(lastErr.Error(), "in use") && !strings.Contains(lastErr.Error(), "could not bind") {
			break
		}
	}
	return nil, lastErr
}

// initCluster creates a new cluster in dataDir.
func initCluster(ctx context.Context, bin *binDir, who *runAs, dataDir string, log *slog.Logger) error {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("devdb: %w", err)
	}
	if err := who.chownTree(dataDir); err != nil {
		return fmt.Errorf("devdb: %w", err)
	}
	log.Info("creating PostgreSQL data directory", "bin", bin.dir, "dir", dataDir, "user", who.String())
	cmd := who.command(ctx, dataDir, bin.initdb(),
		"-D", dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale")
	if err := run(cmd); err != nil {
		return fmt.Errorf("devdb: initdb failed: %w", err)
	}
	return nil
}

// adoptRunning handles a postmaster.pid left in dataDir. If a server from
// dataDir is running and answers, it returns a DB for it; Close leaves that
// server running, since another process (an earlier `allot dev`) owns it.
// A stale postmaster.pid is removed. (nil, nil) means: start a server.
func adoptRunning(ctx context.Context, bin *binDir, who *runAs, dataDir, logFile string, log *slog.Logger) (*DB, error) {
	pidFile := filepath.Join(dataDir, "postmaster.pid")
	if _, err := os.Stat(pidFile); err != nil {
		return nil, nil
	}
	cmd := who.command(ctx, dataDir, bin.pgCtl(), "-D", dataDir, "status")
	err := cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && exitErr.ExitCode() == 3 {
		log.Info("removing stale postmaster.pid", "file", pidFile)
		if err := os.Remove(pidFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("devdb: remove stale %s: %w", pidFile, err)
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("devdb: pg_ctl status for %s: %w", dataDir, err)
	}
	// pg_ctl says a process with the recorded PID is alive. Line 4 of
	// postmaster.pid is the port.
	b, _ := os.ReadFile(pidFile)
	lines := strings.Split(string(b), "\n")
	pid := strings.TrimSpace(lines[0])
	if len(lines) > 3 {
		if port, err := strconv.Atoi(strings.TrimSpace(lines[3])); err == nil {
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			u := superuserURL(addr)
			if waitReadyFor(ctx, u, 10*time.Second) == nil {
				log.Info("using PostgreSQL already running from data directory", "dir", dataDir, "addr", addr, "pid", pid)
				return &DB{URL: u, Source: SourcePrivate, DataDir: dataDir, LogFile: logFile}, nil
			}
		}
	}
	return nil, fmt.Errorf("devdb: %s names process %s, which is alive, but no PostgreSQL answers for %s; "+
		"if that process is not PostgreSQL, remove %s and retry", pidFile, pid, dataDir, pidFile)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// shellQuote quotes s for /bin/sh; pg_ctl passes -o through the shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// maxSocketPath is the usable length of a Unix socket path (sun_path 108
// on Linux, 104 on macOS, less the NUL).
const maxSocketPath = 103

func startServer(ctx context.Context, bin *binDir, who *runAs, dataDir, logFile string, port int) error {
	sockDir := dataDir
	if len(sockDir)+len("/.s.PGSQL.")+len(strconv.Itoa(port))+len(".lock") > maxSocketPath {
		sockDir = "" // no Unix socket; clients use TCP
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", port, shellQuote(sockDir))
	cmd := who.command(ctx, dataDir, bin.pgCtl(),
		"-D", dataDir, "-o", opts, "-l", logFile, "-w", "-t", strconv.Itoa(int(startTimeout/time.Second)), "start")
	if err := run(cmd); err != nil {
		return fmt.Errorf("devdb: start PostgreSQL: %w\n%s", err, LogTail(logFile, 20))
	}
	return nil
}

func stopServer(bin *binDir, who *runAs, dataDir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	cmd := who.command(ctx, dataDir, bin.pgCtl(), "-D", dataDir, "-m", "fast", "-w", "stop")
	if err := run(cmd); err != nil {
		return fmt.Errorf("devdb: stop PostgreSQL: %w", err)
	}
	return nil
}

func waitReady(ctx context.Context, connURL string) error {
	return waitReadyFor(ctx, connURL, startTimeout)
}

// waitReadyFor pings connURL until it answers or d passes.
func waitReadyFor(ctx context.Context, connURL string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		err := ping(ctx, connURL, probeTimeout)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// LogTail returns the last n lines of file, for error messages.
func LogTail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "last lines of " + file + ":\n" + strings.Join(lines, "\n")
}
