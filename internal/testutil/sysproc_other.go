//go:build !linux

package testutil

import "syscall"

// DieWithParent has no portable form outside Linux: a test binary that dies
// without cleanups leaves its servers running there.
func DieWithParent() *syscall.SysProcAttr { return nil }
