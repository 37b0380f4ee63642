package web

import (
	"net/http"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

var personaInfo = map[string]struct{ title, desc string }{
	demo.Engineer: {"Engineer", "Submits jobs for team nlp, watches them run, cancels their own."},
	demo.Lead:     {"Team lead", "Leads team nlp: its jobs, budget and alerts."},
	demo.Finance:  {"Finance", "Reads every team's bill and exports chargeback."},
	demo.Admin:    {"Admin", "Edits tiers, rates, budgets and guarantees; drains nodes."},
}

func (s *Server) home(c echo.Context) error {
	if _, err := currentUser(c); err != nil {
		return c.Redirect(http.StatusSeeOther, "/login")
	}
	return c.Redirect(http.StatusSeeOther, "/jobs")
}

func (s *Server) loginPage(c echo.Context) error {
	return s.renderLogin(c, http.StatusOK, "")
}

// loginError shows the login page with why the sign-in failed; it creates
// no session.
func (s *Server) loginError(c echo.Context, status int, msg string) error {
	return s.renderLogin(c, status, msg)
}

func (s *Server) renderLogin(c echo.Context, status int, errMsg string) error {
	l := views.Login{Page: s.page(c, "Log in"), SSO: s.oidc != nil, Error: errMsg}
	if n := c.QueryParam("next"); n != "" {
		l.Next = safeNext(n)
	}
	if !s.cfg.DevMode && s.oidc == nil {
		l.Message = "Single sign-on (OIDC) is not configured on this server. API clients use personal API tokens."
	}
	if s.cfg.DevMode {
		for _, key := range demo.Personas {
			u, err := s.st.UserByEmail(c.Request().Context(), demo.PersonaEmail[key])
			if err != nil {
				continue
			}
			info := personaInfo[key]
			l.Personas = append(l.Personas, views.Persona{Key: key, Title: info.title, Name: u.Name, Email: u.Email, Description: info.desc})
		}
	}
	return render(c, status, views.LoginView(l))
}

// devLogin logs in as a demo persona. It exists only in `allot dev`.
func (s *Server) devLogin(c echo.Context) error {
	if !s.cfg.DevMode {
		return allot.Errorf(allot.ENotFound, "persona login is only available in development mode")
	}
	email, ok := demo.PersonaEmail[c.FormValue("persona")]
	if !ok {
		return (allot.FieldErrors{"persona": "pick one of engineer, lead, finance, admin"}).Err()
	}
	u, err := s.st.UserByEmail(c.Request().Context(), email)
	if err != nil {
		return err
	}
	if err := s.startSession(c, u.ID); err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, safeNext(c.FormValue("next")))
}

// logout ends the session and, when the identity provider has an
// end-session endpoint, signs out there too.
func (s *Server) logout(c echo.Context) error {
	if ck, err := c.Cookie(sessionCookie); err == nil {
		if err := s.st.DeleteSession(c.Request().Context(), ck.Value); err != nil {
			return err
		}
	}
	s.clearSession(c)
	if to := s.endSessionURL(c.Request().Context()); to != "" {
		return c.Redirect(http.StatusSeeOther, to)
	}
	return c.Redirect(http.StatusSeeOther, "/login")
}

func (s *Server) clearSession(c echo.Context) {
	c.SetCookie(&http.Cookie{Name: sessionCookie, Value: "", Path: "/", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteLaxMode, MaxAge: -1})
}

// Unguarded lists the routes registered on the router without going
// through route (and so without an access rule), as "METHOD PATH". The
// authorization-matrix test requires it to be empty.
func (s *Server) Unguarded() []string {
	ruled := map[string]bool{}
	for _, a := range s.access {
		ruled[a.Method+" "+a.Path] = true
	}
	var out []string
	for _, r := range s.e.Routes() {
		if !ruled[r.Method+" "+r.Path] && !ruled["* "+r.Path] {
			out = append(out, r.Method+" "+r.Path)
		}
	}
	return out
}
