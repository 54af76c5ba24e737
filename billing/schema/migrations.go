package schema

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
)

//go:embed [0-9][0-9][0-9][0-9]_*.sql
var migrationFiles embed.FS

// Migration is one numbered file: 0002_usage_daily.sql is version 2, named
// 0002_usage_daily.
type Migration struct {
	Version    uint32
	Name       string
	Statements []string
}

// Migrations returns the embedded migrations in the order they apply.
func Migrations() ([]Migration, error) {
	names, err := fs.Glob(migrationFiles, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("listing migrations: %w", err)
	}
	migrations := make([]Migration, 0, len(names))
	seen := make(map[uint32]string)
	for _, file := range names {
		name := strings.TrimSuffix(file, path.Ext(file))
		number, _, _ := strings.Cut(name, "_")
		version, err := strconv.ParseUint(number, 10, 32)
		if err != nil || version == 0 {
			return nil, fmt.Errorf("migration %s: name must start with a version number above 0", file)
		}
		if other, dup := seen[uint32(version)]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", other, file, version)
		}
		seen[uint32(version)] = file
		text, err := migrationFiles.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", file, err)
		}
		statements := SplitStatements(string(text))
		if len(statements) == 0 {
			return nil, fmt.Errorf("migration %s holds no statement", file)
		}
		migrations = append(migrations, Migration{Version: uint32(version), Name: name, Statements: statements})
	}
	sort.Slice(migrations, func(i, j int) bool { return migrations[i].Version < migrations[j].Version })
	return migrations, nil
}

// SplitStatements splits SQL text into statements at every ';' that ends a
// line, and drops comment lines (those starting with --) and empty
// statements. A ';' inside a line, as in a string literal, does not split.
func SplitStatements(text string) []string {
	var statements []string
	var current strings.Builder
	flush := func() {
		if s := strings.TrimSpace(current.String()); s != "" {
			statements = append(statements, s)
		}
		current.Reset()
	}
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		line = strings.TrimRight(line, " \t\r")
		if strings.HasSuffix(line, ";") {
			current.WriteString(strings.TrimSuffix(line, ";"))
			flush()
			continue
		}
		current.WriteString(line)
		current.WriteByte('\n')
	}
	flush()
	return statements
}

const createSchemaMigrations = `CREATE TABLE IF NOT EXISTS schema_migrations
(
    version    UInt32,
    name       String,
    applied_at DateTime
)
ENGINE = ReplacingMergeTree
ORDER BY version`

// errCodeTableAlreadyExists is ClickHouse's TABLE_ALREADY_EXISTS. Two
// processes running CREATE … IF NOT EXISTS at the same moment can both pass
// the check; the loser gets this code for a table that is there as asked.
const errCodeTableAlreadyExists = 57

// Migrate applies the migrations conn's database has not recorded yet, in
// order, records each in schema_migrations, and returns the names it
// applied. Every migration is written to be re-run harmlessly (IF NOT
// EXISTS; copies into ReplacingMergeTree tables), so several processes may
// migrate at once: one may apply a migration another has just applied, and
// neither fails.
func Migrate(ctx context.Context, conn driver.Conn) ([]string, error) {
	migrations, err := Migrations()
	if err != nil {
		return nil, err
	}
	if err := execIdempotent(ctx, conn, createSchemaMigrations); err != nil {
		return nil, fmt.Errorf("creating schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, err
	}
	var done []string
	for _, m := range migrations {
		if applied[m.Version] {
			continue
		}
		for i, statement := range m.Statements {
			if err := execIdempotent(ctx, conn, statement); err != nil {
				return done, fmt.Errorf("migration %s, statement %d: %w", m.Name, i+1, err)
			}
		}
		if err := record(ctx, conn, m); err != nil {
			return done, err
		}
		done = append(done, m.Name)
	}
	return done, nil
}

func execIdempotent(ctx context.Context, conn driver.Conn, statement string) error {
	err := conn.Exec(ctx, statement)
	var exception *proto.Exception
	if errors.As(err, &exception) && exception.Code == errCodeTableAlreadyExists {
		return nil
	}
	return err
}

func appliedVersions(ctx context.Context, conn driver.Conn) (map[uint32]bool, error) {
	rows, err := conn.Query(ctx, "SELECT version FROM schema_migrations FINAL")
	if err != nil {
		return nil, fmt.Errorf("reading schema_migrations: %w", err)
	}
	defer rows.Close()
	applied := make(map[uint32]bool)
	for rows.Next() {
		var version uint32
		if err := rows.Scan(&version); err != nil {
			return nil, fmt.Errorf("reading schema_migrations: %w", err)
		}
		applied[version] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading schema_migrations: %w", err)
	}
	return applied, nil
}

func record(ctx context.Context, conn driver.Conn, m Migration) error {
	// Every INSERT names its columns: clickhouse-go needs that on 18.16.
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO schema_migrations (version, name, applied_at)")
	if err != nil {
		return fmt.Errorf("recording migration %s: %w", m.Name, err)
	}
	if err := batch.Append(m.Version, m.Name, time.Now()); err != nil {
		_ = batch.Abort()
		return fmt.Errorf("recording migration %s: %w", m.Name, err)
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("recording migration %s: %w", m.Name, err)
	}
	return nil
}
