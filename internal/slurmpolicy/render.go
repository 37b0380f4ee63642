// Package slurmpolicy renders Allot's live policy into what a Slurm cluster
// needs — a slurm.conf fragment, the sacctmgr commands for QOS and accounts,
// a job_submit.lua that demotes over-budget accounts, and the over-budget
// list that script reads — and compares what the cluster runs with it
// (ColdFront's `slurm_check --sync` pattern: read with `sacctmgr show`,
// diff, fix with `sacctmgr -i`).
//
// Rendering is pure (Render); ReadClusterState and Apply run the sacctmgr
// CLI with the environment they are given (SLURM_CONF=...).
//
// The mapping, and the decisions behind it:
//
//   - Tier ↔ QOS allot-t1 … allot-t4, allot-preemptible (QOSName,
//     TierOfQOS). A QOS's Priority is its tier's rank by class order: the
//     most important class gets the highest Priority (the number of
//     distinct class orders), the least important 1; tiers sharing a class
//     order share a Priority.
//   - PriorityWeightQOS dominates: it is (distinct classes) × (fair-share +
//     size + age weights + 1), so one class step of the QOS factor (1/D of
//     the weight) outweighs every other factor together, as Allot's classes
//     do. The fair-share, job-size and age weights are Allot's own.
//   - Preemption: PreemptType=preempt/qos, PreemptMode=REQUEUE; a tier's QOS
//     Preempt= lists the QOS of its tiers.may_preempt; every Allot QOS has
//     PreemptMode=requeue and GraceTime = the policy's grace period (Slurm
//     sends SIGTERM, then SIGKILL once the grace time is over).
//     The policy's minimum runtime becomes PreemptExemptTime (when > 0).
//     Measured on Debian's 22.05: the SIGTERM that starts the grace time
//     goes to the job's steps (srun) only, not to its batch shell; the
//     batch script's own processes get SIGTERM when the grace time is
//     over, KillWait before SIGKILL. Work that checkpoints on SIGTERM
//     should run under srun.
//   - UsageFactor stays 1 on every QOS (rendered explicitly, so a hand edit
//     shows in the diff): Allot's fair share counts every GPU-second alike
//     whatever the tier, and the tier multiplier is a price, which Allot's
//     chargeback applies to the imported accounting. A UsageFactor of 0.3
//     would change Slurm's fair share away from Allot's and, with the
//     chargeback, discount twice.
//   - No MaxWall from the tiers' maximum runtime: Slurm refuses a job over
//     its QOS's MaxWall at submission, and a demoted tier-3 job must never
//     be refused because the preemptible tier's limit is shorter.
//   - Team ↔ account (same name as the slug), Fairshare = the team's
//     fair-share weight, Description = the team's name, Organization = its
//     cost center; QOS = every Allot QOS, DefaultQOS = allot-t3. Users: the
//     members' POSIX accounts (resolved as jobs resolve them) and the team's
//     service account. Users' own associations keep Slurm's defaults
//     (fairshare 1 under the account).
//   - Only Allot's objects are compared and changed: QOS named allot-*, and
//     accounts named like a team. Other QOS and accounts are left alone;
//     users of a team's account who are not (or no longer) members are
//     removed from it.
package slurmpolicy

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// QOS names.
const (
	QOSPrefix      = "allot-"
	QOSPreemptible = "allot-preemptible"
	// DefaultQOS is every Allot account's default QOS (tier 3).
	DefaultQOS = "allot-t3"
	// DemotedTag is appended (after a space) to the comment of a job that
	// job_submit.lua moved to QOSPreemptible.
	DemotedTag = "allot:demoted-over-budget"
	// DefaultOverBudgetFile is where the over-budget list lives unless the
	// input names another path.
	DefaultOverBudgetFile = "/etc/slurm/allot-over-budget"
	// DefaultRefresh is how often job_submit.lua re-reads the list.
	DefaultRefresh = 10 * time.Second
)

// QOSName is the QOS of a tier: allot-t1 … allot-t4, allot-preemptible.
func QOSName(tier string) string {
	if tier == string(allot.TierPreemptible) {
		return QOSPreemptible
	}
	return QOSPrefix + "t" + tier
}

