package agent

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/clock"
)

// GPUBackend reads a node's GPUs: NVML on a real node, Fake elsewhere.
type GPUBackend interface {
	// Inventory lists the GPUs; it does not change while the agent runs.
	Inventory() (GPUInventory, error)
	// Metrics reads every GPU now. busy holds the indices of GPUs allocated
	// to a running job (the fake backend shows load on them; NVML ignores it).
	Metrics(busy map[int]bool) ([]agentproto.GPUMetrics, error)
	Close() error
}

// GPUInventory is what a backend reports once.
type GPUInventory struct {
	Backend       string // "nvml" or "fake"
	DriverVersion string
	GPUs          []agentproto.GPU
	// Minors maps a GPU index to its /dev/nvidiaN minor number (the device
	// fence); a GPU absent from it has minor = index.
	Minors map[int]int
	// DevDir holds the GPUs' device files: /dev, or the fake backend's
	// directory of fake device nodes ("" = /dev).
	DevDir string
}

// FakeOptions configure a Fake backend. Zero values take the defaults.
type FakeOptions struct {
	GPUs      int    // default 8
	Model     string // default "A100-80GB"
	MemoryMiB int64  // default 81920
	Hostname  string // seeds the UUIDs and metric phases
	// Now is the clock the metric curves follow; default time.Now.
	Now func() time.Time
	// FaultFile, when set, is re-read at every reading: it injects faults
	// into a running agent (see Faults). A missing file means no faults.
	FaultFile string
}

// Faults is the JSON of a fake backend's fault file, e.g.
//
//	{"gpus": [{"index": 3, "ecc_dbe": 1}, {"index": 5, "xids": [79]}, {"index": 6, "throttle": 64}, {"index": 7, "missing": true}]}
//
// ECC totals, throttle reasons and missing are set as written (removing a
// GPU's entry clears them); xids is the list of XID events ever injected:
// entries beyond those already seen are new events.
type Faults struct {
	GPUs []GPUFault `json:"gpus"`
}

// GPUFault is one GPU's injected faults.
type GPUFault struct {
	Index    int    `json:"index"`
	ECCSBE   int64  `json:"ecc_sbe,omitempty"`
	ECCDBE   int64  `json:"ecc_dbe,omitempty"`
	XIDs     []int  `json:"xids,omitempty"`
	Throttle uint64 `json:"throttle,omitempty"`
	Missing  bool   `json:"missing,omitempty"` // fallen off the bus: absent from readings
}

// xidRingSize bounds the XID codes a backend remembers per GPU.
const xidRingSize = 64

func pushXID(ring []int, code int) []int {
	ring = append(ring, code)
	if len(ring) > xidRingSize {
		ring = ring[len(ring)-xidRingSize:]
	}
	return ring
}

// Fake is a GPU backend without GPUs: N identical devices whose metrics
// follow deterministic curves (a slow sine per GPU, phase from its UUID):
// idle GPUs sit at 0–3 % utilisation, ~35 °C, ~60 W; busy ones at 85–99 %,
// most memory used, 65–75 °C, 300–400 W. Faults can be injected for health
// tests. It is safe for concurrent use.
type Fake struct {
	opts FakeOptions
	gpus []agentproto.GPU

	mu       sync.Mutex
	sbe      []int64
	dbe      []int64
	xids     []int64
	lastXID  []int
	xidRing  [][]int
	throttle []uint64
	missing  []bool
	// fileXIDs counts the XIDs of each GPU taken from the fault file.
	fileXIDs  []int
	faultErr  error
	faultSeen bool
}

// NewFake returns a fake backend.
func NewFake(opts FakeOptions) *Fake {
	if opts.GPUs <= 0 {
		opts.GPUs = 8
	}
	if opts.Model == "" {
		opts.Model = "A100-80GB"
	}
	if opts.MemoryMiB <= 0 {
		opts.MemoryMiB = 81920
	}
	if opts.Now == nil {
		opts.Now = clock.Now
	}
	f := &Fake{
		opts:     opts,
		sbe:      make([]int64, opts.GPUs),
		dbe:      make([]int64, opts.GPUs),
		xids:     make([]int64, opts.GPUs),
		lastXID:  make([]int, opts.GPUs),
		xidRing:  make([][]int, opts.GPUs),
		throttle: make([]uint64, opts.GPUs),
		missing:  make([]bool, opts.GPUs),
		fileXIDs: make([]int, opts.GPUs),
	}
	for i := range opts.GPUs {
		peers := make([]int, 0, opts.GPUs-1)
		for j := range opts.GPUs {
			if j != i {
				peers = append(peers, j)
			}
		}
		f.gpus = append(f.gpus, agentproto.GPU{
			Index:       i,
			UUID:        fakeUUID(opts.Hostname, i),
			Model:       opts.Model,
			MemoryMiB:   opts.MemoryMiB,
			NVLinkPeers: peers,
		})
	}
	return f
}

