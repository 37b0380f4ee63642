package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// defaultAPITokenTTL is how long a personal API token made without an
// expiry lasts, unless --api-token-ttl says otherwise.
const defaultAPITokenTTL = 90 * 24 * time.Hour

// ttlFlag is a duration flag that also takes days ("90d").
type ttlFlag struct{ d *time.Duration }

func (f ttlFlag) String() string {
	if f.d == nil {
		return ""
	}
	if *f.d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(*f.d/(24*time.Hour)), 10) + "d"
	}
	return f.d.String()
}

func (f ttlFlag) Set(s string) error {
	d, err := parseTTL(s)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

// parseTTL reads "90d", "2160h", "30m" or "0" (none).
func parseTTL(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	var err error
	if n, ok := strings.CutSuffix(s, "d"); ok {
		var days int64
		days, err = strconv.ParseInt(n, 10, 64)
		if err == nil && (days < 0 || days > 100*365) {
			err = fmt.Errorf("out of range")
		}
		d = time.Duration(days) * 24 * time.Hour
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d < 0 {
		return 0, fmt.Errorf("want a lifetime like 90d, 720h or 0 (no default), got %q", s)
	}
	return d, nil
}

// apiTokenTTLFlag adds --api-token-ttl to fs (default 90 days) and
// returns its value once parsed.
func apiTokenTTLFlag(fs *flag.FlagSet) func() time.Duration {
	d := defaultAPITokenTTL
	fs.Var(ttlFlag{&d}, "api-token-ttl", "lifetime of a personal API token made without an expiry, and the longest one may ask for: 90d, 720h; 0: no default, tokens last until revoked unless they ask for an expiry")
	return func() time.Duration { return d }
}

// noAPITokenTTL is the lifetime of a process without --api-token-ttl (a
// worker): none.
func noAPITokenTTL() time.Duration { return 0 }
