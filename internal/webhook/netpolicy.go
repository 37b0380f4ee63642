// Package webhook holds the one address policy for outgoing webhooks (team
// budget alerts, weekly reports, the admin's health notifications): where
// Allot may post to. It is applied twice, with the same rules: when a URL is
// set (Problem, a field error for the form or API) and when a delivery
// connects (Dialer), so that a name that resolves differently later — DNS
// rebinding, a record changed after the check — still cannot reach this
// machine or a private network.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Lookup resolves a host name to its addresses. The default is the system
// resolver; tests pass a table.
type Lookup func(ctx context.Context, host string) ([]netip.Addr, error)

// DefaultLookup resolves with the system resolver.
func DefaultLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// refusedV4 are the IPv4 special-purpose ranges (IANA's registry) that are
// not a public host: RFC 6890 and its successors.
var refusedV4 = []struct {
	p    netip.Prefix
	what string
}{
	{pfx("0.0.0.0/8"), "a \"this network\" address"},
	{pfx("10.0.0.0/8"), "a private address"},
	{pfx("100.64.0.0/10"), "a carrier-grade NAT address"},
	{pfx("127.0.0.0/8"), "a loopback address"},
	{pfx("169.254.0.0/16"), "a link-local address"},
	{pfx("172.16.0.0/12"), "a private address"},
	{pfx("192.0.0.0/24"), "an IETF protocol address"},
	{pfx("192.0.2.0/24"), "a documentation address"},
	{pfx("192.88.99.0/24"), "a 6to4 relay address"},
	{pfx("192.168.0.0/16"), "a private address"},
	{pfx("198.18.0.0/15"), "a benchmarking address"},
	{pfx("198.51.100.0/24"), "a documentation address"},
	{pfx("203.0.113.0/24"), "a documentation address"},
	{pfx("224.0.0.0/4"), "a multicast address"},
	{pfx("240.0.0.0/4"), "a reserved address"}, // includes 255.255.255.255
}

var (
	globalV6 = pfx("2000::/3") // the only IPv6 unicast that is routed publicly
	nat64    = pfx("64:ff9b::/96")
	sixTo4   = pfx("2002::/16")
	// refusedV6 are the special-purpose ranges inside 2000::/3.
	refusedV6 = []struct {
		p    netip.Prefix
		what string
	}{
		{pfx("2001::/23"), "an IETF protocol address"}, // Teredo, benchmarking, ORCHID…
		{pfx("2001:db8::/32"), "a documentation address"},
		{pfx("3fff::/20"), "a documentation address"},
	}
)

// Refused says why a is not a public unicast address ("" when it is one).
// An IPv4 address inside IPv6 — IPv4-mapped (::ffff:a.b.c.d), NAT64
// (64:ff9b::/96) or 6to4 (2002::/16) — is judged by the IPv4 address it
// carries, since that is where the packets end up.
func Refused(a netip.Addr) string {
	if !a.IsValid() {
		return "not an address"
	}
	a = a.WithZone("")
	if a.Is4In6() {
		a = a.Unmap()
	}
	if a.Is4() {
		for _, r := range refusedV4 {
			if r.p.Contains(a) {
				return r.what
			}
		}
		return ""
	}
	switch {
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast():
		return "a link-local address"
	case a.IsMulticast():
		return "a multicast address"
	case a.IsPrivate():
		return "a private (unique local) address"
	case nat64.Contains(a):
		b := a.As16()
		if why := Refused(netip.AddrFrom4([4]byte(b[12:16]))); why != "" {
			return "a NAT64 address of " + why
		}
		return ""
	case !globalV6.Contains(a):
		return "not a global unicast address"
	case sixTo4.Contains(a):
		b := a.As16()
		if why := Refused(netip.AddrFrom4([4]byte(b[2:6]))); why != "" {
			return "a 6to4 address of " + why
		}
		return ""
	}
	for _, r := range refusedV6 {
		if r.p.Contains(a) {
			return r.what
		}
	}
	return ""
}

