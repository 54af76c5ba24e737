package main

import (
	"os/signal"
	"syscall"
)

// ignoreBrokenPipe lets a long-running command outlive the reader of its
// output. Go ends a process with SIGPIPE when a write to fd 1 or 2 finds
// the pipe closed, unless SIGPIPE is ignored or notified: `make run | tee
// log` and Ctrl-C killed tee first, and the gateway's next log line killed
// it with no shutdown (open streams unbilled, the NATS store left to be
// rebuilt at the next start). Ignored, the write fails with EPIPE, the log
// line is lost, and the Ctrl-C the process got too stops it as usual.
func ignoreBrokenPipe() { signal.Ignore(syscall.SIGPIPE) }
