package slurmpolicy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/slurmpolicy"
	"github.com/google/go-cmp/cmp"
)

// defaultTiers are migration 0020's tiers.
func defaultTiers() []allot.Tier {
	return []allot.Tier{
		{ID: allot.Tier1, Name: "Production incident", ClassOrder: 1, MayPreempt: []allot.TierID{"3", "4", "preemptible"}, MultiplierBP: 15000, MaxRuntime: 48 * time.Hour},
		{ID: allot.Tier2, Name: "Scheduled production", ClassOrder: 2, MayPreempt: []allot.TierID{"preemptible"}, MultiplierBP: 12500, MaxRuntime: 72 * time.Hour},
		{ID: allot.Tier3, Name: "Experiment", ClassOrder: 3, MultiplierBP: 10000, MaxRuntime: 7 * 24 * time.Hour},
		{ID: allot.Tier4, Name: "Exploration", ClassOrder: 4, MultiplierBP: 10000, MaxRuntime: 7 * 24 * time.Hour},
		{ID: allot.TierPreemptible, Name: "Preemptible", ClassOrder: 5, MultiplierBP: 3000, MaxRuntime: 7 * 24 * time.Hour},
	}
}

func testInput() slurmpolicy.Input {
	p := allot.DefaultPolicy()
	p.Version = 7
	return slurmpolicy.Input{
		ClusterName: "alpha",
		Tiers:       defaultTiers(),
		Policy:      p,
		Teams: []allot.Team{
			{Slug: "nlp", Name: "Natural Language", CostCenter: "CC-100", FairShareWeight: 3, PosixAccount: "svc_nlp"},
			{Slug: "vision", Name: `Vision "core" team's | lab`, CostCenter: "cc-200", FairShareWeight: 1},
		},
		Members:        map[string][]string{"nlp": {"noah", "alice", "noah"}, "vision": {"vic"}},
		OverBudget:     []string{"vision"},
		OverBudgetFile: "/etc/slurm/allot \"over\"-budget",
	}
}

func TestQOSNames(t *testing.T) {
	for _, tier := range allot.Tiers {
		q := slurmpolicy.QOSName(string(tier))
		back, ok := slurmpolicy.TierOfQOS(strings.ToUpper(q))
		if !ok || back != string(tier) {
			t.Errorf("TierOfQOS(QOSName(%q) = %q) = %q, %v", tier, q, back, ok)
		}
	}
	if got := slurmpolicy.QOSName("3"); got != "allot-t3" {
		t.Errorf("QOSName(3) = %q", got)
	}
	if got := slurmpolicy.QOSName("preemptible"); got != "allot-preemptible" {
		t.Errorf("QOSName(preemptible) = %q", got)
	}
	for _, q := range []string{"normal", "allot-t5", "allot-tpreemptible", "allot-", "t3", ""} {
		if tier, ok := slurmpolicy.TierOfQOS(q); ok {
			t.Errorf("TierOfQOS(%q) = %q, want not Allot's", q, tier)
		}
	}
}

func TestRenderConf(t *testing.T) {
	r := slurmpolicy.Render(testInput())
	// 5 classes × (10000 + 1000 + 500 + 1).
	for _, want := range []string{
		"PriorityType=priority/multifactor\n",
		"PriorityWeightQOS=57505\n",
		"PriorityWeightFairshare=10000\n",
		"PriorityWeightJobSize=1000\n",
		"PriorityWeightAge=500\n",
		"PriorityDecayHalfLife=7-00:00:00\n",
		"PriorityMaxAge=7-00:00:00\n",
		"PreemptType=preempt/qos\n",
		"PreemptMode=REQUEUE\n",
		"PreemptExemptTime=0-00:10:00\n",
		"JobSubmitPlugins=lua\n",
		"policy version 7 for cluster alpha",
	} {
		if !strings.Contains(r.SlurmConf, want) {
			t.Errorf("slurm.conf fragment lacks %q:\n%s", want, r.SlurmConf)
		}
	}
	in := testInput()
	in.Policy.HalfLife, in.Policy.MaxAge, in.Policy.MinRuntime = 90*time.Second, 26*time.Hour+3*time.Minute, 0
	r = slurmpolicy.Render(in)
	for _, want := range []string{"PriorityDecayHalfLife=0-00:02:00\n", "PriorityMaxAge=1-02:03:00\n"} {
		if !strings.Contains(r.SlurmConf, want) {
			t.Errorf("slurm.conf fragment lacks %q:\n%s", want, r.SlurmConf)
		}
	}
	if strings.Contains(r.SlurmConf, "PreemptExemptTime") {
		t.Errorf("no minimum runtime, yet PreemptExemptTime:\n%s", r.SlurmConf)
	}
	// Every non-comment line is Key=Value.
	for _, l := range strings.Split(r.SlurmConf, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") && !strings.Contains(l, "=") {
			t.Errorf("slurm.conf line %q is not Key=Value", l)
		}
	}
}

