package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestTemplateNamesPerCheckout: template names carry the checkout and the
// migration set, and only this checkout's templates of other migration
// sets are stale.
func TestTemplateNamesPerCheckout(t *testing.T) {
	id := checkoutID()
	if !regexp.MustCompile(`^[0-9a-f]{10}$`).MatchString(id) || checkoutID() != id {
		t.Fatalf("checkoutID() = %q", id)
	}
	own := templateNameFor(id, migrationsHash())
	if len(own+"_build") > 63 {
		t.Errorf("%q is too long for PostgreSQL", own+"_build")
	}
	names := []string{
		own,
		own + "_build",
		templateNameFor(id, "0123456789ab"), // this checkout, older migrations: stale
		templateNameFor("ffffffffff", "0123456789ab"), // another checkout
		templateNameFor("ffffffffff", migrationsHash()),
		"allot_tmpl_0123456789ab", // the older naming, any checkout's
		"allot_test_0123456789ab",
	}
	if got, want := staleTemplates(names, own), []string{templateNameFor(id, "0123456789ab")}; !slices.Equal(got, want) {
		t.Errorf("staleTemplates = %q, want %q", got, want)
	}
	if got := staleTemplates(names, "not_a_template"); got != nil {
		t.Errorf("staleTemplates with a foreign own name = %q", got)
	}
}

// TestDropStaleTemplatesSparesOtherCheckouts: on the real server, dropping
// stale templates removes this checkout's unused old one, and leaves other
// checkouts' templates and one that is in use.
func TestDropStaleTemplatesSparesOtherCheckouts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Skipf("no PostgreSQL: %v", err)
	}
	defer admin.Close(ctx)
	rnd := func() string { b := make([]byte, 5); rand.Read(b); return hex.EncodeToString(b) } //nolint:errcheck
	mine, other := rnd(), rnd()
	own, old, inUse, foreign := templateNameFor(mine, "new"), templateNameFor(mine, "old"), templateNameFor(mine, "busy"), templateNameFor(other, "old")
	for _, n := range []string{own, old, inUse, foreign} {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{n}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			admin, err := pgx.Connect(context.Background(), AdminURL())
			if err == nil {
				admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()+" WITH (FORCE)") //nolint:errcheck
				admin.Close(context.Background())
			}
		})
	}
	busy, err := pgx.Connect(ctx, replaceDB(AdminURL(), inUse))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close(ctx)

	dropStaleTemplates(ctx, admin, own)

	exists := func(n string) bool {
		var ok bool
		if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", n).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if exists(old) {
		t.Errorf("this checkout's stale template %s was kept", old)
	}
	for _, n := range []string{own, inUse, foreign} {
		if !exists(n) {
			t.Errorf("%s was dropped", n)
		}
	}
	if err := busy.Ping(ctx); err != nil {
		t.Errorf("a connection to a template in use was cut: %v", err)
	}
}
