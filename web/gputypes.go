package web

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// GPU types, for admins: the portal page /admin/gpu-types and the JSON API
// under /api/v1/gpu-types. Each change is a policy change (a new version
// and an audit entry, by the store); money is exact decimal text.

// GPUTypeJSON is a GPU type as the API shows it.
type GPUTypeJSON struct {
	Name       string     `json:"name"`
	MemoryGB   int        `json:"memory_gb"`
	HourlyRate string     `json:"hourly_rate"` // per GPU-hour at multiplier 1, in force now, decimal
	Currency   string     `json:"currency"`
	Retired    bool       `json:"retired"`
	RetiredAt  *time.Time `json:"retired_at"`
	Nodes      int        `json:"nodes"`
	// Backend is the engine that runs the pool's jobs: native or slurm.
	Backend string `json:"backend"`
	// CapacityCost is one GPU-hour of owned capacity's cost (capacity
	// report, unrecovered cost), decimal in the rate card's currency; "":
	// not set.
	CapacityCost string `json:"capacity_cost"`
}

// GPUTypeList is GET /api/v1/gpu-types.
type GPUTypeList struct {
	GPUTypes []GPUTypeJSON `json:"gpu_types"`
}

// GPUTypeRequest is the body of POST /api/v1/gpu-types (all but currency
// and note required) and PUT /api/v1/gpu-types/{name} (absent fields keep
// their value; name is not changed; hourly_rate sets a new rate from now
// on, audited as rate.set).
type GPUTypeRequest struct {
	Name       string  `json:"name,omitempty"`
	MemoryGB   *int    `json:"memory_gb"`
	HourlyRate *string `json:"hourly_rate"`
	Currency   string  `json:"currency,omitempty"`
	Retired    *bool   `json:"retired,omitempty"`
	Note       string  `json:"note,omitempty"`
	// Backend (POST only): native (default) or slurm, the engine that
	// runs the pool's jobs.
	Backend string `json:"backend,omitempty"`
	// CapacityCost (PUT only) sets the cost of one GPU-hour of owned
	// capacity, decimal; "" clears it.
	CapacityCost *string `json:"capacity_cost,omitempty"`
}

func gpuTypeJSON(g store.GPUTypeInfo) GPUTypeJSON {
	out := GPUTypeJSON{Name: g.Name, MemoryGB: g.MemoryGB, HourlyRate: g.HourlyRate.Decimal(), Currency: g.HourlyRate.Currency,
		Retired: g.Retired(), RetiredAt: optTime(g.RetiredAt), Nodes: g.Nodes, Backend: g.Backend}
	if g.CapacityCost != nil {
		out.CapacityCost = g.CapacityCost.Decimal()
	}
	return out
}

func (s *Server) apiListGPUTypes(c echo.Context) error {
	list, err := s.st.GPUTypeInfos(c.Request().Context())
	if err != nil {
		return err
	}
	out := GPUTypeList{GPUTypes: []GPUTypeJSON{}}
	for _, g := range list {
		out.GPUTypes = append(out.GPUTypes, gpuTypeJSON(g))
	}
	return writeJSON(c, http.StatusOK, out)
}

// createGPUType checks a create request and makes the type.
func (s *Server) createGPUType(c echo.Context, u *allot.User, req GPUTypeRequest) (store.AdminResult, error) {
	f := allot.FieldErrors{}
	g := allot.GPUType{Name: strings.TrimSpace(req.Name), Backend: strings.TrimSpace(req.Backend)}
	if g.Name == "" {
		f.Add("name", "is required")
	}
	if req.MemoryGB == nil {
		f.Add("memory_gb", "is required")
	} else {
		g.MemoryGB = *req.MemoryGB
	}
	cur := strings.TrimSpace(req.Currency)
	if cur == "" {
		var err error
		if cur, err = s.cardCurrency(c); err != nil {
			return store.AdminResult{}, err
		}
	}
	if req.HourlyRate == nil || strings.TrimSpace(*req.HourlyRate) == "" {
		f.Add("hourly_rate", "is required (a decimal amount per GPU-hour, e.g. 4.10)")
	} else if m, err := allot.ParseMoney(*req.HourlyRate, cur); err != nil {
		f.Add("hourly_rate", "%v", err)
	} else {
		g.HourlyRate = m
	}
	if req.Retired != nil && *req.Retired {
		f.Add("retired", "a new GPU type cannot be retired")
	}
	if req.CapacityCost != nil && strings.TrimSpace(*req.CapacityCost) != "" {
		f.Add("capacity_cost", "set it once the type exists (allot gpu-type set %s --capacity-cost X)", g.Name)
	}
	if err := f.Err(); err != nil {
		return store.AdminResult{}, err
	}
	return s.st.CreateGPUTypeAudited(c.Request().Context(), policyChange(u, "gpu_type.create", "gpu_type:"+g.Name, req.Note), g)
}

