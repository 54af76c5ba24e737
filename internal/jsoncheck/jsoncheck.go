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
// cannot know which was read.
func DuplicateMember(obj gjson.Result) string {
	var keys Keys
	dup := ""
	obj.ForEach(func(key, _ gjson.Result) bool {
		if keys.Seen(key.Str) {
			dup = key.Str
			return false
		}
		return true
	})
	return dup
}

// Keys tells the keys of one object named twice, fed one at a time, for a
// caller that walks the object's members for its own reasons too. The
// zero value is empty. The keys of an object of a few dozen members, the
// usual case, are compared without allocating; past that a map keeps a
// hostile object of a million keys linear (compared pairwise, a request
// body of 100,000 keys took 20 s of CPU).
type Keys struct {
	small [32]string
	n     int
	many  map[string]struct{}
}

// Seen reports whether key was fed before, and notes it.
func (k *Keys) Seen(key string) bool {
	if k.many == nil {
		for _, s := range k.small[:k.n] {
			if s == key {
				return true
			}
		}
		if k.n < len(k.small) {
			k.small[k.n] = key
			k.n++
			return false
		}
		k.many = make(map[string]struct{}, 2*len(k.small))
		for _, s := range k.small {
			k.many[s] = struct{}{}
		}
	}
	if _, ok := k.many[key]; ok {
		return true
	}
	k.many[key] = struct{}{}
	return false
}
