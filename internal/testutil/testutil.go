// Package testutil holds what tests across packages share.
package testutil

import (
	"testing"
	"time"
)

// CheckFor polls fn every interval until it returns nil, and fails t with
// fn's last error once total has passed. Tests wait with it instead of
// sleeping a guessed time.
func CheckFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", total, err)
		}
		time.Sleep(every)
	}
}
