//go:build !linux

package miniotest

import "syscall"

// dieWithParent has no portable form outside Linux: a test binary that dies
// without cleanups leaves its server running there.
func dieWithParent() *syscall.SysProcAttr { return nil }
