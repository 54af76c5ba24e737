package config

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/tollgate/tollgate/internal/suggest"
)

// Load reads, expands, decodes, defaults and validates the config file at
// path. A file that cannot be read gives a wrapped I/O error; a file with
// problems gives *Errors listing every one of them.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return parse(path, data, os.LookupEnv)
}

// LoadNotConnecting is Load for the commands that do not connect to NATS
// (the admin CLI, finance, config get, migrate): it leaves the NATS
// credentials and TLS files unread. They are often readable only by the
// user serve runs as, and an operator allowed to read gateway.yaml could
// not run any of those commands when the load read them.
func LoadNotConnecting(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return parseWith(path, data, os.LookupEnv, false)
}

// Parse is Load for bytes already read; name is the file name used in error
// messages and stored in Config.Path. Environment variables are read from the
// process environment.
func Parse(name string, data []byte) (*Config, error) {
	return parse(name, data, os.LookupEnv)
}

// maxWalk bounds the nodes visited while checking a document, so aliases
// that fan out (a "billion laughs" file) fail fast instead of running away.
const maxWalk = 1 << 20

type loader struct {
	file      string
	data      []byte // the file's text, to place errors yaml.v3 gives no line
	lookupEnv func(string) (string, bool)
	errs      Errors
	// failed holds paths already reported while decoding, so validation does
	// not report the same value a second time as merely "missing".
	failed map[string]bool
	// nodes maps a yaml path to the node holding its value, for placing
	// validation errors on the right line.
	nodes map[string]*yaml.Node
	// expanded marks plain scalars whose text came (partly) from the
	// environment: they must not turn into null or a number where a string
	// is wanted.
	expanded map[*yaml.Node]bool
	// unexpanded marks scalars whose ${...} was reported as wrong: walk
	// leaves them out rather than report their text a second time.
	unexpanded map[*yaml.Node]bool
	// broken are values already reported as the wrong shape or type; they
	// are cleared before decoding so one bad value cannot stop yaml.v3 from
	// decoding (and validation from checking) the rest of the file.
	broken []brokenValue
	walked int
	// unset holds the variables of a scalar's ${VAR}s, without a default,
	// that are not set: they are named in its errors, and warned of in
	// the order of unsetPaths.
	unset      map[*yaml.Node][]string
	unsetPaths []nodePath
	// natsFiles: read the NATS credentials and TLS files (checkNATSFiles),
	// for the commands that connect.
	natsFiles bool
}

type nodePath struct {
	node *yaml.Node
	path string
}

func parse(name string, data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	return parseWith(name, data, lookupEnv, true)
}

// parseWith is parse; natsFiles says whether the NATS credentials and TLS
// files are read (checkNATSFiles).
func parseWith(name string, data []byte, lookupEnv func(string) (string, bool), natsFiles bool) (*Config, error) {
	l := &loader{
		natsFiles:  natsFiles,
		file:       name,
		data:       data,
		lookupEnv:  lookupEnv,
		failed:     map[string]bool{},
		nodes:      map[string]*yaml.Node{},
		expanded:   map[*yaml.Node]bool{},
		unexpanded: map[*yaml.Node]bool{},
		unset:      map[*yaml.Node][]string{},
	}
	cfg := &Config{Path: name, source: sha256.Sum256(data), envRead: map[string]bool{}}
	l.lookupEnv = func(name string) (string, bool) {
		cfg.envRead[name] = true
		return lookupEnv(name)
	}
	// YAML ends a line at a lone CR too; errors count lines by LF, so a
	// file with CR line ends had every syntax error on line 1.
	data = crToLF(data)
	l.data = data

	root, ok := l.parseYAML(data)
	if !ok {
		return nil, l.result()
	}
	if root != nil {
		l.expandTree(root, "")
		l.nodes[""] = root
		l.walk(root, reflect.TypeOf(*cfg), "", 0)
		l.decode(root, cfg)
	}
	l.applyDefaults(cfg)
	l.validate(cfg)
	if err := l.result(); err != nil {
		return nil, err
	}
	cfg.lines = make(map[string]int, len(l.nodes))
	for path, n := range l.nodes {
		cfg.lines[path] = n.Line
	}
	for _, at := range l.unsetPaths {
		for _, name := range l.unset[at.node] {
			cfg.unsetEnv = append(cfg.unsetEnv, fmt.Sprintf("warning: %s:%d: %s reads ${%s}, which is not set: it is %q. Set %s, or write ${%s:-default} for a default, or ${%s:?why} to refuse the file without it",
				l.file, at.node.Line, at.path, name, at.node.Value, name, name, name))
		}
	}
	return cfg, nil
}

