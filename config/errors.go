package config

import (
	"fmt"
	"strings"
)

// Error is one problem in a config file, placed where the file shows it.
type Error struct {
	File string
	// Line and Col are 1-based; 0 when the problem has no place of its own
	// in the file (Col is also 0 when only the line is known).
	Line, Col int
	// Path is the yaml path of the value at fault, such as
	// models[2].pricing.prompt; empty when the message names its place itself.
	Path string
	Msg  string
}

// Error formats as "file:line:col: path: message".
func (e Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Col > 0 {
			fmt.Fprintf(&b, ":%d", e.Col)
		}
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one config file: the loader reports them
// all at once so one edit can fix them all. Only *Errors is an error.
type Errors []Error

// Error joins the problems one per line.
func (e *Errors) Error() string {
	lines := make([]string, len(*e))
	for i, one := range *e {
		lines[i] = one.Error()
	}
	return strings.Join(lines, "\n")
}

// RestartRequiredError refuses a reload that changes fields which only take
// effect at start (the listener, the data directory, NATS, ClickHouse). The
// running config stays; restart the process to apply the new file.
type RestartRequiredError struct {
	// Fields are the yaml paths of the changed restart-only fields.
	Fields []string
	// Reasons, when set, say the same as Fields with each one's line in
	// the file and, for a change refused for what it would destroy, what.
	Reasons []string
}

func (e *RestartRequiredError) Error() string {
	named := e.Fields
	if len(e.Reasons) == len(e.Fields) {
		named = e.Reasons
	}
	return "config reload not supported for " + strings.Join(named, ", ") + " (restart required)"
}
