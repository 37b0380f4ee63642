package slurm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"time"
)

// MintJWT returns an HS256 token for user with the claims Slurm's auth/jwt
// checks: iat, exp and sun (the Slurm user name). key is the raw content of
// the jwt_key file.
func MintJWT(key []byte, user string, iat time.Time, lifespan time.Duration) string {
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	claims, _ := json.Marshal(struct {
		Iat int64  `json:"iat"`
		Exp int64  `json:"exp"`
		Sun string `json:"sun"`
	}{iat.Unix(), iat.Add(lifespan).Unix(), user})
	signing := header + "." + enc.EncodeToString(claims)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signing))
	return signing + "." + enc.EncodeToString(mac.Sum(nil))
}

// tokenSource hands out the token for X-SLURM-USER-TOKEN: minted from the
// key (cached, renewed when a third of its life is left) or read from a
// static file (re-read when its modification time or size changes).
type tokenSource struct {
	user     string
	keyFile  string
	tokFile  string
	lifespan time.Duration
	now      func() time.Time // protocol time: slurmctld checks exp against its real clock

	mu      sync.Mutex
	key     []byte
	token   string
	expires time.Time
	fileMod time.Time
	fileSz  int64
}

func (s *tokenSource) get() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokFile != "" {
		st, err := os.Stat(s.tokFile)
		if err != nil {
			return "", &configError{"TokenFile: " + err.Error()}
		}
		if s.token == "" || !st.ModTime().Equal(s.fileMod) || st.Size() != s.fileSz {
			b, err := os.ReadFile(s.tokFile)
			if err != nil {
				return "", &configError{"TokenFile: " + err.Error()}
			}
			t := strings.TrimSpace(string(b))
			t = strings.TrimPrefix(t, "SLURM_JWT=")
			if t == "" {
				return "", &configError{"TokenFile " + s.tokFile + " is empty"}
			}
			s.token, s.fileMod, s.fileSz = t, st.ModTime(), st.Size()
		}
		return s.token, nil
	}
	now := s.now()
	if s.token != "" && now.Before(s.expires.Add(-s.lifespan/3)) {
		return s.token, nil
	}
	if s.key == nil {
		k, err := readKey(s.keyFile)
		if err != nil {
			return "", err
		}
		s.key = k
	}
	// iat a little in the past: slurmctld rejects tokens from its future.
	iat := now.Add(-5 * time.Second)
	s.token = MintJWT(s.key, s.user, iat, s.lifespan+5*time.Second)
	s.expires = now.Add(s.lifespan)
	return s.token, nil
}

func readKey(path string) ([]byte, error) {
	k, err := os.ReadFile(path)
	if err != nil {
		return nil, &configError{"JWTKeyFile: " + err.Error()}
	}
	if len(k) < 16 {
		return nil, &configError{"JWTKeyFile " + path + " holds " + itoa(int64(len(k))) + " bytes; Slurm's jwt_key needs at least 16 (32 random bytes is usual)"}
	}
	return k, nil
}
