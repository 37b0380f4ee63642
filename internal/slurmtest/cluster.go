package slurmtest

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/testlock"
)

// The accounting database server every cluster uses (its own database on it).
const (
	dbHost       = "127.0.0.1"
	systemDBPort = 3306
	dbUser       = "root"
	// If set, Stop copies the cluster's log dir to $ALLOT_SLURMTEST_LOGS/<Name>/ first.
	keepLogsEnv = "ALLOT_SLURMTEST_LOGS"
	// If set, every command and daemon stop is written to stderr with its duration.
	traceEnv = "ALLOT_SLURMTEST_TRACE"
)

// trace reports what took how long (since t0, a stopwatch) when traceEnv is set.
func trace(t0 time.Time, what string) {
	if os.Getenv(traceEnv) != "" {
		fmt.Fprintf(os.Stderr, "slurmtest %s %v %s\n", time.Now().Format("15:04:05.000"), time.Since(t0).Round(time.Millisecond), what)
	}
}

// Options shape a cluster. The zero value is a 2-node × 4-GPU cluster with
// accounting and slurmrestd.
type Options struct {
	Nodes, GPUsPerNode int // default 2 × 4; GPUsPerNode < 0 means none
	CPUsPerNode        int // default 2 × GPUsPerNode (at least 2)
	NodePrefix         string
	GPUType            string // "" = untyped gres (gpu:4); "h100" = gpu:h100:4
	Partition          string // the one default partition over all nodes; default "gpu"
	// Accounts are created with sacctmgr (fairshare=1) before slurmctld starts,
	// each with the users Users + root (root's default account is the first).
	Accounts []string
	// Users are POSIX accounts that must exist on the host (see EnsureUser).
	Users []string
	// ConfExtra is appended to slurm.conf. A plain Key=value line there
	// replaces the harness's own setting of that key (which is then commented
	// out); a PartitionName= line there replaces the default partition.
	// "{{nodes}}" is replaced by the node hostlist (sn[01-02]) and
	// "{{partition}}" by the partition name.
	ConfExtra string
	// JobSubmitLua, if set, is written as job_submit.lua next to slurm.conf
	// and JobSubmitPlugins=lua is set.
	JobSubmitLua string
	// Enforce, if set, is AccountingStorageEnforce (e.g.
	// "associations,limits,qos"); unset means no enforcement.
	Enforce string
	NoRest  bool // no slurmrestd
	NoDBD   bool // no slurmdbd / database (AccountingStorageType=none)
}

// Cluster is a running private cluster.
type Cluster struct {
	Dir        string // everything of the cluster lives below it
	Name       string // ClusterName, unique
	SlurmConf  string
	RestURL    string // "http://127.0.0.1:PORT"; "" with NoRest
	JWTKeyFile string // the HS256 key slurmctld and slurmdbd verify tokens with
	SlurmUser  string // "root"
	Nodes      []string
	Partition  string
	DBName     string // "" with NoDBD
	JobsDir    string // world-writable (sticky) working directory for jobs; ExecAs runs there
	// StartupTime is how long Start took until all nodes were idle and the
	// REST port answered; StartupPhases says where it went.
	StartupTime   time.Duration
	StartupPhases string

	opts         Options
	host         string
	mungeSocket  string
	ctldPort     int
	dbdPort      int
	dbServerPort int // the MariaDB slurmdbd stores into
	restPort     int
	slurmdPorts  []int
	env          []string

	mu      sync.Mutex
	daemons map[string]*daemon
	stopped bool
}

type daemon struct {
	name  string
	argv  []string
	env   []string
	cmd   *exec.Cmd
	stdin *os.File // write end of the reaper's stdin: closing it stops the daemon
	done  chan struct{}
	err   error
}

// Available reports whether a private cluster can be started here: root,
// the Slurm, munge and MariaDB client binaries and plugins, and a database
// server on 127.0.0.1:3306. The reason says what is missing.
func Available() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "slurmtest needs root (SlurmUser=root, slurmd runs jobs as other users)"
	}
	var missing []string
	for _, b := range []string{"munged", "slurmctld", "slurmd", "slurmstepd", "slurmdbd", "slurmrestd",
		"sbatch", "scontrol", "sacctmgr", "sacct", "squeue", "sinfo", "scancel"} {
		if findBin(b) == "" {
			missing = append(missing, b)
		}
	}
	if mysqlClient() == "" {
		missing = append(missing, "mariadb (client)")
	}
	if len(missing) > 0 {
		return false, "Slurm test cluster: missing " + strings.Join(missing, ", ") +
			" (Debian: slurmctld slurmd slurm-client slurmdbd slurmrestd slurm-wlm-jwt-plugin slurm-wlm-mysql-plugin munge mariadb-client)"
	}
	for _, p := range []string{"auth_jwt.so", "rest_auth_jwt.so", "accounting_storage_mysql.so", "openapi_v0_0_38.so"} {
		if !pluginExists(p) {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return false, "Slurm test cluster: missing plugins " + strings.Join(missing, ", ") +
			" (Debian: slurm-wlm-jwt-plugin slurm-wlm-mysql-plugin slurmrestd)"
	}
	if os.Getenv(dbEnv) != "private" {
		if err := systemDBCheck(); err == nil {
			return true, ""
		} else if !privateDBPossible() {
			return false, fmt.Sprintf("Slurm test cluster: %v, and no mariadbd/mariadb-install-db for a private one", err)
		}
	} else if !privateDBPossible() {
		return false, "Slurm test cluster: " + dbEnv + "=private but no mariadbd/mariadb-install-db"
	}
	return true, ""
}