// fakeUUID derives a stable, NVML-shaped UUID from the host and index.
func fakeUUID(host string, index int) string {
	h := sha256.Sum256(fmt.Appendf(nil, "allot-fake-gpu/%s/%d", host, index))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// Inventory implements GPUBackend.
func (f *Fake) Inventory() (GPUInventory, error) {
	gpus := make([]agentproto.GPU, len(f.gpus))
	for i, g := range f.gpus {
		g.NVLinkPeers = append([]int(nil), g.NVLinkPeers...)
		gpus[i] = g
	}
	return GPUInventory{Backend: "fake", DriverVersion: "fake", GPUs: gpus}, nil
}

// Metrics implements GPUBackend.
func (f *Fake) Metrics(busy map[int]bool) ([]agentproto.GPUMetrics, error) {
	t := float64(f.opts.Now().UnixNano()) / 1e9
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readFaultsLocked()
	out := make([]agentproto.GPUMetrics, 0, len(f.gpus))
	for i, g := range f.gpus {
		if f.missing[i] {
			continue
		}
		h := sha256.Sum256([]byte(g.UUID))
		phase := float64(h[0]) / 256 * 2 * math.Pi
		s := math.Sin(2*math.Pi*t/60 + phase)     // one cycle a minute
		s2 := math.Sin(2*math.Pi*t/300 + 2*phase) // slower drift
		total := g.MemoryMiB
		m := agentproto.GPUMetrics{Index: g.Index, UUID: g.UUID, MemTotalMiB: total}
		if busy[i] {
			m.UtilPct = round1(92 + 7*s)
			m.MemUsedMiB = int64(float64(total) * (0.88 + 0.06*s2))
			m.TempC = round1(70 + 5*s2)
			m.PowerW = round1(350 + 50*s)
		} else {
			m.UtilPct = round1(1.5 + 1.5*s)
			m.MemUsedMiB = int64(float64(total) * (0.004 + 0.001*s2))
			m.TempC = round1(35 + 2*s2)
			m.PowerW = round1(60 + 4*s)
		}
		m.ECCSingleVol = f.sbe[i]
		m.ECCDoubleVol = f.dbe[i]
		m.XIDErrors = f.xids[i]
		m.LastXID = f.lastXID[i]
		m.XIDs = append([]int(nil), f.xidRing[i]...)
		m.ThrottleReasons = f.throttle[i]
		out = append(out, m)
	}
	return out, nil
}

// readFaultsLocked applies the fault file, if any. A file that cannot be
// parsed keeps the previous faults (FaultError says why).
func (f *Fake) readFaultsLocked() {
	if f.opts.FaultFile == "" {
		return
	}
	b, err := os.ReadFile(f.opts.FaultFile)
	var fl Faults
	switch {
	case errors.Is(err, os.ErrNotExist):
		if !f.faultSeen {
			return // never had faults from the file: leave Set* alone
		}
	case err != nil:
		f.faultErr = err
		return
	default:
		if err := json.Unmarshal(b, &fl); err != nil {
			f.faultErr = fmt.Errorf("fault file %s: %w", f.opts.FaultFile, err)
			return
		}
	}
	f.faultErr = nil
	f.faultSeen = true
	for i := range f.gpus {
		f.sbe[i], f.dbe[i], f.throttle[i], f.missing[i] = 0, 0, 0, false
	}
	for _, g := range fl.GPUs {
		if g.Index < 0 || g.Index >= len(f.gpus) {
			f.faultErr = fmt.Errorf("fault file %s: GPU %d does not exist (have %d)", f.opts.FaultFile, g.Index, len(f.gpus))
			continue
		}
		i := g.Index
		f.sbe[i], f.dbe[i], f.throttle[i], f.missing[i] = g.ECCSBE, g.ECCDBE, g.Throttle, g.Missing
		for _, code := range g.XIDs[min(f.fileXIDs[i], len(g.XIDs)):] {
			f.xids[i]++
			f.lastXID[i] = code
			f.xidRing[i] = pushXID(f.xidRing[i], code)
		}
		f.fileXIDs[i] = max(f.fileXIDs[i], len(g.XIDs))
	}
}

// FaultError reports why the fault file was last refused (nil when fine).
func (f *Fake) FaultError() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.faultErr
}

// SetMissing makes GPU index vanish from (or return to) the readings, as
// a GPU that fell off the bus.
func (f *Fake) SetMissing(index int, missing bool) {
	f.check(index)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.missing[index] = missing
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// Close implements GPUBackend.
func (f *Fake) Close() error { return nil }

func (f *Fake) check(index int) {
	if index < 0 || index >= len(f.gpus) {
		panic(fmt.Sprintf("agent: fake GPU %d does not exist (have %d)", index, len(f.gpus)))
	}
}

// SetECCSingleBit sets GPU index's volatile single-bit ECC error total.
func (f *Fake) SetECCSingleBit(index int, n int64) {
	f.check(index)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sbe[index] = n
}

// SetECCDoubleBit sets GPU index's volatile double-bit ECC error total.
func (f *Fake) SetECCDoubleBit(index int, n int64) {
	f.check(index)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dbe[index] = n
}

// InjectXID records an XID event with the given code on GPU index.
func (f *Fake) InjectXID(index, code int) {
	f.check(index)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.xids[index]++
	f.lastXID[index] = code
	f.xidRing[index] = pushXID(f.xidRing[index], code)
}

// SetThrottle sets GPU index's clocks-event (throttle) reason bitmask, as
// NVML reports it (e.g. 0x40 hardware thermal slowdown).
func (f *Fake) SetThrottle(index int, mask uint64) {
	f.check(index)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.throttle[index] = mask
}
