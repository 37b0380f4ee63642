package slurmtest

import (
	"fmt"
	"path/filepath"
	"strings"
)

// nodeName is the name of node i (1-based).
func nodeName(prefix string, i, n int) string {
	if n > 99 {
		return fmt.Sprintf("%s%03d", prefix, i)
	}
	return fmt.Sprintf("%s%02d", prefix, i)
}

// hostlist is Slurm's compact form of all node names: sn[01-04].
func hostlist(prefix string, n int) string {
	if n == 1 {
		return nodeName(prefix, 1, 1)
	}
	return fmt.Sprintf("%s[%s-%s]", prefix, strings.TrimPrefix(nodeName(prefix, 1, n), prefix),
		strings.TrimPrefix(nodeName(prefix, n, n), prefix))
}

// confKeys returns the lower-cased keys of the plain "Key=value" lines of a
// slurm.conf fragment (NodeName/PartitionName/NodeSet/DownNodes lines are not
// plain settings and are reported through hasPartition instead).
func confKeys(extra string) (keys map[string]bool, hasPartition bool) {
	keys = map[string]bool{}
	for _, line := range strings.Split(extra, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k = strings.ToLower(strings.TrimSpace(k))
		switch k {
		case "partitionname":
			hasPartition = true
		case "nodename", "nodeset", "downnodes", "frontendname", "include":
		default:
			keys[k] = true
		}
	}
	return keys, hasPartition
}

func (c *Cluster) renderSlurmConf() string {
	o := c.opts
	extra := strings.ReplaceAll(o.ConfExtra, "{{nodes}}", hostlist(o.NodePrefix, o.Nodes))
	extra = strings.ReplaceAll(extra, "{{partition}}", c.Partition)
	override, extraPartition := confKeys(extra)
	var b strings.Builder
	set := func(k, v string) {
		if override[strings.ToLower(k)] {
			fmt.Fprintf(&b, "# %s=%s  (set in ConfExtra below)\n", k, v)
			return
		}
		fmt.Fprintf(&b, "%s=%s\n", k, v)
	}
	fmt.Fprintf(&b, "# slurmtest cluster %s: %d node(s) x %d GPU(s), all on 127.0.0.1\n", c.Name, o.Nodes, o.GPUsPerNode)
	set("ClusterName", c.Name)
	set("SlurmctldHost", fmt.Sprintf("%s(127.0.0.1)", c.host))
	set("SlurmUser", "root")
	set("SlurmdUser", "root")
	set("SlurmctldPort", fmt.Sprint(c.ctldPort))
	set("SlurmdPort", fmt.Sprint(c.slurmdPorts[0]))
	set("CommunicationParameters", "NoCtldInAddrAny,NoInAddrAny")
	set("AuthType", "auth/munge")
	set("AuthInfo", "socket="+c.mungeSocket)
	set("CredType", "cred/munge")
	set("AuthAltTypes", "auth/jwt")
	set("AuthAltParameters", "jwt_key="+c.JWTKeyFile)
	set("StateSaveLocation", filepath.Join(c.Dir, "state"))
	set("SlurmdSpoolDir", filepath.Join(c.Dir, "spool", "%n"))
	set("SlurmctldPidFile", filepath.Join(c.Dir, "run", "slurmctld.pid"))
	set("SlurmdPidFile", filepath.Join(c.Dir, "run", "slurmd-%n.pid"))
	set("SlurmctldLogFile", filepath.Join(c.Dir, "log", "slurmctld.log"))
	set("SlurmdLogFile", filepath.Join(c.Dir, "log", "slurmd-%n.log"))
	set("SlurmctldDebug", "info")
	set("SlurmdDebug", "info")
	set("MailProg", "/bin/true")
	set("ProctrackType", "proctrack/pgid")
	set("TaskPlugin", "task/none")
	set("JobAcctGatherType", "jobacct_gather/none")
	set("JobCompType", "jobcomp/none")
	set("MpiDefault", "none")
	set("ReturnToService", "2")
	set("SlurmdParameters", "config_overrides")
	set("InactiveLimit", "0")
	set("KillWait", "5")
	set("MinJobAge", "300")
	set("JobRequeue", "1")
	set("SchedulerType", "sched/backfill")
	set("SchedulerParameters", "bf_interval=1,bf_resolution=1,bf_continue,default_queue_depth=1000,sched_interval=1")
	set("SelectType", "select/cons_tres")
	set("SelectTypeParameters", "CR_Core")
	set("GresTypes", "gpu")
	set("PriorityType", "priority/multifactor")
	if o.NoDBD {
		set("AccountingStorageType", "accounting_storage/none")
	} else {
		set("AccountingStorageType", "accounting_storage/slurmdbd")
		set("AccountingStorageHost", "127.0.0.1")
		set("AccountingStoragePort", fmt.Sprint(c.dbdPort))
		// For DBD connections the munge socket comes from AccountingStoragePass.
		set("AccountingStoragePass", c.mungeSocket)
		tres := "gres/gpu"
		if o.GPUType != "" {
			tres += ",gres/gpu:" + o.GPUType
		}
		set("AccountingStorageTRES", tres)
		if o.Enforce != "" {
			set("AccountingStorageEnforce", o.Enforce)
		}
	}
	if o.JobSubmitLua != "" {
		set("JobSubmitPlugins", "lua")
	}
	gres := fmt.Sprintf("gpu:%d", o.GPUsPerNode)
	if o.GPUType != "" {
		gres = fmt.Sprintf("gpu:%s:%d", o.GPUType, o.GPUsPerNode)
	}
	for i, n := range c.Nodes {
		g := ""
		if o.GPUsPerNode > 0 {
			g = " Gres=" + gres
		}
		fmt.Fprintf(&b, "NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d CPUs=%d Boards=1 SocketsPerBoard=1 CoresPerSocket=%d ThreadsPerCore=1 RealMemory=64000%s State=UNKNOWN\n",
			n, c.host, c.slurmdPorts[i], o.CPUsPerNode, o.CPUsPerNode, g)
	}
	if !extraPartition {
		fmt.Fprintf(&b, "PartitionName=%s Nodes=%s Default=YES MaxTime=INFINITE State=UP\n", c.Partition, hostlist(o.NodePrefix, o.Nodes))
	}
	if extra != "" {
		fmt.Fprintf(&b, "#\n# ---- Options.ConfExtra ----\n%s\n", strings.TrimRight(extra, "\n"))
	}
	return b.String()
}