func findBin(name string) string {
	for _, d := range []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"} {
		// The Debian daemons are NAME-wlm behind update-alternatives; prefer
		// the regular build (the emulator package switches the alternative).
		for _, n := range []string{name + "-wlm", name} {
			p := filepath.Join(d, n)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p
			}
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}

func mysqlClient() string {
	for _, n := range []string{"mariadb", "mysql"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

func pluginExists(name string) bool {
	m, _ := filepath.Glob("/usr/lib/*/slurm-wlm/" + name)
	m2, _ := filepath.Glob("/usr/lib*/slurm/" + name)
	m3, _ := filepath.Glob("/usr/local/lib/slurm/" + name)
	return len(m)+len(m2)+len(m3) > 0
}

// Start starts a private cluster and registers its stop with t.Cleanup; it
// fails t when the cluster does not come up (after retrying on port races).
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	c, err := StartErr(t, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// StartErr is Start returning the error instead of failing t, for starting
// clusters from other goroutines (t.Fatal must not be called there).
func StartErr(t testing.TB, o Options) (*Cluster, error) {
	t.Helper()
	if ok, why := Available(); !ok {
		return nil, fmt.Errorf("slurmtest.Start: %s", why)
	}
	// A cluster loads the machine: tests that measure time wait for it
	// (internal/testlock).
	release, err := testlock.Shared()
	if err != nil {
		return nil, err
	}
	t.Cleanup(release) // after the cluster's own Stop (cleanups run last-first)
	var errs []string
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := start(o)
		if err == nil {
			t.Cleanup(func() {
				if err := c.Stop(); err != nil {
					t.Errorf("slurmtest: stopping cluster %s: %v", c.Name, err)
				}
			})
			t.Logf("slurmtest: cluster %s up in %v [%s] (%d nodes, dir %s, rest %s)", c.Name,
				c.StartupTime.Round(time.Millisecond), c.StartupPhases, len(c.Nodes), c.Dir, c.RestURL)
			return c, nil
		}
		errs = append(errs, fmt.Sprintf("attempt %d: %v", attempt, err))
		if c != nil {
			if serr := c.Stop(); serr != nil {
				errs = append(errs, fmt.Sprintf("attempt %d: stopping: %v", attempt, serr))
			}
		}
		if !isPortRace(err) {
			break
		}
	}
	return nil, fmt.Errorf("slurmtest.Start: %s", strings.Join(errs, "\n"))
}

type portRaceError struct{ error }

func isPortRace(err error) bool {
	var p portRaceError
	return errors.As(err, &p)
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// portsDir registers the ports handed out by every process on the host that
// uses slurmtest (one file per port holding the owner's pid), so two test
// binaries never pick the same port in the gap between choosing it and the
// daemon binding it.
const portsDir = "/tmp/allot-slurmtest-ports"

// claimPort registers port for this process; false if a live process has it.
func claimPort(p int) bool {
	if err := os.MkdirAll(portsDir, 0o700); err != nil {
		return true // no registry: fall back to the kernel's choice
	}
	f := filepath.Join(portsDir, strconv.Itoa(p))
	for range 2 {
		h, err := os.OpenFile(f, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintf(h, "%d\n", os.Getpid())
			h.Close()
			return true
		}
		b, rerr := os.ReadFile(f)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if rerr == nil && perr == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
			return false // a live process holds it
		}
		os.Remove(f) // stale (dead owner, or half-written: retried once)
	}
	return false
}

// pruneStalePorts removes (once per process) the registrations of processes
// that are gone, e.g. a test binary killed by its timeout.
var pruneStalePorts = sync.OnceFunc(func() {
	ents, _ := os.ReadDir(portsDir)
	for _, e := range ents {
		f := filepath.Join(portsDir, e.Name())
		b, err := os.ReadFile(f)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err == nil && perr == nil && pid > 0 && syscall.Kill(pid, 0) != nil {
			os.Remove(f)
		}
	}
})

func releasePorts(ports []int) {
	for _, p := range ports {
		f := filepath.Join(portsDir, strconv.Itoa(p))
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(os.Getpid()) {
			os.Remove(f)
		}
	}
}

// freePorts returns n distinct free loopback ports, never handed out before
// in this process nor held by another live slurmtest process (someone else
// can still take one before the daemon binds it: Start then retries).
func freePorts(n int) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	pruneStalePorts()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > 100*n {
			return nil, errors.New("no free ports")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		p := l.Addr().(*net.TCPAddr).Port
		if portsUsed[p] || !claimPort(p) {
			continue
		}
		portsUsed[p] = true
		out = append(out, p)
	}
	return out, nil
}

func start(o Options) (*Cluster, error) {
	began := time.Now() // stopwatch for StartupTime
	if o.Nodes <= 0 {
		o.Nodes = 2
	}
	if o.GPUsPerNode == 0 {
		o.GPUsPerNode = 4
	} else if o.GPUsPerNode < 0 {
		o.GPUsPerNode = 0
	}
	if o.CPUsPerNode <= 0 {
		o.CPUsPerNode = max(2, 2*o.GPUsPerNode)
	}
	if o.NodePrefix == "" {
		o.NodePrefix = "sn"
	}
	if o.NoDBD && len(o.Accounts) > 0 {
		return nil, errors.New("Options.Accounts needs accounting (NoDBD is set)")
	}
	for _, u := range o.Users {
		if _, err := user.Lookup(u); err != nil {
			return nil, fmt.Errorf("Options.Users: %q is not a POSIX account on this host (see EnsureUser): %v", u, err)
		}
	}
	id := randHex(4)
	c := &Cluster{
		Name:      "st" + id,
		SlurmUser: "root",
		Partition: o.Partition,
		opts:      o,
		daemons:   map[string]*daemon{},
	}
	if c.Partition == "" {
		c.Partition = "gpu"
	}
	if !o.NoDBD {
		c.DBName = "allot_slurm_" + id
		port, err := dbPort()
		if err != nil {
			return nil, err
		}
		c.dbServerPort = port
	}
	c.host, _ = os.Hostname()
	if i := strings.IndexByte(c.host, '.'); i > 0 {
		c.host = c.host[:i]
	}
	// A short directory: the munge socket path must fit in sun_path (108).
	// Other users (jobs, sbatch as a test account, slurmrestd as nobody) must
	// reach it: every ancestor must be world-searchable.
	base := os.TempDir()
	if len(base) > 40 || !worldSearchable(base) {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "slurmtest-"+id+"-")
	if err != nil {
		return nil, err
	}
	c.Dir = dir
	for i := 1; i <= o.Nodes; i++ {
		c.Nodes = append(c.Nodes, nodeName(o.NodePrefix, i, o.Nodes))
	}
	ports, err := freePorts(3 + o.Nodes)
	if err != nil {
		return c, err
	}
	c.ctldPort, c.dbdPort, c.restPort, c.slurmdPorts = ports[0], ports[1], ports[2], ports[3:]
	if !o.NoRest {
		c.RestURL = fmt.Sprintf("http://127.0.0.1:%d", c.restPort)
	}
	if err := c.layout(); err != nil {
		return c, err
	}

	var phases []string
	last := time.Now() // stopwatch
	mark := func(what string) {
		phases = append(phases, fmt.Sprintf("%s=%v", what, time.Since(last).Round(time.Millisecond)))
		last = time.Now()
	}
	mark("layout")
	if err := c.startMunge(); err != nil {
		return c, err
	}
	mark("munge")
	if !o.NoDBD {
		if err := c.startDaemon("slurmdbd", c.bin("slurmdbd"), "-D"); err != nil {
			return c, err
		}
		if err := c.waitPort("slurmdbd", c.dbdPort, 60*time.Second); err != nil {
			return c, err
		}
		mark("dbd")
	}
	// slurmctld registers its cluster with slurmdbd itself.
	if err := c.startDaemon("slurmctld", c.bin("slurmctld"), "-D"); err != nil {
		return c, err
	}
	if !o.NoRest {
		if err := c.startRest(); err != nil {
			return c, err
		}
	}
	acctErr := make(chan error, 1)
	go func() { acctErr <- c.setupAccounts() }()
	if err := c.waitPort("slurmctld", c.ctldPort, 30*time.Second); err != nil {
		<-acctErr
		return c, err
	}
	mark("ctld")
	// slurmd started before slurmctld listens waits ~1 s before registering
	// again; started now, it registers at once.
	for _, n := range c.Nodes {
		if err := c.startDaemon("slurmd-"+n, c.bin("slurmd"), "-D", "-N", n, "-d", c.bin("slurmstepd")); err != nil {
			<-acctErr
			return c, err
		}
	}
	if err := c.waitNodesIdle(30 * time.Second); err != nil {
		<-acctErr
		return c, err
	}
	mark("nodes")
	if err := <-acctErr; err != nil {
		return c, err
	}
	mark("accounts")
	if !o.NoRest {
		if err := c.waitPort("slurmrestd", c.restPort, 30*time.Second); err != nil {
			return c, err
		}
	}
	// A daemon that lost its port to someone else's listener dies at once;
	// make sure all of ours are still there and that the slurmctld we talk
	// to is ours.
	c.mu.Lock()
	names := slices.Sorted(maps.Keys(c.daemons))
	c.mu.Unlock()
	for _, n := range names {
		if !c.alive(n) {
			return c, c.daemonFailed(n)
		}
	}
	if out, err := c.Exec("scontrol", "show", "config"); err != nil {
		return c, err
	} else if !regexp.MustCompile(`(?m)^ClusterName\s*=\s*` + c.Name + `$`).MatchString(out) {
		return c, portRaceError{fmt.Errorf("slurmctld on port %d is not cluster %s", c.ctldPort, c.Name)}
	}
	mark("rest")
	c.StartupTime = time.Since(began)
	c.StartupPhases = strings.Join(phases, " ")
	return c, nil
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.Dir, "bin", name) }