func (l *loader) result() error {
	if len(l.errs) == 0 {
		return nil
	}
	sort.SliceStable(l.errs, func(i, j int) bool {
		a, b := l.errs[i], l.errs[j]
		if (a.Line == 0) != (b.Line == 0) {
			return b.Line == 0
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	// A value reached through several aliases is reported once.
	errs := l.errs[:0:0]
	for i, e := range l.errs {
		if i == 0 || e != l.errs[i-1] {
			errs = append(errs, e)
		}
	}
	return &errs
}

// errAt records a problem at node n (nil: at the nearest known ancestor of
// path) and marks path as reported.
func (l *loader) errAt(n *yaml.Node, path, format string, args ...any) {
	if n == nil {
		n = l.nodeFor(path)
	}
	e := Error{File: l.file, Path: path, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
		e.Msg = unsetNote(e.Msg, n, l.unset[n])
	}
	l.errs = append(l.errs, e)
	if path != "" {
		l.failed[path] = true
	}
}

// unsetNote names in msg, an error of the value of n, the variables of
// its ${VAR}s that are not set: a value they left empty is "required" or
// "is empty", which said nothing of the variable.
func unsetNote(msg string, n *yaml.Node, unset []string) string {
	if len(unset) == 0 {
		return msg
	}
	vars := "${" + strings.Join(unset, "} and ${") + "}"
	verb := "is"
	if len(unset) > 1 {
		verb = "are"
	}
	if n.Value != "" {
		return fmt.Sprintf("%s (it reads %s, which %s not set)", msg, vars, verb)
	}
	head, rest, found := strings.Cut(msg, ": ")
	if !found {
		return fmt.Sprintf("%s: %s %s not set", msg, vars, verb)
	}
	return fmt.Sprintf("%s: %s %s not set: %s", head, vars, verb, rest)
}

// nodeFor finds the node of path, or of its nearest ancestor present in the
// file (defaults have no node of their own).
func (l *loader) nodeFor(path string) *yaml.Node {
	for {
		if n, ok := l.nodes[path]; ok {
			return n
		}
		if path == "" {
			return nil
		}
		path = parentPath(path)
	}
}

func parentPath(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

var unknownAnchor = regexp.MustCompile(`^(?:yaml: )?unknown anchor '([^']*)' referenced$`)

// yamlErrors turns yaml.v3's "yaml: line N: msg" texts into located errors.
// An unknown anchor comes without a place: it is found in the file, the
// first *name that is not a longer name's start.
func (l *loader) yamlErrors(err error) {
	var texts []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		texts = te.Errors
	} else {
		texts = []string{err.Error()}
	}
	for _, text := range texts {
		e := Error{File: l.file, Msg: strings.TrimPrefix(text, "yaml: ")}
		if m := yamlLine.FindStringSubmatch(text); m != nil {
			e.Line, _ = strconv.Atoi(m[1])
			e.Msg = m[2]
			if te == nil {
				if parserProblems[e.Msg] {
					e.Line++ // yaml.v3 counts a parser error's line from 0
				}
				// A block left open on the last line is reported past the
				// end of the file.
				lines := bytes.Count(l.data, []byte("\n"))
				if len(l.data) > 0 && l.data[len(l.data)-1] != '\n' {
					lines++
				}
				e.Line = min(e.Line, max(lines, 1))
				problem := e.Msg
				line := problemLine(l.data, e.Line, problem)
				blockNote := ""
				if at, col, key, text := missingSpace(l.data, line); at != 0 {
					e.Msg = fmt.Sprintf("%q needs a space after the colon: YAML reads %s as one text, not a key and its value (the parser stopped on line %d: %s)",
						key+":", text, line, problem)
					e.Line, e.Col = at, col
				} else if odd, note := oddIndent(l.data, line, e.Msg); odd != 0 {
					e.Line, e.Msg = odd, e.Msg+note
				} else if line != e.Line {
					blockNote = fmt.Sprintf(" (the block holding it starts on line %d)", e.Line)
					e.Msg += blockNote
					e.Line = line
				}
				if e.Col == 0 {
					e.Col, e.Msg = tabHint(l.data, e.Line, e.Msg)
				}
				if e.Col == 0 {
					if at, col, r := oddSpace(l.data, e.Line); at > 0 {
						what := fmt.Sprintf("the space character %U", r)
						if r == '\u00a0' {
							what = "a non-breaking space (U+00A0)"
						}
						e.Msg += fmt.Sprintf(": %s in the indentation; YAML indents with plain spaces only", what)
						if at != e.Line {
							e.Msg += fmt.Sprintf(" (the parser stopped on line %d)", e.Line)
						}
						e.Line, e.Col = at, col
					} else if at, note := deeperHint(l.data, e.Line, problem); note != "" {
						// The block that ended is not the one the block
						// note names (that is the file's top level).
						e.Line, e.Msg = at, strings.TrimSuffix(e.Msg, blockNote)+note
					}
				}
			}
		} else if m := unknownAnchor.FindStringSubmatch(text); m != nil {
			e.Line, e.Col = aliasPlace(l.data, m[1])
		} else if te == nil {
			// Errors of the reader (invalid UTF-8, a NUL byte) come with no
			// line at all: the search by halves finds it from the top.
			e.Line = problemLine(l.data, 0, e.Msg)
		}
		l.errs = append(l.errs, e)
	}
}

// keyWithoutSpace is a line that starts as a key whose colon the value
// follows with no space (grace_usd:"0.50", - name:u): no "::", and no URL
// (http://…), which a value going on over lines may hold.
var keyWithoutSpace = regexp.MustCompile(`^(\s*(?:-\s+)?)([A-Za-z_][A-Za-z0-9_]*):([^\s:].*)$`)

// missingSpace finds the line to blame for a syntax error found on line
// stop when it is a key written without the space after its colon: YAML
// reads the line as one plain text, and fails a line or more later, at
// the next key (blaming the line its block starts on, or one of the
// file's top level). The nearest such line up to stop is the one whose
// space, put in, makes the file up to stop parse; a line in a literal
// block or in a value going on over lines changes nothing, or breaks the
// file sooner, and is passed over. It returns the line, the colon's
// column, the key and the line's text, or 0.
func missingSpace(data []byte, stop int) (int, int, string, string) {
	lines := strings.SplitAfter(string(data), "\n")
	if stop < 1 || stop > len(lines) {
		return 0, 0, "", ""
	}
	cut := strings.Join(lines[:stop], "")
	offset := len(cut)
	tries := 0
	for i := stop - 1; i >= 0 && tries < 16; i-- {
		offset -= len(lines[i])
		text := strings.TrimRight(lines[i], "\r\n")
		m := keyWithoutSpace.FindStringSubmatch(text)
		if m == nil || strings.HasPrefix(m[3], "//") {
			continue
		}
		tries++
		colon := offset + len(m[1]) + len(m[2])
		if unmarshalCut([]byte(cut[:colon+1]+" "+cut[colon+1:])) == nil {
			return i + 1, len(m[1]) + len(m[2]) + 1, m[2], strings.TrimSpace(strings.TrimPrefix(text, m[1]))
		}
	}
	return 0, 0, "", ""
}

// tabHint says what yaml.v3's "found character that cannot start any
// token" means when the line starts with a tab, as an editor that indents
// with tabs writes it: YAML indents with spaces only.
func tabHint(data []byte, line int, msg string) (int, string) {
	if !strings.Contains(msg, "cannot start any token") || line < 1 {
		return 0, msg
	}
	lines := bytes.SplitN(data, []byte("\n"), line+1)
	if len(lines) < line {
		return 0, msg
	}
	text := lines[line-1]
	indent := len(text) - len(bytes.TrimLeft(text, " \t"))
	if i := bytes.IndexByte(text[:indent], '\t'); i >= 0 {
		return i + 1, msg + ": a tab in the indentation (YAML indents with spaces only)"
	}
	return 0, msg
}

// crToLF turns each CR not followed by LF into LF: the same line end to
// YAML, and one the error placing counts.
func crToLF(data []byte) []byte {
	if !bytes.Contains(data, []byte{'\r'}) {
		return data
	}
	out := bytes.Clone(data)
	for i, b := range out {
		if b == '\r' && (i+1 == len(out) || out[i+1] != '\n') {
			out[i] = '\n'
		}
	}
	return out
}

// oddSpace finds the last line up to line whose indentation holds a
// space other than U+0020, such as the non-breaking space a copy from a
// web page brings: YAML reads it as the start of the key, which breaks
// the block a line or more later. It returns the line, the column of
// that space and the space, or 0.
func oddSpace(data []byte, line int) (int, int, rune) {
	lines := strings.Split(string(data), "\n")
	for i := min(line, len(lines)) - 1; i >= 0; i-- {
		col := 1
		for _, r := range lines[i] {
			if r == ' ' {
				col++
				continue
			}
			if r == '\r' {
				break // a CRLF line end (crToLF made every lone CR an LF)
			}
			if r != '\t' && unicode.IsSpace(r) {
				return i + 1, col, r
			}
			break
		}
	}
	return 0, 0, 0
}

// deeperHint explains an error on a line indented deeper than the key
// before it (comments between skipped) when that key has its value
// already: a key of a block written at column 0 ends the block, and the
// parser fails on the next line holding YAML, which may be the right one.
// yaml.v3 says "mapping values are not allowed" when that line comes
// right after the key, "did not find expected key" after a comment line.
// A key at column 0 that is no top-level section is the one at fault:
// its line is returned, with a note saying so; otherwise line is, with
// a note naming both. No note: the error is something else.
func deeperHint(data []byte, line int, problem string) (int, string) {
	switch problem {
	case "mapping values are not allowed in this context", "did not find expected key":
	default:
		return line, ""
	}
	lines := strings.Split(string(data), "\n")
	if line < 2 || line > len(lines) {
		return line, ""
	}
	indent := func(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }
	for i := line - 2; i >= 0; i-- {
		t := strings.TrimSpace(lines[i])
		if t == "" || t[0] == '#' {
			continue
		}
		key, value, found := strings.Cut(t, ": ")
		value, _, _ = strings.Cut(value, " #")
		if !found || key == "" || strings.TrimSpace(value) == "" || strings.ContainsAny(key[:1], "-[{\"'") || indent(lines[i]) >= indent(lines[line-1]) {
			return line, ""
		}
		if indent(lines[i]) == 0 && !isSection(key) {
			return i + 1, fmt.Sprintf(" (%q at column 0 is no top-level section: it lacks indentation, and ended the block above it; the parser stopped on line %d)", key, line)
		}
		return line, fmt.Sprintf(" (indented deeper than line %d above it, whose key has its value already: line %d lacks indentation, or this line has too much)", i+1, i+1)
	}
	return line, ""
}

// isSection says whether key may start a line at column 0: a section of
// Config, or an "x-" extension key.
func isSection(key string) bool {
	return strings.HasPrefix(key, "x-") || slices.Contains(fieldNames(reflect.TypeOf(Config{})), key)
}

// parserProblems are the errors of yaml.v3's parser, as opposed to its
// scanner: yaml.v3 reports their line counted from 0, one line early
// (its fail adds the 1 for scanner errors only).
var parserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"found undefined tag handle":             true,
	"did not find expected node content":     true,
	"did not find expected '-' indicator":    true,
	"did not find expected key":              true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found duplicate %TAG directive":         true,
}

// oddIndent finds the line to blame for an indentation error found on
// line: a block's first key sets its indent, so a first key indented one
// space off makes yaml.v3 fail at the next key, which is right. When the
// keys after line share its indent, and the line before it is the first
// of its block with another indent, that first line is the one that
// differs from its siblings: its number and a note saying so are returned.
// 0 leaves the error where it is.
func oddIndent(data []byte, line int, problem string) (int, string) {
	switch problem {
	case "did not find expected key", "did not find expected '-' indicator", "mapping values are not allowed in this context":
	default:
		return 0, ""
	}
	lines := strings.Split(string(data), "\n")
	// content is the key column of the line at i (0-based) when it holds
	// YAML, not a comment or nothing; for "- key:" the key's column.
	content := func(i int) (int, bool) {
		t := strings.TrimLeft(lines[i], " ")
		if t == "" || t[0] == '#' {
			return 0, false
		}
		col := len(lines[i]) - len(t)
		if rest, ok := strings.CutPrefix(t, "- "); ok {
			col += 2 + len(rest) - len(strings.TrimLeft(rest, " "))
		}
		return col, true
	}
	near := func(from, step int) (int, int) { // the next line holding YAML from from, and its column
		for i := from; i >= 0 && i < len(lines); i += step {
			if col, ok := content(i); ok {
				return i, col
			}
		}
		return -1, 0
	}
	at := line - 1
	if at < 0 || at >= len(lines) {
		return 0, ""
	}
	col, ok := content(at)
	next, nextCol := near(at+1, 1)
	first, firstCol := near(at-1, -1)
	if !ok || next < 0 || nextCol != col || first < 0 || firstCol == col {
		return 0, ""
	}
	if firstCol < col && strings.HasSuffix(strings.TrimRight(lines[first], " "), ":") {
		return 0, "" // the line before is the parent of line's block, not a sibling
	}
	// The first key of its block: a "- " item, or right under "key:".
	if t := strings.TrimLeft(lines[first], " "); !strings.HasPrefix(t, "- ") {
		opener, openerCol := near(first-1, -1)
		if opener < 0 || openerCol >= min(firstCol, col) || !strings.HasSuffix(strings.TrimRight(lines[opener], " "), ":") {
			return 0, ""
		}
	}
	return first + 1, fmt.Sprintf(" (the first key of its block starts in column %d, the keys after it in column %d; the parser stopped on line %d)", firstCol+1, col+1, line)
}

// problemLine is the line a YAML syntax error is on. yaml.v3 reports the
// line the enclosing block starts on (a bad indent on line 3 of a mapping
// begun on line 2 says line 2), so the file is cut after a line from the
// reported one on: the first cut that fails with the same problem ends on
// the problem's line. The cuts are searched by halves, a few parses for
// any file. A construct that may span lines (a quoted string) fails only
// where it would have ended, so the line found can be past the problem;
// yamlErrors says where the block began too.
func problemLine(data []byte, reported int, problem string) int {
	var ends []int // ends[i]: the offset just past line i+1
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	failsSame := func(line int) bool {
		err := unmarshalCut(data[:ends[line-1]])
		if err == nil {
			return false
		}
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			msg = m[2]
		}
		return msg == problem
	}
	lo, hi := max(reported, 1), len(ends)
	if lo > hi || !failsSame(hi) {
		return reported
	}
	for lo < hi {
		if mid := (lo + hi) / 2; failsSame(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// unmarshalCut parses one cut; a variable so a test can count them.
var unmarshalCut = unmarshalSafely

func unmarshalSafely(data []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("unreadable YAML: %v", r)
		}
	}()
	var n yaml.Node
	return yaml.Unmarshal(data, &n)
}

// aliasPlace is the 1-based line and column of the first alias *name in
// data, or 0, 0.
func aliasPlace(data []byte, name string) (line, col int) {
	alias := regexp.MustCompile(`\*` + regexp.QuoteMeta(name) + `(?:[\s,\]}]|$)`)
	loc := alias.FindIndex(data)
	if loc == nil {
		return 0, 0
	}
	before := data[:loc[0]]
	line = bytes.Count(before, []byte{'\n'}) + 1
	return line, loc[0] - (bytes.LastIndexByte(before, '\n') + 1) + 1
}

// parseYAML returns the root node of the single document in data (nil when
// the file is empty or holds only comments).
func (l *loader) parseYAML(data []byte) (root *yaml.Node, ok bool) {
	defer func() {
		// yaml.v3 has panicked on hostile input before; a config file must
		// never take the process down.
		if r := recover(); r != nil {
			l.errs = append(l.errs, Error{File: l.file, Msg: fmt.Sprintf("unreadable YAML: %v", r)})
			root, ok = nil, false
		}
	}()
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, true
		}
		l.yamlErrors(err)
		return nil, false
	}
	var second yaml.Node
	if err := dec.Decode(&second); err == nil {
		l.errs = append(l.errs, Error{File: l.file, Line: second.Line, Col: second.Column,
			Msg: "a second YAML document (after ---): gateway.yaml holds exactly one"})
		return nil, false
	} else if !errors.Is(err, io.EOF) {
		l.yamlErrors(err)
		return nil, false
	}
	root = &doc
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil, true
		}
		root = doc.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil, true
	}
	if root.Kind != yaml.MappingNode {
		l.errs = append(l.errs, Error{File: l.file, Line: root.Line, Col: root.Column,
			Msg: "the config must be a mapping of sections (" + strings.Join(fieldNames(reflect.TypeOf(Config{})), ", ") + "), got " + describeNode(root)})
		return nil, false
	}
	return root, true
}

