package slurm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMintJWT(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	iat := time.Unix(1796153000, 0)
	tok := MintJWT(key, "root", iat, 5*time.Minute)
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q", tok)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	if base64.RawURLEncoding.EncodeToString(mac.Sum(nil)) != parts[2] {
		t.Error("signature does not verify")
	}
	var h map[string]string
	hb, _ := base64.RawURLEncoding.DecodeString(parts[0])
	if json.Unmarshal(hb, &h) != nil || h["alg"] != "HS256" {
		t.Errorf("header %s", hb)
	}
	var c struct {
		Iat, Exp int64
		Sun      string
	}
	cb, _ := base64.RawURLEncoding.DecodeString(parts[1])
	if json.Unmarshal(cb, &c) != nil || c.Iat != 1796153000 || c.Exp != 1796153300 || c.Sun != "root" {
		t.Errorf("claims %s", cb)
	}
}

func TestTokenSourceCachesAndRenews(t *testing.T) {
	dir := t.TempDir()
	kf := filepath.Join(dir, "jwt.key")
	if err := os.WriteFile(kf, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1796153000, 0)
	s := &tokenSource{user: "root", keyFile: kf, lifespan: 5 * time.Minute, now: func() time.Time { return now }}
	a, err := s.get()
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(3 * time.Minute) // 2 of 5 minutes left: still more than a third
	if b, _ := s.get(); b != a {
		t.Error("token renewed too early")
	}
	now = now.Add(90 * time.Second) // 30 s left
	if b, _ := s.get(); b == a {
		t.Error("token not renewed before expiry")
	}

	tf := filepath.Join(dir, "token")
	os.WriteFile(tf, []byte("SLURM_JWT=abc.def.ghi\n"), 0o600)
	st := &tokenSource{tokFile: tf}
	if got, err := st.get(); err != nil || got != "abc.def.ghi" {
		t.Errorf("static token = %q, %v", got, err)
	}
	os.WriteFile(tf, []byte("new.token.value2\n"), 0o600)
	if got, _ := st.get(); got != "new.token.value2" {
		t.Errorf("static token not re-read: %q", got)
	}
}

func TestNewConfigErrors(t *testing.T) {
	dir := t.TempDir()
	kf := filepath.Join(dir, "jwt.key")
	os.WriteFile(kf, []byte("0123456789abcdef0123456789abcdef"), 0o600)
	short := filepath.Join(dir, "short.key")
	os.WriteFile(short, []byte("abc"), 0o600)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "URL is empty"},
		{Config{URL: "127.0.0.1:6820", JWTKeyFile: kf}, "not an http(s)://host:port"},
		{Config{URL: "http://h:6820/slurm", JWTKeyFile: kf}, "has a path"},
		{Config{URL: "http://h:6820"}, "no credentials"},
		{Config{URL: "http://h:6820", JWTKeyFile: kf, TokenFile: kf}, "not both"},
		{Config{URL: "http://h:6820", JWTKeyFile: filepath.Join(dir, "missing")}, "JWTKeyFile: open"},
		{Config{URL: "http://h:6820", JWTKeyFile: short}, "at least 16"},
		{Config{URL: "http://h:6820", TokenFile: filepath.Join(dir, "missing")}, "TokenFile: stat"},
		{Config{URL: "http://h:6820", JWTKeyFile: kf, Version: "v0.0.39"}, `Version "v0.0.39" is not supported; use one of v0.0.41, v0.0.40, v0.0.38 or "auto"`},
		{Config{URL: "http://h:6820", JWTKeyFile: kf, TokenLifespan: time.Second}, "too short"},
	} {
		_, err := New(c.cfg)
		if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want ErrConfig containing %q", c.cfg, err, c.want)
		}
	}
	c, err := New(Config{URL: "http://h:6820/", JWTKeyFile: kf, Version: "v0.0.40"})
	if err != nil || c.Version() != "v0.0.40" || c.cfg.TokenUser != "root" {
		t.Errorf("New ok = %v, %v", c, err)
	}
}
