package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/allotlabs/allot/internal/cliflag"
)

// Slurm-like output: a format is a list of fields, each with an optional
// width and justification, and literal text between them (squeue's
// -o "%.18i %.9P %.8j"), or a list of field names (--format id,name,state;
// squeue's -O "jobid,name:30,state:.10"). A table prints aligned columns,
// or with --parsable the values separated by |.

// field is one column a command can print.
type field[T any] struct {
	letter byte     // squeue's format letter (0: none)
	names  []string // the first is the canonical name; the others are aliases (Slurm's -O names)
	header string
	help   string
	value  func(*T) string
}

// spec is one field in a format, with how wide to print it.
type spec[T any] struct {
	f     *field[T]
	width int  // 0: as wide as the value
	right bool // right-justified (squeue's "%.8i")
}

// format is a parsed format: literal text and fields in order. A
// letter format keeps its text and widths exactly; a names format is
// printed as aligned columns.
type format[T any] struct {
	parts   []formatPart[T]
	letters bool
}

type formatPart[T any] struct {
	text string   // literal text, when s is nil
	s    *spec[T] // a field
}

func (f format[T]) specs() []spec[T] {
	var out []spec[T]
	for _, p := range f.parts {
		if p.s != nil {
			out = append(out, *p.s)
		}
	}
	return out
}

func fieldByName[T any](fields []field[T], name string) *field[T] {
	name = strings.ToLower(name)
	for i := range fields {
		for _, n := range fields[i].names {
			if n == name {
				return &fields[i]
			}
		}
	}
	return nil
}

func fieldByLetter[T any](fields []field[T], c byte) *field[T] {
	for i := range fields {
		if fields[i].letter == c {
			return &fields[i]
		}
	}
	return nil
}

// parseFormat reads a format given as letters ("%.18i %-10j %T": any
// text, "%%" for a percent sign) or as names ("id,name:30,state:.10",
// commas or spaces between them).
func parseFormat[T any](fields []field[T], s string) (format[T], error) {
	if strings.TrimSpace(s) == "" {
		return format[T]{}, fmt.Errorf("the format is empty")
	}
	if strings.Contains(s, "%") {
		return parseLetters(fields, s)
	}
	return parseNames(fields, s)
}

func parseLetters[T any](fields []field[T], s string) (format[T], error) {
	f := format[T]{letters: true}
	var text strings.Builder
	flush := func() {
		if text.Len() > 0 {
			f.parts = append(f.parts, formatPart[T]{text: text.String()})
			text.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			text.WriteByte(s[i])
			continue
		}
		start := i
		i++
		if i < len(s) && s[i] == '%' {
			text.WriteByte('%')
			continue
		}
		sp := spec[T]{}
		if i < len(s) && (s[i] == '.' || s[i] == '-') {
			sp.right = s[i] == '.'
			i++
		}
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i > j {
			w, err := strconv.Atoi(s[j:i])
			if err != nil || w > 1000 {
				return f, fmt.Errorf("width %q in %q is too large", s[j:i], s[start:min(i+1, len(s))])
			}
			sp.width = w
		}
		if i >= len(s) {
			return f, fmt.Errorf("%q ends in the middle of a field (%q): a field is %%[.|-][width]LETTER", s, s[start:])
		}
		sp.f = fieldByLetter(fields, s[i])
		if sp.f == nil {
			return f, fmt.Errorf("unknown format letter %%%c in %q; known: %s", s[i], s, letterList(fields))
		}
		flush()
		f.parts = append(f.parts, formatPart[T]{s: &sp})
	}
	flush()
	if len(f.specs()) == 0 {
		return f, fmt.Errorf("the format %q has no field (%%i, %%j, …)", s)
	}
	return f, nil
}

func parseNames[T any](fields []field[T], s string) (format[T], error) {
	var f format[T]
	for _, item := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		name, size, sized := strings.Cut(item, ":")
		sp := spec[T]{f: fieldByName(fields, name)}
		if sp.f == nil {
			return f, fmt.Errorf("unknown field %q; known: %s", name, nameList(fields))
		}
		if sized {
			if strings.HasPrefix(size, ".") {
				sp.right, size = true, size[1:]
			}
			w, err := strconv.Atoi(size)
			if err != nil || w < 0 || w > 1000 {
				return f, fmt.Errorf("bad width %q for field %s: give name:WIDTH or name:.WIDTH (right-justified)", item[len(name)+1:], name)
			}
			sp.width = w
		}
		f.parts = append(f.parts, formatPart[T]{s: &sp})
	}
	if len(f.parts) == 0 {
		return f, fmt.Errorf("the format %q names no field", s)
	}
	return f, nil
}

func letterList[T any](fields []field[T]) string {
	var l []string
	for _, f := range fields {
		if f.letter != 0 {
			l = append(l, "%"+string(f.letter))
		}
	}
	return strings.Join(l, " ")
}

func nameList[T any](fields []field[T]) string {
	var l []string
	for _, f := range fields {
		l = append(l, f.names[0])
	}
	sort.Strings(l)
	return strings.Join(l, ", ")
}

// fieldHelp lists the fields for a command's -h.
func fieldHelp[T any](fields []field[T]) string {
	var b strings.Builder
	for _, f := range fields {
		l := "  "
		if f.letter != 0 {
			l = "%" + string(f.letter)
		}
		fmt.Fprintf(&b, "  %s  %-28s %s\n", l, strings.Join(f.names, ", "), f.help)
	}
	return b.String()
}

