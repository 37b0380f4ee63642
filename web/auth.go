package web

import (
	"net/http"
	"time"

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
	l := views.Login{Page: s.page(c, "Log in")}
	if !s.cfg.DevMode {
		l.Message = "Single sign-on (OIDC) is not configured on this server yet. API clients use personal API tokens."
	}
	for _, key := range demo.Personas {
		u, err := s.st.UserByEmail(c.Request().Context(), demo.PersonaEmail[key])
		if err != nil {
			continue
		}
		info := personaInfo[key]
		l.Personas = append(l.Personas, views.Persona{Key: key, Title: info.title, Name: u.Name, Email: u.Email, Description: info.desc})
	}
	return render(c, http.StatusOK, views.LoginView(l))
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
	secret, err := s.st.CreateSession(c.Request().Context(), u.ID, s.cfg.SessionTTL)
	if err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{Name: sessionCookie, Value: secret, Path: "/", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteLaxMode, Expires: time.Now().Add(s.cfg.SessionTTL)})
	return c.Redirect(http.StatusSeeOther, "/jobs")
}

func (s *Server) logout(c echo.Context) error {
	if ck, err := c.Cookie(sessionCookie); err == nil {
		if err := s.st.DeleteSession(c.Request().Context(), ck.Value); err != nil {
			return err
		}
	}
	s.clearSession(c)
	return c.Redirect(http.StatusSeeOther, "/login")
}

func (s *Server) clearSession(c echo.Context) {
	c.SetCookie(&http.Cookie{Name: sessionCookie, Value: "", Path: "/", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteLaxMode, MaxAge: -1})
}
