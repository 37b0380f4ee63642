package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/web"
)

// `allot nodes` (like sinfo): nodes by GPU type and state, with their
// GPUs allocated, idle and out of service; -N one line per node. For every
// signed-in person (`allot node list` is the admin's command).

type nodesCmd struct {
	long           bool
	gpuType, state string
	listOutput
}

func nodesFlags(stderr io.Writer) (*flag.FlagSet, func() *client.Client, *nodesCmd) {
	fs := flag.NewFlagSet("nodes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	c := &nodesCmd{}
	fs.BoolVar(&c.long, "N", false, "one line per node (sinfo -N)")
	fs.StringVar(&c.gpuType, "gpu-type", "", "only these GPU `types`, comma-separated (Slurm's partitions)")
	fs.StringVar(&c.state, "state", "", "only nodes in these `states`, comma-separated: idle, mix, alloc, drng, drain, down (or Allot's up, draining, drained)")
	c.flags(fs)
	aliasFlags(fs, map[string]string{"Node": "N", "partition": "gpu-type", "p": "gpu-type", "states": "state", "t": "state"})
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot nodes [-N] [--gpu-type T] [--state idle,mix] [--parsable] [--noheader] [--json]")
		fmt.Fprintln(stderr, "Nodes by GPU type and state, like sinfo. STATE: idle (no GPU allocated), mix (some), alloc (all), drng (draining),")
		fmt.Fprintln(stderr, "drain (drained), down. GPUS = ALLOC + IDLE + OTHER; OTHER: free GPUs of nodes that take no jobs (draining, drained, down).")
		fs.PrintDefaults()
	}
	return fs, newClient, c
}

// nodeState is a node's state as sinfo names it.
func nodeState(n web.NodeUsageRowJSON) string {
	switch n.State {
	case "up":
		switch {
		case n.Allocated == 0:
			return "idle"
		case n.Allocated >= n.GPUs:
			return "alloc"
		}
		return "mix"
	case "draining":
		return "drng"
	case "drained":
		return "drain"
	}
	return n.State
}

var nodeStateNames = map[string]string{"idle": "idle", "mix": "mix", "mixed": "mix", "alloc": "alloc", "allocated": "alloc",
	"drng": "drng", "draining": "drng", "drain": "drain", "drained": "drain", "down": "down"}