// errNotIPv4 says a host that ends in a number is not a valid IPv4 address.
var errNotIPv4 = errors.New("not a valid IPv4 address")

// ParseHost parses a URL's host name as the address it denotes, the way
// the operating system's resolver (inet_aton) and browsers (the WHATWG URL
// standard) read it: besides the usual forms, IPv4 in one to four parts,
// each decimal, octal (leading 0) or hex (0x), so "0", "127.1",
// "2130706433" and "0x7f000001" are addresses, not names. ok is false for
// a host name; err is set for a host that ends in a number but is not a
// valid address (no resolver should be asked about it).
func ParseHost(host string) (a netip.Addr, ok bool, err error) {
	h := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	if a, err := netip.ParseAddr(h); err == nil {
		return a, true, nil
	}
	parts := strings.Split(h, ".")
	if !isNumber(parts[len(parts)-1]) {
		return netip.Addr{}, false, nil // a name
	}
	if len(parts) > 4 {
		return netip.Addr{}, false, errNotIPv4
	}
	var v uint64
	for i, p := range parts {
		n, err := parseNumber(p)
		if err != nil {
			return netip.Addr{}, false, errNotIPv4
		}
		if i < len(parts)-1 {
			if n > 255 {
				return netip.Addr{}, false, errNotIPv4
			}
			v |= n << (8 * (3 - i))
			continue
		}
		if n >= 1<<(8*(4-i)) {
			return netip.Addr{}, false, errNotIPv4
		}
		v |= n
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true, nil
}

// isNumber reports whether a label is numeric in the WHATWG sense (digits,
// or 0x and hex digits): a host ending in one is an IPv4 address or
// nothing.
func isNumber(s string) bool {
	if s == "" {
		return false
	}
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		for _, c := range s[2:] {
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
		return true
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func parseNumber(s string) (uint64, error) {
	base := 10
	switch {
	case strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X"):
		s, base = s[2:], 16
		if s == "" {
			return 0, nil
		}
	case len(s) > 1 && s[0] == '0':
		s, base = s[1:], 8
	}
	return strconv.ParseUint(s, base, 32)
}

// embedded returns the IPv4 addresses a name spells out in its labels the
// way wildcard-DNS services (nip.io, sslip.io, xip.io) answer them:
// "127.0.0.1.nip.io", "10-0-0-1.sslip.io", "app-192-168-1-2.nip.io",
// "7f000001.nip.io". Set-time resolution may fail (no network where the
// portal runs, a resolver that filters rebinding answers), so such names
// are judged by what they spell, too.
func embedded(host string) []netip.Addr {
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	var out []netip.Addr
	for i := 0; i+4 <= len(labels); i++ {
		if a, err := netip.ParseAddr(strings.Join(labels[i:i+4], ".")); err == nil && a.Is4() {
			out = append(out, a)
		}
	}
	for _, l := range labels {
		ds := strings.Split(l, "-")
		for i := 0; i+4 <= len(ds); i++ {
			if a, err := netip.ParseAddr(strings.Join(ds[i:i+4], ".")); err == nil && a.Is4() {
				out = append(out, a)
			}
		}
		if len(l) == 8 {
			if n, err := strconv.ParseUint(l, 16, 32); err == nil {
				out = append(out, netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}))
			}
		}
	}
	return out
}

// lookupTimeout bounds set-time resolution: a slow resolver must not hold
// a form submission.
const lookupTimeout = 3 * time.Second

// Problem says what is wrong with a webhook URL ("" if nothing): it must
// be an http(s) URL whose host is, and resolves only to, public addresses.
// A name that does not resolve now is accepted (it may be a record not yet
// published, or the portal may have no outside DNS); Dialer checks again
// at every delivery. lookup nil is DefaultLookup.
func Problem(ctx context.Context, raw string, lookup Lookup) string {
	if raw == "" {
		return ""
	}
	p, err := url.Parse(raw)
	if err != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Hostname() == "" || p.Opaque != "" {
		return "must be an http(s) URL, e.g. https://hooks.slack.com/services/…"
	}
	if p.User != nil {
		return "must not carry a user name or password: put the secret in the path, as Slack does"
	}
	host := p.Hostname()
	if port := p.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "has a port that is not a number from 1 to 65535"
		}
	}
	if a, ok, err := ParseHost(host); err != nil {
		return fmt.Sprintf("has host %q, which is neither a name nor a valid IP address", host)
	} else if ok {
		if why := Refused(a); why != "" {
			return refusal(host, a, why)
		}
		return ""
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return fmt.Sprintf("must not point at this machine or a private network: %q names this machine", host)
	}
	for _, a := range embedded(name) {
		if why := Refused(a); why != "" {
			return fmt.Sprintf("must not point at this machine or a private network: %q spells out %s, %s (wildcard DNS such as nip.io answers it with that address)", host, a, why)
		}
	}
	if lookup == nil {
		lookup = DefaultLookup
	}
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	addrs, err := lookup(lctx, name)
	if err != nil {
		return "" // not resolvable now; checked again at delivery
	}
	for _, a := range addrs {
		if why := Refused(a); why != "" {
			return refusal(host, a, why)
		}
	}
	return ""
}

