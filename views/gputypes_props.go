package views

// GPUTypeRow is one GPU type on /admin/gpu-types with its edit form.
type GPUTypeRow struct {
	Name, Memory, Rate, Status string
	Backend                    string // native or slurm
	CapacityCost               string // per GPU-hour of owned capacity; "" not set
	Retired                    bool
	Nodes                      int
	Values                     GPUTypeFormValues
	Errors                     map[string]string
	Saved                      string
}

// GPUTypeFormValues are a GPU type form's fields as typed.
type GPUTypeFormValues struct {
	Name, MemoryGB, Rate, Note string
	CapacityCost               string
	Backend                    string // creation only
}

// AdminGPUTypes is /admin/gpu-types.
type AdminGPUTypes struct {
	Page
	Currency string
	Types    []GPUTypeRow
	New      GPUTypeRow // the create form
}
