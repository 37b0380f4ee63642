package web

import (
	"encoding/csv"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/store"
	"github.com/labstack/echo/v4"
)

// Capacity: GET /api/v1/capacity?month=YYYY-MM (JSON) and
// /api/v1/capacity.csv (CSV), for finance and admins. Team leads are
// refused: the figures are the whole cluster's cost, not their teams'
// bill (which /finance and the chargeback show them).

// CapacityRowJSON is one GPU type at one site (or the total); hours are
// exact decimals of the GPU-seconds, which come along as integers.
type CapacityRowJSON struct {
	GPUType                string `json:"gpu_type,omitempty"`
	Site                   string `json:"site,omitempty"`
	RegisteredGPUHours     string `json:"registered_gpu_hours"`
	AllocatedGPUHours      string `json:"allocated_gpu_hours"`
	IdleGPUHours           string `json:"idle_gpu_hours"`
	DrainedDownGPUHours    string `json:"drained_down_gpu_hours"`
	RegisteredGPUSeconds   int64  `json:"registered_gpu_seconds"`
	AllocatedGPUSeconds    int64  `json:"allocated_gpu_seconds"`
	IdleGPUSeconds         int64  `json:"idle_gpu_seconds"`
	DrainedDownGPUSeconds  int64  `json:"drained_down_gpu_seconds"`
	CostPerGPUHour         string `json:"cost_per_gpu_hour,omitempty"` // owned capacity; absent: not set
	CapacityCost           string `json:"capacity_cost"`
	UnrecoveredCost        string `json:"unrecovered_cost"`
	UnrecoveredGPUHours    string `json:"unrecovered_gpu_hours"`
	UtilizationBasisPoints int64  `json:"allocated_bp"` // allocated / registered, in 1/10000
}

// CapacityJSON is the body of GET /api/v1/capacity.
type CapacityJSON struct {
	Month    string            `json:"month"`
	From     time.Time         `json:"from"`
	To       time.Time         `json:"to"` // the month's end, or now for this month
	Currency string            `json:"currency"`
	Rows     []CapacityRowJSON `json:"rows"`
	Total    CapacityRowJSON   `json:"total"`
	// Allocated GPU-hours on no registered capacity (see store.Capacity).
	AllocatedOutsideGPUHours string `json:"allocated_outside_capacity_gpu_hours"`
}

func capacityRowJSON(r store.CapacityRow) CapacityRowJSON {
	out := CapacityRowJSON{GPUType: r.GPUType, Site: r.Site,
		RegisteredGPUHours: gpuHours(r.RegisteredGPUSeconds), AllocatedGPUHours: gpuHours(r.AllocatedGPUSeconds),
		IdleGPUHours: gpuHours(r.IdleGPUSeconds), DrainedDownGPUHours: gpuHours(r.DrainedDownGPUSeconds),
		RegisteredGPUSeconds: r.RegisteredGPUSeconds, AllocatedGPUSeconds: r.AllocatedGPUSeconds,
		IdleGPUSeconds: r.IdleGPUSeconds, DrainedDownGPUSeconds: r.DrainedDownGPUSeconds,
		CapacityCost: r.CapacityCost.Decimal(), UnrecoveredCost: r.UnrecoveredCost.Decimal(), UnrecoveredGPUHours: gpuHours(r.UnrecoveredGPUSeconds)}
	if r.CostPerGPUHour != nil {
		out.CostPerGPUHour = r.CostPerGPUHour.Decimal()
	}
	if r.RegisteredGPUSeconds > 0 {
		out.UtilizationBasisPoints = r.AllocatedGPUSeconds * 10000 / r.RegisteredGPUSeconds
	}
	return out
}

// capacity loads month m's capacity report as the API shows it.
func (s *Server) capacity(c echo.Context, m billing.YearMonth) (CapacityJSON, error) {
	cp, err := s.st.CapacityOf(c.Request().Context(), m)
	if err != nil {
		return CapacityJSON{}, err
	}
	out := CapacityJSON{Month: m.String(), From: cp.From, To: cp.To, Currency: cp.Currency, Rows: []CapacityRowJSON{},
		Total: capacityRowJSON(cp.Total), AllocatedOutsideGPUHours: gpuHours(cp.AllocatedOutsideGPUSeconds)}
	for _, r := range cp.Rows {
		out.Rows = append(out.Rows, capacityRowJSON(r))
	}
	return out, nil
}

// queriedCapacity is the capacity report of ?month= (chargebackMonth:
// default this month; a malformed or future month is a field error, 422).
func (s *Server) queriedCapacity(c echo.Context) (CapacityJSON, error) {
	m, err := s.chargebackMonth(c)
	if err != nil {
		return CapacityJSON{}, err
	}
	return s.capacity(c, m)
}

func (s *Server) apiCapacity(c echo.Context) error {
	out, err := s.queriedCapacity(c)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, out)
}

// CapacityCSVColumns are the capacity CSV's columns, in order; the last
// row is the total (gpu_type "TOTAL", site empty).
var CapacityCSVColumns = []string{"month", "gpu_type", "site", "registered_gpu_hours", "allocated_gpu_hours", "idle_gpu_hours",
	"drained_down_gpu_hours", "unrecovered_gpu_hours", "cost_per_gpu_hour", "capacity_cost", "unrecovered_cost", "currency"}

// apiCapacityCSV is the report as RFC 4180 CSV, through the chargeback
// export's writer (streamed, stall-guarded) and formula guard.
func (s *Server) apiCapacityCSV(c echo.Context) error {
	out, err := s.queriedCapacity(c)
	if err != nil {
		return err
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="allot-capacity-%s.csv"`, out.Month))
	c.Response().WriteHeader(http.StatusOK)
	w := csv.NewWriter(c.Response())
	w.UseCRLF = true
	x := s.exportWriter(c, w)
	if err := x.write(CapacityCSVColumns); err != nil {
		return err
	}
	record := func(r CapacityRowJSON, gpuType string) []string {
		return []string{out.Month, csvText(gpuType), csvText(r.Site), r.RegisteredGPUHours, r.AllocatedGPUHours, r.IdleGPUHours,
			r.DrainedDownGPUHours, r.UnrecoveredGPUHours, r.CostPerGPUHour, r.CapacityCost, r.UnrecoveredCost, out.Currency}
	}
	for _, r := range out.Rows {
		if err := x.write(record(r, r.GPUType)); err != nil {
			return err
		}
	}
	if err := x.write(record(out.Total, "TOTAL")); err != nil {
		return err
	}
	return x.flush()
}

// capacityPercent is allocated/registered as "63.2 %" (basis points,
// truncated), "—" without capacity.
func capacityPercent(r CapacityRowJSON) string {
	if r.RegisteredGPUSeconds == 0 {
		return "—"
	}
	bp := r.UtilizationBasisPoints
	return strconv.FormatInt(bp/100, 10) + "." + strconv.FormatInt(bp%100/10, 10) + " %"
}
