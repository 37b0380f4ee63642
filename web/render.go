package web

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// render writes a templ component with the status.
func render(c echo.Context, status int, t templ.Component) error {
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMETextHTMLCharsetUTF8)
	c.Response().WriteHeader(status)
	return t.Render(c.Request().Context(), c.Response())
}

func jsonEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc
}

func writeJSON(c echo.Context, status int, v any) error {
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	c.Response().WriteHeader(status)
	return jsonEncoder(c.Response()).Encode(v)
}

// page builds the layout props for the current request.
func (s *Server) page(c echo.Context, title string) views.Page {
	p := views.Page{Title: title, DevMode: s.cfg.DevMode}
	if t, ok := c.Get(ctxCSRF).(string); ok {
		p.CSRF = t
	}
	if u, ok := c.Get(ctxUser).(*allot.User); ok {
		p.User = &views.UserBadge{Name: u.Name, Email: u.Email, Roles: describeRoles(u), Teams: u.Teams(),
			Admin: u.Admin, Finance: u.Finance, Lead: leadsAny(u), Submitter: u.Admin || len(u.Memberships) > 0}
	}
	return p
}

func describeRoles(u *allot.User) string {
	var r []string
	if u.Admin {
		r = append(r, "admin")
	}
	if u.Finance {
		r = append(r, "finance")
	}
	for _, m := range u.Memberships {
		if m.Role == allot.TeamRoleLead {
			r = append(r, "lead of "+m.Team)
		} else {
			r = append(r, "engineer in "+m.Team)
		}
	}
	return strings.Join(r, ", ")
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

func redirect(c echo.Context, to string) error {
	if c.Request().Header.Get("HX-Request") == "true" {
		c.Response().Header().Set("HX-Redirect", to)
		return c.NoContent(http.StatusOK)
	}
	return c.Redirect(http.StatusSeeOther, to)
}
