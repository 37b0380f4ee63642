package allot

import (
	"regexp"
	"time"
)

// Node states.
const (
	NodeUp       = "up"
	NodeDraining = "draining"
	NodeDrained  = "drained"
	NodeDown     = "down"
)

// Sites.
const (
	SiteOnPrem = "onprem"
	SiteCloud  = "cloud"
)

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,62}[a-z0-9])?$`)

// Node is a GPU machine run by an agent.
type Node struct {
	Name          string
	GPUType       string
	GPUCount      int
	Site          string // SiteOnPrem or SiteCloud
	Domain        string // interconnect domain (NVLink/IB); "" = none
	Rack          string
	State         string
	StateReason   string
	LastHeartbeat time.Time // zero if never
	Hostname      string    // as the agent reported it ("" until registered)
	Backend       string    // BackendNative, or the engine that runs it (BackendSlurm)
}

// MaxGPUsPerNode bounds a node's GPU count.
const MaxGPUsPerNode = 64

// Validate checks the node's fields.
func (n *Node) Validate() error {
	f := FieldErrors{}
	if !nodeNameRE.MatchString(n.Name) {
		f.Add("name", "must be a lower-case host name")
	}
	if n.GPUType == "" {
		f.Add("gpu_type", "is required")
	}
	if n.GPUCount < 1 || n.GPUCount > MaxGPUsPerNode {
		f.Add("gpu_count", "must be between 1 and %d", MaxGPUsPerNode)
	}
	if n.Site != SiteOnPrem && n.Site != SiteCloud {
		f.Add("site", "must be onprem or cloud")
	}
	switch n.State {
	case NodeUp, NodeDraining, NodeDrained, NodeDown:
	default:
		f.Add("state", "must be up, draining, drained or down")
	}
	return f.Err()
}

// Allocation is the GPUs one job holds on one node for one run segment.
type Allocation struct {
	ID         int64
	JobID      int64
	Node       string
	GPUIndices []int
	StartedAt  time.Time
	ReleasedAt time.Time // zero while active
}

// Active reports whether the allocation still holds its GPUs.
func (a *Allocation) Active() bool { return a.ReleasedAt.IsZero() }

// Why a node is draining or drained.
const (
	DrainByAdmin  = "admin"  // an admin drained it
	DrainByHealth = "health" // a health rule drained it
)

// NodeLabels are an admin's key=value labels on a node.
type NodeLabels map[string]string

var labelKeyRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,62}[a-z0-9])?$`)

// Validate checks the labels: at most 32, keys lower-case (letters, digits,
// ". _ / -"), values up to 128 printable characters.
func (l NodeLabels) Validate() error {
	f := FieldErrors{}
	if len(l) > 32 {
		f.Add("labels", "at most 32 labels")
	}
	for k, v := range l {
		if !labelKeyRE.MatchString(k) {
			f.Add("labels."+k, "label keys are lower-case letters, digits and . _ / - (at most 64)")
			continue
		}
		if len(v) > 128 {
			f.Add("labels."+k, "must be at most 128 characters")
		}
		for _, r := range v {
			if r < 0x20 || r == 0x7f {
				f.Add("labels."+k, "must not contain control characters")
				break
			}
		}
	}
	return f.Err()
}