func (c *Cluster) layout() error {
	if err := os.Chmod(c.Dir, 0o755); err != nil { // users' sbatch reads slurm.conf, reaches the munge socket
		return err
	}
	for _, d := range []string{"etc", "bin", "run", "log", "state", "dev", "munge", "munge-run", "spool"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(c.Dir, "munge"), 0o700); err != nil {
		return err
	}
	c.JobsDir = filepath.Join(c.Dir, "jobs")
	if err := os.MkdirAll(c.JobsDir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(c.JobsDir, 0o1777); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := os.MkdirAll(filepath.Join(c.Dir, "spool", n), 0o755); err != nil {
			return err
		}
	}
	// Slurm tells its daemons apart by argv[0] (run_in_daemon): links with the
	// plain names to the regular (non-emulator) binaries.
	for _, b := range []string{"slurmctld", "slurmd", "slurmstepd", "slurmdbd"} {
		p := findBin(b)
		if p == "" {
			return fmt.Errorf("%s not found", b)
		}
		if err := os.Symlink(p, c.bin(b)); err != nil {
			return err
		}
	}
	for g := 0; g < c.opts.GPUsPerNode; g++ {
		if err := os.Symlink("/dev/null", filepath.Join(c.Dir, "dev", fmt.Sprintf("nvidia%d", g))); err != nil {
			return err
		}
	}
	c.mungeSocket = filepath.Join(c.Dir, "munge-run", "munge.socket.2")
	c.JWTKeyFile = filepath.Join(c.Dir, "etc", "jwt_hs256.key")
	c.SlurmConf = filepath.Join(c.Dir, "etc", "slurm.conf")
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{filepath.Join(c.Dir, "munge", "munge.key"), randBytes(1024), 0o400},
		{c.JWTKeyFile, randBytes(32), 0o600},
		{c.SlurmConf, []byte(c.renderSlurmConf()), 0o644},
		{filepath.Join(c.Dir, "etc", "gres.conf"), []byte(c.renderGresConf()), 0o644},
	}
	if !c.opts.NoDBD {
		files = append(files, struct {
			path string
			data []byte
			mode os.FileMode
		}{filepath.Join(c.Dir, "etc", "slurmdbd.conf"), []byte(c.renderDBDConf()), 0o600})
	}
	if c.opts.JobSubmitLua != "" {
		files = append(files, struct {
			path string
			data []byte
			mode os.FileMode
		}{filepath.Join(c.Dir, "etc", "job_submit.lua"), []byte(c.opts.JobSubmitLua), 0o644})
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(f.path, f.mode); err != nil {
			return err
		}
	}
	c.env = []string{"SLURM_CONF=" + c.SlurmConf}
	for _, e := range os.Environ() {
		if strings.HasPrefix(e, "SLURM_") || strings.HasPrefix(e, "SBATCH_") || strings.HasPrefix(e, "SQUEUE_") ||
			strings.HasPrefix(e, "SACCT_") || strings.HasPrefix(e, "SINFO_") || strings.HasPrefix(e, reaperEnv) ||
			// jobs inherit the submitter's environment; the test's TMPDIR is
			// usually private to root
			strings.HasPrefix(e, "TMPDIR=") {
			continue
		}
		c.env = append(c.env, e)
	}
	return nil
}