// expandTree replaces ${VAR}, ${VAR:-default} and $$ in every scalar value
// (mapping keys stay literal). Expanding after parsing keeps line numbers
// true and means a value from the environment can never change the YAML
// structure around it.
func (l *loader) expandTree(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			l.expandTree(c, path)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			l.expandTree(n.Content[i+1], joinPath(path, n.Content[i].Value))
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			l.expandTree(c, fmt.Sprintf("%s[%d]", path, i))
		}
	case yaml.ScalarNode:
		if !strings.Contains(n.Value, "$") {
			return
		}
		value, unset, err := expandEnv(n.Value, l.lookupEnv)
		if err != nil {
			l.errAt(n, path, "%v", err)
			// Left unexpanded, it would be reported again as the
			// wrong type where a number goes.
			l.unexpanded[n] = true
			return
		}
		n.Value = value
		if len(unset) > 0 {
			l.unset[n] = unset
			l.unsetPaths = append(l.unsetPaths, nodePath{n, path})
		}
		if n.Style&(yaml.TaggedStyle|yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0 {
			// A plain scalar was typed by its unexpanded text ("${X}" is a
			// string); type it again by what it says now, as if written so.
			n.Tag = ""
			l.expanded[n] = true
		}
	}
}

// ErrUnterminatedVar is returned for a "${" without its "}": close the
// reference, or write "$$" for a literal dollar sign.
var ErrUnterminatedVar = errors.New(`unterminated "${" (close it with "}", or write "$$" for a literal "$")`)

