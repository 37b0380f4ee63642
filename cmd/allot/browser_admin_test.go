package main

import (
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/chromedp/chromedp"
)

// TestBrowserAdminChangesMultiplier: the admin changes tier 3's billing
// multiplier on the admin page in a real browser, finds the new multiplier
// in the policy documentation and the change in the audit log; then the
// engineer is refused the admin page with a clear message.
func TestBrowserAdminChangesMultiplier(t *testing.T) {
	e := boot(t)
	b := browse(t)
	b.login(e.url+"/login", demo.Admin, `[data-testid="whoami"]`)
	b.do(chromedp.Navigate(e.url+"/admin"),
		chromedp.WaitVisible(css(`[data-testid="policy-version"]`)),
		chromedp.Click(css(`[data-testid="tab-tiers"]`)),
		chromedp.WaitVisible(css(`[data-testid="tier-form-3"]`)),
		chromedp.SetValue(css(`#tier-3-multiplier`), "1.5"),
		chromedp.SendKeys(css(`#tier-3-note`), "experiments use the new cluster"),
		chromedp.Click(css(`[data-testid="save-tier-3"]`)),
		chromedp.WaitVisible(css(`[data-testid="tier-form-3"] [data-testid="saved"]`)),
		chromedp.ScrollIntoView(css(`[data-testid="tier-form-3"]`)))
	screenshot(t, b.ctx, "admin-tiers")
	if saved := b.text(`[data-testid="tier-form-3"] [data-testid="saved"]`); !strings.HasPrefix(saved, "Saved tier 3 as policy version") {
		t.Errorf("confirmation %q", saved)
	}

	b.do(chromedp.Click(css(`[data-testid="nav-docs"]`)), chromedp.WaitVisible(css(`[data-testid="docs-tiers"]`)))
	screenshot(t, b.ctx, "docs")
	if m := b.text(`[data-testid="docs-tier-3"] [data-testid="multiplier"]`); m != "×1.5" {
		t.Errorf("docs show tier 3 at %q", m)
	}
	if a := b.text(`[data-testid="docs-example-3"] td:last-child`); a != "134.40 USD" {
		t.Errorf("docs example for tier 3: %q", a)
	}

	b.do(chromedp.Navigate(e.url+"/admin/audit"), chromedp.WaitVisible(css(`[data-testid="audit-table"]`)))
	screenshot(t, b.ctx, "audit")
	row := `[data-testid="audit-table"] tbody tr:first-child`
	if a, ch, who, note := b.text(row+` [data-testid="action"]`), b.text(row+` [data-testid="change-multiplier"]`), b.text(row+` [data-testid="actor"]`),
		b.text(row+` [data-testid="note"]`); a != "tier.update" || ch != "multiplier: 1 → 1.5" || who != "ada@example.com" || note != "experiments use the new cluster" {
		t.Errorf("audit row: %q %q %q %q", a, ch, who, note)
	}

	// The other admin pages render (screenshots for the README), and the
	// tiers page fits a phone.
	for _, page := range []string{"rates", "teams", "policy", "versions"} {
		b.do(chromedp.Navigate(e.url+"/admin/"+page), chromedp.WaitVisible(css(`[data-testid="tab-`+page+`"][aria-current="page"]`)))
		screenshot(t, b.ctx, "admin-"+page)
	}
	b.do(chromedp.EmulateViewport(390, 844), chromedp.Navigate(e.url+"/admin/tiers"), chromedp.WaitVisible(css(`[data-testid="tier-form-3"]`)))
	screenshot(t, b.ctx, "admin-tiers-phone")
	// (The shared header is measured by the layout's own tests.)
	if w, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`Math.ceil(Math.max(...[...document.querySelectorAll('main article, main form, main input')].map(e => e.getBoundingClientRect().right)))`)); err != nil || w > 390 {
		t.Errorf("tier forms on a phone reach %d px (%v)", w, err)
	}
	b.do(chromedp.EmulateViewport(1280, 1000))

	// The engineer: no Admin link, and the page itself refuses.
	b.do(chromedp.Click(css(`form[action="/logout"] button`)),
		chromedp.WaitVisible(css(`[data-testid="persona-`+demo.Engineer+`"]`)),
		chromedp.Click(css(`[data-testid="persona-`+demo.Engineer+`"]`)),
		chromedp.WaitVisible(css(`[data-testid="whoami"]`)))
	if n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="nav-admin"]').length`)); err != nil || n != 0 {
		t.Errorf("engineer sees an Admin link (%d, %v)", n, err)
	}
	b.do(chromedp.Navigate(e.url+"/admin"), chromedp.WaitVisible(css(`[data-testid="error-message"]`)))
	screenshot(t, b.ctx, "admin-denied")
	if h, msg := b.text("h1"), b.text(`[data-testid="error-message"]`); h != "Forbidden" || msg != "only admins may do this" {
		t.Errorf("engineer on /admin: %q %q", h, msg)
	}
}