// worldSearchable: dir and all its ancestors have o+x.
func worldSearchable(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" || d == "." {
			return true
		}
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

func (c *Cluster) startMunge() error {
	m := filepath.Join(c.Dir, "munge")
	err := c.startDaemon("munged", findBin("munged"), "-F",
		"--socket="+c.mungeSocket,
		"--key-file="+filepath.Join(m, "munge.key"),
		"--pid-file="+filepath.Join(c.Dir, "munge-run", "munged.pid"),
		"--log-file="+filepath.Join(c.Dir, "log", "munged.log"),
		"--seed-file="+filepath.Join(m, "munged.seed"))
	if err != nil {
		return err
	}
	return c.waitFor("munged", 10*time.Second, func() bool {
		st, err := os.Stat(c.mungeSocket)
		return err == nil && st.Mode()&os.ModeSocket != 0
	})
}

func (c *Cluster) startRest() error {
	u, g := "nobody", "nogroup"
	if _, err := user.LookupGroup(g); err != nil {
		g = "nobody"
	}
	plugins := "openapi/v0.0.38,openapi/dbv0.0.38"
	if c.opts.NoDBD {
		plugins = "openapi/v0.0.38" // dbv0.0.38 is fatal without slurmdbd
	}
	return c.startDaemonEnv("slurmrestd", []string{"SLURM_JWT=daemon"}, findBin("slurmrestd"),
		"-a", "rest_auth/jwt", "-s", plugins, "-u", u, "-g", g,
		fmt.Sprintf("127.0.0.1:%d", c.restPort))
}