// updateGPUType applies an edit (memory, rate from now on, retirement) as
// one change.
func (s *Server) updateGPUType(c echo.Context, u *allot.User, name string, req GPUTypeRequest) (store.AdminResult, error) {
	ctx := c.Request().Context()
	if _, err := s.st.GPUTypeInfo(ctx, name); err != nil {
		return store.AdminResult{}, err
	}
	if req.Name != "" && req.Name != name {
		return store.AdminResult{}, (allot.FieldErrors{"name": "a GPU type cannot be renamed; create a new one and retire this one"}).Err()
	}
	var rate *allot.Money
	if req.HourlyRate != nil {
		cur := strings.TrimSpace(req.Currency)
		if cur == "" {
			var err error
			if cur, err = s.cardCurrency(c); err != nil {
				return store.AdminResult{}, err
			}
		}
		m, err := allot.ParseMoney(*req.HourlyRate, cur)
		if err != nil {
			return store.AdminResult{}, (allot.FieldErrors{"hourly_rate": err.Error()}).Err()
		}
		rate = &m
	}
	up := store.GPUTypeUpdate{MemoryGB: req.MemoryGB, Retired: req.Retired, Rate: rate}
	if req.CapacityCost != nil {
		up.SetCapacityCost = true
		if v := strings.TrimSpace(*req.CapacityCost); v != "" {
			cur, err := s.cardCurrency(c)
			if err != nil {
				return store.AdminResult{}, err
			}
			m, err := allot.ParseMoney(v, cur)
			if err != nil {
				return store.AdminResult{}, (allot.FieldErrors{"capacity_cost": err.Error()}).Err()
			}
			up.CapacityCost = &m
		}
	}
	return s.st.UpdateGPUType(ctx, policyChange(u, "", "gpu_type:"+name, req.Note), name, up)
}

func (s *Server) apiCreateGPUType(c echo.Context) error {
	u, req, err := userAndBody[GPUTypeRequest](c)
	if err != nil {
		return err
	}
	r, err := s.createGPUType(c, u, req)
	if err != nil {
		return err
	}
	g, err := s.st.GPUTypeInfo(c.Request().Context(), strings.TrimSpace(req.Name))
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", "/api/v1/gpu-types/"+url.PathEscape(g.Name))
	return writeJSON(c, http.StatusCreated, changeJSON(r, gpuTypeJSON(g)))
}

func (s *Server) apiUpdateGPUType(c echo.Context) error {
	u, req, err := userAndBody[GPUTypeRequest](c)
	if err != nil {
		return err
	}
	r, err := s.updateGPUType(c, u, c.Param("name"), req)
	if err != nil {
		return err
	}
	g, err := s.st.GPUTypeInfo(c.Request().Context(), c.Param("name"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, gpuTypeJSON(g)))
}

// ---- Portal

func (s *Server) adminGPUTypesPage(c echo.Context) error {
	a, err := s.gpuTypesView(c, nil, nil)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.AdminGPUTypesView(a))
}

