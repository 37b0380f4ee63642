package main

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestBrowserOIDCLogin signs in through the real provider process in
// headless Chromium: the login page's SSO button, the provider's form,
// and back to the portal as the person the provider said.
func TestBrowserOIDCLogin(t *testing.T) {
	issuer := startProvider(t)
	e := bootSSO(t, issuer)
	b := browse(t)
	// A page that needs a login sends the browser to the login page and,
	// after the sign-in, back to it.
	b.do(chromedp.Navigate(e.url+"/teams/nlp"),
		chromedp.WaitVisible(css(`[data-testid="sso-login"]`)),
		chromedp.Click(css(`[data-testid="sso-login"]`)),
		chromedp.WaitVisible(css(`[data-testid="idp-login-form"]`)))
	if loc, err := chromedp.Run(b.ctx, chromedp.Location()); err != nil || !strings.HasPrefix(loc, issuer+"/authorize?") {
		t.Fatalf("at %q (%v), want the provider's form", loc, err)
	}
	b.do(chromedp.SendKeys(css(`#username`), "nadia"),
		chromedp.SendKeys(css(`#password`), testPassword))
	screenshot(t, b.ctx, "oidc-provider-form")
	b.do(chromedp.Click(css(`[data-testid="idp-submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="whoami"]`)))
	screenshot(t, b.ctx, "oidc-login")
	if who := b.text(`[data-testid="whoami"]`); !strings.Contains(who, "Nadia Petrova") || !strings.Contains(who, "lead of nlp") {
		t.Errorf("header says %q", who)
	}
	if loc, err := chromedp.Run(b.ctx, chromedp.Location()); err != nil || loc != e.url+"/teams/nlp" {
		t.Errorf("landed on %q (%v), want /teams/nlp", loc, err)
	}
}
