package schema_test

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tollgate/tollgate/billing/schema"
	"github.com/tollgate/tollgate/internal/chtest"
)

func connect(t testing.TB, srv *chtest.Server) driver.Conn {
	t.Helper()
	opts, err := clickhouse.ParseDSN(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func migrationNames(t testing.TB) []string {
	t.Helper()
	migrations, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range migrations {
		names = append(names, m.Name)
	}
	return names
}

func TestMigrationsAreNumberedWithoutGaps(t *testing.T) {
	migrations, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range migrations {
		if m.Version != uint32(i+1) {
			t.Errorf("migration %d is %s (version %d): versions must count up from 1", i+1, m.Name, m.Version)
		}
		for _, statement := range m.Statements {
			if strings.Contains(statement, "--") {
				t.Errorf("%s: a comment was left in a statement:\n%s", m.Name, statement)
			}
		}
	}
	if len(migrations) < 2 {
		t.Fatalf("got %d migrations, want usage_events and the daily rollup", len(migrations))
	}
}

func TestSplitStatements(t *testing.T) {
	got := schema.SplitStatements(`-- a comment; with a semicolon;
CREATE TABLE a (x String DEFAULT ';') ENGINE = Log;

-- another
SELECT 1;  
SELECT
    2
`)
	want := []string{
		"CREATE TABLE a (x String DEFAULT ';') ENGINE = Log",
		"SELECT 1",
		"SELECT\n    2",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestMigrateTwiceAppliesOnce(t *testing.T) {
	srv := chtest.Start(t)
	conn := connect(t, srv)
	ctx := context.Background()

	applied, err := schema.Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if want := migrationNames(t); !reflect.DeepEqual(applied, want) {
		t.Fatalf("first run applied %v, want %v", applied, want)
	}
	applied, err = schema.Migrate(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Fatalf("second run applied %v again", applied)
	}
	tables := srv.Query(t, "SELECT name FROM system.tables WHERE database = 'default' ORDER BY name")
	for _, want := range []string{"request_logs", "schema_migrations", "usage_daily", "usage_daily_events", "usage_daily_mv", "usage_events"} {
		if !strings.Contains("\n"+tables, "\n"+want+"\n") {
			t.Errorf("table %s is missing; there are:\n%s", want, tables)
		}
	}
	want := strconv.Itoa(len(migrationNames(t)))
	if recorded := srv.Query(t, "SELECT count() FROM schema_migrations FINAL"); strings.TrimSpace(recorded) != want {
		t.Fatalf("schema_migrations holds %s versions, want %s", recorded, want)
	}
}

func TestMigrateFromSeveralProcessesAtOnce(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const migrators = 4
	errs := make(chan error, migrators)
	var wg sync.WaitGroup
	for range migrators {
		conn := connect(t, srv) // a connection each, as separate processes have
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := schema.Migrate(ctx, conn)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	applied, err := schema.Migrate(ctx, connect(t, srv))
	if err != nil || len(applied) != 0 {
		t.Fatalf("after concurrent runs: applied %v, %v; want nothing left", applied, err)
	}
}
