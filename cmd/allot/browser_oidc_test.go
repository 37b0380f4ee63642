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
	ctx := chromium(t)
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	do := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatal(err)
		}
	}
	// A page that needs a login sends the browser to the login page and,
	// after the sign-in, back to it.
	do(chromedp.Navigate(e.url+"/teams/nlp"),
		chromedp.WaitVisible(css(`[data-testid="sso-login"]`)),
		chromedp.Click(css(`[data-testid="sso-login"]`)),
		chromedp.WaitVisible(css(`[data-testid="idp-login-form"]`)))
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || !strings.HasPrefix(loc, issuer+"/authorize?") {
		t.Fatalf("at %q (%v), want the provider's form", loc, err)
	}
	do(chromedp.SendKeys(css(`#username`), "nadia"),
		chromedp.SendKeys(css(`#password`), testPassword))
	screenshot(t, ctx, "oidc-provider-form")
	do(chromedp.Click(css(`[data-testid="idp-submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="whoami"]`)))
	screenshot(t, ctx, "oidc-login")
	who, err := chromedp.Run(ctx, chromedp.Text(css(`[data-testid="whoami"]`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(who, "Nadia Petrova") || !strings.Contains(who, "lead of nlp") {
		t.Errorf("header says %q", who)
	}
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || loc != e.url+"/teams/nlp" {
		t.Errorf("landed on %q (%v), want /teams/nlp", loc, err)
	}
}
