package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/store/storetest"
)

// TestDevBootsSeedsAndRestarts runs `allot dev` (what `make run` runs) on a
// test database: it migrates, seeds, serves, prints working persona tokens,
// and on a second start reuses the data without seeding twice.
func TestDevBootsSeedsAndRestarts(t *testing.T) {
	t.Parallel()
	dbURL := storetest.URL(t)
	dir := t.TempDir()
	var firstJobs string
	for round := 1; round <= 2; round++ {
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		done := make(chan int, 1)
		go func() {
			done <- devMain(ctx, []string{"--addr", "127.0.0.1:0", "--database-url", dbURL, "--data-dir", filepath.Join(dir, "pgdata")}, pw, testWriter{t})
			pw.Close()
		}()
		var url, token string
		sc := bufio.NewScanner(pr)
		urlRE := regexp.MustCompile(`Allot is running at (http://\S+)`)
		tokRE := regexp.MustCompile(`^\s+engineer\s+\S+\s+(allot_\S+)`)
		deadline := time.After(60 * time.Second)
		lines := make(chan string)
		go func() {
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		ready := false
		for !ready {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("round %d: allot dev exited early (code %d)", round, <-done)
				}
				if m := urlRE.FindStringSubmatch(l); m != nil {
					url = m[1]
				}
				if m := tokRE.FindStringSubmatch(l); m != nil {
					token = m[1]
				}
				ready = strings.Contains(l, "Ctrl-C stops everything")
			case <-deadline:
				t.Fatalf("round %d: allot dev did not finish starting", round)
			}
		}
		if url == "" || token == "" {
			t.Fatalf("round %d: no URL (%q) or engineer token printed", round, url)
		}
		go func() {
			for range lines {
			}
		}()
		req, _ := http.NewRequest("GET", url+"/api/v1/jobs?limit=1000", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), "llama-sft") {
			t.Fatalf("round %d: engineer token: %d %.200s", round, resp.StatusCode, b)
		}
		if round == 1 {
			firstJobs = string(b)
		} else if strings.Count(string(b), `"id"`) != strings.Count(firstJobs, `"id"`) {
			t.Errorf("restart changed the job count: seeded twice?")
		}
		cancel()
		if code := <-done; code != 0 {
			t.Fatalf("round %d: allot dev exit code %d", round, code)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