// expandEnv expands ${VAR}, ${VAR:-default} (default when VAR is unset or
// empty), ${VAR:?message} (an error saying message when VAR is unset or
// empty) and $$ (a literal $), in a default or message too. Any other $
// stays as it is. A default cannot contain "}" or another ${...}: it ends
// at the first "}", so a nested one would be cut in two. unset names the
// variables of the ${VAR}s without either form that are not set: they
// read as empty, which is rarely meant.
func expandEnv(s string, lookupEnv func(string) (string, bool)) (_ string, unset []string, _ error) {
	var b strings.Builder
	for i := 0; i < len(s); {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			i++
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i += 2
		case '{':
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 {
				return "", nil, ErrUnterminatedVar
			}
			ref := s[i+2 : i+2+end]
			name, def, hasDefault := strings.Cut(ref, ":-")
			name, why, required := strings.Cut(name, ":?")
			if required && hasDefault { // ${X:?a:-b}: the message holds ":-"
				name, why, _ = strings.Cut(ref, ":?")
				def, hasDefault = "", false
			}
			if !validVarName(name) {
				return "", nil, fmt.Errorf("${%s}: %q is not a variable name (letters, digits and _, not starting with a digit)", ref, name)
			}
			def, nested := unescapeDefault(def)
			why, nestedWhy := unescapeDefault(why)
			if nested || nestedWhy {
				return "", nil, fmt.Errorf(`%s: a default cannot hold another ${...}: nested defaults are not supported (write "$${" for a literal "${")`, wholeRef(s[i:]))
			}
			value, set := lookupEnv(name)
			// Set to nothing is refused too, as the shell does, and said
			// as what it is.
			state := "is not set"
			if set {
				state = "is set but empty"
			}
			switch {
			case required && (!set || value == "") && why == "":
				return "", nil, fmt.Errorf("${%s} %s, and the file requires it", name, state)
			case required && (!set || value == ""):
				return "", nil, fmt.Errorf("${%s} %s: %s", name, state, why)
			case hasDefault && (!set || value == ""):
				value = def
			case !hasDefault && !required && !set && !slices.Contains(unset, name):
				unset = append(unset, name)
			}
			b.WriteString(value)
			i += 2 + end + 1
		default:
			b.WriteByte('$')
			i++
		}
	}
	return b.String(), unset, nil
}

