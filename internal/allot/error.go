// Package allot holds Allot's domain types and their rules: teams, users,
// GPU types, tiers, nodes, jobs and their state machine, allocations and
// versioned policy. It depends on the standard library only; storage, HTTP
// and scheduling are adapters around it.
package allot

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Error codes. Each maps to one HTTP status in one place (package web).
const (
	EInvalid      = "invalid"      // bad input; Fields says which
	ENotFound     = "not_found"    // no such thing (or not visible to the caller)
	EConflict     = "conflict"     // the request clashes with current state
	EUnauthorized = "unauthorized" // who are you?
	EForbidden    = "forbidden"    // known, but not allowed
	EInternal     = "internal"     // our fault; details are logged, not shown
	EUnavailable  = "unavailable"  // transient (a lock conflict): retry
)

// Error is a domain error with a code and a message that is safe to show to
// users. Fields carries per-field messages for EInvalid.
type Error struct {
	Code    string
	Message string
	Fields  FieldErrors
}

func (e *Error) Error() string {
	if len(e.Fields) == 0 {
		return e.Message
	}
	return e.Message + ": " + e.Fields.String()
}

// Errorf returns an *Error with the code and a formatted, user-safe message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrNotFound is returned (wrapped) when something does not exist.
var ErrNotFound = &Error{Code: ENotFound, Message: "not found"}

// ErrorCode returns the code of the first *Error in err's chain, EInternal
// for any other non-nil error and "" for nil.
func ErrorCode(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	default:
		return EInternal
	}
}

// ErrorMessage returns the user-safe message of err.
func ErrorMessage(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Message
	default:
		return "internal error"
	}
}

// FieldErrors maps a field name (the JSON key) to a message for it.
type FieldErrors map[string]string

// Add records msg for field unless the field already has a message.
func (f FieldErrors) Add(field, format string, args ...any) {
	if _, ok := f[field]; !ok {
		f[field] = fmt.Sprintf(format, args...)
	}
}

// Err returns nil when there are no field errors, else an EInvalid *Error.
func (f FieldErrors) Err() error {
	if len(f) == 0 {
		return nil
	}
	return &Error{Code: EInvalid, Message: "invalid input", Fields: f}
}

// String lists the fields in name order, "field: message; ...".
func (f FieldErrors) String() string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ": " + f[k]
	}
	return strings.Join(parts, "; ")
}

// Fields returns the field errors carried by err, or nil.
func Fields(err error) FieldErrors {
	var e *Error
	if errors.As(err, &e) {
		return e.Fields
	}
	return nil
}