func (c *Cluster) renderGresConf() string {
	o := c.opts
	var b strings.Builder
	b.WriteString("AutoDetect=off\n")
	if o.GPUsPerNode > 0 {
		typ := ""
		if o.GPUType != "" {
			typ = " Type=" + o.GPUType
		}
		// gres/gpu drops GPUs without File=; each file is a symlink to /dev/null
		// (task/none, no cgroups: never opened).
		fmt.Fprintf(&b, "NodeName=%s Name=gpu%s File=%s/nvidia[0-%d]\n", hostlist(o.NodePrefix, o.Nodes), typ,
			filepath.Join(c.Dir, "dev"), o.GPUsPerNode-1)
	}
	return b.String()
}

func (c *Cluster) renderDBDConf() string {
	var b strings.Builder
	for _, kv := range [][2]string{
		{"AuthType", "auth/munge"},
		{"AuthInfo", "socket=" + c.mungeSocket},
		{"AuthAltTypes", "auth/jwt"},
		{"AuthAltParameters", "jwt_key=" + c.JWTKeyFile},
		{"DbdAddr", "127.0.0.1"},
		{"DbdHost", "localhost"},
		{"DbdPort", fmt.Sprint(c.dbdPort)},
		{"SlurmUser", "root"},
		{"DebugLevel", "info"},
		{"LogFile", filepath.Join(c.Dir, "log", "slurmdbd.log")},
		{"PidFile", filepath.Join(c.Dir, "run", "slurmdbd.pid")},
		{"StorageType", "accounting_storage/mysql"},
		{"StorageHost", dbHost},
		{"StoragePort", fmt.Sprint(c.dbServerPort)},
		{"StorageUser", dbUser},
		{"StorageLoc", c.DBName},
	} {
		fmt.Fprintf(&b, "%s=%s\n", kv[0], kv[1])
	}
	return b.String()
}