// unescapeDefault turns each $$ of a default into $, and reports a "${"
// that is not one.
func unescapeDefault(def string) (string, bool) {
	if !strings.Contains(def, "$") {
		return def, false
	}
	var b strings.Builder
	for i := 0; i < len(def); i++ {
		switch {
		case def[i] != '$' || i+1 == len(def):
			b.WriteByte(def[i])
		case def[i+1] == '$':
			b.WriteByte('$')
			i++
		case def[i+1] == '{':
			return "", true
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), false
}

// wholeRef is the reference s starts with, "${" to its matching "}" (or
// to the end when there is none), for quoting a nested one whole.
func wholeRef(s string) string {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch {
		case strings.HasPrefix(s[i:], "$$"):
			i++
		case strings.HasPrefix(s[i:], "${"):
			depth++
			i++
		case s[i] == '}':
			if depth--; depth == 0 {
				return s[:i+1]
			}
		}
	}
	return s
}

func validVarName(name string) bool {
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	for _, c := range name {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

var (
	durationType    = reflect.TypeOf(time.Duration(0))
	byteSizeType    = reflect.TypeOf(ByteSize(0))
	timestampType   = reflect.TypeOf(Timestamp(0))
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
)

// walk checks node n against Go type t: every key must name a field (all
// unknown keys are reported, with a suggestion), every value must have the
// right shape, and every leaf must decode. It records each value's node for
// placing validation errors.
func (l *loader) walk(n *yaml.Node, t reflect.Type, path string, depth int) {
	if !l.walkValue(n, t, path, depth) {
		l.broken = append(l.broken, brokenValue{node: n})
	}
}

// brokenValue is a value walk reported. A list item is cleared to an
// empty value of its type (item), not to null: yaml.v3 drops a null item
// from the list, which moved every later item up one place, and errors
// then named them by the file's places but showed the lines of the items
// before them.
type brokenValue struct {
	node *yaml.Node
	item reflect.Type // the list's item type; nil for a value that is no list item
}

// walkItem checks the list item n at path. An empty item (a bare "-",
// "~") is refused: yaml.v3 would drop it without a word.
func (l *loader) walkItem(n *yaml.Node, t reflect.Type, path string, depth int) {
	if v := resolveAlias(n); v.Kind == yaml.ScalarNode && !l.expanded[v] && v.ShortTag() == "!!null" {
		l.errAt(n, path, "an empty list item: write the item, or remove it")
		l.broken = append(l.broken, brokenValue{node: n, item: t})
		return
	}
	if !l.walkValue(n, t, path, depth) {
		l.broken = append(l.broken, brokenValue{node: n, item: t})
	}
}

// blank is what a broken value is decoded as: nothing (the default), or
// for a list item the empty value of its type, which keeps its place.
func (b brokenValue) blank() yaml.Node {
	at := func(n yaml.Node) yaml.Node {
		n.Line, n.Column = b.node.Line, b.node.Column
		return n
	}
	t := b.item
	if t == nil {
		return at(yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"})
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return at(yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"})
	case reflect.Slice:
		return at(yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"})
	}
	var n yaml.Node
	if n.Encode(reflect.Zero(t).Interface()) != nil {
		return at(yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"})
	}
	return at(n)
}

// walkValue is walk, reporting whether n itself has the right shape.
// Problems are placed where the value is used, which for an alias is the
// alias, not its anchor.
func (l *loader) walkValue(n *yaml.Node, t reflect.Type, path string, depth int) bool {
	site := n
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return true
		}
		n = n.Alias
	}
	if !l.enter(site, path, depth) {
		return false
	}
	if n.Kind == yaml.ScalarNode && !l.expanded[n] && n.ShortTag() == "!!null" {
		return true // an empty value leaves the default
	}
	if l.unexpanded[n] {
		return false
	}
	if n.Kind == yaml.ScalarNode && n.Value == "" && n.ShortTag() == "!!str" && emptyIsNull(t) {
		// "" where a number, duration, size or true/false goes is an
		// empty value too, as gateway.yaml's header says: it was an
		// error whose hint (drop the quotes) led to "got 0".
		n.Tag, n.Style = "!!null", 0
		return true
	}
	if t.Kind() == reflect.Pointer {
		return l.walkValue(n, t.Elem(), path, depth+1)
	}
	if t == poolMemberType && n.Kind == yaml.MappingNode {
		l.walkMapping(n, t, path, depth, false) // the long form of a pool member
		return true
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return l.leaf(n, site, t, path)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			l.errAt(site, path, "want a mapping of fields, got %s", describeNode(n))
			return false
		}
		l.walkMapping(n, t, path, depth, false)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			l.errAt(site, path, "want a mapping, got %s", describeNode(n))
			return false
		}
		l.walkMap(n, t, path, depth)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			l.errAt(site, path, "want a list, got %s", describeNode(n))
			return false
		}
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			l.nodes[p] = c
			l.walkItem(c, t.Elem(), p, depth+1)
		}
	default:
		return l.leaf(n, site, t, path)
	}
	return true
}

