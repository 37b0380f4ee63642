package views

// Tokens is the personal API tokens page.
type Tokens struct {
	Page
	Tokens []TokenRow
	// NewSecret is the token just created, shown this once.
	NewSecret string
	NewName   string
	// Values and Errors refill the create form after bad input.
	Name    string
	Expires string
	Errors  map[string]string
	// MinDate is today (the earliest expiry date the form offers);
	// MaxDate the latest the server's token lifetime allows ("" = none).
	MinDate, MaxDate string
	// DefaultExpiry says what an empty expiry means ("" = until revoked).
	DefaultExpiry string
}

// TokenRow is one token in the list.
type TokenRow struct {
	ID       int64
	Name     string
	Prefix   string
	Created  string
	LastUsed string
	Expires  string
	Status   string // active, expired, revoked
	Active   bool
}
