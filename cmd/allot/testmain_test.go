package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/agent/agenttest"
	"github.com/allotlabs/allot/internal/demo"
)

// testJobUser is the account the jobs of this package's in-process agents
// run as (made for the run, removed after it).
const testJobUser = "allot-tc1"

func TestMain(m *testing.M) {
	agent.MaybeShim() // in-process agents start this binary as their job shim
	// Jobs get their own /tmp: the test's directories, which its jobs
	// write to, must live elsewhere.
	restore := agenttest.TempDirOutsideTmp()
	// The demo's accounts too: its people's and teams' jobs run as them;
	// and allot dev's job account, which allot dev (run by tests) keeps.
	cleanup, err := agenttest.EnsureAccounts(append(demo.Accounts(), testJobUser, DevJobAccount)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agent.SetLocalJobUser(testJobUser)
	code := m.Run()
	cleanup()
	restore()
	os.Exit(code)
}