// enter counts one more node visited and says whether to go on: aliases can
// make a small file expand enormously, or (through merges) into itself.
func (l *loader) enter(n *yaml.Node, path string, depth int) bool {
	l.walked++
	if l.walked > maxWalk+1 {
		return false
	}
	if l.walked == maxWalk+1 || depth > 64 {
		l.errAt(n, path, "too many values, or aliases nested too deep, to check; write the file out plainly")
		l.walked = maxWalk + 2
		return false
	}
	return true
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

// walkMapping checks the keys of n against struct type t. Keys merged in
// with "<<" are checked like written ones; a written key wins over a merged
// one, as in YAML.
func (l *loader) walkMapping(n *yaml.Node, t reflect.Type, path string, depth int, merged bool) {
	if merged && !l.enter(n, path, depth) {
		return
	}
	seen := map[string]*yaml.Node{}
	var merges []*yaml.Node
	// Pairs yaml.v3 would refuse (a repeated key drops the whole mapping)
	// are reported here and left out of the tree it decodes.
	kept := n.Content[:0:0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge" {
			sources, ok := mergeSources(v)
			if !ok {
				l.errAt(v, path, "a merge (<<) takes a mapping or a list of mappings, got %s", describeNode(v))
				continue
			}
			merges = append(merges, sources...)
			kept = append(kept, k, v)
			continue
		}
		if k.Kind != yaml.ScalarNode {
			l.errAt(k, "", "a key must be a plain name, got %s", describeNode(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			l.errAt(k, "", "key %q is repeated (first at line %d)", k.Value, first.Line)
			continue
		}
		seen[k.Value] = k
		kept = append(kept, k, v)
		field, ok := fieldByKey(t, k.Value)
		if !ok {
			if path == "" && strings.HasPrefix(k.Value, "x-") {
				continue // an extension key, kept for anchors to live in
			}
			l.unknownField(k, t, path)
			continue
		}
		p := joinPath(path, k.Value)
		if _, known := l.nodes[p]; !known || !merged {
			l.nodes[p] = v
		}
		l.walk(v, field.Type, p, depth+1)
	}
	if len(kept) != len(n.Content) {
		n.Content = kept
	}
	for _, m := range merges {
		l.walkMapping(m, t, path, depth+1, true)
	}
}

// walkMap checks a mapping of free-form names (map[string]T): keys must be
// plain, unique names; every value is walked as T under path.name.
func (l *loader) walkMap(n *yaml.Node, t reflect.Type, path string, depth int) {
	seen := map[string]*yaml.Node{}
	kept := n.Content[:0:0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge" {
			l.errAt(k, path, "a merge (<<) is not supported in %s: write its entries out", path)
			continue
		}
		if k.Kind != yaml.ScalarNode {
			l.errAt(k, "", "a key must be a plain name, got %s", describeNode(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			l.errAt(k, "", "key %q is repeated (first at line %d)", k.Value, first.Line)
			continue
		}
		seen[k.Value] = k
		kept = append(kept, k, v)
		p := joinPath(path, k.Value)
		l.nodes[p] = v
		l.walk(v, t.Elem(), p, depth+1)
	}
	if len(kept) != len(n.Content) {
		n.Content = kept
	}
}

// mergeSources returns the mappings a "<<" value merges in, and false when
// it is not a mapping or a list of mappings (yaml.v3 would stop decoding).
func mergeSources(v *yaml.Node) ([]*yaml.Node, bool) {
	v = resolveAlias(v)
	list := []*yaml.Node{v}
	if v.Kind == yaml.SequenceNode {
		list = nil
		for _, c := range v.Content {
			list = append(list, resolveAlias(c))
		}
	}
	for _, m := range list {
		if m.Kind != yaml.MappingNode {
			return nil, false
		}
	}
	return list, true
}

func (l *loader) unknownField(k *yaml.Node, t reflect.Type, path string) {
	where := ""
	if path != "" {
		where = " in " + path
	}
	hint := ""
	if s := suggest.Nearest(k.Value, fieldNames(t)); s != "" {
		hint = fmt.Sprintf(" (did you mean %q?)", s)
	}
	l.errAt(k, "", "unknown field %q%s%s", k.Value, where, hint)
}

// leaf decodes one scalar value into a fresh value of type t, reporting a
// failure in words a config author reads.
func (l *loader) leaf(n, site *yaml.Node, t reflect.Type, path string) bool {
	if n.Kind != yaml.ScalarNode {
		l.errAt(site, path, "want %s, got %s", describeType(t), describeNode(n))
		return false
	}
	if l.expanded[n] && t.Kind() == reflect.String {
		n.Tag = "!!str" // "null" or "123" from the environment is still text
	}
	// yaml.v3 truncates a float into an integer field: 0.5 requests a
	// minute would be 0, which means the default.
	if isInteger(t.Kind()) && n.ShortTag() == "!!float" {
		l.errAt(site, path, "want %s, got %s", describeType(t), describeNode(n))
		return false
	}
	// yaml.v3 reads 010 as 8, and 0x10, 0o10, 0b10 and 1_000 too: a
	// leading 0 written to line numbers up (retries: 010) set 8. The CLI
	// refuses the same; here too only decimal is taken.
	if isInteger(t.Kind()) && n.ShortTag() == "!!int" {
		switch digits := strings.TrimLeft(n.Value, "+-"); {
		case len(digits) > 1 && digits[0] == '0':
			l.errAt(site, path, "want an integer in decimal, got %s: YAML reads a leading 0 as octal (010 is 8), and 0x, 0o, 0b as other bases", n.Value)
			return false
		case strings.Contains(digits, "_"):
			l.errAt(site, path, "want an integer in decimal, got %s: write it without _", n.Value)
			return false
		}
	}
	if err := safeDecode(n, reflect.New(t).Interface()); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			l.errAt(site, path, "want %s, got %s%s", describeType(t), describeNode(n), quotesHint(n, t))
		} else {
			l.errAt(site, path, "%v", err)
		}
		return false
	}
	return true
}

// emptyIsNull says whether "" written for a value of type t means no
// value, as null does: for a number, duration, size or true/false. A
// string can be empty, and a list or mapping is not written as "".
func emptyIsNull(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Bool || isInteger(t.Kind()) || t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64
}

// quotesHint explains a quoted value that would have done unquoted:
// max_connections: "${MAXC}" is the string "12", not the number. An
// empty one would not have: unquoted it is no value.
func quotesHint(n *yaml.Node, t reflect.Type) string {
	if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 || strings.TrimSpace(n.Value) == "" {
		return ""
	}
	plain := yaml.Node{Kind: yaml.ScalarNode, Value: n.Value}
	if safeDecode(&plain, reflect.New(t).Interface()) != nil {
		return ""
	}
	return " (the quotes make it a string: write it without them)"
}

func isInteger(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

func safeDecode(n *yaml.Node, out any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("unreadable value: %v", r)
		}
	}()
	return n.Decode(out)
}

