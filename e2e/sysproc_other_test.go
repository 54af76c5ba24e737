//go:build !linux

package e2e

// isStopped cannot look: it trusts that SIGSTOP took effect.
func isStopped(int) error { return nil }