// pad fits v to sp's width: padded, and cut when longer (as squeue does).
func pad(v string, width int, right bool) string {
	if width <= 0 {
		return v
	}
	n := utf8.RuneCountInString(v)
	if n > width {
		r := []rune(v)
		return string(r[:width])
	}
	if right {
		return strings.Repeat(" ", width-n) + v
	}
	return v + strings.Repeat(" ", width-n)
}

// printRows prints rows in format f: a header line unless noHeader, then
// one line per row. parsable: the fields' values joined by |, no padding
// and no literal text.
func printRows[T any](w io.Writer, f format[T], rows []*T, parsable, noHeader bool) {
	specs := f.specs()
	if parsable {
		line := func(get func(spec[T]) string) {
			vals := make([]string, len(specs))
			for i, sp := range specs {
				vals[i] = strings.ReplaceAll(get(sp), "|", "/")
			}
			fmt.Fprintln(w, strings.Join(vals, "|"))
		}
		if !noHeader {
			line(func(sp spec[T]) string { return sp.f.header })
		}
		for _, r := range rows {
			line(func(sp spec[T]) string { return oneLine(sp.f.value(r)) })
		}
		return
	}
	if f.letters {
		line := func(get func(spec[T]) string) {
			var b strings.Builder
			for _, p := range f.parts {
				if p.s == nil {
					b.WriteString(p.text)
					continue
				}
				b.WriteString(pad(get(*p.s), p.s.width, p.s.right))
			}
			fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		}
		if !noHeader {
			line(func(sp spec[T]) string { return sp.f.header })
		}
		for _, r := range rows {
			line(func(sp spec[T]) string { return oneLine(sp.f.value(r)) })
		}
		return
	}
	// Names: aligned columns; a field with a width keeps it.
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(get func(spec[T]) string) {
		vals := make([]string, len(specs))
		for i, sp := range specs {
			vals[i] = pad(get(sp), sp.width, sp.right)
		}
		fmt.Fprintln(tw, strings.Join(vals, "\t"))
	}
	if !noHeader {
		line(func(sp spec[T]) string { return sp.f.header })
	}
	for _, r := range rows {
		line(func(sp spec[T]) string { return oneLine(sp.f.value(r)) })
	}
	tw.Flush()
}

// oneLine keeps a value on its line (a reason or command with newlines
// or tabs would break the columns).
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\n\r\t") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// slurmDuration formats d as Slurm does: M:SS, H:MM:SS or D-HH:MM:SS.
func slurmDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d / time.Second)
	days, h, m, sec := s/86400, s/3600%24, s/60%60, s%60
	switch {
	case days > 0:
		return fmt.Sprintf("%d-%02d:%02d:%02d", days, h, m, sec)
	case h > 0:
		return fmt.Sprintf("%d:%02d:%02d", h, m, sec)
	}
	return fmt.Sprintf("%d:%02d", m, sec)
}

// slurmTime formats an instant as Slurm does (2026-12-01T16:45:19), in
// UTC; "N/A" when unset.
func slurmTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "N/A"
	}
	return t.UTC().Format("2006-01-02T15:04:05")
}

// listOutput is the output flags of the Slurm-like listings (jobs, prio,
// share, nodes): --parsable, --noheader, --json.
type listOutput struct {
	parsable, noHeader bool
	json               bool
}

func (o *listOutput) flags(fs *flag.FlagSet) {
	fs.BoolVar(&o.parsable, "parsable", false, "values separated by |, no padding")
	fs.BoolVar(&o.noHeader, "noheader", false, "no header line")
	fs.BoolVar(&o.json, "json", false, "print JSON")
}

// table prints t as the flags say.
func (o *listOutput) table(w io.Writer, t *simpleTable) { t.print(w, o.parsable, o.noHeader) }

// parseFlagsOnly parses the flags of `allot cmd`, which takes no
// arguments (cliflag.Parse: they read ALLOT_* variables too); false when
// they are refused, after saying why.
func parseFlagsOnly(fs *flag.FlagSet, args []string, cmd string, stderr io.Writer) bool {
	if err := cliflag.Parse(fs, args); err != nil {
		return false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "allot %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return false
	}
	return true
}

// simpleTable is a fixed-column table (share, prio, nodes): aligned, or
// with parsable the values joined by |.
type simpleTable struct {
	header []string
	rows   [][]string
}

func (t *simpleTable) add(vals ...string) { t.rows = append(t.rows, vals) }

func (t *simpleTable) print(w io.Writer, parsable, noHeader bool) {
	all := t.rows
	if !noHeader {
		all = append([][]string{t.header}, t.rows...)
	}
	if parsable {
		for _, r := range all {
			vals := make([]string, len(r))
			for i, v := range r {
				vals[i] = strings.ReplaceAll(oneLine(v), "|", "/")
			}
			fmt.Fprintln(w, strings.Join(vals, "|"))
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range all {
		vals := make([]string, len(r))
		for i, v := range r {
			vals[i] = oneLine(v)
		}
		fmt.Fprintln(tw, strings.Join(vals, "\t"))
	}
	tw.Flush()
}
