package web

import "testing"

func TestCSVTextNeutralisesFormulas(t *testing.T) {
	for in, want := range map[string]string{
		"=1+2": "'=1+2", "+1": "'+1", "-1": "'-1", "@SUM(A1)": "'@SUM(A1)", "\tcmd": "'\tcmd", "\rcmd": "'\rcmd",
		"": "", "ada@example.com": "ada@example.com", "team:nlp": "team:nlp", `{"a":-1}`: `{"a":-1}`, "a=b": "a=b",
	} {
		if got := csvText(in); got != want {
			t.Errorf("csvText(%q) = %q, want %q", in, got, want)
		}
	}
}
