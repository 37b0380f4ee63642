// Package static embeds the portal's CSS and JavaScript (vendored from npm:
// htmx 2, Pico CSS 2) and serves them under content-hash URLs so browsers
// can cache them forever. Pages work offline: nothing comes from a CDN.
package static

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed *.js *.css all:sim
var files embed.FS

var (
	hashed = map[string]string{} // name → name.HASH.ext
	byURL  = map[string]string{} // name.HASH.ext → name
)

func init() {
	fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error { //nolint:errcheck
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := files.ReadFile(p)
		sum := sha256.Sum256(b)
		ext := path.Ext(p)
		h := strings.TrimSuffix(p, ext) + "." + hex.EncodeToString(sum[:])[:10] + ext
		hashed[p], byURL[h] = h, p
		return nil
	})
}

// Prefix is where static files are served.
const Prefix = "/static/"

// URL returns the content-hash URL of an embedded file, e.g.
// URL("htmx.min.js") = "/static/htmx.min.3f2a….js".
func URL(name string) string {
	if h, ok := hashed[name]; ok {
		return Prefix + h
	}
	return Prefix + name
}

// Handler serves embedded files; hashed URLs are cached for a year.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, Prefix)
		if orig, ok := byURL[name]; ok {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
			name = orig
		} else {
			w.Header().Set("Cache-Control", "no-cache")
		}
		b, err := files.ReadFile(name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		switch path.Ext(name) {
		case ".js":
			w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		case ".css":
			w.Header().Set("Content-Type", "text/css; charset=utf-8")
		case ".svg":
			w.Header().Set("Content-Type", "image/svg+xml")
		}
		w.Write(b) //nolint:errcheck
	})
}