func refusal(host string, a netip.Addr, why string) string {
	if host == a.String() || strings.Trim(host, "[]") == a.String() {
		return fmt.Sprintf("must not point at this machine or a private network: %s is %s", a, why)
	}
	return fmt.Sprintf("must not point at this machine or a private network: %q is %s, %s", host, a, why)
}

// Dialer connects deliveries under the policy. It resolves the host
// itself, refuses unless every address it resolves to is public (a name
// with one private answer is not a public webhook), then dials exactly the
// addresses it checked — there is no second lookup for DNS rebinding to
// answer differently — and checks each socket's address once more just
// before it connects.
type Dialer struct {
	// Lookup resolves names (nil: DefaultLookup).
	Lookup Lookup
	// Timeout bounds each connection attempt (0: 5 s).
	Timeout time.Duration
	// AllowPrivate skips the policy (development mode and tests that post
	// to a local server).
	AllowPrivate bool
}

// ErrNotPublic marks a delivery refused by the policy (it will not become
// deliverable by retrying at once).
var ErrNotPublic = errors.New("webhook address is not public")

// DialContext is an http.Transport DialContext.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: d.Timeout}
	if nd.Timeout == 0 {
		nd.Timeout = 5 * time.Second
	}
	if d.AllowPrivate {
		return nd.DialContext(ctx, network, address)
	}
	nd.Control = func(_, addr string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return fmt.Errorf("%w: cannot read socket address %q", ErrNotPublic, addr)
		}
		if why := Refused(ap.Addr()); why != "" {
			return fmt.Errorf("%w: %s is %s", ErrNotPublic, ap.Addr(), why)
		}
		return nil
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if a, ok, err := ParseHost(host); err != nil {
		return nil, fmt.Errorf("%w: host %q is not a valid address", ErrNotPublic, host)
	} else if ok {
		addrs = []netip.Addr{a}
	} else {
		lookup := d.Lookup
		if lookup == nil {
			lookup = DefaultLookup
		}
		if addrs, err = lookup(ctx, host); err != nil {
			return nil, err
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("webhook host %q has no addresses", host)
		}
	}
	for _, a := range addrs {
		if why := Refused(a); why != "" {
			return nil, fmt.Errorf("%w: %q is %s, %s", ErrNotPublic, host, a.Unmap(), why)
		}
	}
	var first error
	for _, a := range addrs {
		c, err := nd.DialContext(ctx, network, net.JoinHostPort(a.Unmap().String(), port))
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

// Client returns an HTTP client that delivers under d's policy: no proxy
// (one would connect for us, past the check), redirects followed through
// the same dialer, a 10 s overall timeout.
func (d *Dialer) Client() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: d.DialContext, TLSHandshakeTimeout: 5 * time.Second, ResponseHeaderTimeout: 10 * time.Second,
		MaxIdleConns: 10, IdleConnTimeout: 30 * time.Second, ForceAttemptHTTP2: true}}
}