// decode fills cfg from the checked tree. Problems yaml.v3 finds were
// already reported by walk; anything it finds that walk did not is reported
// as yaml.v3 words it.
func (l *loader) decode(root *yaml.Node, cfg *Config) {
	for _, b := range l.broken {
		*b.node = b.blank()
	}
	before := len(l.errs)
	err := safeDecode(root, cfg)
	if err != nil && before == 0 {
		l.yamlErrors(err)
	}
}

func describeType(t reflect.Type) string {
	switch t {
	case durationType:
		return `a duration such as "10s" or "1m30s"`
	case byteSizeType:
		return "a size such as 1048576, 8MiB or 5GB"
	case timestampType:
		return "a date such as 2025-01-27, or Unix seconds"
	}
	if isInteger(t.Kind()) {
		return "an integer"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "a mapping"
	}
	return t.String()
}

func describeNode(n *yaml.Node) string {
	n = resolveAlias(n)
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:37] + "..."
		}
		if n.ShortTag() == "!!str" {
			return strconv.Quote(v)
		}
		return v
	}
	return "nothing"
}

// fieldByKey finds the struct field a yaml key names, by its yaml tag.
func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if name := yamlName(f); name != "" && name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// yamlName is the key yaml.v3 uses for f, "" when f is not in the YAML.
func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	switch name {
	case "-":
		return ""
	case "":
		return strings.ToLower(f.Name)
	}
	return name
}

func hasSpace(s string) bool {
	return strings.IndexFunc(s, unicode.IsSpace) >= 0
}
