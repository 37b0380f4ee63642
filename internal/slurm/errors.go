package slurm

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrConfig: Config is not usable (New).
	ErrConfig = errors.New("slurm: bad configuration")
	// ErrUnreachable: slurmrestd (or slurmctld behind it) does not answer.
	ErrUnreachable = errors.New("slurm: not reachable")
	// ErrUnauthorized: the token was rejected (HTTP 401/403, or Slurm's
	// "Protocol authentication error"), or a proxied user may not do it.
	ErrUnauthorized = errors.New("slurm: unauthorized")
	// ErrUnsupported: slurmrestd speaks no REST version this client has an
	// adapter for, or the operation does not exist in the version in use.
	ErrUnsupported = errors.New("slurm: unsupported version")
	// ErrNotFound: the job (or node) does not exist.
	ErrNotFound = errors.New("slurm: not found")
	// ErrRejected: Slurm refused the request and said why (invalid account,
	// QOS, partition, "Unknown key", ...); the *APIError has its errors[].
	ErrRejected = errors.New("slurm: request rejected")
)

// SlurmError is one entry of a response's errors[] array. v0.0.38 spells the
// number error_code, error_number or errno depending on the endpoint.
type SlurmError struct {
	Number      int    `json:"error_number"`
	Code        int    `json:"error_code"`
	Errno       int    `json:"errno"`
	Error       string `json:"error"`
	Description string `json:"description"`
	Source      string `json:"source"`
}

// Num is the Slurm error number, whichever key carried it.
func (e SlurmError) Num() int {
	switch {
	case e.Number != 0:
		return e.Number
	case e.Code != 0:
		return e.Code
	}
	return e.Errno
}

func (e SlurmError) String() string {
	msg := e.Description
	if msg == "" {
		msg = e.Error
	} else if e.Error != "" && !strings.Contains(msg, e.Error) && e.Error != "Unspecified error" {
		msg += ": " + e.Error
	}
	if n := e.Num(); n > 0 {
		msg += " (" + strconv.Itoa(n) + ")"
	}
	return msg
}

// Slurm error numbers this client acts on (slurm_errno.h).
const (
	errInvalidJobID     = 2017 // ESLURM_INVALID_JOB_ID
	errAlreadyDone      = 2021 // ESLURM_ALREADY_DONE
	errAccessDenied     = 2002 // ESLURM_ACCESS_DENIED
	errUserIDMissing    = 2010 // ESLURM_USER_ID_MISSING
	errJobHeld          = 2042 // ESLURM_JOB_HELD: informational on submit with hold
	errInvalidNodeName  = 2018 // ESLURM_INVALID_NODE_NAME
	errProtocolAuth     = 1007 // SLURM_PROTOCOL_AUTHENTICATION_ERROR
	errNothingFound     = 9003 // ESLURM_REST_EMPTY_RESULT
	errAuthCredInvalid  = 6001 // ESLURM_AUTH_CRED_INVALID
	errZeroBytes        = 5005 // SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT: a non-proxy token used for another user
	errProtoSocketError = 5000 // SLURM_PROTOCOL_SOCKET_IMPL_*: slurmctld down
	errDBConnection     = 7000 // ESLURM_DB_CONNECTION: slurmdbd down
)

// APIError is a failed call: the operation, the HTTP status and what Slurm
// said. errors.Is(err, ErrRejected|ErrUnauthorized|ErrNotFound|ErrUnreachable)
// classifies it.
type APIError struct {
	Op     string // "submit job as alice", "GET /slurm/v0.0.38/jobs"
	URL    string // slurmrestd base URL
	Status int
	Errors []SlurmError
	Body   string // a non-JSON answer, trimmed
	// TokenUser is whose token was sent; AsUser the X-SLURM-USER-NAME.
	TokenUser, AsUser string
	kind              error
	badToken          bool // the token itself was rejected (not a permission)
}

func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString("slurm: ")
	b.WriteString(e.Op)
	switch e.kind {
	case ErrUnauthorized:
		if e.badToken {
			b.WriteString(": slurmrestd at " + e.URL + " rejected the token for user " + e.TokenUser)
			if e.AsUser != "" && e.AsUser != e.TokenUser {
				b.WriteString(" (acting for " + e.AsUser + ")")
			}
		} else {
			b.WriteString(": Slurm refused it for user " + e.AsUser)
		}
	case ErrUnreachable:
		daemon := "slurmctld"
		if e.Has(errDBConnection) {
			daemon = "slurmdbd"
		}
		b.WriteString(": " + daemon + " behind slurmrestd at " + e.URL + " does not answer")
	}
	b.WriteString(": ")
	var parts []string
	for _, se := range e.Errors {
		parts = append(parts, se.String())
	}
	if len(parts) == 0 && e.Body != "" {
		parts = append(parts, e.Body)
	}
	if len(parts) == 0 {
		parts = append(parts, "no detail")
	}
	b.WriteString(strings.Join(parts, "; "))
	if e.Status != 0 && e.Status != 200 {
		fmt.Fprintf(&b, " (HTTP %d)", e.Status)
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrRejected) etc. work.
func (e *APIError) Unwrap() error { return e.kind }

// Has reports whether Slurm returned the error number n.
func (e *APIError) Has(n int) bool {
	for _, se := range e.Errors {
		if se.Num() == n {
			return true
		}
	}
	return false
}

// classify picks the sentinel for a failed response.
func classify(status int, errs []SlurmError) error {
	if status == 401 || status == 403 {
		return ErrUnauthorized
	}
	for _, se := range errs {
		switch se.Num() {
		case errProtocolAuth, errAuthCredInvalid, errZeroBytes, errAccessDenied, errUserIDMissing:
			return ErrUnauthorized
		case errInvalidJobID, errInvalidNodeName:
			return ErrNotFound
		case errDBConnection:
			return ErrUnreachable
		}
		if se.Num() > errProtoSocketError && se.Num() < errProtoSocketError+100 && se.Num() != errZeroBytes {
			return ErrUnreachable
		}
	}
	if status == 404 || status == 405 {
		return ErrUnsupported
	}
	return ErrRejected
}

type unreachableError struct {
	url string
	err error
}

func (e *unreachableError) Error() string {
	return "slurmrestd at " + e.url + " is not reachable: " + e.err.Error()
}
func (e *unreachableError) Unwrap() []error { return []error{ErrUnreachable, e.err} }

type unsupportedError struct{ msg string }

func (e *unsupportedError) Error() string { return e.msg }
func (e *unsupportedError) Unwrap() error { return ErrUnsupported }

type configError struct{ msg string }

func (e *configError) Error() string { return "slurm: " + e.msg }
func (e *configError) Unwrap() error { return ErrConfig }