// TierOfQOS is the tier of one of Allot's QOS (any case); ok is false for
// every other QOS.
func TierOfQOS(qos string) (tier string, ok bool) {
	q := strings.ToLower(strings.TrimSpace(qos))
	if q == QOSPreemptible {
		return string(allot.TierPreemptible), true
	}
	rest, found := strings.CutPrefix(q, QOSPrefix+"t")
	if !found {
		return "", false
	}
	for _, t := range allot.Tiers {
		if string(t) == rest && t != allot.TierPreemptible {
			return rest, true
		}
	}
	return "", false
}

// Input is the live policy a rendering is made from.
type Input struct {
	// ClusterName names the cluster in the files' headers only (sacctmgr
	// works on the cluster of SLURM_CONF).
	ClusterName string
	Tiers       []allot.Tier
	Policy      allot.Policy
	Teams       []allot.Team
	// Members maps a team slug to the POSIX accounts of its members
	// (resolved like jobs resolve accounts).
	Members map[string][]string
	// OverBudget lists the teams over their budget (their accounts).
	OverBudget []string
	// OverBudgetFile is the path job_submit.lua reads the list from
	// ("" = DefaultOverBudgetFile); baked into the script.
	OverBudgetFile string
	// OverBudgetRefresh is how often the script re-reads the file (0 =
	// DefaultRefresh).
	OverBudgetRefresh time.Duration
}

// Rendered is what Render makes: four files and the desired state they
// describe.
type Rendered struct {
	SlurmConf      string // slurm.conf fragment
	Sacctmgr       string // idempotent shell script of sacctmgr commands
	JobSubmitLua   string // job_submit.lua (next to slurm.conf)
	OverBudgetList string // the content of the over-budget file
	Desired        ClusterState
}

// ClusterState is Allot's part of what a cluster's accounting holds.
type ClusterState struct {
	Accounts map[string]Account
	QOS      map[string]QOS
}

// Account is one account and its account-level association.
type Account struct {
	Description  string
	Organization string
	Shares       int      // 0 when the association's share is not a number ("parent")
	QOS          []string // sorted
	DefaultQOS   string
	Users        []string // sorted
}

// QOS is one QOS's preemption and priority settings.
type QOS struct {
	Priority    int
	Preempt     []string // sorted
	PreemptMode string   // lower case: "requeue", "cancel", "cluster", ...
	GraceTime   int      // seconds
	UsageFactor float64
}

// Render turns the policy into the four files.
func Render(in Input) Rendered {
	if in.OverBudgetFile == "" {
		in.OverBudgetFile = DefaultOverBudgetFile
	}
	if in.OverBudgetRefresh <= 0 {
		in.OverBudgetRefresh = DefaultRefresh
	}
	d := desired(in)
	return Rendered{
		SlurmConf:      renderConf(in),
		Sacctmgr:       renderSacctmgr(in, d),
		JobSubmitLua:   renderLua(in),
		OverBudgetList: renderList(in),
		Desired:        d,
	}
}

// qosPriorities gives each tier its QOS priority: the number of distinct
// class orders for the most important, down to 1; and that number.
func qosPriorities(tiers []allot.Tier) (map[allot.TierID]int, int) {
	var orders []int
	for _, t := range tiers {
		orders = append(orders, t.ClassOrder)
	}
	slices.Sort(orders)
	orders = slices.Compact(orders)
	p := map[allot.TierID]int{}
	for _, t := range tiers {
		i, _ := slices.BinarySearch(orders, t.ClassOrder)
		p[t.ID] = len(orders) - i
	}
	return p, len(orders)
}

// WeightQOS is PriorityWeightQOS for the policy and tiers: one class step
// outweighs all other factors together.
func WeightQOS(p allot.Policy, tiers []allot.Tier) int {
	_, n := qosPriorities(tiers)
	return max(n, 1) * (p.WeightFairShare + p.WeightSize + p.WeightAge + 1)
}

// sortedTiers orders tiers by class order, then id.
func sortedTiers(tiers []allot.Tier) []allot.Tier {
	out := slices.Clone(tiers)
	slices.SortStableFunc(out, func(a, b allot.Tier) int {
		return cmp.Or(cmp.Compare(a.ClassOrder, b.ClassOrder), cmp.Compare(a.ID.Class(), b.ID.Class()))
	})
	return out
}

