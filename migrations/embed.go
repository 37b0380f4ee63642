// Package migrations holds Allot's numbered SQL migrations, embedded in the
// binary. Never edit a shipped file: add a new one.
package migrations

import "embed"

// FS holds the NNNN_name.up.sql files.
//
//go:embed *.sql
var FS embed.FS
