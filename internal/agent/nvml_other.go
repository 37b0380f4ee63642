//go:build !(linux && cgo)

package agent

import "errors"

// NewNVML fails: NVML needs cgo on Linux.
func NewNVML() (GPUBackend, error) {
	return nil, errors.New("--gpu nvml: this agent was built without cgo (or not for Linux), so it cannot load libnvidia-ml.so; rebuild with CGO_ENABLED=1 or run with --gpu fake")
}
