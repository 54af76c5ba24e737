//go:build !linux

package e2e

import "syscall"

// dieWithParent has no portable form outside Linux: a test binary that dies
// without cleanups leaves its children running there.
func dieWithParent() *syscall.SysProcAttr { return nil }

// isStopped cannot look: it trusts that SIGSTOP took effect.
func isStopped(int) error { return nil }