// setupAccounts creates Options.Accounts and their users once slurmctld has
// registered the cluster, and waits until slurmctld has the associations.
func (c *Cluster) setupAccounts() error {
	if c.opts.NoDBD || len(c.opts.Accounts) == 0 {
		return nil
	}
	err := c.waitFor("slurmctld", 30*time.Second, func() bool {
		out, err := c.Exec("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster")
		return err == nil && slices.Contains(strings.Fields(out), c.Name)
	})
	if err != nil {
		return fmt.Errorf("cluster not registered in slurmdbd: %w", err)
	}
	accts := strings.Join(c.opts.Accounts, ",")
	if _, err := c.Exec("sacctmgr", "-i", "add", "account", accts, "cluster="+c.Name, "fairshare=1",
		"description=slurmtest", "organization=slurmtest"); err != nil {
		return err
	}
	users := append([]string{"root"}, c.opts.Users...)
	if _, err := c.Exec("sacctmgr", "-i", "add", "user", strings.Join(users, ","), "account="+accts,
		"cluster="+c.Name, "fairshare=1"); err != nil {
		return err
	}
	// slurmdbd pushes the new associations to slurmctld asynchronously.
	lastUser, lastAcct := users[len(users)-1], c.opts.Accounts[len(c.opts.Accounts)-1]
	return c.waitFor("slurmctld", 30*time.Second, func() bool {
		out, err := c.Exec("scontrol", "show", "assoc_mgr", "flags=assoc", "users="+lastUser, "accounts="+lastAcct)
		return err == nil && strings.Contains(out, "Account="+lastAcct+" UserName="+lastUser)
	})
}

// startDaemon starts argv under its own reaper (a re-executed copy of this
// binary), output to log/NAME.out.
func (c *Cluster) startDaemon(name string, argv ...string) error {
	return c.startDaemonEnv(name, nil, argv...)
}

func (c *Cluster) startDaemonEnv(name string, extraEnv []string, argv ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("cluster stopped")
	}
	if d := c.daemons[name]; d != nil {
		select {
		case <-d.done:
		default:
			return fmt.Errorf("%s is already running", name)
		}
	}
	d := &daemon{name: name, argv: argv, env: extraEnv, done: make(chan struct{})}
	if err := c.spawn(d); err != nil {
		return err
	}
	c.daemons[name] = d
	return nil
}

func (c *Cluster) spawn(d *daemon) error {
	return spawnReaped(d, "slurmtest-reaper["+c.Name+"/"+d.name+"]", filepath.Join(c.Dir, "log", d.name+".out"),
		c.Dir, append(slices.Clone(c.env), d.env...))
}

// spawnReaped starts d.argv under a reaper (a re-executed copy of this
// binary) whose command line starts with label, output to logPath.
func spawnReaped(d *daemon, label, logPath, dir string, env []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path:   self,
		Args:   append([]string{label, "--"}, d.argv...),
		Env:    append(slices.Clone(env), reaperEnv+"=1", reaperGraceEnv+"=5000"),
		Dir:    dir,
		Stdin:  r,
		Stdout: logf,
		Stderr: logf,
		// Its own process group: a ^C to the test's terminal reaches the test
		// only, which then stops the cluster in order.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("start %s: %w", d.name, err)
	}
	d.cmd, d.stdin = cmd, w
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	return nil
}

