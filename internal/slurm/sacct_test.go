package slurm

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseSacctRecorded(t *testing.T) {
	f, err := os.Open("testdata/sacct_v0038_X.txt") // recorded: sacct 22.05.8, SacctArgs + TZ=UTC
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs, err := ParseSacct(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 11 {
		t.Fatalf("%d runs", len(runs))
	}
	var five []Run
	for _, r := range runs {
		if r.JobID == 5 {
			five = append(five, r)
		}
	}
	if len(five) != 3 || five[0].State != "PREEMPTED" || five[1].State != "PREEMPTED" || five[2].State != "PENDING" {
		t.Fatalf("job 5 = %+v", five)
	}
	want := Run{JobID: 5, Name: "pre-victim", Account: "vision", User: "root", QOS: "normal", Partition: "preemptible",
		State: "PREEMPTED", Comment: "allot:job=102", Submit: ts(1796153593), Eligible: ts(1796153714),
		Start: ts(1796153714), End: ts(1796154115), TimeLimit: 20 * time.Minute, GPUs: 4, GRESType: "h100", Nodes: []string{"gpu02"}}
	if !reflect.DeepEqual(five[1], want) {
		t.Errorf("second run\n got %+v\nwant %+v", five[1], want)
	}
	// The same records as REST (dbv0038_jobs.json was taken at the same time, minus job 9 which started later).
	rest, _ := a38.decodeRuns(fixture(t, "dbv0038_jobs.json"))
	sortRuns(rest)
	restKeys := map[string]Run{}
	for _, r := range rest {
		restKeys[r.Key()] = r
	}
	for _, r := range runs {
		if r.JobID == 9 || r.JobID == 7 {
			continue // changed state between the two recordings
		}
		rr, ok := restKeys[r.Key()]
		if !ok {
			t.Errorf("sacct run %s not in REST", r.Key())
			continue
		}
		if rr.State != r.State || !rr.Start.Equal(r.Start) || !rr.End.Equal(r.End) || rr.GPUs != r.GPUs {
			t.Errorf("REST %+v\nsacct %+v", rr, r)
		}
	}
	for _, r := range runs {
		switch r.JobID {
		case 10:
			if r.ExitCode != 3 {
				t.Errorf("job 10 exit = %d", r.ExitCode)
			}
		case 9:
			if r.State != "RUNNING" || !r.End.IsZero() {
				t.Errorf("job 9 = %+v", r)
			}
		case 2:
			if r.TimeLimit != 0 || r.GPUs != 0 {
				t.Errorf("job 2 = %+v", r)
			}
		case 3:
			if r.TimeLimit != 365*24*time.Hour {
				t.Errorf("job 3 limit = %v", r.TimeLimit)
			}
		case 4:
			if r.Nodes != nil && len(r.Nodes) != 1 {
				t.Errorf("job 4 nodes = %v", r.Nodes)
			}
		}
	}
}

func TestParseSacctStepsSynthetic(t *testing.T) {
	// SYNTHETIC: what sacct without -X prints on a site with NVML gathering
	// (JobAcctGatherType=jobacct_gather/cgroup, AccountingStorageTRES=gres/gpu):
	// TRESUsageInAve on step lines, gpuutil summed over the step's GPUs,
	// gpumem in bytes (--noconvert). Also a comment holding "|".
	in := strings.Join([]string{
		"JobIDRaw|JobName|Account|User|QOS|Partition|State|Submit|Eligible|Start|End|Timelimit|AllocTRES|ReqTRES|NodeList|ExitCode|TRESUsageInAve|Comment",
		"42|train|nlp|alice|allot-t2|gpu|COMPLETED|2026-12-01T10:00:00|2026-12-01T10:00:00|2026-12-01T10:00:05|2026-12-01T11:00:05|01:30:00|billing=2,cpu=4,gres/gpu:h100=2,gres/gpu=2,node=1|gres/gpu=2|sn01|0:0||allot:job=9|x",
		"42.batch|batch|nlp||||COMPLETED|2026-12-01T10:00:05|2026-12-01T10:00:05|2026-12-01T10:00:05|2026-12-01T11:00:05||cpu=4,gres/gpu=2,node=1||sn01|0:0|cpu=00:00:01,gres/gpuutil=10,gres/gpumem=1048576|",
		"42.0|python|nlp||||COMPLETED|2026-12-01T10:00:06|2026-12-01T10:00:06|2026-12-01T10:00:06|2026-12-01T11:00:00||cpu=4,gres/gpu=2,node=1||sn01|0:0|cpu=00:59:00,gres/gpuutil=150,gres/gpumem=21474836480|",
		"43|killed|nlp|alice|allot-t3|gpu|CANCELLED by 0|2026-12-01T10:00:00|2026-12-01T10:00:00|2026-12-01T10:00:01|2026-12-01T10:00:09|UNLIMITED|gres/gpu=1|gres/gpu=1|sn02|0:15||",
		"",
	}, "\n")
	runs, err := ParseSacct(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 {
		t.Fatalf("runs = %+v", runs)
	}
	r := runs[0]
	if r.Comment != "allot:job=9|x" || r.GPUs != 2 || r.GRESType != "h100" || r.TimeLimit != 90*time.Minute ||
		r.GPUUtilPct == nil || *r.GPUUtilPct != 75 || r.GPUMemMiB == nil || *r.GPUMemMiB != 20480 {
		t.Errorf("run 42 = %+v", r)
	}
	if r := runs[1]; r.State != "CANCELLED" || r.ExitCode != 143 || r.GPUUtilPct != nil {
		t.Errorf("run 43 = %+v", r)
	}
	if _, err := ParseSacct(strings.NewReader("1|2|3\n")); err == nil || !strings.Contains(err.Error(), "has 3 fields") {
		t.Errorf("short line: %v", err)
	}
	args := strings.Join(SacctArgs(ts(1796153000), ts(1796156600)), " ")
	if args != "-a -X -D --parsable2 --noheader --noconvert -S 2026-12-01T19:23:20 -E 2026-12-01T20:23:20 -o "+strings.Join(SacctFields(), ",") {
		t.Errorf("SacctArgs = %s", args)
	}
}
