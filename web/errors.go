package web

import (
	"errors"
	"net/http"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// Problem is an RFC 9457 problem details body, with per-field messages.
type Problem struct {
	Type   string            `json:"type"`
	Title  string            `json:"title"`
	Status int               `json:"status"`
	Detail string            `json:"detail,omitempty"`
	Errors map[string]string `json:"errors,omitempty"`
}

var statusOf = map[string]int{
	allot.EInvalid:      http.StatusUnprocessableEntity,
	allot.ENotFound:     http.StatusNotFound,
	allot.EConflict:     http.StatusConflict,
	allot.EUnauthorized: http.StatusUnauthorized,
	allot.EForbidden:    http.StatusForbidden,
	allot.EInternal:     http.StatusInternalServerError,
	allot.EUnavailable:  http.StatusServiceUnavailable,
}

// badRequest is malformed input that is not about one field (bad JSON).
type badRequest struct{ msg string }

func (b *badRequest) Error() string { return b.msg }

// handleError is the one place errors become responses: problem+json for
// the API and JSON clients, an HTML page otherwise. Internal errors are
// logged and shown without details.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, code, msg := http.StatusInternalServerError, allot.EInternal, "internal error"
	var fields allot.FieldErrors
	var he *echo.HTTPError
	var br *badRequest
	switch {
	case errors.As(err, &br):
		status, code, msg = http.StatusBadRequest, "bad_request", br.msg
	case errors.As(err, &he):
		status = he.Code
		code = strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "_"))
		msg = http.StatusText(status)
		if m, ok := he.Message.(string); ok && m != "" {
			msg = m
		}
		if status == http.StatusForbidden && strings.Contains(strings.ToLower(msg), "csrf") || status == http.StatusBadRequest && strings.Contains(msg, "csrf") {
			msg = "the form expired or was sent from another site; reload the page and try again"
		}
	default:
		code = allot.ErrorCode(err)
		status = statusOf[code]
		msg = allot.ErrorMessage(err)
		fields = allot.Fields(err)
	}
	if status >= 500 {
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
	}
	if wantsJSON(c) {
		p := Problem{Type: "https://allot.dev/problems/" + code, Title: http.StatusText(status), Status: status, Detail: msg, Errors: fields}
		if status == http.StatusUnauthorized {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="allot"`)
		}
		c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
		c.Response().WriteHeader(status)
		enc := jsonEncoder(c.Response())
		if err := enc.Encode(p); err != nil {
			s.log.Warn("writing problem", "err", err)
		}
		return
	}
	if status == http.StatusUnauthorized && c.Request().Method == http.MethodGet {
		c.Redirect(http.StatusSeeOther, "/login") //nolint:errcheck
		return
	}
	page := s.page(c, http.StatusText(status))
	if err := render(c, status, views.ErrorView(views.ErrorPage{Page: page, Status: status, Message: msg})); err != nil {
		s.log.Warn("rendering error page", "err", err)
	}
}

func wantsJSON(c echo.Context) bool {
	if isAPI(c) {
		return true
	}
	a := c.Request().Header.Get("Accept")
	return strings.Contains(a, "json") && !strings.Contains(a, "html")
}
