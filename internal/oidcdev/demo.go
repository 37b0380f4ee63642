package oidcdev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/demo"
)

// DemoUsers are the four demo personas as identity-provider users, all
// with password, and with the groups Allot's default claim mapping reads:
// noah is an engineer in nlp, nadia leads nlp, finn is finance and ada is
// an admin. Everyone is also in "staff", which Allot ignores.
func DemoUsers(password string) []User {
	return []User{
		{Subject: "dev-noah", Username: "noah", Password: password, Email: demo.PersonaEmail[demo.Engineer], Name: "Noah Kim", Groups: []string{"staff", "team:nlp"}},
		{Subject: "dev-nadia", Username: "nadia", Password: password, Email: demo.PersonaEmail[demo.Lead], Name: "Nadia Petrova", Groups: []string{"staff", "team:nlp:lead"}},
		{Subject: "dev-finn", Username: "finn", Password: password, Email: demo.PersonaEmail[demo.Finance], Name: "Finn Finance", Groups: []string{"staff", "allot-finance"}},
		{Subject: "dev-ada", Username: "ada", Password: password, Email: demo.PersonaEmail[demo.Admin], Name: "Ada Admin", Groups: []string{"staff", "allot-admins"}},
	}
}

// DemoHint describes the demo users for the login page.
func DemoHint(users []User) string {
	var b strings.Builder
	b.WriteString("Demo users:")
	for _, u := range users {
		fmt.Fprintf(&b, "\n%s / %s (%s)", u.Username, u.Password, strings.Join(u.Groups, ", "))
	}
	return b.String()
}

// Server is a provider listening on its own port.
type Server struct {
	*Provider
	ln   net.Listener
	http *http.Server
	done chan error
}

// Listen starts a provider on addr (":0" for any free port); the issuer is
// http://<listen address>, unless cfg.Issuer is set.
func Listen(addr string, cfg Config) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("oidcdev: listening on %s: %w", addr, err)
	}
	if cfg.Issuer == "" {
		a := ln.Addr().(*net.TCPAddr)
		host := a.IP.String()
		if a.IP.IsUnspecified() {
			host = "127.0.0.1"
		}
		cfg.Issuer = "http://" + net.JoinHostPort(host, fmt.Sprint(a.Port))
	}
	p, err := New(cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{Provider: p, ln: ln, http: &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 10 * time.Second}, done: make(chan error, 1)}
	go func() { s.done <- s.http.Serve(ln) }()
	return s, nil
}

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.http.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