func cmdNodes(args []string, stdout, stderr io.Writer) int {
	fs, newClient, c := nodesFlags(stderr)
	if !parseFlagsOnly(fs, args, "nodes", stderr) {
		return 2
	}
	states := map[string]bool{}
	up := false
	for _, s := range strings.Split(c.state, ",") {
		s = strings.ToLower(strings.TrimSpace(s))
		switch {
		case s == "":
		case s == "up":
			up = true
		case nodeStateNames[s] != "":
			states[nodeStateNames[s]] = true
		default:
			fmt.Fprintf(stderr, "allot nodes: --state: unknown node state %q: use idle, mix, alloc, drng, drain, down or up, draining, drained\n", s)
			return 2
		}
	}
	if up {
		states["idle"], states["mix"], states["alloc"] = true, true, true
	}
	types := map[string]bool{}
	for _, t := range strings.Split(c.gpuType, ",") {
		if t = strings.TrimSpace(t); t != "" {
			types[t] = true
		}
	}
	u, err := newClient().NodeUsage(context.Background())
	if err != nil {
		return reportErr(stderr, "nodes", err)
	}
	var nodes []web.NodeUsageRowJSON
	for _, n := range u.Nodes {
		if (len(types) == 0 || types[n.GPUType]) && (len(states) == 0 || states[nodeState(n)]) {
			nodes = append(nodes, n)
		}
	}
	if c.json {
		if nodes == nil {
			nodes = []web.NodeUsageRowJSON{}
		}
		return printJSON(stdout, web.NodeUsageJSON{AsOf: u.AsOf, Nodes: nodes})
	}
	itoa := strconv.Itoa
	if c.long {
		t := simpleTable{header: []string{"NODELIST", "NODES", "GPUTYPE", "STATE", "GPUS", "ALLOC", "IDLE", "OTHER", "JOBS", "SITE", "REASON"}}
		for _, n := range nodes {
			t.add(n.Name, "1", n.GPUType, nodeState(n), itoa(n.GPUs), itoa(n.Allocated), itoa(n.Idle), itoa(n.Other), itoa(n.RunningJobs), n.Site, n.Reason)
		}
		c.table(stdout, &t)
		return 0
	}
	type key struct{ typ, state string }
	type group struct {
		names                        []string
		gpus, alloc, idle, otherGPUs int
	}
	groups := map[key]*group{}
	var keys []key
	for _, n := range nodes {
		k := key{n.GPUType, nodeState(n)}
		g := groups[k]
		if g == nil {
			g = &group{}
			groups[k] = g
			keys = append(keys, k)
		}
		g.names = append(g.names, n.Name)
		g.gpus, g.alloc, g.idle, g.otherGPUs = g.gpus+n.GPUs, g.alloc+n.Allocated, g.idle+n.Idle, g.otherGPUs+n.Other
	}
	order := map[string]int{"idle": 0, "mix": 1, "alloc": 2, "drng": 3, "drain": 4, "down": 5}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].typ != keys[j].typ {
			return keys[i].typ < keys[j].typ
		}
		return order[keys[i].state] < order[keys[j].state]
	})
	t := simpleTable{header: []string{"GPUTYPE", "STATE", "NODES", "GPUS", "ALLOC", "IDLE", "OTHER", "NODELIST"}}
	for _, k := range keys {
		g := groups[k]
		t.add(k.typ, k.state, itoa(len(g.names)), itoa(g.gpus), itoa(g.alloc), itoa(g.idle), itoa(g.otherGPUs), hostList(g.names))
	}
	c.table(stdout, &t)
	return 0
}

// hostList compresses node names as Slurm does: gpu01,gpu02,gpu03,gpu07
// → gpu[01-03,07]. Names without a numeric suffix are listed as they are.
func hostList(names []string) string {
	type num struct {
		n     int
		digit string
	}
	byPrefix := map[string][]num{}
	var prefixes, plain []string
	for _, name := range names {
		i := len(name)
		for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
			i--
		}
		if i == len(name) || len(name)-i > 9 {
			plain = append(plain, name)
			continue
		}
		p := name[:i]
		n, _ := strconv.Atoi(name[i:])
		if _, ok := byPrefix[p]; !ok {
			prefixes = append(prefixes, p)
		}
		byPrefix[p] = append(byPrefix[p], num{n, name[i:]})
	}
	sort.Strings(prefixes)
	out := append([]string{}, plain...)
	for _, p := range prefixes {
		nums := byPrefix[p]
		sort.Slice(nums, func(i, j int) bool { return nums[i].n < nums[j].n })
		if len(nums) == 1 {
			out = append(out, p+nums[0].digit)
			continue
		}
		var ranges []string
		for i := 0; i < len(nums); {
			j := i
			// A run: consecutive numbers written with the same width.
			for j+1 < len(nums) && nums[j+1].n == nums[j].n+1 && sameWidth(nums[j].digit, nums[j+1].digit) {
				j++
			}
			if j > i {
				ranges = append(ranges, nums[i].digit+"-"+nums[j].digit)
			} else {
				ranges = append(ranges, nums[i].digit)
			}
			i = j + 1
		}
		out = append(out, p+"["+strings.Join(ranges, ",")+"]")
	}
	return strings.Join(out, ",")
}

// sameWidth: two numbers can share a range when both are written
// without leading zeros, or with the same width (gpu09, gpu10).
func sameWidth(a, b string) bool {
	return len(a) == len(b) || a[0] != '0' && b[0] != '0'
}
