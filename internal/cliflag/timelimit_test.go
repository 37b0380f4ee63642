package cliflag

import (
	"strings"
	"testing"
	"time"
)

func TestParseTimeLimit(t *testing.T) {
	const d, h, m, s = 24 * time.Hour, time.Hour, time.Minute, time.Second
	good := []struct {
		in   string
		want time.Duration
	}{
		// Slurm's forms; a bare number is minutes.
		{"240", 240 * m},
		{"1", m},
		{" 30 ", 30 * m},
		{"90:30", 90*m + 30*s},
		{"0:30", 30 * s},
		{"4:00:00", 4 * h},
		{"04:05:06", 4*h + 5*m + 6*s},
		{"48:00:00", 2 * d},
		{"2-12", 2*d + 12*h},
		{"0-1", h},
		{"2-12:30", 2*d + 12*h + 30*m},
		{"2-12:30:15", 2*d + 12*h + 30*m + 15*s},
		{"1-00:00:00", d},
		{"14-0", 14 * d},
		// Allot's unit form.
		{"4h", 4 * h},
		{"90m", 90 * m},
		{"2d", 2 * d},
		{"1h30m", 90 * m},
		{"1.5h", 90 * m},
		{"45s", 45 * s},
	}
	for _, tt := range good {
		got, err := ParseTimeLimit(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseTimeLimit(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	bad := []struct{ in, msg string }{
		{"", "empty time limit"},
		{"0", "need a time limit"},
		{"00:00", "need a time limit"},
		{"0-0", "need a time limit"},
		{"0h", "need a time limit"},
		{"UNLIMITED", "need a time limit"},
		{"infinite", "need a time limit"},
		{"-5", "must be positive"},
		{"-5m", "must be positive"},
		{"-1-00:00", "must be positive"},
		{"abc", "invalid time limit"},
		{"4:00:00:00", "invalid time limit"},
		{"1-2-3", "invalid time limit"},
		{"1:", "invalid time limit"},
		{":30", "invalid time limit"},
		{"1-", "invalid time limit"},
		{"1-:30", "invalid time limit"},
		{"1.5", "invalid time limit"},
		{"1e3", "invalid time limit"},
		{"+5", "invalid time limit"},
		{"4h:30", "invalid time limit"},
		{"1h1h", "invalid time limit"},
		{"1-24", "hours after the days must be 0–23"},
		{"1-2:60", "minutes must be 0–59"},
		{"1:60:00", "minutes must be 0–59"},
		{"10:60", "seconds must be 0–59"},
		{"1:00:75", "seconds must be 0–59"},
		{"1-2:03:60", "seconds must be 0–59"},
		{"1.5s", "whole seconds"},
		{"999999999-23:59:59", "too long"},
		{"9999999999", "invalid time limit"}, // more than 9 digits
	}
	for _, tt := range bad {
		got, err := ParseTimeLimit(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("ParseTimeLimit(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.msg)
		}
	}
}
