package batch_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
)

// TestListReadsTheNewestJobsNotAll: GET /v1/batch walked every job key
// of the account to answer its 20 newest: 95-210 ms at 10,000 jobs,
// and chat calls of another key fell from 3,503 to 219 a second while
// 4 connections listed. Once the account's index of its newest jobs is
// built (here from jobs stored by a release without one), a listing
// reads about 20 messages whatever the number of jobs, and stays right
// as jobs are made and deleted.
func TestListReadsTheNewestJobsNotAll(t *testing.T) {
	e := newEnv(t, envOptions{})
	b, err := broker.Start(e.ctx, config.NATS{URL: e.broker.ClientURL()}, e.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	svc, err := batch.Open(e.ctx, b.JetStream(), e.store, batch.Options{Runtime: e.rt, Recorder: e.rec, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	template := e.create(svc, "acme", nil, "")
	entry, err := e.kv(batch.JobsBucket).Get(e.ctx, "acme."+template)
	if err != nil {
		t.Fatal(err)
	}
	const stored = 300
	ids := []string{template}
	for range stored {
		var rec map[string]any
		if err := json.Unmarshal(entry.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		id := uuid.Must(uuid.NewV7()).String()
		rec["id"] = id
		data, _ := json.Marshal(rec)
		if _, err := e.kv(batch.JobsBucket).Create(e.ctx, "acme."+id, data); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// As a release without the index left it.
	if kv, err := b.JetStream().KeyValue(e.ctx, batch.NewestBucket); err == nil {
		if err := kv.Purge(e.ctx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
	wantNewest := func(ids []string) {
		t.Helper()
		jobs, err := svc.List(e.ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		want := slices.Clone(ids[len(ids)-20:])
		slices.Reverse(want)
		if !slices.Equal(got, want) {
			t.Fatalf("listed %v,\nwant %v", got, want)
		}
	}
	listedReading := func(ids []string) uint64 {
		t.Helper()
		before := b.Conn().Stats().InMsgs
		wantNewest(ids)
		return b.Conn().Stats().InMsgs - before
	}

	wantNewest(ids) // builds the index
	if read := listedReading(ids); read > 40 {
		t.Errorf("a listing read %d messages of %d jobs; want about 20", read, len(ids))
	}
	for range 3 {
		ids = append(ids, e.create(svc, "acme", nil, ""))
	}
	if err := svc.Delete(e.ctx, "acme", ids[len(ids)-2]); err != nil {
		t.Fatal(err)
	}
	ids = slices.Delete(ids, len(ids)-2, len(ids)-1)
	if read := listedReading(ids); read > 40 {
		t.Errorf("a listing after creates and a delete read %d messages; want about 20", read)
	}
	// Deleting the newest jobs past what the index holds sends one listing
	// to the walk, which builds it again.
	for range 45 {
		if err := svc.Delete(e.ctx, "acme", ids[len(ids)-1]); err != nil {
			t.Fatal(err)
		}
		ids = ids[:len(ids)-1]
	}
	wantNewest(ids)
	if read := listedReading(ids); read > 40 {
		t.Errorf("a listing after the index was built again read %d messages; want about 20", read)
	}
}
