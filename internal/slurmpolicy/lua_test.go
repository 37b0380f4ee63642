package slurmpolicy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/slurmpolicy"
)

// lookLua finds a Lua 5.1 tool (Debian's Slurm links Lua 5.1), else any
// Lua; the test skips without one (apt-get install lua5.1).
func lookLua(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	t.Skipf("no %s on PATH (apt-get install lua5.1)", strings.Join(names, " or "))
	return ""
}

func TestJobSubmitLuaSyntax(t *testing.T) {
	luac := lookLua(t, "luac5.1", "luac")
	in := testInput()
	r := slurmpolicy.Render(in)
	f := filepath.Join(t.TempDir(), "job_submit.lua")
	if err := os.WriteFile(f, []byte(r.JobSubmitLua), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(luac, "-p", f).CombinedOutput(); err != nil {
		t.Fatalf("%s -p: %v\n%s\n%s", luac, err, out, r.JobSubmitLua)
	}
	// The path is baked in, escaped.
	if !strings.Contains(r.JobSubmitLua, `local OVER_BUDGET_FILE = "/etc/slurm/allot \"over\"-budget"`) {
		t.Errorf("the over-budget path is not in the script:\n%s", r.JobSubmitLua)
	}
	if !strings.Contains(r.JobSubmitLua, "local REFRESH_SECONDS = 10\n") {
		t.Errorf("default refresh is not 10 s:\n%s", r.JobSubmitLua)
	}
}

// luaHarness runs job_submit.lua under a Lua interpreter with Slurm's
// side of the interface (the slurm table) standing in, over a sequence of
// job descriptions, and prints what the script made of each.
const luaHarness = `
local msgs = {}
slurm = { SUCCESS = 0, ERROR = -1,
	log_user = function(fmt, ...) table.insert(msgs, string.format(fmt, ...)) end,
	log_error = function(fmt, ...) table.insert(msgs, "ERROR " .. string.format(fmt, ...)) end,
	log_info = function(fmt, ...) end }
local rc = dofile(arg[1])
assert(rc == slurm.SUCCESS, "load returned " .. tostring(rc))
local function show(v) if v == nil then return "nil" end return v end
local function run(name, job)
	msgs = {}
	local r = slurm_job_submit(job, {}, 1000)
	print(name .. " rc=" .. r .. " qos=" .. show(job.qos) .. " comment=" .. show(job.comment) .. " msg=" .. table.concat(msgs, ";"))
end
run("t3", { account = "vision", qos = "allot-t3" })
run("t4-upper", { account = "VISION", qos = "allot-t4", comment = "allot:job=12" })
run("unset", { default_account = "vision" })
run("t1", { account = "vision", qos = "allot-t1" })
run("other", { account = "nlp", qos = "allot-t3" })
run("already", { account = "vision", qos = "allot-t3", comment = "x allot:demoted-over-budget" })
run("noaccount", { qos = "allot-t3" })
-- The list is re-read only after REFRESH_SECONDS.
local f = assert(io.open(arg[2], "w")); f:write("nlp\n"); f:close()
run("cached", { account = "nlp", qos = "allot-t3" })
run("unset2", { account = "vision" })
print("modify rc=" .. slurm_job_modify({}, {}, {}, 0))
`

func TestJobSubmitLuaBehaviour(t *testing.T) {
	lua := lookLua(t, "lua5.1", "lua")
	dir := t.TempDir()
	list := filepath.Join(dir, "over budget")
	in := testInput()
	in.OverBudgetFile = list
	in.OverBudgetRefresh = time.Hour
	r := slurmpolicy.Render(in)
	if err := os.WriteFile(list, []byte(r.OverBudgetList+"  # a comment line\n  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "job_submit.lua")
	harness := filepath.Join(dir, "harness.lua")
	if err := os.WriteFile(script, []byte(r.JobSubmitLua), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(harness, []byte(luaHarness), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(lua, harness, script, list).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", lua, err, out)
	}
	const msg = "account vision is over its GPU-hour budget; job runs as preemptible"
	want := []string{
		"t3 rc=0 qos=allot-preemptible comment=allot:demoted-over-budget msg=" + msg,
		"t4-upper rc=0 qos=allot-preemptible comment=allot:job=12 allot:demoted-over-budget msg=" + msg,
		"unset rc=0 qos=allot-preemptible comment=allot:demoted-over-budget msg=" + msg,
		"t1 rc=0 qos=allot-t1 comment=nil msg=",
		"other rc=0 qos=allot-t3 comment=nil msg=",
		"already rc=0 qos=allot-preemptible comment=x allot:demoted-over-budget msg=" + msg,
		"noaccount rc=0 qos=allot-t3 comment=nil msg=",
		"cached rc=0 qos=allot-t3 comment=nil msg=",
		"unset2 rc=0 qos=allot-preemptible comment=allot:demoted-over-budget msg=" + msg,
		"modify rc=0",
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("script output:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A missing file: nobody is over, and no submission fails.
	in.OverBudgetFile = filepath.Join(dir, "missing")
	if err := os.WriteFile(script, []byte(slurmpolicy.Render(in).JobSubmitLua), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(lua, harness, script, filepath.Join(dir, "scratch")).CombinedOutput()
	if err != nil {
		t.Fatalf("%s without the list: %v\n%s", lua, err, out)
	}
	if first := strings.Split(string(out), "\n")[0]; first != "t3 rc=0 qos=allot-t3 comment=nil msg=" {
		t.Errorf("without the list, a tier-3 job of vision: %q", first)
	}
}
