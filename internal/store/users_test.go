package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// TestDisableUser: disabling revokes every API token and ends every
// session in one audited change; the person cannot get a session or sign
// in through SSO until enabled; bad references and disabling oneself are
// refused and change nothing; enabling lets them sign in again, their
// tokens stay revoked.
func TestDisableUser(t *testing.T) {
	b := setup(t)
	ada, noah := b.user(t, "ada@example.com"), b.user(t, "noah@example.com")
	var secrets []string
	for _, name := range []string{"laptop", "ci"} {
		s, _, err := b.st.CreateAPIToken(b.ctx, noah.ID, name)
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, s)
	}
	sid, err := b.st.CreateSession(b.ctx, noah.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ref  string
		code string
	}{{"nobody@example.com", allot.ENotFound}, {"999999", allot.ENotFound}, {"noah", allot.EInvalid}, {"ADA@example.com", allot.EInvalid}} {
		if _, err := b.st.DisableUser(b.ctx, tc.ref, ada, ""); allot.ErrorCode(err) != tc.code {
			t.Errorf("disable %q: %v, want %s", tc.ref, err, tc.code)
		}
	}
	if _, err := b.st.UserBySession(b.ctx, sid); err != nil || len(b.audits(t, "user.")) != 0 {
		t.Fatalf("refused disables changed something: %v", err)
	}

	res, err := b.st.DisableUser(b.ctx, "Noah@Example.com", ada, "left the company")
	if err != nil || !res.Changed || res.TokensRevoked < 2 || res.SessionsEnded != 1 || !res.User.Disabled() || res.User.DisabledBy != ada.Email {
		t.Fatalf("disable: %+v %v", res, err)
	}
	for _, s := range secrets {
		if _, err := b.st.UserByAPIToken(b.ctx, s); allot.ErrorCode(err) != allot.EUnauthorized {
			t.Errorf("token of a disabled user: %v", err)
		}
	}
	if _, err := b.st.UserBySession(b.ctx, sid); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("session of a disabled user: %v", err)
	}
	if _, err := b.st.CreateSession(b.ctx, noah.ID, time.Hour); allot.ErrorCode(err) != allot.EForbidden || !strings.Contains(allot.ErrorMessage(err), "disabled") {
		t.Errorf("new session for a disabled user: %v", err)
	}
	if _, _, err := b.st.CreateAPIToken(b.ctx, noah.ID, "after"); allot.ErrorCode(err) != allot.EForbidden {
		t.Errorf("new token for a disabled user: %v", err)
	}
	if _, err := b.st.SignInOIDC(b.ctx, &allot.User{OIDCSubject: "idp|noah", Email: noah.Email, Name: "Noah"}, "https://idp.example.com", true, true); allot.ErrorCode(err) != allot.EForbidden {
		t.Errorf("SSO sign-in of a disabled user: %v", err)
	}
	if a := b.audits(t, "user.disable"); len(a) != 1 || a[0].Object != "user:noah@example.com" || a[0].Actor != ada.Email ||
		!strings.Contains(a[0].Note, "left the company") || !strings.Contains(a[0].Note, "1 session(s)") {
		t.Errorf("audit: %+v", a)
	}
	if again, err := b.st.DisableUser(b.ctx, "noah@example.com", ada, ""); err != nil || again.Changed || len(b.audits(t, "user.disable")) != 1 {
		t.Errorf("disabling again: %+v %v", again, err)
	}
	accts, err := b.st.ListUserAccounts(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range accts {
		if (a.Email == noah.Email) != a.Disabled() {
			t.Errorf("list: %s disabled=%v", a.Email, a.Disabled())
		}
	}

	en, err := b.st.EnableUser(b.ctx, "noah@example.com", ada, "came back")
	if err != nil || !en.Changed || en.User.Disabled() {
		t.Fatalf("enable: %+v %v", en, err)
	}
	if _, err := b.st.CreateSession(b.ctx, noah.ID, time.Hour); err != nil {
		t.Errorf("session after enabling: %v", err)
	}
	if _, err := b.st.UserByAPIToken(b.ctx, secrets[0]); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("a token revoked by disabling works again after enabling: %v", err)
	}
	if a := b.audits(t, "user.enable"); len(a) != 1 || !strings.Contains(a[0].Note, "came back") {
		t.Errorf("enable audit: %+v", a)
	}
	if _, err := b.st.UserAccountByRef(b.ctx, "x"); allot.Fields(err)["user"] == "" {
		t.Errorf("bad ref: %v", err)
	}
	var _ store.UserAccessChange = en
}
