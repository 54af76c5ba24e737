package e2e

import (
	"bytes"
	"fmt"
	"os"
)

// isStopped reports, as an error, whether some thread of process pid is
// not stopped yet: after SIGSTOP, kill(2) returns before every thread has
// stopped.
func isStopped(pid int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, task := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return err
		}
		// "tid (comm) state …"; comm may hold spaces and parentheses.
		fields := bytes.Fields(data[bytes.LastIndexByte(data, ')')+1:])
		if len(fields) == 0 || string(fields[0]) != "T" {
			return fmt.Errorf("thread %s of process %d is not stopped yet", task.Name(), pid)
		}
	}
	return nil
}
