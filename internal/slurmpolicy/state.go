package slurmpolicy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The sacctmgr queries ReadClusterState runs (with -n -P: no header, '|'
// between fields).
var (
	qosFormat     = "format=Name,Priority,Preempt,PreemptMode,GraceTime,UsageFactor"
	accountFormat = "format=Account,Organization,Description" // Description last: it may hold anything
	assocFormat   = "format=Cluster,Account,User,Share,QOS,DefaultQOS"
)

// sacctmgr runs `sacctmgr args...` with env added to this process's
// environment, and returns its standard output.
func sacctmgr(ctx context.Context, env []string, args ...string) (string, error) {
	if err := checkConf(env); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "sacctmgr", args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String() + "\n" + out.String())
		return out.String(), fmt.Errorf("sacctmgr %s: %v: %s", commandLine(args), err, msg)
	}
	return out.String(), nil
}

// ReadClusterState reads Allot's part of the cluster's accounting with the
// sacctmgr CLI (env: SLURM_CONF=... and whatever else it needs): every
// QOS named allot-*, and every account with its account-level association
// and users. Associations of other clusters of the same slurmdbd are left
// out when SLURM_CONF names the cluster.
func ReadClusterState(ctx context.Context, env []string) (ClusterState, error) {
	if err := checkConf(env); err != nil {
		return ClusterState{}, err
	}
	qos, err := sacctmgr(ctx, env, "-n", "-P", "show", "qos", qosFormat)
	if err != nil {
		return ClusterState{}, err
	}
	accts, err := sacctmgr(ctx, env, "-n", "-P", "show", "account", accountFormat)
	if err != nil {
		return ClusterState{}, err
	}
	assocs, err := sacctmgr(ctx, env, "-n", "-P", "show", "assoc", assocFormat)
	if err != nil {
		return ClusterState{}, err
	}
	return ParseClusterState(qos, accts, assocs, ClusterName(env))
}

// confPath is the slurm.conf that env's (or this process's) SLURM_CONF
// names ("" when neither sets it).
func confPath(env []string) string {
	path := os.Getenv("SLURM_CONF")
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "SLURM_CONF="); ok {
			path = v
		}
	}
	return path
}

// checkConf fails at once when SLURM_CONF names no readable file: sacctmgr
// would retry for a minute before saying so.
func checkConf(env []string) error {
	path := confPath(env)
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("SLURM_CONF=%s: %w", path, err)
	}
	f.Close()
	return nil
}

// ClusterName is the ClusterName of the slurm.conf env's SLURM_CONF
// names (lower case; "" when unknown).
func ClusterName(env []string) string {
	path := confPath(env)
	if path == "" {
		path = "/etc/slurm/slurm.conf"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	name := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		k, v, ok := strings.Cut(line, "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "ClusterName") {
			name = strings.ToLower(strings.TrimSpace(v))
		}
	}
	return name
}

// ParseClusterState reads the output of the three `sacctmgr -n -P show`
// queries of ReadClusterState; cluster ("" = any) selects the
// associations.
func ParseClusterState(qosOut, accountOut, assocOut, cluster string) (ClusterState, error) {
	st := ClusterState{Accounts: map[string]Account{}, QOS: map[string]QOS{}}
	for _, line := range lines(qosOut) {
		f := strings.Split(line, "|")
		if len(f) < 6 {
			return st, fmt.Errorf("sacctmgr show qos: unexpected line %q", line)
		}
		name := strings.ToLower(f[0])
		if !strings.HasPrefix(name, QOSPrefix) {
			continue
		}
		prio, err := atoiOrZero(f[1])
		if err != nil {
			return st, fmt.Errorf("sacctmgr show qos: priority of %s: %v", name, err)
		}
		grace, err := parseSlurmTime(f[4])
		if err != nil {
			return st, fmt.Errorf("sacctmgr show qos: grace time of %s: %v", name, err)
		}
		uf := 1.0
		if s := strings.TrimSpace(f[5]); s != "" {
			if uf, err = strconv.ParseFloat(s, 64); err != nil {
				return st, fmt.Errorf("sacctmgr show qos: usage factor of %s: %v", name, err)
			}
		}
		st.QOS[name] = QOS{Priority: prio, Preempt: splitList(f[2]), PreemptMode: strings.ToLower(strings.TrimSpace(f[3])), GraceTime: grace, UsageFactor: uf}
	}
	for _, line := range lines(accountOut) {
		f := strings.SplitN(line, "|", 3)
		if len(f) < 3 {
			return st, fmt.Errorf("sacctmgr show account: unexpected line %q", line)
		}
		name := strings.ToLower(f[0])
		a := st.Accounts[name]
		a.Organization, a.Description = f[1], f[2]
		a.Users = []string{}
		st.Accounts[name] = a
	}
	for _, line := range lines(assocOut) {
		f := strings.Split(line, "|")
		if len(f) < 6 {
			return st, fmt.Errorf("sacctmgr show assoc: unexpected line %q", line)
		}
		if cluster != "" && !strings.EqualFold(f[0], cluster) {
			continue
		}
		name, user := strings.ToLower(f[1]), strings.ToLower(f[2])
		a, ok := st.Accounts[name]
		if !ok {
			a.Users = []string{}
		}
		if user == "" {
			a.Shares, _ = strconv.Atoi(strings.TrimSpace(f[3])) // "parent" → 0
			a.QOS = splitList(f[4])
			a.DefaultQOS = strings.ToLower(strings.TrimSpace(f[5]))
		} else if !slices.Contains(a.Users, user) {
			a.Users = append(a.Users, user)
			slices.Sort(a.Users)
		}
		st.Accounts[name] = a
	}
	return st, nil
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimRight(l, "\r"); strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func atoiOrZero(s string) (int, error) {
	if s = strings.TrimSpace(s); s == "" {
		return 0, nil
	}
	return strconv.Atoi(s)
}

// splitList is a comma-separated list, lower case, sorted, never nil.
func splitList(s string) []string {
	out := []string{}
	for _, v := range strings.Split(s, ",") {
		if v = strings.ToLower(strings.TrimSpace(v)); v != "" {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// parseSlurmTime reads sacctmgr's [days-]hours:minutes:seconds (or
// minutes:seconds, or "" for none) as seconds.
func parseSlurmTime(s string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	days := 0
	if d, rest, ok := strings.Cut(s, "-"); ok {
		n, err := strconv.Atoi(d)
		if err != nil {
			return 0, fmt.Errorf("bad time %q", s)
		}
		days, s = n, rest
	}
	parts := strings.Split(s, ":")
	if len(parts) > 3 {
		return 0, fmt.Errorf("bad time %q", s)
	}
	total := 0
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("bad time %q", s)
		}
		total = total*60 + n
	}
	if len(parts) == 1 { // plain minutes
		total *= 60
	}
	return days*86400 + total, nil
}
