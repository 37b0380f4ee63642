package slurmpolicy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Change is one difference between what Allot renders and what the
// cluster runs, and the sacctmgr command that removes it.
type Change struct {
	// Object is what changes: "qos allot-t1", "account nlp".
	Object string `json:"object"`
	// Text says it for people: "account nlp: fairshare 1 → 3".
	Text string `json:"text"`
	// Args are sacctmgr's arguments (after -i).
	Args []string `json:"args"`
}

// Command is the change as a shell command line.
func (c Change) Command() string { return "sacctmgr -i " + commandLine(c.Args) }

func (c Change) String() string { return c.Text }

func list(v []string) string {
	if len(v) == 0 {
		return "none"
	}
	return strings.Join(v, ",")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return strconv.Quote(s)
}

// Diff lists the changes that bring actual to desired, in an order they
// can be applied in: new QOS, QOS settings (Preempt= after every QOS
// exists), new accounts, account settings, users added, users removed.
// Only desired's QOS and accounts are looked at; others in actual are
// left alone.
func Diff(desired, actual ClusterState) []Change {
	var adds, mods, acctAdds, acctMods, userAdds, userRemoves []Change
	for _, n := range slices.Sorted(maps.Keys(desired.QOS)) {
		want := desired.QOS[n]
		have, ok := actual.QOS[n]
		obj := "qos " + n
		if !ok {
			adds = append(adds, Change{Object: obj, Text: fmt.Sprintf("qos %s: missing, add it (priority %d, preempt %s, preempt mode %s, grace time %d s)",
				n, want.Priority, list(want.Preempt), want.PreemptMode, want.GraceTime),
				Args: append([]string{"add", "qos", n}, qosSettings(want)...)})
			if len(want.Preempt) > 0 {
				mods = append(mods, Change{Object: obj, Text: fmt.Sprintf("qos %s: preempt none → %s", n, list(want.Preempt)),
					Args: qosSet(n, "Preempt="+strings.Join(want.Preempt, ","))})
			}
			continue
		}
		if have.Priority != want.Priority {
			mods = append(mods, Change{Object: obj, Text: fmt.Sprintf("qos %s: priority %d → %d", n, have.Priority, want.Priority),
				Args: qosSet(n, "Priority="+strconv.Itoa(want.Priority))})
		}
		if !slices.Equal(have.Preempt, want.Preempt) {
			mods = append(mods, Change{Object: obj, Text: fmt.Sprintf("qos %s: preempt %s → %s", n, list(have.Preempt), list(want.Preempt)),
				Args: qosSet(n, "Preempt="+strings.Join(want.Preempt, ","))})
		}
		if have.PreemptMode != want.PreemptMode {
			mods = append(mods, Change{Object: obj, Text: fmt.Sprintf("qos %s: preempt mode %s → %s", n, have.PreemptMode, want.PreemptMode),
				Args: qosSet(n, "PreemptMode="+want.PreemptMode)})
		}
		if have.GraceTime != want.GraceTime {
			mods = append(mods, Change{Object: obj, Text: fmt.Sprintf("qos %s: grace time %d s → %d s", n, have.GraceTime, want.GraceTime),
				Args: qosSet(n, "GraceTime="+strconv.Itoa(want.GraceTime))})
		}
		if have.UsageFactor != want.UsageFactor {
			mods = append(mods, Change{Object: obj, Text: fmt.Sprintf("qos %s: usage factor %s → %s", n, formatFactor(have.UsageFactor), formatFactor(want.UsageFactor)),
				Args: qosSet(n, "UsageFactor="+formatFactor(want.UsageFactor))})
		}
	}
	for _, n := range slices.Sorted(maps.Keys(desired.Accounts)) {
		want := desired.Accounts[n]
		have, ok := actual.Accounts[n]
		obj := "account " + n
		if !ok {
			args := []string{"add", "account", n, "Description=" + want.Description, "Organization=" + want.Organization,
				"Fairshare=" + strconv.Itoa(want.Shares), "QOS=" + strings.Join(want.QOS, ",")}
			if want.DefaultQOS != "" {
				args = append(args, "DefaultQOS="+want.DefaultQOS)
			}
			acctAdds = append(acctAdds, Change{Object: obj, Text: fmt.Sprintf("account %s: missing, add it (fairshare %d, QOS %s, default QOS %s)",
				n, want.Shares, list(want.QOS), want.DefaultQOS), Args: args})
			have.Users = nil
		} else {
			if have.Description != want.Description {
				acctMods = append(acctMods, Change{Object: obj, Text: fmt.Sprintf("account %s: description %s → %s", n, orNone(have.Description), orNone(want.Description)),
					Args: accountSet(n, "Description="+want.Description)})
			}
			if have.Organization != want.Organization {
				acctMods = append(acctMods, Change{Object: obj, Text: fmt.Sprintf("account %s: organization %s → %s", n, orNone(have.Organization), orNone(want.Organization)),
					Args: accountSet(n, "Organization="+want.Organization)})
			}
			if have.Shares != want.Shares {
				from := strconv.Itoa(have.Shares)
				if have.Shares == 0 {
					from = "parent"
				}
				acctMods = append(acctMods, Change{Object: obj, Text: fmt.Sprintf("account %s: fairshare %s → %d", n, from, want.Shares),
					Args: accountSet(n, "Fairshare="+strconv.Itoa(want.Shares))})
			}
			// QOS and the default together: the default must be in the list.
			if !slices.Equal(have.QOS, want.QOS) || have.DefaultQOS != want.DefaultQOS {
				args := accountSet(n, "QOS="+strings.Join(want.QOS, ","))
				text := fmt.Sprintf("account %s: QOS %s → %s", n, list(have.QOS), list(want.QOS))
				if have.DefaultQOS != want.DefaultQOS {
					text = fmt.Sprintf("account %s: default QOS %s → %s", n, orNone(have.DefaultQOS), orNone(want.DefaultQOS))
					if !slices.Equal(have.QOS, want.QOS) {
						text = fmt.Sprintf("account %s: QOS %s → %s, default QOS %s → %s", n, list(have.QOS), list(want.QOS), orNone(have.DefaultQOS), orNone(want.DefaultQOS))
					}
				}
				if want.DefaultQOS != "" {
					args = append(args, "DefaultQOS="+want.DefaultQOS)
				} else {
					args = append(args, "DefaultQOS=-1")
				}
				acctMods = append(acctMods, Change{Object: obj, Text: text, Args: args})
			}
		}
		for _, u := range want.Users {
			if !slices.Contains(have.Users, u) {
				userAdds = append(userAdds, Change{Object: obj, Text: fmt.Sprintf("account %s: add user %s", n, u),
					Args: []string{"add", "user", u, "Account=" + n}})
			}
		}
		for _, u := range have.Users {
			if !slices.Contains(want.Users, u) {
				userRemoves = append(userRemoves, Change{Object: obj, Text: fmt.Sprintf("account %s: remove user %s (not a member in Allot)", n, u),
					Args: []string{"remove", "user", "where", "name=" + u, "account=" + n}})
			}
		}
	}
	return slices.Concat(adds, mods, acctAdds, acctMods, userAdds, userRemoves)
}

func qosSet(name string, settings ...string) []string {
	return append([]string{"modify", "qos", "where", "name=" + name, "set"}, settings...)
}

func accountSet(name string, settings ...string) []string {
	return append([]string{"modify", "account", "where", "name=" + name, "set"}, settings...)
}

// Apply runs the changes' commands in order with `sacctmgr -i` and env. It
// stops at the first that fails; the error names that change and how many
// before it were applied.
func Apply(ctx context.Context, env []string, changes []Change) error {
	for i, c := range changes {
		if _, err := sacctmgr(ctx, env, append([]string{"-i"}, c.Args...)...); err != nil {
			return fmt.Errorf("%s (after %d of %d changes applied): %w", c.Text, i, len(changes), err)
		}
	}
	return nil
}