func TestRenderDesired(t *testing.T) {
	r := slurmpolicy.Render(testInput())
	all := []string{"allot-preemptible", "allot-t1", "allot-t2", "allot-t3", "allot-t4"}
	want := slurmpolicy.ClusterState{
		QOS: map[string]slurmpolicy.QOS{
			"allot-t1":          {Priority: 5, Preempt: []string{"allot-preemptible", "allot-t3", "allot-t4"}, PreemptMode: "requeue", GraceTime: 120, UsageFactor: 1},
			"allot-t2":          {Priority: 4, Preempt: []string{"allot-preemptible"}, PreemptMode: "requeue", GraceTime: 120, UsageFactor: 1},
			"allot-t3":          {Priority: 3, Preempt: []string{}, PreemptMode: "requeue", GraceTime: 120, UsageFactor: 1},
			"allot-t4":          {Priority: 2, Preempt: []string{}, PreemptMode: "requeue", GraceTime: 120, UsageFactor: 1},
			"allot-preemptible": {Priority: 1, Preempt: []string{}, PreemptMode: "requeue", GraceTime: 120, UsageFactor: 1},
		},
		Accounts: map[string]slurmpolicy.Account{
			"nlp": {Description: "natural language", Organization: "cc-100", Shares: 3, QOS: all, DefaultQOS: "allot-t3",
				Users: []string{"alice", "noah", "svc_nlp"}},
			"vision": {Description: "vision `core` team`s / lab", Organization: "cc-200", Shares: 1, QOS: all, DefaultQOS: "allot-t3",
				Users: []string{"vic"}},
		},
	}
	if d := cmp.Diff(want, r.Desired); d != "" {
		t.Errorf("desired state (-want +got):\n%s", d)
	}
	if got := slurmpolicy.SlurmText(" Équipe ÉTÉ 'A' "); got != "Équipe ÉtÉ `a`" {
		t.Errorf("SlurmText lower-cases like sacctmgr (ASCII only): %q", got)
	}
	// Tiers sharing a class order share a priority; the ranks stay dense.
	in := testInput()
	in.Tiers[3].ClassOrder = 3
	in.Tiers[4].ClassOrder = 40
	d := slurmpolicy.Render(in).Desired
	if p3, p4, pp := d.QOS["allot-t3"].Priority, d.QOS["allot-t4"].Priority, d.QOS["allot-preemptible"].Priority; p3 != 2 || p4 != 2 || pp != 1 {
		t.Errorf("priorities t3 %d t4 %d preemptible %d, want 2 2 1", p3, p4, pp)
	}
	if w := slurmpolicy.WeightQOS(in.Policy, in.Tiers); w != 4*11501 {
		t.Errorf("WeightQOS = %d, want %d", w, 4*11501)
	}
}

