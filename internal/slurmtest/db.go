package slurmtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The accounting database. By default the MariaDB at 127.0.0.1:3306 (root,
// no password), each cluster in a database of its own. Where that server is
// not there (a fresh CI image: the package's service is not started) or
// ALLOT_SLURMTEST_DB=private, the first cluster of the test process starts a
// private mariadbd on a free port under a reaper, for the life of the process:
// when the process exits, its end of the reaper's stdin closes, mariadbd is
// stopped and its directory removed.
const dbEnv = "ALLOT_SLURMTEST_DB"

// systemDBCheck: the system server takes root without a password over TCP
// (checked once per process).
var systemDBCheck = sync.OnceValue(func() error {
	addr := net.JoinHostPort(dbHost, strconv.Itoa(systemDBPort))
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return fmt.Errorf("no MariaDB/MySQL at %s (%v)", addr, err)
	}
	conn.Close()
	if err := dbQuery(systemDBPort, "SELECT 1"); err != nil {
		return fmt.Errorf("MariaDB at %s does not let %s in without a password: %v", addr, dbUser, err)
	}
	return nil
})

func dbQuery(port int, sql string) error {
	cl := mysqlClient()
	if cl == "" {
		return errors.New("no mariadb/mysql client")
	}
	out, err := exec.Command(cl, "-h", dbHost, "-P", strconv.Itoa(port), "-u", dbUser, "-N", "-e", sql).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func mariadbBins() (server, install string) {
	for _, n := range []string{"mariadbd", "mysqld"} {
		if p := findBin(n); p != "" {
			server = p
			break
		}
	}
	for _, n := range []string{"mariadb-install-db", "mysql_install_db"} {
		if p := findBin(n); p != "" {
			install = p
			break
		}
	}
	return server, install
}

func privateDBPossible() bool {
	s, i := mariadbBins()
	return s != "" && i != "" && mysqlClient() != ""
}

// dbPort is the port of the database server clusters use (starting the
// private one if needed).
func dbPort() (int, error) { return database() }

var privateDB *daemon // kept for the life of the process: its stdin pipe ends with it

var database = sync.OnceValues(func() (int, error) {
	if os.Getenv(dbEnv) != "private" && systemDBCheck() == nil {
		return systemDBPort, nil
	}
	server, install := mariadbBins()
	if server == "" || install == "" {
		return 0, errors.New("no usable MariaDB at 127.0.0.1:3306 and no mariadbd/mariadb-install-db")
	}
	dir, err := os.MkdirTemp("/tmp", "slurmtest-mariadb-")
	if err != nil {
		return 0, err
	}
	fail := func(err error) (int, error) {
		os.RemoveAll(dir)
		return 0, fmt.Errorf("private MariaDB: %w", err)
	}
	out, err := exec.Command(install, "--no-defaults", "--user=root", "--datadir="+filepath.Join(dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("%s: %v: %s", install, err, out))
	}
	ports, err := freePorts(1)
	if err != nil {
		return fail(err)
	}
	d := &daemon{name: "mariadbd", done: make(chan struct{}), argv: []string{server, "--no-defaults", "--user=root",
		"--datadir=" + filepath.Join(dir, "data"), "--bind-address=127.0.0.1", "--port=" + strconv.Itoa(ports[0]),
		"--socket=" + filepath.Join(dir, "mysqld.sock"), "--pid-file=" + filepath.Join(dir, "mysqld.pid"),
		"--log-error=" + filepath.Join(dir, "mariadb.log"), "--skip-name-resolve", "--innodb-buffer-pool-size=256M"}}
	env := append(os.Environ(), reaperRmdirEnv+"="+dir)
	if err := spawnReaped(d, "slurmtest-reaper[mariadbd]", filepath.Join(dir, "mariadbd.out"), dir, env); err != nil {
		return fail(err)
	}
	deadline := time.Now().Add(60 * time.Second) // stopwatch
	for {
		if err := dbQuery(ports[0], "SELECT 1"); err == nil {
			break
		}
		select {
		case <-d.done:
			b, _ := os.ReadFile(filepath.Join(dir, "mariadb.log"))
			return fail(fmt.Errorf("mariadbd exited: %s", b))
		default:
		}
		if time.Now().After(deadline) {
			d.stdin.Close()
			<-d.done
			return fail(errors.New("mariadbd not ready after 60 s"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	privateDB = d
	return ports[0], nil
})
