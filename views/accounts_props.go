package views

// AdminAccounts is /admin/accounts: who jobs run as.
type AdminAccounts struct {
	Page
	// Require: a job without an account is refused (else it runs as the
	// agent's default job user). Claim: the identity provider's claim
	// read at sign-in ("" = none).
	Require bool
	Claim   string
	Users   []AccountRow
	Teams   []Option // Value: team slug, Label: its service account ("" = none)
	Saved   string
}

// AccountRow is one person's POSIX accounts and the form that maps them.
type AccountRow struct {
	ID                 int64
	Email, Name, Teams string
	Mapped, Claimed    string // the admin's mapping, the provider's claim
	Value, Note        string // as typed (after an error)
	Errors             map[string]string
}
