package cliflag

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// TimeLimitForms is what ParseTimeLimit accepts, for error messages and
// help screens.
const TimeLimitForms = "MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (as in Slurm: a bare number is minutes) or 4h, 90m, 1h30m, 2d"

// errNoLimit is the answer to Slurm's "no time limit" values.
var errNoLimit = errors.New("Allot jobs need a time limit (0, UNLIMITED and INFINITE mean none in Slurm): give the time the job needs, e.g. 2-00:00:00; each tier has a maximum, which the server checks")

// ParseTimeLimit parses a job's time limit the way sbatch's --time does,
// and also Allot's unit form:
//
//	90          90 minutes (a bare number is minutes, as in Slurm)
//	90:30       90 minutes 30 seconds (MM:SS)
//	4:00:00     4 hours (HH:MM:SS)
//	2-12        2 days 12 hours (D-HH)
//	2-12:30     (D-HH:MM)
//	2-12:30:15  (D-HH:MM:SS)
//	4h, 90m, 1h30m, 2d, 1.5h
//
// The leading field may be as large as needed ("48:00:00" is 2 days); the
// fields after it are bounded (minutes and seconds below 60, the hours of
// a D-HH form below 24), so that a typo is not silently added up. The
// limit must be positive and whole seconds; "0", "UNLIMITED" and
// "INFINITE", Slurm's "no limit", are refused: every Allot job has one.
// The longest allowed depends on the tier and is the server's to check.
func ParseTimeLimit(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty time limit: use %s", TimeLimitForms)
	}
	switch strings.ToUpper(s) {
	case "UNLIMITED", "INFINITE":
		return 0, errNoLimit
	}
	invalid := fmt.Errorf("invalid time limit %q: use %s", s, TimeLimitForms)
	if strings.ContainsAny(s, "hdmsuµμn") && !strings.ContainsAny(s, ":") {
		if s[0] == '-' {
			return 0, fmt.Errorf("invalid time limit %q: it must be positive", s)
		}
		d, err := allot.ParseDuration(s)
		if err != nil {
			return 0, invalid
		}
		if d <= 0 {
			return 0, errNoLimit
		}
		if d%time.Second != 0 {
			return 0, fmt.Errorf("invalid time limit %q: give whole seconds", s)
		}
		return d, nil
	}
	days := int64(0)
	rest := s
	hasDays := false
	if d, r, ok := strings.Cut(s, "-"); ok {
		n, err := field(d)
		if err != nil {
			if d == "" {
				return 0, fmt.Errorf("invalid time limit %q: it must be positive", s)
			}
			return 0, invalid
		}
		days, rest, hasDays = n, r, true
	}
	parts := strings.Split(rest, ":")
	nums := make([]int64, len(parts))
	for i, p := range parts {
		n, err := field(p)
		if err != nil {
			return 0, invalid
		}
		nums[i] = n
	}
	var h, m, sec int64
	switch {
	case hasDays && len(nums) == 1: // D-HH
		h = nums[0]
	case hasDays && len(nums) == 2: // D-HH:MM
		h, m = nums[0], nums[1]
	case hasDays && len(nums) == 3: // D-HH:MM:SS
		h, m, sec = nums[0], nums[1], nums[2]
	case len(nums) == 1: // MINUTES
		m = nums[0]
	case len(nums) == 2: // MM:SS
		m, sec = nums[0], nums[1]
	case len(nums) == 3: // HH:MM:SS
		h, m, sec = nums[0], nums[1], nums[2]
	default:
		return 0, invalid
	}
	// The fields after the leading one are bounded.
	switch {
	case hasDays && h > 23:
		return 0, fmt.Errorf("invalid time limit %q: the hours after the days must be 0–23", s)
	case (hasDays && len(nums) >= 2 || len(nums) == 3) && m > 59:
		return 0, fmt.Errorf("invalid time limit %q: the minutes must be 0–59", s)
	case (hasDays && len(nums) == 3 || !hasDays && len(nums) >= 2) && sec > 59:
		return 0, fmt.Errorf("invalid time limit %q: the seconds must be 0–59", s)
	}
	const maxSecs = math.MaxInt64 / int64(time.Second)
	total := float64(days)*86400 + float64(h)*3600 + float64(m)*60 + float64(sec)
	if total > float64(maxSecs)/2 {
		return 0, fmt.Errorf("invalid time limit %q: too long", s)
	}
	secs := days*86400 + h*3600 + m*60 + sec
	if secs <= 0 {
		return 0, errNoLimit
	}
	return time.Duration(secs) * time.Second, nil
}

// field is one decimal field of a Slurm time: digits only, at most 9.
func field(s string) (int64, error) {
	if s == "" || len(s) > 9 {
		return 0, errors.New("bad field")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, errors.New("bad field")
		}
	}
	return strconv.ParseInt(s, 10, 64)
}
