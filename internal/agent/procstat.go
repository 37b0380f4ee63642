package agent

import (
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, 100 on every Linux platform Go supports.
const clockTicks = 100

// eachProc calls fn with the pid and the /proc/<pid>/stat fields after the
// command name (f[0] is field 3, the state; pgrp is f[2]) of every process.
func eachProc(fn func(pid int, f []string)) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, ok := procStat(pid); ok {
			fn(pid, f)
		}
	}
}

// procStat returns the /proc/<pid>/stat fields after the command name
// (f[0] is field 3), false when the process is gone. The command name may
// hold spaces and parentheses: fields start after the last ')'.
func procStat(pid int) ([]string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(s[i+1:]), true
}

// groupStats sums CPU seconds (including reaped children) and resident
// memory over the processes of process group pgid, from /proc. It returns
// zeros where /proc is unavailable.
func groupStats(pgid int) (cpuSeconds float64, rssBytes int64) {
	var st procTotals
	eachProc(func(pid int, f []string) {
		if len(f) > 2 {
			if g, _ := strconv.Atoi(f[2]); g == pgid || pid == pgid {
				st.add(f)
			}
		}
	})
	return st.result()
}

// pidStats is groupStats over a set of processes (a job's cgroup).
func pidStats(pids []int) (cpuSeconds float64, rssBytes int64) {
	var st procTotals
	for _, pid := range pids {
		if f, ok := procStat(pid); ok {
			st.add(f)
		}
	}
	return st.result()
}

// procTotals sums /proc/<pid>/stat fields (after the command name).
type procTotals struct{ ticks, rssPages int64 }

func (t *procTotals) add(f []string) {
	// utime..cstime are fields 14..17, rss field 24.
	if len(f) < 22 {
		return
	}
	for _, k := range []int{11, 12, 13, 14} {
		v, _ := strconv.ParseInt(f[k], 10, 64)
		t.ticks += v
	}
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	t.rssPages += rss
}

func (t *procTotals) result() (float64, int64) {
	return float64(t.ticks) / clockTicks, t.rssPages * int64(os.Getpagesize())
}

// liveGroupMembers counts the processes of group pgid that are not zombies.
func liveGroupMembers(pgid int) int {
	n := 0
	eachProc(func(_ int, f []string) {
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			return
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			n++
		}
	})
	return n
}
