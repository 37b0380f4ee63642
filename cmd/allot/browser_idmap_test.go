package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/allotlabs/allot/internal/demo"
)

// TestBrowserIdentityPage: an admin opens Admin → Identity in headless
// Chromium, adds a rule (a bad GUID first: the field's error, what was
// typed kept), and links a sign-in that waits for an admin from the list.
func TestBrowserIdentityPage(t *testing.T) {
	issuer := startProvider(t)
	e := bootSSOConfig(t, issuer, true, nil)
	// noah's first sign-in waits for an admin (no email linking here).
	sb := newSSOBrowser(t)
	if s := sb.do("GET", sb.authorize(sb.start(e, ""), "noah", testPassword, "login"), nil); s.status != http.StatusForbidden {
		t.Fatalf("noah's sign-in: %d", s.status)
	}
	b := browse(t)
	b.login(e.url+"/login", demo.Admin, `[data-testid="whoami"]`)
	b.do(chromedp.Navigate(e.url+"/admin/identity"),
		chromedp.WaitVisible(css(`[data-testid="idp-defaults"]`)),
		chromedp.WaitVisible(css(`[data-testid="idp-sign-in"][data-outcome="link_required"]`)))
	screenshot(t, b.ctx, "identity-page")

	b.do(chromedp.SetValue(css(`#new-rule-match`), "guid"),
		chromedp.SendKeys(css(`#new-rule-pattern`), "not-a-guid"),
		chromedp.SetValue(css(`#new-rule-grant`), "admin"),
		chromedp.Click(css(`[data-testid="add-rule"]`)),
		chromedp.WaitVisible(css(`[data-testid="error-pattern"]`)))
	if msg := b.text(`[data-testid="error-pattern"]`); !strings.Contains(msg, "GUID") {
		t.Errorf("pattern error: %q", msg)
	}
	if typed, err := chromedp.Run(b.ctx, chromedp.Value(css(`#new-rule-pattern`))); err != nil || typed != "not-a-guid" {
		t.Errorf("the form kept %q (%v)", typed, err)
	}
	b.do(chromedp.SetValue(css(`#new-rule-pattern`), "3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f"),
		chromedp.Click(css(`[data-testid="add-rule"]`)),
		chromedp.WaitVisible(css(`[data-testid="saved"]`)),
		chromedp.WaitVisible(css(`[data-testid="idp-rule"]`)))
	screenshot(t, b.ctx, "identity-rule")

	// The rule's "saved" note is still on the page until the link's
	// answer replaces the page: take it away first, so that the one
	// waited for is the answer's.
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="saved"]').forEach(e => e.remove()), 0`)); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Click(css(`[data-testid="idp-sign-in"][data-outcome="link_required"] button`)),
		chromedp.WaitVisible(css(`[data-testid="saved"]`)))
	if msg := b.text(`[data-testid="saved"]`); !strings.Contains(msg, "Linked the identity to "+demo.PersonaEmail[demo.Engineer]) {
		t.Errorf("after the link: %q", msg)
	}
	if n := e.auditActions("user.oidc_link", "user:"+demo.PersonaEmail[demo.Engineer]); n != 1 {
		t.Errorf("link audit entries: %d", n)
	}
}
