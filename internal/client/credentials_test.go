package client

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCredentialsPath(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	for xdg, want := range map[string]string{
		"":            filepath.Join(home, ".config", "allot", "credentials.json"),
		"relative":    filepath.Join(home, ".config", "allot", "credentials.json"), // the XDG spec ignores it
		"/etc/xdgcfg": "/etc/xdgcfg/allot/credentials.json",
	} {
		t.Setenv("XDG_CONFIG_HOME", xdg)
		if got, err := CredentialsPath(); err != nil || got != want {
			t.Errorf("XDG_CONFIG_HOME=%q: %q %v, want %q", xdg, got, err, want)
		}
	}
}

func TestCredentialsFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "allot")
	path := filepath.Join(dir, "credentials.json")
	if _, err := LoadCredentials(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	c := &Credentials{Server: "http://a", Token: "allot_x", TokenID: 3, ExpiresAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), RefreshToken: "r"}
	if err := SaveCredentials(path, c); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, dir: 0o700} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v %v", p, st.Mode(), err)
		}
	}
	got, err := LoadCredentials(path)
	if err != nil || got.Token != c.Token || got.Server != c.Server || got.TokenID != 3 || !got.ExpiresAt.Equal(c.ExpiresAt) || got.RefreshToken != "r" {
		t.Errorf("loaded %+v %v", got, err)
	}
	// Saving again keeps one file and no temporary ones.
	c.Token = "allot_y"
	if err := SaveCredentials(path, c); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %v", ents)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCredentials(path); err == nil || !strings.Contains(err.Error(), "readable by other users") {
		t.Errorf("group-readable file: %v", err)
	}
	os.Chmod(path, 0o600) //nolint:errcheck
	if err := os.WriteFile(path, []byte(`{"server":""}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCredentials(path); err == nil || !strings.Contains(err.Error(), "no server or token") {
		t.Errorf("empty credentials: %v", err)
	}
	if err := RemoveCredentials(path); err != nil {
		t.Fatal(err)
	}
	if err := RemoveCredentials(path); err != nil {
		t.Errorf("removing twice: %v", err)
	}
}

func TestSameServer(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"http://h:8080", "http://h:8080/", true},
		{"http://H:8080", "http://h:8080", true},
		{"http://h:8080", "https://h:8080", false},
		{"http://h:8080", "http://h:8081", false},
		{"http://127.0.0.1:8080", "http://localhost:8080", false},
	} {
		if got := SameServer(tc.a, tc.b); got != tc.same {
			t.Errorf("SameServer(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}
