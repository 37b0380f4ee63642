package web

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Notifier wakes agents' long polls when PostgreSQL announces new orders
// for their node (LISTEN allot_orders). Any server replica can serve any
// agent: the notification reaches every replica.
type Notifier struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	log     *slog.Logger
	closed  bool
}

// Close ends every long poll now and every later one at once (the server is
// shutting down; agents reconnect to another replica or after the restart).
func (n *Notifier) Close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.Wake("")
}

// Closed reports whether Close was called.
func (n *Notifier) Closed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closed
}

// NewNotifier returns a notifier with no listener; call Listen.
func NewNotifier(log *slog.Logger) *Notifier {
	return &Notifier{waiters: map[string]map[chan struct{}]struct{}{}, log: log}
}

// Subscribe returns a channel that is closed at the next notification for
// node, and a function to unsubscribe.
func (n *Notifier) Subscribe(node string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	n.mu.Lock()
	if n.waiters[node] == nil {
		n.waiters[node] = map[chan struct{}]struct{}{}
	}
	n.waiters[node][ch] = struct{}{}
	n.mu.Unlock()
	return ch, func() {
		n.mu.Lock()
		if _, ok := n.waiters[node][ch]; ok {
			delete(n.waiters[node], ch)
			close(ch)
		}
		n.mu.Unlock()
	}
}

// Wake closes the waiters of node ("" wakes everyone).
func (n *Notifier) Wake(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, set := range n.waiters {
		if node != "" && name != node {
			continue
		}
		for ch := range set {
			close(ch)
			delete(set, ch)
		}
	}
}

// Listen holds one connection in LISTEN until ctx ends, reconnecting after
// errors (and waking everyone then, since notifications may have been
// missed).
func (n *Notifier) Listen(ctx context.Context, pool *pgxpool.Pool) {
	for ctx.Err() == nil {
		err := n.listenOnce(ctx, pool)
		if ctx.Err() != nil {
			return
		}
		n.log.Warn("order notifications interrupted; reconnecting", "err", err)
		n.Wake("")
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (n *Notifier) listenOnce(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+store.OrdersChannel); err != nil {
		return err
	}
	defer conn.Exec(context.Background(), "UNLISTEN *") //nolint:errcheck
	n.Wake("")
	for {
		note, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		n.Wake(note.Payload)
	}
}