// allQOS is every Allot QOS of the tiers, sorted by name.
func allQOS(tiers []allot.Tier) []string {
	var q []string
	for _, t := range tiers {
		q = append(q, QOSName(string(t.ID)))
	}
	slices.Sort(q)
	return slices.Compact(q)
}

func desired(in Input) ClusterState {
	d := ClusterState{Accounts: map[string]Account{}, QOS: map[string]QOS{}}
	prio, _ := qosPriorities(in.Tiers)
	grace := int(in.Policy.GracePeriod / time.Second)
	for _, t := range in.Tiers {
		q := QOS{Priority: prio[t.ID], PreemptMode: "requeue", GraceTime: grace, UsageFactor: 1, Preempt: []string{}}
		for _, v := range t.MayPreempt {
			q.Preempt = append(q.Preempt, QOSName(string(v)))
		}
		slices.Sort(q.Preempt)
		q.Preempt = slices.Compact(q.Preempt)
		d.QOS[QOSName(string(t.ID))] = q
	}
	qos := allQOS(in.Tiers)
	def := ""
	if slices.Contains(qos, DefaultQOS) {
		def = DefaultQOS
	}
	for _, t := range in.Teams {
		users := map[string]bool{}
		for _, u := range in.Members[t.Slug] {
			if u = strings.ToLower(strings.TrimSpace(u)); u != "" {
				users[u] = true
			}
		}
		if t.PosixAccount != "" {
			users[strings.ToLower(t.PosixAccount)] = true
		}
		var us []string
		for u := range users {
			us = append(us, u)
		}
		slices.Sort(us)
		if us == nil {
			us = []string{}
		}
		d.Accounts[strings.ToLower(t.Slug)] = Account{Description: SlurmText(t.Name), Organization: SlurmText(t.CostCenter),
			Shares: t.FairShareWeight, QOS: slices.Clone(qos), DefaultQOS: def, Users: us}
	}
	return d
}

