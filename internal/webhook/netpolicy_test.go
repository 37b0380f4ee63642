package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/allotlabs/allot/internal/webhook"
)

// hosts is a hosts-file style resolver: names it does not know do not
// resolve, as on a machine with no outside DNS.
func hosts(table map[string][]string) webhook.Lookup {
	return func(_ context.Context, host string) ([]netip.Addr, error) {
		addrs, ok := table[strings.ToLower(host)]
		if !ok {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		var out []netip.Addr
		for _, a := range addrs {
			out = append(out, netip.MustParseAddr(a))
		}
		return out, nil
	}
}

var table = hosts(map[string][]string{
	"hooks.example.com":  {"93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"},
	"rebind.example.com": {"93.184.215.14", "127.0.0.1"}, // one bad answer is enough
	"intranet.example":   {"10.1.2.3"},
	"nat64.example":      {"64:ff9b::a00:1"},
	"cgnat.example":      {"100.64.1.1"},
})

// TestWebhookAddressPolicyAtSetTime: every form of a loopback, private or
// otherwise non-public address is a clear field error at set time,
// including the odd IPv4 spellings the OS resolver accepts, wildcard-DNS
// names and names whose records point inside; public addresses and names
// pass, and so does a name that does not resolve here (it is checked again
// at delivery).
func TestWebhookAddressPolicyAtSetTime(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		url  string
		want string // "" = accepted; else a fragment of the message
	}{
		{"", ""},
		{"https://hooks.slack.com/services/T0/B0/x", ""}, // unresolvable here: accepted
		{"https://hooks.example.com/x", ""},
		{"http://93.184.215.14:8080/x", ""},
		{"https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/x", ""},
		{"http://[64:ff9b::5db8:d70e]/x", ""}, // NAT64 of a public v4
		{"http://[2002:5db8:d70e::1]/x", ""},  // 6to4 of a public v4
		{"http://deadbeef.example.com/x", ""}, // spells a public address

		{"ftp://example.com/x", "http(s) URL"},
		{"hooks.example.com/x", "http(s) URL"},
		{"https://user:pw@hooks.example.com/x", "user name or password"},
		{"http://0/", "\"0\" is 0.0.0.0, a \"this network\" address"},
		{"http://0.0.0.0/", "\"this network\""},
		{"http://2130706433/", "127.0.0.1, a loopback address"},
		{"http://127.1/", "127.0.0.1, a loopback address"},
		{"http://0x7f000001/", "127.0.0.1, a loopback address"},
		{"http://0x7f.1/", "127.0.0.1, a loopback"},
		{"http://0177.0.0.1/", "127.0.0.1, a loopback"},
		{"http://127.0.0.1./", "loopback"},
		{"http://127.0.0.1:9/x", "loopback"},
		{"http://10.0.0.8/hook", "a private address"},
		{"http://172.16.5.4/", "a private address"},
		{"http://192.168.1.1/", "a private address"},
		{"http://169.254.169.254/latest", "link-local"},
		{"http://100.64.0.1/", "carrier-grade NAT"},
		{"http://100.127.255.254/", "carrier-grade NAT"},
		{"http://198.18.0.1/", "benchmarking"},
		{"http://198.19.255.255/", "benchmarking"},
		{"http://224.0.0.1/", "multicast"},
		{"http://240.0.0.1/", "reserved"},
		{"http://255.255.255.255/", "reserved"},
		{"http://192.0.2.1/", "documentation"},
		{"http://[::1]/", "loopback"},
		{"http://[::]/", "unspecified"},
		{"http://[::ffff:127.0.0.1]/", "loopback"},
		{"http://[::ffff:10.0.0.1]/", "private"},
		{"http://[64:ff9b::7f00:1]/", "NAT64 address of a loopback"},
		{"http://[64:ff9b::a00:1]/", "NAT64 address of a private"},
		{"http://[2002:7f00:1::]/", "6to4 address of a loopback"},
		{"http://[fe80::1%25eth0]/", "link-local"},
		{"http://[fd00::1]/", "unique local"},
		{"http://[fc00::1]/", "unique local"},
		{"http://[ff02::1]/", "multicast"},
		{"http://[2001:db8::1]/", "documentation"},
		{"http://[100::1]/", "not a global unicast"},
		{"http://[::127.0.0.1]/", "not a global unicast"},
		{"http://localhost/x", "names this machine"},
		{"http://LOCALHOST./x", "names this machine"},
		{"http://api.localhost/x", "names this machine"},
		{"http://127.0.0.1.nip.io/x", "spells out 127.0.0.1"},
		{"http://app.10.0.0.1.nip.io/x", "spells out 10.0.0.1"},
		{"http://10-0-0-1.sslip.io/x", "spells out 10.0.0.1"},
		{"http://www-192-168-0-1.sslip.io/x", "spells out 192.168.0.1"},
		{"http://7f000001.nip.io/x", "spells out 127.0.0.1"},
		{"http://intranet.example/x", "\"intranet.example\" is 10.1.2.3, a private address"},
		{"http://rebind.example.com/x", "127.0.0.1, a loopback"},
		{"http://nat64.example/x", "NAT64 address of a private"},
		{"http://cgnat.example/x", "carrier-grade NAT"},
		{"http://1.2.3.4.5/", "neither a name nor a valid IP"},
		{"http://256.1.1.1/", "neither a name nor a valid IP"},
		{"http://example.0x/", "neither a name nor a valid IP"}, // "0x" is a number in the URL standard
		{"http://4294967296/", "neither a name nor a valid IP"},
		{"http://hooks.example.com:99999/x", "port"},
	} {
		got := webhook.Problem(ctx, tt.url, table)
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("Problem(%q) = %q, want %q", tt.url, got, tt.want)
		}
		if got != "" && !strings.HasPrefix(got, "must") && !strings.HasPrefix(got, "has") {
			t.Errorf("Problem(%q) = %q: not a field message", tt.url, got)
		}
	}
}

