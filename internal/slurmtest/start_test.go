package slurmtest

import "testing"

func TestStartBasic(t *testing.T) {
	if ok, why := Available(); !ok {
		t.Skip(why)
	}
	c := Start(t, Options{})
	t.Log(c.Run(t, "sinfo"))
}
