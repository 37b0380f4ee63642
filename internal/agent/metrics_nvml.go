//go:build linux && cgo

package agent

import (
	"encoding/binary"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// extraMetrics reads the rest of dcgm-exporter's default fields that NVML
// can read (clocks, memory temperature, energy, PCIe replays, copy and
// codec utilization, reserved memory, row remapping), per GPU index. A
// field a GPU does not support is left out.
func (b *nvmlBackend) extraMetrics() map[int]map[string]float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[int]map[string]float64{}
	if b.closed {
		return out
	}
	for i, d := range b.devs {
		m := map[string]float64{}
		if v, ret := d.GetClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
			m[fieldSMClock] = float64(v)
		}
		if v, ret := d.GetClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
			m[fieldMemClock] = float64(v)
		}
		fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_MEMORY_TEMP}}
		if ret := d.GetFieldValues(fv); ret == nvml.SUCCESS && nvml.Return(fv[0].NvmlReturn) == nvml.SUCCESS {
			if v, ok := fieldValue(fv[0]); ok {
				m[fieldMemTemp] = v
			}
		}
		if v, ret := d.GetTotalEnergyConsumption(); ret == nvml.SUCCESS {
			m[fieldEnergy] = float64(v)
		}
		if v, ret := d.GetPcieReplayCounter(); ret == nvml.SUCCESS {
			m[fieldPCIeReplay] = float64(v)
		}
		if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			m[fieldMemCopyUtil] = float64(u.Memory)
		}
		if v, _, ret := d.GetEncoderUtilization(); ret == nvml.SUCCESS {
			m[fieldEncUtil] = float64(v)
		}
		if v, _, ret := d.GetDecoderUtilization(); ret == nvml.SUCCESS {
			m[fieldDecUtil] = float64(v)
		}
		if mem, ret := d.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
			m[fieldFBReserved] = float64(mem.Reserved >> 20)
		}
		if corr, unc, _, failed, ret := d.GetRemappedRows(); ret == nvml.SUCCESS {
			m[fieldCorrRemapped], m[fieldUncorrRemapped] = float64(corr), float64(unc)
			m[fieldRemapFailure] = 0
			if failed {
				m[fieldRemapFailure] = 1
			}
		}
		out[i] = m
	}
	return out
}

// fieldValue decodes an NVML field value (host byte order: little-endian
// on the platforms NVML ships for).
func fieldValue(f nvml.FieldValue) (float64, bool) {
	b := f.Value[:]
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(binary.LittleEndian.Uint64(b)), true
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return float64(binary.LittleEndian.Uint32(b)), true
	case nvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(binary.LittleEndian.Uint32(b))), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return float64(binary.LittleEndian.Uint64(b)), true
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(binary.LittleEndian.Uint64(b))), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(binary.LittleEndian.Uint16(b)), true
	}
	return 0, false
}