// gpuTypesView builds the page; edited (a type's form as typed, with its
// errors) or created (the create form) replace the blank forms.
func (s *Server) gpuTypesView(c echo.Context, edited, created *views.GPUTypeRow) (views.AdminGPUTypes, error) {
	ctx := c.Request().Context()
	list, err := s.st.GPUTypeInfos(ctx)
	if err != nil {
		return views.AdminGPUTypes{}, err
	}
	cur, err := s.cardCurrency(c)
	if err != nil {
		return views.AdminGPUTypes{}, err
	}
	a := views.AdminGPUTypes{Page: s.page(c, "GPU types · Admin"), Currency: cur, New: views.GPUTypeRow{Errors: map[string]string{}}}
	for _, g := range list {
		row := views.GPUTypeRow{Name: g.Name, Memory: fmt.Sprintf("%d GB", g.MemoryGB), Rate: g.HourlyRate.String(), Status: "in use",
			Retired: g.Retired(), Nodes: g.Nodes, Backend: g.Backend, Values: views.GPUTypeFormValues{MemoryGB: strconv.Itoa(g.MemoryGB)}, Errors: map[string]string{}}
		if g.CapacityCost != nil {
			row.CapacityCost, row.Values.CapacityCost = g.CapacityCost.String(), g.CapacityCost.Decimal()
		}
		if g.Retired() {
			row.Status = "retired " + fmtTime(g.RetiredAt)
		}
		if c.QueryParam("saved") == g.Name {
			row.Saved = savedMessage(c, "GPU type "+g.Name)
		}
		if edited != nil && edited.Name == g.Name {
			row.Values, row.Errors = edited.Values, edited.Errors
		}
		a.Types = append(a.Types, row)
	}
	if created != nil {
		a.New = *created
	}
	return a, nil
}

func (s *Server) adminCreateGPUTypeForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	v := views.GPUTypeFormValues{Name: c.FormValue("name"), MemoryGB: c.FormValue("memory_gb"), Rate: c.FormValue("hourly_rate"), Note: c.FormValue("note"),
		Backend: c.FormValue("backend")}
	req := GPUTypeRequest{Name: v.Name, HourlyRate: &v.Rate, Note: v.Note, Backend: v.Backend}
	var r store.AdminResult
	if mem, perr := strconv.Atoi(strings.TrimSpace(v.MemoryGB)); perr == nil {
		req.MemoryGB = &mem
		r, err = s.createGPUType(c, u, req)
	} else {
		err = (allot.FieldErrors{"memory_gb": "must be a whole number of GB, e.g. 80"}).Err()
	}
	name := strings.TrimSpace(v.Name)
	return formDone(c, err, savedURL("/admin/gpu-types", name, r, "gpu-type-"+name), func(errs map[string]string) (templ.Component, error) {
		a, err := s.gpuTypesView(c, nil, &views.GPUTypeRow{Values: v, Errors: errs})
		return views.AdminGPUTypesView(a), err
	})
}

func (s *Server) adminGPUTypeForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	name := c.Param("name")
	v := views.GPUTypeFormValues{MemoryGB: c.FormValue("memory_gb"), Note: c.FormValue("note"), CapacityCost: c.FormValue("capacity_cost")}
	req := GPUTypeRequest{Note: v.Note}
	switch c.FormValue("action") {
	case "retire", "reinstate":
		retired := c.FormValue("action") == "retire"
		req.Retired = &retired
	}
	var r store.AdminResult
	if req.Retired == nil {
		if mem, perr := strconv.Atoi(strings.TrimSpace(v.MemoryGB)); perr == nil {
			req.MemoryGB = &mem
		} else {
			err = (allot.FieldErrors{"memory_gb": "must be a whole number of GB, e.g. 80"}).Err()
		}
		req.CapacityCost = &v.CapacityCost
	}
	if err == nil {
		r, err = s.updateGPUType(c, u, name, req)
	}
	return formDone(c, err, savedURL("/admin/gpu-types", name, r, "gpu-type-"+name), func(errs map[string]string) (templ.Component, error) {
		a, err := s.gpuTypesView(c, &views.GPUTypeRow{Name: name, Values: v, Errors: errs}, nil)
		return views.AdminGPUTypesView(a), err
	})
}
