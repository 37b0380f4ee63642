package web

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/views"
)

// engineView is the engine's side of a job another engine runs (Slurm):
// its job id, state and reason code, Slurm's expected start, its runs
// from accounting, and whether Slurm has answered lately.
func (s *Server) engineView(c echo.Context, j *allot.Job) (*views.EngineView, error) {
	ctx := c.Request().Context()
	in, ok, err := s.st.EngineJob(ctx, j.ID)
	if err != nil {
		return nil, err
	}
	v := &views.EngineView{Engine: engineName(j.Backend), Origin: "through Allot"}
	sync, err := s.st.EngineSync(ctx)
	if err != nil {
		return nil, err
	}
	if !sync.DownSince.IsZero() {
		v.SyncProblem = fmt.Sprintf("%s has not answered Allot since %s (%s): this page shows what it last said; Allot catches up when it answers.",
			v.Engine, fmtTime(sync.DownSince), sync.LastError)
	}
	if !ok {
		return v, nil
	}
	if in.ExternalID > 0 {
		v.JobID = strconv.FormatInt(in.ExternalID, 10)
	}
	if in.Origin == "sbatch" {
		v.Origin = "with sbatch"
	}
	v.Account, v.User, v.QOS, v.Partition, v.State, v.Reason = in.Account, in.User, in.QOS, in.Partition, in.State, in.Reason
	if v.Account == "" {
		v.Account = j.Team
	}
	if v.User == "" {
		v.User = j.RunAsUser
	}
	if j.State == allot.JobPending && !in.StartEstimate.IsZero() {
		v.StartEstimate = fmtTime(in.StartEstimate)
	}
	v.Nodes, v.SubmitError = strings.Join(in.Nodes, ", "), in.SubmitError
	for _, r := range in.Runs {
		rv := views.EngineRunView{Segment: strconv.Itoa(r.Segment), State: r.State, Start: fmtTime(r.Start), End: fmtTime(r.End),
			GPUs: strconv.Itoa(r.GPUs), Nodes: strings.Join(r.Nodes, ", "), QOS: r.QOS, GPUUtil: "—", GPUMem: "—"}
		if r.End.IsZero() {
			rv.End = "running"
		}
		if r.GPUUtilPct != nil {
			rv.GPUUtil = strconv.FormatFloat(*r.GPUUtilPct, 'f', 0, 64) + " %"
		}
		if r.GPUMemMiB != nil {
			rv.GPUMem = strconv.FormatInt(*r.GPUMemMiB, 10) + " MiB"
		}
		v.Runs = append(v.Runs, rv)
	}
	return v, nil
}

func engineName(backend string) string {
	if backend == allot.BackendSlurm {
		return "Slurm"
	}
	return backend
}
