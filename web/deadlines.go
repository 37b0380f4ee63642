package web

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// Read deadlines (issue 16: 400 connections trickling a request body
// stayed open for good). http.Server.ReadTimeout is not used: it runs
// from the start of the request to the end of the handler, and once it
// passes, the server's background read cancels the request's context, so
// it would cut the agents' long polls and every long download. Instead a
// request that has a body must deliver all of it within BodyReadTimeout;
// once the body is read, the deadline is lifted. A handler that ignores
// its body still cannot be held: the server reads the rest (to reuse the
// connection) under the same deadline, and closes the connection when it
// passes. Requests without a body are bounded by ReadHeaderTimeout, the
// response by WriteTimeout (or a handler's own deadline: exports, polls),
// and the pause between requests by IdleTimeout, all in cmd/allot.

// bodyDeadline puts the body read deadline around next.
func (s *Server) bodyDeadline(next http.Handler) http.Handler {
	d := s.cfg.BodyReadTimeout
	if d <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			rc := http.NewResponseController(w)
			if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
			} else if !errors.Is(err, http.ErrNotSupported) {
				s.log.Warn("setting a read deadline", "err", err)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline once the body has been read
// whole, so a handler that runs on (a long poll, an export) keeps its
// connection.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		b.rc.SetReadDeadline(time.Time{}) //nolint:errcheck // best effort: it was set on the same connection
	}
	return n, err
}

type connKey struct{}

// WithConn is an http.Server's ConnContext: it keeps each request's
// connection in its context, for handlers that tune the socket (exports).
func WithConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// exportSendBuffer caps an export's socket send buffer (the kernel
// doubles it). Left to itself, Linux grows it to tcp_wmem's maximum (4 MB
// here), so a client that reads nothing has the server read and format
// some 30,000 lines for it before a write blocks; capped, a page or two.
// 512 KiB in flight still moves 10 MB/s over a 50 ms round trip.
const exportSendBuffer = 256 << 10

// capSendBuffer applies exportSendBuffer to the request's connection
// (when the server keeps it in the context: WithConn).
func capSendBuffer(r *http.Request) {
	if c, ok := r.Context().Value(connKey{}).(*net.TCPConn); ok {
		c.SetWriteBuffer(exportSendBuffer) //nolint:errcheck // a tuning: the export works without it
	}
}
