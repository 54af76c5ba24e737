package testutil

import "syscall"

// DieWithParent is the SysProcAttr of a server a test starts (ClickHouse,
// MinIO, a gateway): the child gets SIGKILL when the test binary dies
// without running its cleanups (a panic, a -timeout), so none outlives its
// test.
//
// Linux sends the signal when the thread that started the child ends; the Go
// runtime keeps its threads unless a goroutine exits while locked to one,
// which the tests never do.
func DieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
