//go:build linux && cgo

package agent

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/allotlabs/allot/internal/agentproto"
)

const nvmlLibrary = "libnvidia-ml.so.1"

// nvmlBackend reads real GPUs through NVML (libnvidia-ml.so, loaded at run
// time, so the agent builds and starts without a driver).
type nvmlBackend struct {
	devs   []nvml.Device
	inv    GPUInventory
	events nvml.EventSet // nil when XID events are not supported
	done   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	xids    []int64
	lastXID []int
	xidRing [][]int
	closed  bool
}

// NewNVML opens NVML and reads the inventory. Without a driver it fails
// with a message that says so and suggests --gpu fake.
func NewNVML() (GPUBackend, error) {
	// nvml.Init reports only "library not found"; open it once ourselves to
	// get dlopen's reason.
	probe := dl.New(nvmlLibrary, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := probe.Open(); err != nil {
		return nil, fmt.Errorf("--gpu nvml: no NVIDIA driver found (libnvidia-ml.so could not be loaded: %v); install the NVIDIA driver or run with --gpu fake", err)
	}
	_ = probe.Close()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("--gpu nvml: NVML failed to initialise: %s; check the NVIDIA driver (nvidia-smi) or run with --gpu fake", nvml.ErrorString(ret))
	}
	b := &nvmlBackend{done: make(chan struct{})}
	fail := func(what string, ret nvml.Return) (GPUBackend, error) {
		nvml.Shutdown()
		return nil, fmt.Errorf("--gpu nvml: %s: %s", what, nvml.ErrorString(ret))
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fail("counting GPUs", ret)
	}
	b.inv.Backend = "nvml"
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		b.inv.DriverVersion = v
	}
	for i := range n {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fail(fmt.Sprintf("opening GPU %d", i), ret)
		}
		g := agentproto.GPU{Index: i}
		if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
			return fail(fmt.Sprintf("reading GPU %d UUID", i), ret)
		}
		g.Model, _ = d.GetName()
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryMiB = int64(mem.Total >> 20)
		}
		if minor, ret := d.GetMinorNumber(); ret == nvml.SUCCESS {
			if b.inv.Minors == nil {
				b.inv.Minors = map[int]int{}
			}
			b.inv.Minors[i] = minor
		}
		b.devs = append(b.devs, d)
		b.inv.GPUs = append(b.inv.GPUs, g)
	}
	// NVLink peers (best effort): pairs NVML calls P2P-capable over NVLink,
	// which also covers NVSwitch systems where a link's remote end is the
	// switch rather than a GPU.
	for i, d := range b.devs {
		for j, e := range b.devs {
			if i == j {
				continue
			}
			if st, ret := d.GetP2PStatus(e, nvml.P2P_CAPS_INDEX_NVLINK); ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK {
				b.inv.GPUs[i].NVLinkPeers = append(b.inv.GPUs[i].NVLinkPeers, j)
			}
		}
	}
	b.xids = make([]int64, len(b.devs))
	b.lastXID = make([]int, len(b.devs))
	b.xidRing = make([][]int, len(b.devs))
	b.watchXIDs()
	return b, nil
}

// watchXIDs registers for XID events on every GPU that supports them and
// counts them in the background. Where events are unsupported (e.g. some
// virtualised GPUs) the counts stay 0.
func (b *nvmlBackend) watchXIDs() {
	set, ret := nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		return
	}
	registered := 0
	for _, d := range b.devs {
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret == nvml.SUCCESS {
			registered++
		}
	}
	if registered == 0 {
		set.Free()
		return
	}
	b.events = set
	byUUID := make(map[string]int, len(b.inv.GPUs))
	for _, g := range b.inv.GPUs {
		byUUID[g.UUID] = g.Index
	}
	b.wg.Go(func() {
		for {
			select {
			case <-b.done:
				return
			default:
			}
			data, ret := set.Wait(500)
			if ret != nvml.SUCCESS || data.EventType != nvml.EventTypeXidCriticalError || data.Device == nil {
				continue
			}
			uuid, ret := data.Device.GetUUID()
			i, ok := byUUID[uuid]
			if ret != nvml.SUCCESS || !ok {
				continue
			}
			b.mu.Lock()
			b.xids[i]++
			b.lastXID[i] = int(data.EventData)
			b.xidRing[i] = pushXID(b.xidRing[i], int(data.EventData))
			b.mu.Unlock()
		}
	})
}

func (b *nvmlBackend) Inventory() (GPUInventory, error) { return b.inv, nil }

func (b *nvmlBackend) Metrics(map[int]bool) ([]agentproto.GPUMetrics, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("nvml backend is closed")
	}
	out := make([]agentproto.GPUMetrics, 0, len(b.devs))
	for i, d := range b.devs {
		m := agentproto.GPUMetrics{Index: i, UUID: b.inv.GPUs[i].UUID}
		// A GPU that fell off the bus (XID 79) answers GPU_IS_LOST: it is
		// left out of the readings, so the server sees it missing.
		if _, ret := d.GetUUID(); ret == nvml.ERROR_GPU_IS_LOST {
			continue
		}
		if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			m.UtilPct = float64(u.Gpu)
		}
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			m.MemUsedMiB = int64(mem.Used >> 20)
			m.MemTotalMiB = int64(mem.Total >> 20)
		}
		if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
			m.TempC = float64(t)
		}
		if p, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
			m.PowerW = float64(p) / 1000
		}
		if n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
			m.ECCSingleVol = int64(n)
		}
		if n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
			m.ECCDoubleVol = int64(n)
		}
		if r, ret := d.GetCurrentClocksEventReasons(); ret == nvml.SUCCESS {
			m.ThrottleReasons = r
		} else if r, ret := d.GetCurrentClocksThrottleReasons(); ret == nvml.SUCCESS {
			m.ThrottleReasons = r
		}
		m.XIDErrors = b.xids[i]
		m.LastXID = b.lastXID[i]
		m.XIDs = append([]int(nil), b.xidRing[i]...)
		out = append(out, m)
	}
	return out, nil
}

func (b *nvmlBackend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	close(b.done)
	b.wg.Wait()
	if b.events != nil {
		b.events.Free()
	}
	if ret := nvml.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %s", nvml.ErrorString(ret))
	}
	return nil
}
