// Package jsondepth bounds how deeply a JSON text nests before gjson reads
// it. gjson validates arrays and objects recursively, so a body of a few
// million '[' overflows the goroutine's stack, and a stack overflow ends
// the whole process, not one request.
package jsondepth

import "bytes"

// Max is the deepest nesting accepted, encoding/json's own limit: far
// beyond any real request (a tool's JSON schema nests a few dozen deep),
// and shallow enough that validating costs a few MiB of stack at most.
const Max = 10000

// Exceeds reports whether data nests arrays and objects more than limit
// deep. Brackets inside strings do not count. It costs two vectorised
// counts for any text with fewer brackets than limit, which is every real
// one, and one byte-by-byte pass otherwise.
func Exceeds(data []byte, limit int) bool {
	if bytes.Count(data, []byte{'['})+bytes.Count(data, []byte{'{'}) <= limit {
		return false
	}
	depth := 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			if depth++; depth > limit {
				return true
			}
		case ']', '}':
			depth--
		}
	}
	return false
}
