package slurm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// Fixtures: testdata/v0038_*, dbv0038_* and sacct_v0038_* were recorded
// from a real Slurm 22.05.8 (slurmrestd v0.0.38) on this machine (see
// doc.go). testdata/v0040_*, v0041_*, dbv0040_*, dbv0041_* and
// v0039_openapi_paths.json are SYNTHETIC, written from the data_parser
// schemas of Slurm 23.11 / 24.05; each says so in its "_comment".

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ts(sec int64) time.Time { return time.Unix(sec, 0).UTC() }

func jobByID(t *testing.T, jobs []Job, id int64) Job {
	t.Helper()
	for _, j := range jobs {
		if j.ID == id {
			return j
		}
	}
	t.Fatalf("job %d not in %d jobs", id, len(jobs))
	return Job{}
}

func TestV0038JobsRecorded(t *testing.T) {
	jobs, err := a38.decodeJobs(fixture(t, "v0038_jobs_pending.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Running, proxied submit as allot-h2u: 2 typed GPUs, indices from gres_detail.
	j1 := jobByID(t, jobs, 1)
	want1 := Job{ID: 1, Name: "h2-run", Account: "nlp", User: "allot-h2u", QOS: "normal", Partition: "gpu",
		State: "RUNNING", Comment: "allot:job=101", Submit: ts(1796153559), Eligible: ts(1796153559), Start: ts(1796153560),
		TimeLimit: 30 * time.Minute, GPUs: 2, GRESType: "h100", Nodes: []string{"gpu01"},
		GPUIndices: map[string][]int{"gpu01": {0, 1}}}
	if !reflect.DeepEqual(j1, want1) {
		t.Errorf("job 1:\n got %+v\nwant %+v", j1, want1)
	}
	// Pending on Resources: start_time is the backfill estimate (end of job 1), 8 GPUs over 2 nodes.
	j7 := jobByID(t, jobs, 7)
	if j7.State != "PENDING" || j7.Reason != "Resources" || !j7.Start.Equal(ts(1796155360)) || j7.GPUs != 8 || j7.GRESType != "h100" || j7.Nodes != nil || !j7.End.IsZero() {
		t.Errorf("job 7 = %+v", j7)
	}
	// Requeued after preemption: BeginTime, restart count, start = begin time.
	j5 := jobByID(t, jobs, 5)
	if j5.State != "PENDING" || j5.Reason != "BeginTime" || j5.Restarts != 1 || !j5.Start.Equal(ts(1796153714)) || j5.GPUs != 4 {
		t.Errorf("job 5 = %+v", j5)
	}
	// Held: no estimate.
	if j8 := jobByID(t, jobs, 8); j8.Reason != "JobHeldUser" || !j8.Start.IsZero() || !j8.Eligible.IsZero() || j8.GPUs != 1 || j8.GRESType != "" {
		t.Errorf("job 8 = %+v", j8)
	}
	if j9 := jobByID(t, jobs, 9); j9.Reason != "Dependency" || !j9.Start.IsZero() {
		t.Errorf("job 9 = %+v", j9)
	}
	// Failed at submit (too many GPUs): BadConstraints, exit 1.
	if j4 := jobByID(t, jobs, 4); j4.State != "FAILED" || j4.Reason != "BadConstraints" || j4.ExitCode != 1 || j4.End.IsZero() {
		t.Errorf("job 4 = %+v", j4)
	}

	jobs, err = a38.decodeJobs(fixture(t, "v0038_jobs.json"))
	if err != nil {
		t.Fatal(err)
	}
	// exit 3: raw wait status 768.
	if j10 := jobByID(t, jobs, 10); j10.State != "FAILED" || j10.ExitCode != 3 || j10.Reason != "NonZeroExitCode" || j10.Comment != "allot:job=103" {
		t.Errorf("job 10 = %+v", j10)
	}
	jobs, err = a38.decodeJobs(fixture(t, "v0038_jobs_requeued.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Two nodes: one gres_detail entry per node in hostlist order.
	j7 = jobByID(t, jobs, 7)
	if !reflect.DeepEqual(j7.Nodes, []string{"gpu01", "gpu02"}) || !reflect.DeepEqual(j7.GPUIndices, map[string][]int{"gpu01": {0, 1, 2, 3}, "gpu02": {0, 1, 2, 3}}) || j7.GPUs != 8 {
		t.Errorf("job 7 running = %+v", j7)
	}
	if j5 := jobByID(t, jobs, 5); j5.Restarts != 2 || j5.State != "PENDING" {
		t.Errorf("job 5 after 2nd preemption = %+v", j5)
	}
}

func TestV0038NodesRecorded(t *testing.T) {
	nodes, err := a38.decodeNodes(fixture(t, "v0038_nodes_drain.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Node{
		{Name: "gpu01", GPUs: 4, GRESType: "h100", State: "MIXED"},
		{Name: "gpu02", GPUs: 4, GRESType: "h100", State: "MIXED", Flags: []string{"DRAIN"}, Drain: true, Reason: "allot: XID 79 on GPU 3"},
	}
	if !reflect.DeepEqual(nodes, want) {
		t.Errorf("nodes:\n got %+v\nwant %+v", nodes, want)
	}
}

func TestV0038AccountingRecorded(t *testing.T) {
	runs, err := a38.decodeRuns(fixture(t, "dbv0038_jobs.json"))
	if err != nil {
		t.Fatal(err)
	}
	sortRuns(runs)
	var five []Run
	for _, r := range runs {
		if r.JobID == 5 {
			five = append(five, r)
		}
	}
	// Preempted twice: two PREEMPTED records and the pending requeued one,
	// told apart by their submit times (each requeue is a new record).
	if len(five) != 3 {
		t.Fatalf("job 5 records = %+v", five)
	}
	if five[0].State != "PREEMPTED" || !five[0].Start.Equal(ts(1796153578)) || !five[0].End.Equal(ts(1796153591)) || five[0].GPUs != 4 || five[0].GRESType != "h100" || !reflect.DeepEqual(five[0].Nodes, []string{"gpu02"}) {
		t.Errorf("first run = %+v", five[0])
	}
	if five[1].State != "PREEMPTED" || !five[1].Submit.Equal(ts(1796153593)) || !five[1].Start.Equal(ts(1796153714)) || !five[1].End.Equal(ts(1796154115)) || five[1].Comment != "allot:job=102" {
		t.Errorf("second run = %+v", five[1])
	}
	if five[2].State != "PENDING" || !five[2].Start.IsZero() || !five[2].End.IsZero() || five[2].GPUs != 4 {
		t.Errorf("requeued record = %+v", five[2])
	}
	keys := map[string]bool{}
	for _, r := range runs {
		if keys[r.Key()] {
			t.Errorf("duplicate key %s", r.Key())
		}
		keys[r.Key()] = true
	}
	for _, r := range runs {
		switch r.JobID {
		case 7:
			if r.State != "RUNNING" || !r.End.IsZero() || r.GPUs != 8 || !reflect.DeepEqual(r.Nodes, []string{"gpu01", "gpu02"}) {
				t.Errorf("job 7 = %+v", r)
			}
		case 10:
			// The job exited 3 (sacct: 3:0), but 22.05's dbv0.0.38 reports
			// exit_code SUCCESS/0 for it and its steps: REST accounting
			// exit codes are not trustworthy on v0.0.38.
			if r.State != "FAILED" || r.ExitCode != 0 || r.User != "allot-h2u" || r.GPUs != 1 {
				t.Errorf("job 10 = %+v", r)
			}
		case 1:
			if r.TimeLimit != 30*time.Minute || r.GPUUtilPct != nil || r.GPUMemMiB != nil {
				t.Errorf("job 1 = %+v (no gpuutil gathered here)", r)
			}
		}
	}
}

func TestV0038PingRecorded(t *testing.T) {
	info, err := a38.decodePing(fixture(t, "v0038_ping.json"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Release != "22.05.8" || info.Controllers["vm"] != "UP" {
		t.Errorf("ping = %+v", info)
	}
}

func checkNewerJobs(t *testing.T, jobs []Job) {
	t.Helper()
	j := jobByID(t, jobs, 201)
	want := Job{ID: 201, Name: "train", Account: "nlp", User: "alice", QOS: "allot-t2", Partition: "gpu", State: "RUNNING",
		Comment: "allot:job=201", Submit: ts(1796153559), Eligible: ts(1796153559), Start: ts(1796153560),
		TimeLimit: 30 * time.Minute, GPUs: 4, GRESType: "h100", Nodes: []string{"sn01", "sn02"},
		GPUIndices: map[string][]int{"sn01": {0, 1}, "sn02": {2, 3}}}
	if !reflect.DeepEqual(j, want) {
		t.Errorf("job 201:\n got %+v\nwant %+v", j, want)
	}
	j = jobByID(t, jobs, 202)
	if j.State != "PENDING" || j.Reason != "Resources" || j.GPUs != 16 || j.Switches != 1 || !j.Start.Equal(ts(1796157200)) {
		t.Errorf("job 202 = %+v", j)
	}
	if w := ExplainReason(j.Reason, j); w != "waiting for 16 GPUs in one IB domain" {
		t.Errorf("job 202 words = %q", w)
	}
	j = jobByID(t, jobs, 203)
	if j.State != "PENDING" || !reflect.DeepEqual(j.Flags, []string{"REQUEUED"}) || j.Restarts != 1 || !j.Start.IsZero() || j.TimeLimit != 0 || j.GPUs != 1 {
		t.Errorf("job 203 = %+v", j)
	}
	j = jobByID(t, jobs, 204)
	if j.State != "CANCELLED" || j.ExitCode != 137 || !j.End.Equal(ts(1796153100)) {
		t.Errorf("job 204 = %+v", j)
	}
}

func checkNewerRuns(t *testing.T, runs []Run) {
	t.Helper()
	sortRuns(runs)
	if len(runs) != 4 {
		t.Fatalf("runs = %+v", runs)
	}
	r := runs[0] // 201: busiest step 201.0: 360 % over 4 GPUs, 64 GiB
	if r.JobID != 201 || r.GPUs != 4 || r.GRESType != "h100" || r.Comment != "allot:job=201" || r.TimeLimit != 30*time.Minute ||
		r.GPUUtilPct == nil || *r.GPUUtilPct != 90 || r.GPUMemMiB == nil || *r.GPUMemMiB != 65536 {
		t.Errorf("run 201 = %+v", r)
	}
	a, b := runs[1], runs[2]
	if a.JobID != 203 || b.JobID != 203 || a.State != "PREEMPTED" || b.State != "RUNNING" || a.Key() == b.Key() ||
		!a.End.Equal(ts(1796150600)) || !b.End.IsZero() || a.GPUs != 2 || a.GRESType != "a100" ||
		a.GPUUtilPct == nil || *a.GPUUtilPct != 65 || *a.GPUMemMiB != 40960 || b.GPUUtilPct != nil {
		t.Errorf("runs 203 = %+v / %+v", a, b)
	}
	if c := runs[3]; c.State != "CANCELLED" || c.ExitCode != 137 {
		t.Errorf("run 204 = %+v", c)
	}
}

func TestV0040Synthetic(t *testing.T) {
	jobs, err := a40.decodeJobs(fixture(t, "v0040_jobs.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkNewerJobs(t, jobs)
	runs, err := a40.decodeRuns(fixture(t, "dbv0040_jobs.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkNewerRuns(t, runs)
	nodes, err := a40.decodeNodes(fixture(t, "v0040_nodes.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Node{
		{Name: "sn01", GPUs: 4, GRESType: "h100", State: "MIXED"},
		{Name: "sn02", GPUs: 4, GRESType: "h100", State: "IDLE", Flags: []string{"DRAIN"}, Drain: true, Reason: "allot: XID 79 on GPU 3"},
		{Name: "sn03", GPUs: 4, State: "DOWN", Flags: []string{"NOT_RESPONDING"}, Reason: "Not responding"},
	}
	if !reflect.DeepEqual(nodes, want) {
		t.Errorf("nodes:\n got %+v\nwant %+v", nodes, want)
	}
	info, err := a40.decodePing(fixture(t, "v0040_ping.json"))
	if err != nil || info.Release != "23.11.0" || info.Controllers["head1"] != "UP" {
		t.Errorf("ping = %+v, %v", info, err)
	}
}

func TestV0041Synthetic(t *testing.T) {
	jobs, err := a41.decodeJobs(fixture(t, "v0041_jobs.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkNewerJobs(t, jobs)
	runs, err := a41.decodeRuns(fixture(t, "dbv0041_jobs.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkNewerRuns(t, runs)
	info, err := a41.decodePing(fixture(t, "v0041_ping.json"))
	if err != nil || info.Release != "24.05.0" {
		t.Errorf("ping = %+v, %v", info, err)
	}
}

func TestSubmitBodies(t *testing.T) {
	s := JobSubmit{Name: "n", Account: "nlp", QOS: "allot-t3", Partition: "gpu", Comment: "allot:job=7", Workdir: "/w",
		Script: "#!/bin/sh\ntrue\n", Env: map[string]string{"A": "1"}, GPUsPerNode: 2, Nodes: 2, GRESType: "h100",
		TimeLimit: 90*time.Second + time.Hour, Requeue: true}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	got38 := enc(a38.submitBody(s))
	want38 := `{"job":{"account":"nlp","comment":"allot:job=7","current_working_directory":"/w","environment":{"A":"1","PATH":"/usr/local/bin:/usr/bin:/bin"},"gres":"gpu:h100:2","name":"n","nodes":"2","partition":"gpu","qos":"allot-t3","requeue":true,"time_limit":62},"script":"#!/bin/sh\ntrue\n"}`
	if got38 != want38 {
		t.Errorf("v0.0.38 body\n got %s\nwant %s", got38, want38)
	}
	got40 := enc(a40.submitBody(s))
	want40 := `{"job":{"account":"nlp","comment":"allot:job=7","current_working_directory":"/w","environment":["A=1","PATH=/usr/local/bin:/usr/bin:/bin"],"name":"n","nodes":"2","partition":"gpu","qos":"allot-t3","requeue":true,"time_limit":{"infinite":false,"number":62,"set":true},"tres_per_node":"gres/gpu:h100:2"},"script":"#!/bin/sh\ntrue\n"}`
	if got40 != want40 {
		t.Errorf("v0.0.40 body\n got %s\nwant %s", got40, want40)
	}
	s2 := JobSubmit{Script: "x", GPUs: 16, Nodes: 4, Hold: true}
	got41 := enc(a41.submitBody(s2))
	want41 := `{"job":{"current_working_directory":"/tmp","environment":["PATH=/usr/local/bin:/usr/bin:/bin"],"hold":true,"nodes":"4","requeue":false,"script":"x","tres_per_job":"gres/gpu:16"}}`
	if got41 != want41 {
		t.Errorf("v0.0.41 body\n got %s\nwant %s", got41, want41)
	}
	if got := enc(a38.submitBody(s2)); got != `{"job":{"current_working_directory":"/tmp","environment":{"PATH":"/usr/local/bin:/usr/bin:/bin"},"gpus":"16","hold":true,"nodes":"4","requeue":false},"script":"x"}` {
		t.Errorf("v0.0.38 gpus-per-job body %s", got)
	}
	if b, ok := a38.nodeUpdateBody(true, "r"); ok || b != nil {
		t.Error("v0.0.38 has no node update")
	}
	if b, _ := a40.nodeUpdateBody(true, "allot: XID 79"); enc(b) != `{"reason":"allot: XID 79","state":["DRAIN"]}` {
		t.Errorf("drain body %s", enc(b))
	}
	if b, _ := a41.nodeUpdateBody(false, ""); enc(b) != `{"state":["RESUME"]}` {
		t.Errorf("resume body %s", enc(b))
	}
}

func TestParsers(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"gpu[01-03,07],login1", []string{"gpu01", "gpu02", "gpu03", "gpu07", "login1"}},
		{"sn[1-2]", []string{"sn1", "sn2"}},
		{"a[08-10]b", []string{"a08b", "a09b", "a10b"}},
		{"None assigned", []string{"None assigned"}},
		{"(null)", nil}, {"", nil},
	} {
		if got := ExpandHostlist(c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("ExpandHostlist(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	type gresCase struct {
		in  string
		n   int
		typ string
	}
	for _, c := range []gresCase{
		{"gpu:h100:4(S:0)", 4, "h100"}, {"gpu:4", 4, ""}, {"gres:gpu:h100:2", 2, "h100"}, {"gres/gpu:2", 2, ""},
		{"gpu:a100:2,gpu:h100:2", 4, "a100"}, {"gpu", 1, ""}, {"gpu:h100", 1, "h100"}, {"shard:8", 0, ""}, {"", 0, ""},
	} {
		if n, typ := gresGPUs(c.in); n != c.n || typ != c.typ {
			t.Errorf("gresGPUs(%q) = %d %q, want %d %q", c.in, n, typ, c.n, c.typ)
		}
	}
	if got := gresIndices("gpu(IDX:0,2-3)"); !reflect.DeepEqual(got, []int{0, 2, 3}) {
		t.Errorf("gresIndices = %v", got)
	}
	if got := gresIndices("gpu:h100:0(IDX:N/A)"); got != nil {
		t.Errorf("gresIndices N/A = %v", got)
	}
}

var (
	a38 adapter = v0038{}
	a40 adapter = v0040{}
	a41 adapter = v0041{}
)

// BenchmarkDecodeAccountingV0038: decode rate of recorded dbv0.0.38
// records (runs/s is the import ceiling on the client side).
func BenchmarkDecodeAccountingV0038(b *testing.B) {
	body, err := os.ReadFile(filepath.Join("testdata", "dbv0038_jobs.json"))
	if err != nil {
		b.Fatal(err)
	}
	runs := 0
	for b.Loop() {
		r, err := a38.decodeRuns(body)
		if err != nil {
			b.Fatal(err)
		}
		runs += len(r)
	}
	b.ReportMetric(float64(runs)/b.Elapsed().Seconds(), "runs/s")
}