// TestParseHostReadsWhatTheResolverReads: the IPv4 spellings inet_aton
// accepts are canonicalised; names stay names.
func TestParseHostReadsWhatTheResolverReads(t *testing.T) {
	for host, want := range map[string]string{
		"0": "0.0.0.0", "127.1": "127.0.0.1", "2130706433": "127.0.0.1", "0x7f000001": "127.0.0.1",
		"0x7F.0.0.1": "127.0.0.1", "017700000001": "127.0.0.1", "10.1": "10.0.0.1", "192.168.257": "192.168.1.1",
		"8.8.8.8": "8.8.8.8", "[::1]": "::1", "1.2.3.4.": "1.2.3.4", "hooks.example.com": "", "a1": "", "1a": "",
	} {
		a, ok, err := webhook.ParseHost(host)
		if err != nil || ok != (want != "") || (ok && a.String() != want) {
			t.Errorf("ParseHost(%q) = %v %v %v, want %q", host, a, ok, err, want)
		}
	}
	for _, host := range []string{"1.2.3.4.5", "256.0.0.1", "1.2.3.0x100", "08.1.1.1", "4294967296", "x.1"} {
		if _, _, err := webhook.ParseHost(host); err == nil {
			t.Errorf("ParseHost(%q): no error", host)
		}
	}
}

// TestWebhookDialerRefusesNamesThatResolveInside: at connect time a name
// that resolves to loopback (as a rebinding name would, after passing the
// set-time check) reaches nothing; so do the odd spellings and a public
// name that redirects inside. In development mode (AllowPrivate) the same
// local server takes the post.
func TestWebhookDialerRefusesNamesThatResolveInside(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok") //nolint:errcheck
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	port := u.Port()
	lookup := hosts(map[string][]string{
		"hooks.rebind.test": {"127.0.0.1"},
		"v6.rebind.test":    {"::ffff:127.0.0.1"},
		"mixed.rebind.test": {"93.184.215.14", "127.0.0.1"},
	})
	strict := (&webhook.Dialer{Lookup: lookup}).Client()
	for _, host := range []string{"hooks.rebind.test", "v6.rebind.test", "mixed.rebind.test", "127.0.0.1", "127.1", "2130706433", "0x7f000001", "[::ffff:127.0.0.1]"} {
		resp, err := strict.Post(fmt.Sprintf("http://%s:%s/hook", host, port), "application/json", strings.NewReader(`{"text":"x"}`))
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: delivered (%s)", host, resp.Status)
			continue
		}
		if !errors.Is(err, webhook.ErrNotPublic) || !strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("%s: %v, want a not-public refusal naming 127.0.0.1", host, err)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the local server was reached %d times", n)
	}

	// Development mode: the same name and server are fine.
	dev := (&webhook.Dialer{Lookup: lookup, AllowPrivate: true}).Client()
	resp, err := dev.Post("http://"+net.JoinHostPort("127.0.0.1", port)+"/hook", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || hits.Load() != 1 {
		t.Errorf("dev mode: %s, %d hits", resp.Status, hits.Load())
	}
}

// TestRefusedJudgesEmbeddedIPv4: IPv4 inside IPv6 is judged by the IPv4
// address; the edges of CGNAT and benchmarking ranges are right.
func TestRefusedJudgesEmbeddedIPv4(t *testing.T) {
	for a, want := range map[string]bool{
		"8.8.8.8": true, "2001:4860:4860::8888": true, "::ffff:8.8.8.8": true, "64:ff9b::808:808": true, "2002:808:808::1": true,
		"64:ff9b::c0a8:101": false, "::ffff:192.168.1.1": false, "2002:c0a8:101::1": false, "64:ff9b:1::1": false, "2001::1": false,
		"fec0::1": false, "100.63.255.255": true, "100.128.0.0": true, "198.17.255.255": true, "198.20.0.0": true,
	} {
		if got := webhook.Refused(netip.MustParseAddr(a)) == ""; got != want {
			t.Errorf("Refused(%s): public %v, want %v", a, got, want)
		}
	}
}
