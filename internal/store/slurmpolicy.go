package store

import (
	"context"
	"slices"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/slurmpolicy"
	"github.com/jackc/pgx/v5"
)

// SlurmPolicyInput is the live policy as internal/slurmpolicy renders it
// into Slurm: the current policy version, the tiers, the teams, each
// team's members' POSIX accounts (resolved as their jobs resolve them:
// the admin's mapping, else the identity provider's claim, else the team's
// service account; disabled people are left out) and the teams over
// budget (OverBudgetTeams). ClusterName and OverBudgetFile are left for
// the caller, which knows the cluster.
func (s *Store) SlurmPolicyInput(ctx context.Context) (slurmpolicy.Input, error) {
	var in slurmpolicy.Input
	var err error
	if in.Policy, err = s.CurrentPolicy(ctx); err != nil {
		return in, err
	}
	if in.Tiers, err = s.ListTiers(ctx); err != nil {
		return in, err
	}
	if in.Teams, err = s.ListTeams(ctx); err != nil {
		return in, err
	}
	service := map[string]string{}
	for _, t := range in.Teams {
		service[t.Slug] = t.PosixAccount
	}
	rows, err := s.db.Query(ctx, `
		SELECT m.team, u.posix_user, u.oidc_posix_user
		FROM memberships m JOIN users u ON u.id = m.user_id
		WHERE u.disabled_at IS NULL
		ORDER BY m.team, u.id`)
	if err != nil {
		return in, mapErr("loading team members' accounts", err)
	}
	in.Members = map[string][]string{}
	var team, mapped, claimed string
	_, err = pgx.ForEachRow(rows, []any{&team, &mapped, &claimed}, func() error {
		if a, _ := allot.ResolveAccount(mapped, claimed, service[team]); a != "" && !slices.Contains(in.Members[team], a) {
			in.Members[team] = append(in.Members[team], a)
		}
		return nil
	})
	if err != nil {
		return in, mapErr("loading team members' accounts", err)
	}
	if in.OverBudget, err = s.overBudget(ctx, in.Policy, in.Teams); err != nil {
		return in, err
	}
	return in, nil
}

// OverBudgetTeams lists, sorted, the teams whose usage this month is at
// least the policy's demotion threshold (BudgetDemotePct) of their monthly
// GPU-hour budget — the rule the scheduler demotes their tier-3/4 jobs by.
// Teams without a budget are never over.
func (s *Store) OverBudgetTeams(ctx context.Context) ([]string, error) {
	p, err := s.CurrentPolicy(ctx)
	if err != nil {
		return nil, err
	}
	teams, err := s.ListTeams(ctx)
	if err != nil {
		return nil, err
	}
	return s.overBudget(ctx, p, teams)
}

func (s *Store) overBudget(ctx context.Context, p allot.Policy, teams []allot.Team) ([]string, error) {
	now := s.Now()
	rows, err := s.db.Query(ctx, usageSQL("$1", "$2", "", true), MonthStart(now), now)
	if err != nil {
		return nil, mapErr("loading this month's usage", err)
	}
	used := map[string]int64{}
	var team string
	var sec int64
	if _, err := pgx.ForEachRow(rows, []any{&team, &sec}, func() error { used[team] = sec; return nil }); err != nil {
		return nil, mapErr("loading this month's usage", err)
	}
	out := []string{}
	for _, t := range teams {
		budget := t.MonthlyBudgetGPUHours * 3600
		if budget > 0 && used[t.Slug]*100 >= budget*int64(p.BudgetDemotePct) {
			out = append(out, t.Slug)
		}
	}
	slices.Sort(out)
	return out, nil
}
