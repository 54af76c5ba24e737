// Package jsoncheck holds the checks client JSON passes before the
// gateway reads it with gjson, shared by the generation path, the plugin
// endpoints and batch lines: how deeply it nests, and whether an object
// names a key twice.
package jsoncheck

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// MaxDepth is the deepest nesting accepted, encoding/json's own limit: far
// beyond any real request (a tool's JSON schema nests a few dozen deep),
// and shallow enough that validating costs a few MiB of stack at most.
const MaxDepth = 10000

// TooDeep reports whether data nests arrays and objects more than limit
// deep. gjson validates them recursively, so a body of a few million '['
// overflows the goroutine's stack, and a stack overflow ends the whole
// process, not one request. Brackets inside strings do not count. It costs two vectorised
// counts for any text with fewer brackets than limit, which is every real
// one, and one byte-by-byte pass otherwise.
func TooDeep(data []byte, limit int) bool {
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

// DuplicateMember returns a key obj names more than once, or "": encoding/json
// keeps the last of two, gjson finds the first, and a client that sent two
// cannot know which was read. An object of a handful of members, the usual
// case, is checked against the keys before each without allocating; past
// that a map keeps a hostile object of a million keys linear.
func DuplicateMember(obj gjson.Result) string {
	var small [8]string
	seen := small[:0]
	var many map[string]struct{}
	dup := ""
	obj.ForEach(func(key, _ gjson.Result) bool {
		if many == nil {
			for _, k := range seen {
				if k == key.Str {
					dup = k
					return false
				}
			}
			if len(seen) < len(small) {
				seen = append(seen, key.Str)
				return true
			}
			many = make(map[string]struct{}, 2*len(small))
			for _, k := range seen {
				many[k] = struct{}{}
			}
		}
		if _, ok := many[key.Str]; ok {
			dup = key.Str
			return false
		}
		many[key.Str] = struct{}{}
		return true
	})
	return dup
}
