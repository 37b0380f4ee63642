package demo

import (
	"regexp"
	"testing"
)

func TestAccountsArePOSIXNames(t *testing.T) {
	acc := Accounts()
	if len(acc) < len(Teams)+3 {
		t.Fatalf("accounts = %v", acc)
	}
	re := regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	for _, a := range acc {
		if !re.MatchString(a) || a == "root" {
			t.Errorf("%q is not a usable POSIX account name", a)
		}
	}
	t.Log(acc)
}
