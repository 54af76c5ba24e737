package schema

import (
	_ "embed"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed queries.sql
var queriesSQL string

// Query is one finance query of queries.sql.
type Query struct {
	Name string
	// Doc is the comment above the query: what it answers.
	Doc string
	// SQL holds {name:Type} placeholders; see Bind.
	SQL string
	// Params are the placeholders' names and types, each once, in order of
	// first use.
	Params []Param
}

// Param is a {name:Type} placeholder.
type Param struct {
	Name string
	Type string
}

var placeholder = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*):([A-Za-z0-9]+)\}`)

// FinanceQueries returns the queries of queries.sql in file order.
func FinanceQueries() ([]Query, error) {
	var queries []Query
	for _, block := range splitQueryBlocks(queriesSQL) {
		q, ok, err := parseQueryBlock(block)
		if err != nil {
			return nil, err
		}
		if ok {
			queries = append(queries, q)
		}
	}
	if len(queries) == 0 {
		return nil, fmt.Errorf("queries.sql holds no query")
	}
	return queries, nil
}

// FinanceQuery returns the query of queries.sql called name.
func FinanceQuery(name string) (Query, error) {
	queries, err := FinanceQueries()
	if err != nil {
		return Query{}, err
	}
	var names []string
	for _, q := range queries {
		if q.Name == name {
			return q, nil
		}
		names = append(names, q.Name)
	}
	return Query{}, fmt.Errorf("no finance query %q; there are %s", name, strings.Join(names, ", "))
}

// splitQueryBlocks cuts the file at each ';' ending a line, keeping the
// comments, which carry each query's name and doc.
func splitQueryBlocks(text string) []string {
	var blocks []string
	var current strings.Builder
	for _, line := range strings.Split(text, "\n") {
		current.WriteString(line)
		current.WriteByte('\n')
		if strings.HasSuffix(strings.TrimRight(line, " \t\r"), ";") {
			blocks = append(blocks, current.String())
			current.Reset()
		}
	}
	return blocks
}

func parseQueryBlock(block string) (Query, bool, error) {
	var q Query
	var doc, sql []string
	for _, line := range strings.Split(block, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case len(sql) == 0 && strings.HasPrefix(trimmed, "-- name:"):
			q.Name = strings.TrimSpace(strings.TrimPrefix(trimmed, "-- name:"))
			doc = doc[:0]
		case len(sql) == 0 && strings.HasPrefix(trimmed, "--"):
			if q.Name != "" {
				doc = append(doc, strings.TrimSpace(strings.TrimPrefix(trimmed, "--")))
			}
		case len(sql) == 0 && trimmed == "":
		default:
			sql = append(sql, strings.TrimRight(line, " \t\r"))
		}
	}
	if len(sql) == 0 {
		return q, false, nil
	}
	if q.Name == "" {
		return q, false, fmt.Errorf("queries.sql: a query has no \"-- name:\" line: %.60q", strings.Join(sql, " "))
	}
	q.Doc = strings.Join(doc, " ")
	q.SQL = strings.TrimSuffix(strings.TrimSpace(strings.Join(sql, "\n")), ";")
	types := make(map[string]string)
	for _, m := range placeholder.FindAllStringSubmatch(q.SQL, -1) {
		name, typ := m[1], m[2]
		if prev, seen := types[name]; seen {
			if prev != typ {
				return q, false, fmt.Errorf("queries.sql %s: parameter %s is both %s and %s", q.Name, name, prev, typ)
			}
			continue
		}
		types[name] = typ
		q.Params = append(q.Params, Param{Name: name, Type: typ})
	}
	return q, true, nil
}

var (
	datePattern    = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)
	integerPattern = regexp.MustCompile(`^-?\d+$`)
)

// Bind returns q's SQL with every {name:Type} placeholder replaced by the
// literal of values[name], for servers without query parameters (18.16).
// Date becomes toDate('YYYY-MM-DD'), String a quoted, escaped literal,
// (U)Int* the checked integer. Every parameter must have a value, and every
// value a parameter: a misspelt name fails rather than going unused.
func (q Query) Bind(values map[string]string) (string, error) {
	var problems []string
	known := make(map[string]bool, len(q.Params))
	literals := make(map[string]string, len(q.Params))
	for _, p := range q.Params {
		known[p.Name] = true
		v, ok := values[p.Name]
		if !ok {
			problems = append(problems, fmt.Sprintf("missing %s (%s)", p.Name, p.Type))
			continue
		}
		literal, err := literalOf(p, v)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", p.Name, err))
			continue
		}
		literals[p.Name] = literal
	}
	var unknown []string
	for name := range values {
		if !known[name] {
			unknown = append(unknown, name)
		}
	}
	sort.Strings(unknown)
	for _, name := range unknown {
		problems = append(problems, fmt.Sprintf("%s is not a parameter", name))
	}
	if len(problems) > 0 {
		return "", fmt.Errorf("binding query %s: %s", q.Name, strings.Join(problems, "; "))
	}
	return placeholder.ReplaceAllStringFunc(q.SQL, func(m string) string {
		return literals[placeholder.FindStringSubmatch(m)[1]]
	}), nil
}

// The days ClickHouse 18.16's Date holds: toDate('2106-01-01') and
// toDate('1969-12-31') are 0000-00-00 (day 0, 1970-01-01), so a to_date of
// 9999-12-31 matched nothing and an invoice for 2106 billed January 1970,
// without a word. toDateTime of each day, up to the day after lastDate,
// fits its UInt32 seconds too.
const (
	firstDate = "1970-01-01"
	lastDate  = "2105-12-31"
)

// Range bounds, as queries.sql names them (from_date included, to_date
// not): a bound beyond the Date range is only compared, so it is moved to
// the range's edge, where it selects the same days. to_date=9999-12-31 is
// how finance writes "to the end".
const (
	rangeStart = "from_date"
	rangeEnd   = "to_date"
)

func literalOf(p Param, value string) (string, error) {
	typ := p.Type
	switch {
	case typ == "String":
		return quoteString(value), nil
	case typ == "Date":
		if !datePattern.MatchString(value) {
			return "", fmt.Errorf("%q is not a date: write YYYY-MM-DD", value)
		}
		// A date that does not exist is refused here: ClickHouse 18.16
		// turns 2026-11-31 into December 1st and 2026-13-01 into
		// 0000-00-00 without a word, and the invoice of the wrong month,
		// or an empty one, came back.
		if _, err := time.Parse(time.DateOnly, value); err != nil {
			return "", fmt.Errorf("%q is not a date that exists", value)
		}
		// YYYY-MM-DD strings compare as the days they name.
		switch {
		case value < firstDate && p.Name == rangeStart:
			return "toDate('" + firstDate + "')", nil
		case value > lastDate && p.Name == rangeEnd:
			// The day after lastDate has no literal ClickHouse 18.16
			// parses, but Date arithmetic reaches it.
			return "(toDate('" + lastDate + "') + 1)", nil
		case value < firstDate || value > lastDate:
			return "", fmt.Errorf("%q is outside %s..%s, the days ClickHouse's Date holds", value, firstDate, lastDate)
		}
		return "toDate('" + value + "')", nil
	case strings.HasPrefix(typ, "Int") || strings.HasPrefix(typ, "UInt"):
		if !integerPattern.MatchString(value) {
			return "", fmt.Errorf("%q is not an integer", value)
		}
		// Out of the type's range ClickHouse answered "Bad get: has
		// Int64, requested UInt64" for -1, and took 4294967296 as a
		// UInt32.
		bits, err := strconv.Atoi(strings.TrimPrefix(strings.TrimPrefix(typ, "U"), "Int"))
		if err != nil {
			return "", fmt.Errorf("type %s cannot be bound; add it to schema.literalOf", typ)
		}
		if strings.HasPrefix(typ, "U") {
			if _, err := strconv.ParseUint(value, 10, bits); err != nil {
				return "", fmt.Errorf("%q is outside 0..%d", value, uint64(1)<<bits-1)
			}
		} else if _, err := strconv.ParseInt(value, 10, bits); err != nil {
			return "", fmt.Errorf("%q is outside %d..%d", value, -(int64(1) << (bits - 1)), int64(1)<<(bits-1)-1)
		}
		return value, nil
	}
	return "", fmt.Errorf("type %s cannot be bound; add it to schema.literalOf", typ)
}

// quoteString quotes s as a ClickHouse string literal: backslash and quote
// are the characters with meaning inside one.
func quoteString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
