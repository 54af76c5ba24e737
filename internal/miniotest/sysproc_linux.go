package miniotest

import "syscall"

// dieWithParent kills the server when the test binary dies without running
// its cleanups (a panic, a -timeout), so no server outlives its test.
//
// Linux sends the signal when the thread that started the child ends; the Go
// runtime keeps its threads unless a goroutine exits while locked to one,
// which this package never does.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
