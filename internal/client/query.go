package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/allotlabs/allot/web"
)

// JobQuery filters JobsQuery: every field narrows the list.
type JobQuery struct {
	Team   string
	States []string // any of these (Allot's names: pending, running, …)
	Users  []string // submitters' emails
	Mine   bool
	Tier   string
	Name   string // substring of the name
	Limit  int    // per page, 1–1000 (the server's default: 100)
	Before int64  // paging: jobs after this one in the list's order
}

func (o JobQuery) values() url.Values {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("team", o.Team)
	set("state", strings.Join(o.States, ","))
	set("user", strings.Join(o.Users, ","))
	if o.Mine {
		q.Set("mine", "1")
	}
	set("tier", o.Tier)
	set("q", o.Name)
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	if o.Before > 0 {
		q.Set("before", fmt.Sprint(o.Before))
	}
	return q
}

// JobsQuery lists one page of jobs, newest first.
func (c *Client) JobsQuery(ctx context.Context, o JobQuery) (web.JobList, error) {
	var l web.JobList
	path := "/api/v1/jobs"
	if q := o.values(); len(q) > 0 {
		path += "?" + q.Encode()
	}
	return l, c.do(ctx, http.MethodGet, path, nil, &l)
}

// AllJobs lists every job matching o, following the pages (o.Limit is
// the page size, 1000 when unset), at most max jobs (0: no limit).
func (c *Client) AllJobs(ctx context.Context, o JobQuery, max int) ([]web.JobJSON, error) {
	if o.Limit == 0 {
		o.Limit = 1000
	}
	var out []web.JobJSON
	for {
		l, err := c.JobsQuery(ctx, o)
		if err != nil {
			return out, err
		}
		out = append(out, l.Jobs...)
		if max > 0 && len(out) >= max {
			return out[:max], nil
		}
		if l.NextBefore == nil {
			return out, nil
		}
		o.Before = *l.NextBefore
	}
}

// JobDetail returns one job with what the server explains about it
// (priority factors, queue position, runs, cost so far).
func (c *Client) JobDetail(ctx context.Context, id int64) (web.JobDetailJSON, error) {
	var j web.JobDetailJSON
	return j, c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v1/jobs/%d", id), nil, &j)
}

// Me returns the caller.
func (c *Client) Me(ctx context.Context) (web.MeJSON, error) {
	var m web.MeJSON
	return m, c.do(ctx, http.MethodGet, "/api/v1/me", nil, &m)
}

// FairShare returns every team's fair-share standing.
func (c *Client) FairShare(ctx context.Context) (web.FairShareJSON, error) {
	var f web.FairShareJSON
	return f, c.do(ctx, http.MethodGet, "/api/v1/fairshare", nil, &f)
}

// TeamBudget returns a team's budget and use this month.
func (c *Client) TeamBudget(ctx context.Context, team string) (web.BudgetJSON, error) {
	var b web.BudgetJSON
	return b, c.do(ctx, http.MethodGet, "/api/v1/teams/"+url.PathEscape(team)+"/budget", nil, &b)
}

// PriorityQuery filters Priorities.
type PriorityQuery struct {
	Team  string
	Mine  bool
	Limit int
}

// Priorities returns the pending jobs the caller can see in the
// scheduler's order, with their priority factors.
func (c *Client) Priorities(ctx context.Context, o PriorityQuery) (web.PrioritiesJSON, error) {
	q := url.Values{}
	if o.Team != "" {
		q.Set("team", o.Team)
	}
	if o.Mine {
		q.Set("mine", "1")
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	path := "/api/v1/priorities"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var p web.PrioritiesJSON
	return p, c.do(ctx, http.MethodGet, path, nil, &p)
}

// NodeUsage returns every node's GPUs: allocated, idle, out of service.
func (c *Client) NodeUsage(ctx context.Context) (web.NodeUsageJSON, error) {
	var n web.NodeUsageJSON
	return n, c.do(ctx, http.MethodGet, "/api/v1/node-usage", nil, &n)
}