func TestRenderSacctmgrScript(t *testing.T) {
	r := slurmpolicy.Render(testInput())
	s := r.Sacctmgr
	for _, want := range []string{
		"$S add qos allot-t1 >/dev/null 2>&1 || true\n",
		"$S modify qos where name=allot-t1 set Priority=5 PreemptMode=requeue GraceTime=120 UsageFactor=1 Preempt=allot-preemptible,allot-t3,allot-t4\n",
		"$S modify qos where name=allot-t3 set Priority=3 PreemptMode=requeue GraceTime=120 UsageFactor=1 Preempt=\n",
		"$S modify account where name=nlp set Fairshare=3 QOS=allot-preemptible,allot-t1,allot-t2,allot-t3,allot-t4 DefaultQOS=allot-t3\n",
		"$S modify account where name=nlp set 'Description=natural language' Organization=cc-100\n",
		// The quotes of the name are Slurm's backquotes; the | is a /.
		"$S modify account where name=vision set 'Description=vision `core` team`s / lab' Organization=cc-200\n",
		"$S add user svc_nlp Account=nlp >/dev/null 2>&1 || true\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("sacctmgr script lacks %q:\n%s", want, s)
		}
	}
	// Every QOS is added before the first Preempt= names one.
	if strings.LastIndex(s, "add qos") > strings.Index(s, "$S modify qos") {
		t.Errorf("a QOS is added after a Preempt= list:\n%s", s)
	}
	// It is a valid shell script.
	if sh, err := exec.LookPath("sh"); err == nil {
		f := filepath.Join(t.TempDir(), "s.sh")
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(sh, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("sh -n: %v\n%s", err, out)
		}
	}
}

func TestRenderOverBudgetList(t *testing.T) {
	in := testInput()
	in.OverBudget = []string{"vision", " NLP ", "vision"}
	l := slurmpolicy.Render(in).OverBudgetList
	var accounts []string
	for _, line := range strings.Split(l, "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			accounts = append(accounts, line)
		}
	}
	if !slices.Equal(accounts, []string{"nlp", "vision"}) {
		t.Errorf("accounts %q, want nlp, vision:\n%s", accounts, l)
	}
}

