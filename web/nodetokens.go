package web

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// Node tokens, for admins: the portal page /admin/node-tokens and the
// JSON API under /api/v1/node-tokens. Lists never show a secret, only a
// token's prefix; a new token's secret is in the answer that made it and
// nowhere else. Every change is audited by the store.

// NodeTokenJSON is a node token as the API shows it; Token (the secret)
// is only in the answer to its creation or rotation.
type NodeTokenJSON struct {
	ID         int64      `json:"id"`
	Node       string     `json:"node"`
	Prefix     string     `json:"prefix"`
	Status     string     `json:"status"` // active, revoked
	CreatedBy  string     `json:"created_by"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	RevokedBy  string     `json:"revoked_by,omitempty"`
	Token      string     `json:"token,omitempty"`
}

// NodeTokenList is the body of GET /api/v1/node-tokens.
type NodeTokenList struct {
	NodeTokens []NodeTokenJSON `json:"node_tokens"`
}

// NodeTokenRequest is the body of POST /api/v1/node-tokens.
type NodeTokenRequest struct {
	Node string `json:"node"`
}

// NodeTokenRevoked is the answer to revoking node tokens: the tokens, and
// whether anything changed (false: they were revoked already).
type NodeTokenRevoked struct {
	Revoked []NodeTokenJSON `json:"revoked"`
	Changed bool            `json:"changed"`
}

// NodeTokenRotated is the answer to POST /api/v1/nodes/{node}/rotate-token:
// the new token (with its secret) and the ones it replaced.
type NodeTokenRotated struct {
	NodeToken NodeTokenJSON   `json:"node_token"`
	Revoked   []NodeTokenJSON `json:"revoked"`
}

func optTime(v time.Time) *time.Time {
	if v.IsZero() {
		return nil
	}
	v = v.UTC()
	return &v
}

func nodeTokenStatus(t *store.NodeToken) string {
	if t.Active() {
		return "active"
	}
	return "revoked"
}

func nodeTokenJSON(t *store.NodeToken) NodeTokenJSON {
	return NodeTokenJSON{ID: t.ID, Node: t.Node, Prefix: t.Prefix, Status: nodeTokenStatus(t), CreatedBy: t.CreatedBy, CreatedAt: t.CreatedAt.UTC(),
		LastUsedAt: optTime(t.LastUsedAt), RevokedAt: optTime(t.RevokedAt), RevokedBy: t.RevokedBy}
}

func nodeTokensJSON(list []store.NodeToken) []NodeTokenJSON {
	out := []NodeTokenJSON{}
	for i := range list {
		out = append(out, nodeTokenJSON(&list[i]))
	}
	return out
}

// optionalBody reads the request's JSON body into a T when it has one;
// an empty body is a zero T.
func optionalBody[T any](c echo.Context) (T, error) {
	var body T
	if c.Request().ContentLength == 0 {
		return body, nil
	}
	return body, decodeStrict(c.Request().Body, &body)
}

func (s *Server) apiListNodeTokens(c echo.Context) error {
	list, err := s.st.ListNodeTokens(c.Request().Context(), c.QueryParam("node"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, NodeTokenList{NodeTokens: nodeTokensJSON(list)})
}

func (s *Server) apiCreateNodeToken(c echo.Context) error {
	u, req, err := userAndBody[NodeTokenRequest](c)
	if err != nil {
		return err
	}
	res, err := s.st.IssueNodeToken(c.Request().Context(), req.Node, u.Email, false)
	if err != nil {
		return err
	}
	out := nodeTokenJSON(&res.Token)
	out.Token = res.Secret
	c.Response().Header().Set("Location", "/api/v1/node-tokens/"+strconv.FormatInt(res.Token.ID, 10))
	return writeJSON(c, http.StatusCreated, out)
}

func (s *Server) apiRotateNodeToken(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	if _, err := optionalBody[struct{}](c); err != nil {
		return err
	}
	res, err := s.st.IssueNodeToken(c.Request().Context(), c.Param("name"), u.Email, true)
	if err != nil {
		return err
	}
	out := NodeTokenRotated{NodeToken: nodeTokenJSON(&res.Token), Revoked: nodeTokensJSON(res.Revoked)}
	out.NodeToken.Token = res.Secret
	return writeJSON(c, http.StatusCreated, out)
}

// apiRevokeNodeTokens revokes every token of the node in the path.
func (s *Server) apiRevokeNodeTokens(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	if _, err := optionalBody[struct{}](c); err != nil {
		return err
	}
	list, err := s.st.RevokeNodeTokensOf(c.Request().Context(), c.Param("name"), u.Email)
	if err != nil {
		return err
	}
	s.contacts.forgetNode(c.Param("name"))
	return writeJSON(c, http.StatusOK, NodeTokenRevoked{Revoked: nodeTokensJSON(list), Changed: len(list) > 0})
}

// nodeTokenID reads the :id of the path; anything but a positive number
// is a token that does not exist.
func nodeTokenID(c echo.Context) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id < 1 {
		return 0, allot.Errorf(allot.ENotFound, "no node token %q", c.Param("id"))
	}
	return id, nil
}

func (s *Server) apiRevokeNodeToken(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	id, err := nodeTokenID(c)
	if err != nil {
		return err
	}
	t, changed, err := s.st.RevokeNodeToken(c.Request().Context(), id, u.Email)
	if err != nil {
		return err
	}
	s.contacts.forgetNode(t.Node) // its other tokens are learnt again at their next request
	return writeJSON(c, http.StatusOK, NodeTokenRevoked{Revoked: []NodeTokenJSON{nodeTokenJSON(&t)}, Changed: changed})
}

// ---- Portal

func (s *Server) adminNodeTokensPage(c echo.Context) error {
	a := views.AdminNodeTokens{Node: c.QueryParam("node")}
	if id, err := strconv.ParseInt(c.QueryParam("revoked"), 10, 64); err == nil {
		a.Saved = fmt.Sprintf("Node token %d is revoked.", id)
	}
	return s.renderNodeTokens(c, http.StatusOK, a)
}

func (s *Server) renderNodeTokens(c echo.Context, status int, a views.AdminNodeTokens) error {
	ctx := c.Request().Context()
	list, err := s.st.ListNodeTokens(ctx, a.Node)
	if allot.ErrorCode(err) == allot.ENotFound { // ?node= names no node: all of them
		if a.Errors == nil {
			a.Errors = map[string]string{"node": fmt.Sprintf("unknown node %q", a.Node)}
		}
		a.Node = ""
		list, err = s.st.ListNodeTokens(ctx, "")
	}
	if err != nil {
		return err
	}
	nodes, err := s.st.ListNodes(ctx)
	if err != nil {
		return err
	}
	a.Page = s.page(c, "Node tokens")
	for _, n := range nodes {
		a.Nodes = append(a.Nodes, views.Option{Value: n.Name, Label: n.Name})
	}
	for i := range list {
		t := &list[i]
		row := views.NodeTokenRow{ID: t.ID, Node: t.Node, Prefix: t.Prefix, CreatedBy: t.CreatedBy, Created: fmtTime(t.CreatedAt),
			LastUsed: fmtTime(t.LastUsedAt), Status: "active", Active: t.Active()}
		if !t.Active() {
			row.Status = "revoked " + fmtTime(t.RevokedAt)
			if t.RevokedBy != "" {
				row.Status += " by " + t.RevokedBy
			}
		}
		a.Tokens = append(a.Tokens, row)
	}
	return render(c, status, views.AdminNodeTokensView(a))
}

// nodeTokenFormError shows the page again with what went wrong: field
// errors by field, a refusal under "_form"; other errors are errors.
func (s *Server) nodeTokenFormError(c echo.Context, node string, err error) error {
	errs, err := formErrors(err)
	if err != nil {
		return err
	}
	return s.renderNodeTokens(c, http.StatusUnprocessableEntity, views.AdminNodeTokens{Node: node, Errors: errs})
}

// adminCreateNodeTokenForm makes a token for the form's node and shows
// its secret once.
func (s *Server) adminCreateNodeTokenForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	node := c.FormValue("node")
	res, err := s.st.IssueNodeToken(c.Request().Context(), node, u.Email, false)
	if err != nil {
		return s.nodeTokenFormError(c, "", err)
	}
	return s.renderNodeTokens(c, http.StatusCreated, views.AdminNodeTokens{Node: node, NewSecret: res.Secret, NewNode: node})
}

// adminRotateNodeTokenForm rotates the form's node's token after the
// confirm step (confirm.go) and shows the new secret once.
func (s *Server) adminRotateNodeTokenForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	node := c.FormValue("node")
	if !confirmed(c) {
		nodes, err := s.st.ListNodes(c.Request().Context())
		if err != nil {
			return err
		}
		known := false
		for _, n := range nodes {
			known = known || n.Name == node
		}
		if !known {
			return s.nodeTokenFormError(c, "", (allot.FieldErrors{"node": fmt.Sprintf("unknown node %q", node)}).Err())
		}
		return s.confirmPage(c, views.RotateNodeTokenQuestion("page", node), "/admin/node-tokens/rotate",
			[]views.Option{{Value: "node", Label: node}}, "/admin/node-tokens?node="+url.QueryEscape(node))
	}
	res, err := s.st.IssueNodeToken(c.Request().Context(), node, u.Email, true)
	if err != nil {
		return s.nodeTokenFormError(c, "", err)
	}
	a := views.AdminNodeTokens{Node: node, NewSecret: res.Secret, NewNode: node}
	for _, t := range res.Revoked {
		a.Revoked = append(a.Revoked, fmt.Sprintf("%d (%s…)", t.ID, t.Prefix))
	}
	return s.renderNodeTokens(c, http.StatusCreated, a)
}

// adminRevokeNodeTokenForm revokes one token after the confirm step.
func (s *Server) adminRevokeNodeTokenForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	id, err := nodeTokenID(c)
	if err != nil {
		return err
	}
	if !confirmed(c) {
		list, err := s.st.ListNodeTokens(c.Request().Context(), "")
		if err != nil {
			return err
		}
		for _, t := range list {
			if t.ID == id {
				return s.confirmPage(c, views.RevokeNodeTokenQuestion(t.ID, t.Node, t.Prefix), "/admin/node-tokens/"+strconv.FormatInt(id, 10)+"/revoke",
					nil, "/admin/node-tokens")
			}
		}
		return allot.Errorf(allot.ENotFound, "no node token %d", id)
	}
	t, changed, err := s.st.RevokeNodeToken(c.Request().Context(), id, u.Email)
	if err != nil {
		return err
	}
	// Its other tokens are learnt again at their next request.
	s.contacts.forgetNode(t.Node)
	_ = changed // revoking a revoked token again: the same page
	return redirect(c, "/admin/node-tokens?revoked="+strconv.FormatInt(t.ID, 10))
}
