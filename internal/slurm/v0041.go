package slurm

// v0041 is REST v0.0.41 (Slurm 24.05–25.11). NOT tested against a live
// slurmrestd: its tests use synthetic responses under testdata/v0041_*
// written from the data_parser v0.0.41 schema
// (src/plugins/data_parser/v0.0.41/parsers.c at slurm-24-05-0-1).
//
// Differences from v0.0.40 that matter here: the batch script goes inside
// job ("script" at the top level is deprecated), and "hold" exists in the
// job description. The job, node, accounting and ping shapes Allot reads
// are those of v0.0.40.
type v0041 struct{}

func (v0041) version() string { return "v0.0.41" }

func (v0041) submitBody(s JobSubmit) any {
	j := jobDesc40(s)
	j["script"] = s.Script
	if s.Hold {
		j["hold"] = true
	}
	return map[string]any{"job": j}
}

func (v0041) updateBody(u JobUpdate) any { return v0038{}.updateBody(u) }

func (v0041) nodeUpdateBody(drain bool, reason string) (any, bool) {
	return nodeUpdate40(drain, reason)
}

func (v0041) decodeJobs(b []byte) ([]Job, error) { return decodeJobs40(b, "v0.0.41") }

func (v0041) decodeNodes(b []byte) ([]Node, error) { return v0038{}.decodeNodes(b) }

func (v0041) decodePing(b []byte) (Info, error) { return decodePing40(b) }

func (v0041) decodeRuns(b []byte) ([]Run, error) { return decodeDBJobs(b, "v0.0.41") }