func TestParseClusterState(t *testing.T) {
	// What sacctmgr -n -P show prints (shapes seen on Debian's 22.05).
	qos := "normal|0||cluster|00:00:00|1.000000\n" +
		"allot-t1|5|allot-preemptible,allot-t4,allot-t3|requeue|00:02:00|1.000000\n" +
		"allot-t3|3||cluster|1-00:00:10|0.500000\n"
	accts := "root|root|default root account\nnlp|cc-100|natural | language\n"
	assoc := "alpha|root||1|normal|\nalpha|nlp||3|allot-t1,allot-t3|allot-t3\nalpha|nlp|noah|1|allot-t1,allot-t3|\n" +
		"beta|nlp|other|1||\nalpha|nlp|alice|parent||\n"
	st, err := slurmpolicy.ParseClusterState(qos, accts, assoc, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	want := slurmpolicy.ClusterState{
		QOS: map[string]slurmpolicy.QOS{
			"allot-t1": {Priority: 5, Preempt: []string{"allot-preemptible", "allot-t3", "allot-t4"}, PreemptMode: "requeue", GraceTime: 120, UsageFactor: 1},
			"allot-t3": {Priority: 3, Preempt: []string{}, PreemptMode: "cluster", GraceTime: 86410, UsageFactor: 0.5},
		},
		Accounts: map[string]slurmpolicy.Account{
			"root": {Organization: "root", Description: "default root account", Shares: 1, QOS: []string{"normal"}, Users: []string{}},
			"nlp": {Organization: "cc-100", Description: "natural | language", Shares: 3, QOS: []string{"allot-t1", "allot-t3"}, DefaultQOS: "allot-t3",
				Users: []string{"alice", "noah"}},
		},
	}
	if d := cmp.Diff(want, st); d != "" {
		t.Errorf("parsed state (-want +got):\n%s", d)
	}
	if _, err := slurmpolicy.ParseClusterState("allot-t1|x|||", "", "", ""); err == nil {
		t.Error("a short qos line parsed")
	}
}

func TestDiff(t *testing.T) {
	r := slurmpolicy.Render(testInput())
	// Nothing there: everything is added, QOS first, Preempt= after every QOS.
	changes := slurmpolicy.Diff(r.Desired, slurmpolicy.ClusterState{})
	var cmds []string
	for _, c := range changes {
		cmds = append(cmds, c.Command())
	}
	joined := strings.Join(cmds, "\n")
	for _, want := range []string{
		"sacctmgr -i add qos allot-t1 Priority=5 PreemptMode=requeue GraceTime=120 UsageFactor=1",
		"sacctmgr -i modify qos where name=allot-t1 set Preempt=allot-preemptible,allot-t3,allot-t4",
		"sacctmgr -i add account nlp 'Description=natural language' Organization=cc-100 Fairshare=3 QOS=allot-preemptible,allot-t1,allot-t2,allot-t3,allot-t4 DefaultQOS=allot-t3",
		"sacctmgr -i add user noah Account=nlp",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("changes lack %q:\n%s", want, joined)
		}
	}
	if len(changes) != 5+2+2+4 { // 5 QOS, 2 Preempt lists, 2 accounts, 4 users
		t.Errorf("%d changes from nothing, want 13:\n%s", len(changes), joined)
	}
	if strings.LastIndex(joined, "add qos") > strings.Index(joined, "Preempt=") {
		t.Errorf("a QOS is added after a Preempt= list:\n%s", joined)
	}

	// The same state: no change.
	actual := copyState(r.Desired)
	if c := slurmpolicy.Diff(r.Desired, actual); len(c) != 0 {
		t.Errorf("diff of a state with itself: %v", c)
	}
	// Someone else's QOS and accounts are not Allot's business.
	actual.QOS["normal"] = slurmpolicy.QOS{}
	actual.Accounts["physics"] = slurmpolicy.Account{Shares: 9, Users: []string{"p"}}
	if c := slurmpolicy.Diff(r.Desired, actual); len(c) != 0 {
		t.Errorf("other QOS and accounts made changes: %v", c)
	}

	// One change each, with its words and command.
	nlp := actual.Accounts["nlp"]
	nlp.Shares = 1
	nlp.Users = []string{"bob", "noah", "svc_nlp"}
	nlp.Description = "old"
	actual.Accounts["nlp"] = nlp
	t1 := actual.QOS["allot-t1"]
	t1.GraceTime, t1.Preempt = 30, []string{"allot-t4"}
	actual.QOS["allot-t1"] = t1
	t3 := actual.QOS["allot-t3"]
	t3.UsageFactor = 0.3
	actual.QOS["allot-t3"] = t3
	v := actual.Accounts["vision"]
	v.DefaultQOS = ""
	actual.Accounts["vision"] = v
	got := map[string]string{}
	for _, c := range slurmpolicy.Diff(r.Desired, actual) {
		got[c.Text] = c.Command()
	}
	wantChanges := map[string]string{
		"qos allot-t1: preempt allot-t4 → allot-preemptible,allot-t3,allot-t4": "sacctmgr -i modify qos where name=allot-t1 set Preempt=allot-preemptible,allot-t3,allot-t4",
		"qos allot-t1: grace time 30 s → 120 s":                                "sacctmgr -i modify qos where name=allot-t1 set GraceTime=120",
		"qos allot-t3: usage factor 0.3 → 1":                                   "sacctmgr -i modify qos where name=allot-t3 set UsageFactor=1",
		"account nlp: description \"old\" → \"natural language\"":              "sacctmgr -i modify account where name=nlp set 'Description=natural language'",
		"account nlp: fairshare 1 → 3":                                         "sacctmgr -i modify account where name=nlp set Fairshare=3",
		"account nlp: add user alice":                                          "sacctmgr -i add user alice Account=nlp",
		"account nlp: remove user bob (not a member in Allot)":                 "sacctmgr -i remove user where name=bob account=nlp",
		"account vision: default QOS none → \"allot-t3\"":                      "sacctmgr -i modify account where name=vision set QOS=allot-preemptible,allot-t1,allot-t2,allot-t3,allot-t4 DefaultQOS=allot-t3",
	}
	if d := cmp.Diff(wantChanges, got); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
}

func copyState(s slurmpolicy.ClusterState) slurmpolicy.ClusterState {
	out := slurmpolicy.ClusterState{Accounts: map[string]slurmpolicy.Account{}, QOS: map[string]slurmpolicy.QOS{}}
	for k, v := range s.Accounts {
		v.QOS, v.Users = slices.Clone(v.QOS), slices.Clone(v.Users)
		out.Accounts[k] = v
	}
	for k, v := range s.QOS {
		v.Preempt = slices.Clone(v.Preempt)
		out.QOS[k] = v
	}
	return out
}