// SlurmText is s as Slurm's accounting stores a description or an
// organization: sacctmgr lower-cases them (ASCII letters) and turns
// quotes into backquotes; '|' (the parsable output's separator) and line breaks become
// '/' and ' ' here so what is read back matches.
func SlurmText(s string) string {
	s = strings.NewReplacer(`'`, "`", `"`, "`", "|", "/", "\n", " ", "\r", " ", "\t", " ").Replace(strings.TrimSpace(s))
	// sacctmgr lower-cases byte by byte in the C locale: ASCII letters only.
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// slurmDuration formats d as a slurm.conf time: days-hours:minutes:seconds
// in whole minutes (rounded up, at least one).
func slurmDuration(d time.Duration) string {
	m := int64((d + time.Minute - 1) / time.Minute)
	m = max(m, 1)
	return fmt.Sprintf("%d-%02d:%02d:00", m/(24*60), m/60%24, m%60)
}

func header(in Input, what string) string {
	cl := ""
	if in.ClusterName != "" {
		cl = " for cluster " + oneLine(in.ClusterName)
	}
	return fmt.Sprintf("%s generated by Allot from policy version %d%s.\nDo not edit by hand: change the policy in Allot, which renders this again.", what, in.Policy.Version, cl)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func comment(prefix, text string) string {
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		b.WriteString(strings.TrimRight(prefix+" "+l, " ") + "\n")
	}
	return b.String()
}

func renderConf(in Input) string {
	p := in.Policy
	var b strings.Builder
	b.WriteString(comment("#", header(in, "slurm.conf fragment")+"\nAppend it to slurm.conf; job_submit.lua goes next to slurm.conf."))
	b.WriteString("#\n# Priority: Allot's weights; the QOS (the tier) dominates, as Allot's classes do.\n")
	fmt.Fprintf(&b, "PriorityType=priority/multifactor\n")
	fmt.Fprintf(&b, "PriorityWeightQOS=%d\n", WeightQOS(p, in.Tiers))
	fmt.Fprintf(&b, "PriorityWeightFairshare=%d\n", p.WeightFairShare)
	fmt.Fprintf(&b, "PriorityWeightJobSize=%d\n", p.WeightSize)
	fmt.Fprintf(&b, "PriorityWeightAge=%d\n", p.WeightAge)
	fmt.Fprintf(&b, "PriorityWeightPartition=0\n")
	fmt.Fprintf(&b, "PriorityWeightAssoc=0\n")
	fmt.Fprintf(&b, "PriorityDecayHalfLife=%s\n", slurmDuration(p.HalfLife))
	fmt.Fprintf(&b, "PriorityMaxAge=%s\n", slurmDuration(p.MaxAge))
	b.WriteString("#\n# Preemption: a tier's QOS preempts the QOS of the tiers it may preempt; a preempted job gets SIGTERM\n")
	b.WriteString("# (its srun steps), runs on for its QOS's GraceTime (Allot's grace period), then is requeued.\n")
	b.WriteString("PreemptType=preempt/qos\n")
	b.WriteString("PreemptMode=REQUEUE\n")
	if p.MinRuntime > 0 {
		b.WriteString("# Allot's minimum runtime: no job is preempted sooner after it starts.\n")
		fmt.Fprintf(&b, "PreemptExemptTime=%s\n", slurmDuration(p.MinRuntime))
	}
	b.WriteString("#\n# Over-budget demotion at submission (job_submit.lua).\n")
	b.WriteString("JobSubmitPlugins=lua\n")
	b.WriteString("#\n# QOS and accounts need accounting (slurmdbd); enforcing them makes the QOS of a job count.\n")
	b.WriteString("#AccountingStorageEnforce=associations,limits,qos\n")
	b.WriteString("# Accounting keeps the comment that names the Allot job (allot:job=<id>) and GPUs as a TRES.\n")
	b.WriteString("AccountingStoreFlags=job_comment\n")
	b.WriteString("#AccountingStorageTRES=gres/gpu\n")
	return b.String()
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,=/:@+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// commandLine is args as one shell command line.
func commandLine(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

func qosSettings(q QOS) []string {
	return []string{"Priority=" + strconv.Itoa(q.Priority), "PreemptMode=" + q.PreemptMode,
		"GraceTime=" + strconv.Itoa(q.GraceTime), "UsageFactor=" + formatFactor(q.UsageFactor)}
}

func formatFactor(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func renderSacctmgr(in Input, d ClusterState) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	b.WriteString(comment("#", header(in, "sacctmgr commands")+"\nSafe to run again: an add of what exists fails harmlessly, every modify sets the same values.\nUsers of Allot's accounts who are not members are not removed here; the admin page's sync removes them."))
	b.WriteString("set -u\nS=\"sacctmgr -i\"\n")
	b.WriteString("\n# QOS, one per tier (created first: Preempt= names other QOS).\n")
	names := slices.Sorted(maps.Keys(d.QOS))
	for _, n := range names {
		fmt.Fprintf(&b, "$S add qos %s >/dev/null 2>&1 || true\n", shellQuote(n))
	}
	for _, t := range sortedTiers(in.Tiers) {
		n := QOSName(string(t.ID))
		q := d.QOS[n]
		fmt.Fprintf(&b, "# tier %s (%s), class order %d\n", t.ID, oneLine(t.Name), t.ClassOrder)
		args := append([]string{"modify", "qos", "where", "name=" + n, "set"}, qosSettings(q)...)
		args = append(args, "Preempt="+strings.Join(q.Preempt, ","))
		fmt.Fprintf(&b, "$S %s\n", commandLine(args))
	}
	b.WriteString("\n# Accounts, one per team, with their members' POSIX accounts.\n")
	for _, a := range slices.Sorted(maps.Keys(d.Accounts)) {
		acc := d.Accounts[a]
		fmt.Fprintf(&b, "$S add account %s >/dev/null 2>&1 || true\n", shellQuote(a))
		fmt.Fprintf(&b, "$S %s\n", commandLine([]string{"modify", "account", "where", "name=" + a, "set",
			"Description=" + acc.Description, "Organization=" + acc.Organization}))
		fmt.Fprintf(&b, "$S %s\n", commandLine(accountAssocArgs(a, acc)))
		for _, u := range acc.Users {
			fmt.Fprintf(&b, "$S add user %s Account=%s >/dev/null 2>&1 || true\n", shellQuote(u), shellQuote(a))
		}
	}
	return b.String()
}

func accountAssocArgs(name string, a Account) []string {
	args := []string{"modify", "account", "where", "name=" + name, "set", "Fairshare=" + strconv.Itoa(a.Shares), "QOS=" + strings.Join(a.QOS, ",")}
	if a.DefaultQOS != "" {
		args = append(args, "DefaultQOS="+a.DefaultQOS)
	}
	return args
}

// luaQuote is s as a Lua 5.1 string literal.
func luaQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, "\\%03d", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func renderLua(in Input) string {
	var demoted []string
	for _, t := range []allot.TierID{allot.Tier3, allot.Tier4} {
		demoted = append(demoted, "["+luaQuote(QOSName(string(t)))+"] = true")
	}
	r := strings.NewReplacer(
		"@HEADER@", comment("--", header(in, "job_submit.lua")),
		"@FILE@", luaQuote(in.OverBudgetFile),
		"@REFRESH@", strconv.Itoa(max(1, int(in.OverBudgetRefresh/time.Second))),
		"@PREEMPTIBLE@", luaQuote(QOSPreemptible),
		"@DEMOTED@", strings.Join(demoted, ", "),
		"@TAG@", luaQuote(DemotedTag),
	)
	return r.Replace(luaTemplate)
}

// luaTemplate is job_submit.lua (Lua 5.1, which Debian's Slurm links). It
// never refuses a job: every error is logged and the job goes on as
// submitted.
const luaTemplate = `@HEADER@--
-- Jobs of accounts listed in the over-budget file (one account a line, '#'
-- starts a comment) whose QOS is tier 3, tier 4 or unset (the default,
-- tier 3) are moved to the preemptible QOS at submission, with a note to
-- the submitter. Production tiers are never demoted. Slurm runs this while
-- holding its locks, so the file is read at most once every
-- REFRESH_SECONDS; a missing or unreadable file means no account is over.

local OVER_BUDGET_FILE = @FILE@
local REFRESH_SECONDS = @REFRESH@
local PREEMPTIBLE_QOS = @PREEMPTIBLE@
local DEMOTED_QOS = { @DEMOTED@ }
local DEMOTED_TAG = @TAG@

local over_budget = {}
local loaded_at = nil

local function trim(s)
	return (string.gsub(s, "^%s*(.-)%s*$", "%1"))
end

local function current_list(now)
	if loaded_at ~= nil and now >= loaded_at and now - loaded_at < REFRESH_SECONDS then
		return over_budget
	end
	loaded_at = now
	local list = {}
	local f = io.open(OVER_BUDGET_FILE, "r")
	if f ~= nil then
		for line in f:lines() do
			line = trim((string.gsub(line, "#.*$", "")))
			if line ~= "" then
				list[string.lower(line)] = true
			end
		end
		f:close()
	end
	over_budget = list
	return list
end

local function demote(job_desc)
	local account = job_desc.account
	if account == nil or account == "" then
		account = job_desc.default_account
	end
	if account == nil or account == "" then
		return
	end
	account = string.lower(account)
	if not current_list(os.time())[account] then
		return
	end
	local qos = job_desc.qos
	if qos ~= nil and qos ~= "" and not DEMOTED_QOS[string.lower(qos)] then
		return
	end
	job_desc.qos = PREEMPTIBLE_QOS
	local c = job_desc.comment
	if c == nil or c == "" then
		job_desc.comment = DEMOTED_TAG
	elseif not string.find(c, DEMOTED_TAG, 1, true) then
		job_desc.comment = c .. " " .. DEMOTED_TAG
	end
	slurm.log_user("%s", "account " .. account .. " is over its GPU-hour budget; job runs as preemptible")
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local ok, err = pcall(demote, job_desc)
	if not ok then
		slurm.log_error("allot job_submit.lua: %s", tostring(err))
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

return slurm.SUCCESS
`

func renderList(in Input) string {
	var b strings.Builder
	b.WriteString(comment("#", fmt.Sprintf("Accounts at %d %% of their monthly GPU-hour budget or more, one a line, written by Allot (policy version %d).\n"+
		"Their tier-3/4 jobs run as preemptible (job_submit.lua).", in.Policy.BudgetDemotePct, in.Policy.Version)))
	teams := slices.Clone(in.OverBudget)
	for i := range teams {
		teams[i] = strings.ToLower(strings.TrimSpace(teams[i]))
	}
	slices.Sort(teams)
	for _, t := range slices.Compact(teams) {
		if t != "" {
			b.WriteString(t + "\n")
		}
	}
	return b.String()
}
