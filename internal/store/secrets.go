package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// Every job secret value stored encrypted starts with
// allot.SealedSecretPrefix: allot:v1:<key id>:<base64 of nonce ‖
// AES-256-GCM ciphertext>. A value without it was stored before encryption
// was configured, and is read as it is.

// SecretKeys encrypt jobs' secret environment values at rest (AES-256-GCM,
// a random nonce per value, the variable's name as additional data so a
// value cannot be moved to another name). The first key seals; every key
// opens what it sealed, so keys rotate by putting a new one first and
// running `allot secret-key reseal`.
type SecretKeys struct {
	current string                 // key id that seals
	aead    map[string]cipher.AEAD // by key id
}

// ParseSecretKeys reads a key file's text: one key a line, 32 bytes in
// standard base64 (`allot secret-key new`), the first seals; blank lines
// and lines starting with # are skipped.
func ParseSecretKeys(text []byte) (*SecretKeys, error) {
	k := &SecretKeys{aead: map[string]cipher.AEAD{}}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("line %d: not a key (32 bytes in base64, as `allot secret-key new` prints)", n)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		sum := sha256.Sum256(raw)
		id := hex.EncodeToString(sum[:4])
		if _, dup := k.aead[id]; dup {
			return nil, fmt.Errorf("line %d: the same key twice", n)
		}
		k.aead[id] = aead
		if k.current == "" {
			k.current = id
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if k.current == "" {
		return nil, errors.New("no key in it (generate one with `allot secret-key new`)")
	}
	return k, nil
}

// LoadSecretKeys reads the key file at path, which must not be readable
// or writable by group or others (like the agents' token file).
func LoadSecretKeys(path string) (*SecretKeys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat() // the file read below, not whatever the path names later
	if err != nil {
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secret key file %s: mode %04o lets others read it; chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	k, err := ParseSecretKeys(b)
	if err != nil {
		return nil, fmt.Errorf("secret key file %s: %w", path, err)
	}
	return k, nil
}

// NewSecretKey returns a fresh key in the key file's form.
func NewSecretKey() string {
	b := make([]byte, 32)
	rand.Read(b) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24+)
	return base64.StdEncoding.EncodeToString(b)
}

// KeyID is the id of the key that seals (first 8 hex digits of its
// SHA-256), as sealed values name it.
func (k *SecretKeys) KeyID() string { return k.current }

// Seal encrypts value, the secret variable name's, with the current key.
func (k *SecretKeys) Seal(name, value string) string {
	aead := k.aead[k.current]
	nonce := make([]byte, aead.NonceSize())
	rand.Read(nonce) //nolint:errcheck // never fails
	ct := aead.Seal(nonce, nonce, []byte(value), []byte(name))
	return allot.SealedSecretPrefix + k.current + ":" + base64.StdEncoding.EncodeToString(ct)
}

// Sealed reports whether stored is an encrypted value, and by which key.
func Sealed(stored string) (keyID string, ok bool) {
	keyID, _, ok = splitSealed(stored)
	return keyID, ok
}

// splitSealed is a sealed value's key id and base64 ciphertext.
func splitSealed(stored string) (keyID, b64 string, ok bool) {
	rest, ok := strings.CutPrefix(stored, allot.SealedSecretPrefix)
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, ":")
}

// Open decrypts stored, the variable name's value as stored, with k's
// keys (k nil: none configured). A value stored in clear (before encryption was
// configured) is returned as it is.
func (k *SecretKeys) Open(name, stored string) (string, error) {
	id, b64, ok := splitSealed(stored)
	if !ok {
		return stored, nil
	}
	if k == nil {
		return "", fmt.Errorf("secret %s is encrypted (key %s), and this process has no --secret-key-file", name, id)
	}
	aead := k.aead[id]
	if aead == nil {
		return "", fmt.Errorf("secret %s is encrypted with key %s, which is not in the secret key file", name, id)
	}
	ct, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(ct) < aead.NonceSize() {
		return "", fmt.Errorf("secret %s: the stored value is damaged", name)
	}
	pt, err := aead.Open(nil, ct[:aead.NonceSize()], ct[aead.NonceSize():], []byte(name))
	if err != nil {
		return "", fmt.Errorf("secret %s: the stored value does not decrypt with key %s (damaged, or moved from another variable)", name, id)
	}
	return string(pt), nil
}

// sealSecrets is env with every value sealed (env itself without keys).
func sealSecrets(keys *SecretKeys, env map[string]string) map[string]string {
	if keys == nil || len(env) == 0 {
		return env
	}
	out := make(map[string]string, len(env))
	for name, v := range env {
		out[name] = keys.Seal(name, v)
	}
	return out
}

// openSecrets decrypts every value of env in place.
func openSecrets(keys *SecretKeys, env map[string]string) error {
	for name, v := range env {
		pt, err := keys.Open(name, v)
		if err != nil {
			return err
		}
		env[name] = pt
	}
	return nil
}

// ResealSecrets encrypts every job's stored secret values with the
// current key of s.Secrets: those stored in clear before encryption was
// configured, and those sealed by an older key (rotation). Run it once
// every server and worker has the new key file: what they store meanwhile
// is sealed by it already. It reads 500 jobs at a time and rewrites each
// stale one alone, only if its value is still the one it read (no lock is
// held on jobs the scheduler works on). Jobs whose values do not open with
// these keys are left as they are and listed in skipped.
func (s *Store) ResealSecrets(ctx context.Context) (n int, skipped []string, err error) {
	if s.Secrets == nil {
		return 0, nil, errors.New("resealing secrets needs a secret key file")
	}
	var after int64
	for {
		rows, err := s.db.Query(ctx, `SELECT id, secret_env FROM jobs WHERE id > $1 AND secret_env <> '{}'::jsonb ORDER BY id LIMIT 500`, after)
		if err != nil {
			return n, skipped, mapErr("reading secrets", err)
		}
		type jobSecrets struct {
			id  int64
			raw []byte
		}
		var batch []jobSecrets
		var id int64
		var raw []byte
		if _, err := pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
			batch = append(batch, jobSecrets{id, slices.Clone(raw)})
			return nil
		}); err != nil {
			return n, skipped, mapErr("reading secrets", err)
		}
		if len(batch) == 0 {
			return n, skipped, nil
		}
		for _, j := range batch {
			after = j.id
			env := map[string]string{}
			if err := json.Unmarshal(j.raw, &env); err != nil {
				skipped = append(skipped, fmt.Sprintf("job %d: its secrets are not a JSON object: %v", j.id, err))
				continue
			}
			stale := false
			for _, v := range env {
				if kid, ok := Sealed(v); !ok || kid != s.Secrets.current {
					stale = true
				}
			}
			if !stale {
				continue
			}
			if err := openSecrets(s.Secrets, env); err != nil {
				skipped = append(skipped, fmt.Sprintf("job %d: %v", j.id, err))
				continue
			}
			b, _ := json.Marshal(sealSecrets(s.Secrets, env))
			tag, err := s.db.Exec(ctx, `UPDATE jobs SET secret_env = $2 WHERE id = $1 AND secret_env = $3::jsonb`, j.id, b, string(j.raw))
			if err != nil {
				return n, skipped, mapErr("resealing secrets", err)
			}
			n += int(tag.RowsAffected())
		}
	}
}
