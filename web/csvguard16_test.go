package web

import "testing"

// Issue 16: a spreadsheet whose list separator is ';' splits our lines on
// ';' and ignores our quotes there, and a line break inside a quoted cell
// can start a row: a formula character after either is neutralised too,
// while ordinary text (and JSON with commas) is left as it is.
func TestCSVTextSemicolonLocales16(t *testing.T) {
	for in, want := range map[string]string{
		"fan;=1+1":              "fan;'=1+1",
		"fan; =1+1":             "fan; '=1+1",
		`fan;"=1+1`:             `fan;"'=1+1`,
		"a;+1;-2;@x":            "a;'+1;'-2;'@x",
		"note\n@SUM(A1)":        "note\n'@SUM(A1)",
		"note\r\n=cmd":          "note\r\n'=cmd",
		"a\t=1":                 "a\t'=1",
		"=a;=b":                 "'=a;'=b",
		"fan; ok":               "fan; ok",
		"x;;":                   "x;;",
		`{"a":-1,"b":"=x"}`:     `{"a":-1,"b":"=x"}`,
		"field: 1 → 2; gpus: 3": "field: 1 → 2; gpus: 3",
		"a,=1":                  "a,=1", // the writer quotes it; a ',' parser honours those quotes
		"ada@example.com":       "ada@example.com",
	} {
		if got := csvText(in); got != want {
			t.Errorf("csvText(%q) = %q, want %q", in, got, want)
		}
	}
}