// stopDaemon stops one daemon (SIGTERM, SIGKILL after 5 s; then everything
// it left behind) and waits for it.
func (c *Cluster) stopDaemon(name string) error { return c.stopDaemonHow(name, false) }

// stopDaemonHow: fast kills the daemon at once (SIGKILL: no state saved),
// for clusters that are being thrown away.
func (c *Cluster) stopDaemonHow(name string, fast bool) error {
	c.mu.Lock()
	d := c.daemons[name]
	c.mu.Unlock()
	if d == nil {
		return nil
	}
	defer trace(time.Now(), "stop "+name)
	if fast {
		_ = d.cmd.Process.Signal(syscall.SIGUSR1)
	}
	d.stdin.Close() // EOF: the reaper stops the daemon and its descendants
	select {
	case <-d.done:
		return nil
	case <-time.After(15 * time.Second):
	}
	_ = syscall.Kill(d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.done
	return fmt.Errorf("%s: reaper did not finish in 15 s; killed it", name)
}

func (c *Cluster) alive(name string) bool {
	c.mu.Lock()
	d := c.daemons[name]
	c.mu.Unlock()
	if d == nil {
		return false
	}
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

func (c *Cluster) waitFor(name string, timeout time.Duration, ok func() bool) error {
	deadline := time.Now().Add(timeout) // stopwatch
	for {
		if ok() {
			return nil
		}
		if !c.alive(name) {
			return c.daemonFailed(name)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v\n%s", name, timeout, c.logTail(name))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *Cluster) daemonFailed(name string) error {
	tail := c.logTail(name)
	err := fmt.Errorf("%s exited during start\n%s", name, tail)
	if strings.Contains(tail, "Address already in use") || strings.Contains(tail, "Unable to bind") {
		return portRaceError{err}
	}
	return err
}

func (c *Cluster) logTail(name string) string {
	var b strings.Builder
	logs := []string{name + ".out", name + ".log"}
	for _, l := range logs {
		data, err := os.ReadFile(filepath.Join(c.Dir, "log", l))
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s (last lines)\n%s\n", l, strings.Join(lines, "\n"))
	}
	return b.String()
}

func (c *Cluster) waitPort(name string, port int, timeout time.Duration) error {
	return c.waitFor(name, timeout, func() bool {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
}

func (c *Cluster) nodeStates() (map[string]string, error) {
	out, err := c.Exec("sinfo", "-h", "-N", "-o", "%N %T")
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			m[f[0]] = f[1]
		}
	}
	return m, nil
}

func (c *Cluster) waitNodesIdle(timeout time.Duration) error {
	deadline := time.Now().Add(timeout) // stopwatch
	var last map[string]string
	for {
		if !c.alive("slurmctld") {
			return c.daemonFailed("slurmctld")
		}
		for _, n := range c.Nodes {
			if !c.alive("slurmd-" + n) {
				return c.daemonFailed("slurmd-" + n)
			}
		}
		m, err := c.nodeStates()
		if err == nil {
			last = m
			idle := 0
			for _, n := range c.Nodes {
				if m[n] == "idle" {
					idle++
				}
			}
			if idle == len(c.Nodes) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodes not idle after %v: %v\n%s", timeout, last, c.logTail("slurmctld"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Env is the environment for Slurm commands against this cluster (the
// process's own, without SLURM_* variables, plus SLURM_CONF).
func (c *Cluster) Env() []string { return slices.Clone(c.env) }

// Exec runs a Slurm command (sbatch, scontrol, sacctmgr, ...) as root against
// this cluster; the error carries its output.
func (c *Cluster) Exec(name string, args ...string) (string, error) {
	return c.exec("", name, args...)
}

// ExecAs runs a command as the POSIX account user (root when user is "" or
// "root"), in JobsDir, against this cluster.
func (c *Cluster) ExecAs(user, name string, args ...string) (string, error) {
	return c.exec(user, name, args...)
}

func (c *Cluster) exec(asUser, name string, args ...string) (string, error) {
	defer trace(time.Now(), name+" "+strings.Join(args, " "))
	cmd := exec.Command(name, args...)
	cmd.Env = c.Env()
	cmd.Dir = c.JobsDir
	if asUser != "" && asUser != "root" {
		u, err := user.Lookup(asUser)
		if err != nil {
			return "", err
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if gids, err := u.GroupIds(); err == nil {
			for _, g := range gids {
				if n, err := strconv.Atoi(g); err == nil {
					cred.Groups = append(cred.Groups, uint32(n))
				}
			}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Env = append(cmd.Env, "USER="+u.Username, "LOGNAME="+u.Username, "HOME="+u.HomeDir)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// Run is Exec that fails t on error.
func (c *Cluster) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := c.Exec(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// RunAs is ExecAs that fails t on error.
func (c *Cluster) RunAs(t testing.TB, user, name string, args ...string) string {
	t.Helper()
	out, err := c.ExecAs(user, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Sbatch submits with `sbatch --parsable ARGS...` as user (root for "") from
// JobsDir and returns the job id.
func (c *Cluster) Sbatch(t testing.TB, user string, args ...string) int64 {
	t.Helper()
	out := c.RunAs(t, user, "sbatch", append([]string{"--parsable"}, args...)...)
	// --parsable prints "ID" or "ID;cluster" (plus any job_submit messages before it).
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	idStr, _, _ := strings.Cut(last, ";")
	id, err := strconv.ParseInt(idStr, 10, 64)
	if err != nil {
		t.Fatalf("sbatch: no job id in %q", out)
	}
	return id
}

var terminalStates = []string{"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
	"OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}

// JobState is the job's current state word (squeue, or sacct once slurmctld
// has forgotten it); "" when neither knows the job.
func (c *Cluster) JobState(id int64) (string, error) {
	out, err := c.Exec("squeue", "-h", "-t", "all", "-j", strconv.FormatInt(id, 10), "-o", "%T")
	if err == nil && strings.TrimSpace(out) != "" {
		return strings.Fields(out)[0], nil
	}
	if c.opts.NoDBD {
		return "", err
	}
	out, err2 := c.Exec("sacct", "-n", "-X", "-P", "-j", strconv.FormatInt(id, 10), "-o", "State")
	if err2 != nil {
		return "", err2
	}
	lines := strings.Fields(out)
	if len(lines) == 0 {
		return "", nil
	}
	return lines[len(lines)-1], nil
}

// WaitJob waits (up to 30 s) until job id is in one of states (default: any
// terminal state) and returns the state.
func (c *Cluster) WaitJob(t testing.TB, id int64, states ...string) string {
	t.Helper()
	if len(states) == 0 {
		states = terminalStates
	}
	deadline := time.Now().Add(30 * time.Second) // stopwatch
	var st string
	for {
		var err error
		st, err = c.JobState(id)
		if err == nil && slices.Contains(states, st) {
			return st
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("job %d: state %q after 30 s, want one of %v\n%s", id, st, states, c.logTail("slurmctld"))
	return ""
}

// WaitIdle waits (up to 30 s) until every node is idle.
func (c *Cluster) WaitIdle(t testing.TB) {
	t.Helper()
	if err := c.waitNodesIdle(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// Token returns a JWT for user from `scontrol token` (slurmctld mints it).
func (c *Cluster) Token(t testing.TB, user string, lifespan time.Duration) string {
	t.Helper()
	args := []string{"token", "lifespan=" + strconv.Itoa(int(lifespan.Seconds()))}
	if user != "" {
		args = append(args, "username="+user)
	}
	out := c.Run(t, "scontrol", args...)
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "SLURM_JWT="); ok {
			return v
		}
	}
	t.Fatalf("scontrol token: no SLURM_JWT in %q", out)
	return ""
}

// MintToken makes an HS256 JWT for user from JWTKeyFile, the way Allot does
// (claims iat, exp, sun).
func (c *Cluster) MintToken(user string, lifespan time.Duration) (string, error) {
	key, err := os.ReadFile(c.JWTKeyFile)
	if err != nil {
		return "", err
	}
	// Protocol time: slurmctld checks exp against its real clock.
	now := time.Now().Unix()
	hdr, _ := json.Marshal(map[string]string{"alg": "HS256", "typ": "JWT"})
	claims, _ := json.Marshal(map[string]any{"iat": now, "exp": now + int64(lifespan.Seconds()), "sun": user})
	enc := base64.RawURLEncoding
	msg := enc.EncodeToString(hdr) + "." + enc.EncodeToString(claims)
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return msg + "." + enc.EncodeToString(m.Sum(nil)), nil
}

// Reconfigure rewrites slurm.conf with confExtra as Options.ConfExtra (and
// job_submit.lua with lua, if not ""), then runs `scontrol reconfigure`.
func (c *Cluster) Reconfigure(t testing.TB, confExtra, lua string) {
	t.Helper()
	c.opts.ConfExtra = confExtra
	if lua != "" {
		c.opts.JobSubmitLua = lua
		if err := os.WriteFile(filepath.Join(c.Dir, "etc", "job_submit.lua"), []byte(lua), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(c.SlurmConf, []byte(c.renderSlurmConf()), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Run(t, "scontrol", "reconfigure")
}

// StopRest stops slurmrestd (RestURL then refuses connections).
func (c *Cluster) StopRest(t testing.TB) { t.Helper(); c.stop(t, "slurmrestd") }

// StartRest starts slurmrestd again on the same port and waits for it.
func (c *Cluster) StartRest(t testing.TB) {
	t.Helper()
	if c.opts.NoRest {
		t.Fatal("StartRest: cluster has NoRest")
	}
	if err := c.startRest(); err != nil {
		t.Fatal(err)
	}
	if err := c.waitPort("slurmrestd", c.restPort, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// StopCtld stops slurmctld (state is saved in Dir/state; running jobs keep
// running under their slurmd).
func (c *Cluster) StopCtld(t testing.TB) { t.Helper(); c.stop(t, "slurmctld") }

// StartCtld starts slurmctld again (it recovers its state) and waits for it.
func (c *Cluster) StartCtld(t testing.TB) {
	t.Helper()
	if err := c.startDaemon("slurmctld", c.bin("slurmctld"), "-D"); err != nil {
		t.Fatal(err)
	}
	if err := c.waitPort("slurmctld", c.ctldPort, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// StopDBD stops slurmdbd (slurmctld queues accounting for it).
func (c *Cluster) StopDBD(t testing.TB) { t.Helper(); c.stop(t, "slurmdbd") }

// StartDBD starts slurmdbd again and waits for it.
func (c *Cluster) StartDBD(t testing.TB) {
	t.Helper()
	if c.opts.NoDBD {
		t.Fatal("StartDBD: cluster has NoDBD")
	}
	if err := c.startDaemon("slurmdbd", c.bin("slurmdbd"), "-D"); err != nil {
		t.Fatal(err)
	}
	if err := c.waitPort("slurmdbd", c.dbdPort, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) stop(t testing.TB, name string) {
	t.Helper()
	if err := c.stopDaemon(name); err != nil {
		t.Fatal(err)
	}
}

// Stop stops everything the cluster started, kills anything left that refers
// to Dir (and says so in the error), drops the database and removes Dir. It is
// idempotent; Start registers it with t.Cleanup.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()
	var errs []error
	par := func(names ...string) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, n := range names {
			wg.Go(func() {
				if err := c.stopDaemonHow(n, true); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	// slurmd (with their jobs), slurmrestd and slurmctld first, then
	// accounting, munge last (the others authenticate through it).
	first := []string{"slurmrestd", "slurmctld"}
	for _, n := range c.Nodes {
		first = append(first, "slurmd-"+n)
	}
	par(first...)
	par("slurmdbd")
	par("munged")
	if c.Dir != "" {
		if left := sweep(c.Dir); len(left) > 0 {
			errs = append(errs, fmt.Errorf("processes left behind, killed: %s", strings.Join(left, "; ")))
		}
	}
	releasePorts(append([]int{c.ctldPort, c.dbdPort, c.restPort}, c.slurmdPorts...))
	if c.DBName != "" {
		if err := dropDB(c.DBName); err != nil {
			errs = append(errs, err)
		}
	}
	if keep := os.Getenv(keepLogsEnv); keep != "" && c.Dir != "" {
		if err := os.CopyFS(filepath.Join(keep, c.Name), os.DirFS(filepath.Join(c.Dir, "log"))); err != nil {
			errs = append(errs, fmt.Errorf("keeping logs: %w", err))
		}
	}
	if c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func dropDB(name string) error {
	port, err := dbPort()
	if err != nil {
		return err
	}
	if err := dbQuery(port, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
		return fmt.Errorf("drop database %s: %v", name, err)
	}
	return nil
}

// processesUsing lists the processes (pid and command line) whose command
// line, working directory or environment mentions dir: by construction only
// this cluster's processes do (dir is unique).
func processesUsing(dir string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		p := "/proc/" + e.Name()
		if _, st, ok := procStat(pid); !ok || st == 'Z' {
			continue
		}
		cmdline, _ := os.ReadFile(p + "/cmdline")
		cwd, _ := os.Readlink(p + "/cwd")
		environ, _ := os.ReadFile(p + "/environ")
		if bytes.Contains(cmdline, []byte(dir)) || cwd == dir || strings.HasPrefix(cwd, dir+"/") ||
			bytes.Contains(environ, []byte(dir+"/")) {
			out[pid] = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}

// sweep kills (SIGKILL) every process using dir, until none is left, and
// returns what it found.
func sweep(dir string) []string {
	var found []string
	seen := map[int]bool{}
	for range 50 {
		ps := processesUsing(dir)
		if len(ps) == 0 {
			break
		}
		for pid, cmd := range ps {
			if !seen[pid] {
				seen[pid] = true
				found = append(found, fmt.Sprintf("%d %s", pid, cmd))
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	slices.Sort(found)
	return found
}
